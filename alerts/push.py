"""Path B's state logic, pure: which alerts to send to Alertmanager now, and when to resolve.

:func:`reconcile` takes the previous :class:`PushState`, the alerts that evaluation finds
active at ``now_s`` (SLO window pairs, signals with their evidence, flags ≥ L2), and
returns the new state plus the Alertmanager payloads to post: new alerts at once, firing
ones again every ``resend_s`` (Alertmanager forgets an alert whose ``endsAt`` passes, and
forgets everything on restart), and an alert that is no longer active once, with
``endsAt = now`` (resolved). No I/O, no clock: callers pass event time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

__all__ = ["ActiveAlert", "PushState", "alert_ttl_s", "reconcile", "to_rfc3339"]

#: A firing alert's ``endsAt`` lies this many re-send intervals ahead (as Prometheus does).
TTL_RESENDS = 4


def alert_ttl_s(resend_s: float) -> float:
    """How long a firing alert stays active after it was last sent (or confirmed by a jobs
    cycle) without news, seconds: its ``endsAt`` is that far ahead, so a dead pipeline's
    alerts expire in Alertmanager and in ``llmslo alerts`` alike."""
    return TTL_RESENDS * resend_s


def to_rfc3339(ts_s: float) -> str:
    """Unix seconds → ``2026-11-30T23:40:00.000Z`` (what Alertmanager's API expects)."""
    return datetime.fromtimestamp(ts_s, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@dataclass(frozen=True)
class ActiveAlert:
    """One alert that evaluation found active. ``labels`` identify it (with ``alertname``)."""

    labels: Mapping[str, str]
    annotations: Mapping[str, str] = field(default_factory=dict)
    generator_url: str = ""
    since_s: float | None = None  # when the condition started (event time), if known

    @property
    def key(self) -> tuple[tuple[str, str], ...]:
        """Identity of the alert: its sorted labels, as Alertmanager fingerprints it."""
        return tuple(sorted(self.labels.items()))


@dataclass(frozen=True)
class _Sent:
    alert: ActiveAlert
    starts_s: float
    last_sent_s: float


@dataclass(frozen=True)
class PushState:
    """What has been sent: alert key → the alert, its start and its last send (seconds)."""

    sent: Mapping[tuple[tuple[str, str], ...], _Sent] = field(default_factory=dict)

    @property
    def firing(self) -> tuple[ActiveAlert, ...]:
        """The alerts currently firing, in label order."""
        return tuple(self.sent[key].alert for key in sorted(self.sent))

    @property
    def starts_s(self) -> dict[tuple[tuple[str, str], ...], float]:
        """Alert key → its ``startsAt`` (seconds), for every firing alert."""
        return {key: sent.starts_s for key, sent in self.sent.items()}

    @classmethod
    def restore(cls, firing: Iterable[tuple[ActiveAlert, float]]) -> PushState:
        """The state after a restart: alerts recorded as firing, with their start (seconds).

        They count as never sent (so the next :func:`reconcile` re-sends the ones still
        active at once and resolves the others) and keep their original ``startsAt``.
        """
        return cls({alert.key: _Sent(alert, starts_s, float("-inf")) for alert, starts_s in firing})


def _payload(alert: ActiveAlert, starts_s: float, ends_s: float) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "labels": dict(alert.labels),
        "annotations": dict(alert.annotations),
        "startsAt": to_rfc3339(starts_s),
        "endsAt": to_rfc3339(ends_s),
    }
    if alert.generator_url:
        payload["generatorURL"] = alert.generator_url
    return payload


def reconcile(
    state: PushState,
    active: Iterable[ActiveAlert],
    now_s: float,
    resend_s: float = 60.0,
    ttl_s: float | None = None,
) -> tuple[PushState, list[dict[str, Any]]]:
    """The next state and the payloads to post at ``now_s``.

    A firing alert's ``endsAt`` is ``now + ttl_s`` (default 4 × ``resend_s``, as Prometheus
    does), so Alertmanager resolves it by itself if the pipeline dies; a cleared one is sent
    with ``endsAt = now_s``.
    """
    ttl = alert_ttl_s(resend_s) if ttl_s is None else ttl_s
    sent = dict(state.sent)
    payloads = []
    current = {alert.key: alert for alert in active}
    for key, alert in sorted(current.items()):
        previous = sent.get(key)
        if previous is None:
            starts = alert.since_s if alert.since_s is not None else now_s
            sent[key] = _Sent(alert, starts, now_s)
        elif now_s - previous.last_sent_s >= resend_s or previous.alert != alert:
            sent[key] = replace(previous, alert=alert, last_sent_s=now_s)
        else:
            continue
        payloads.append(_payload(alert, sent[key].starts_s, now_s + ttl))
    for key in sorted(set(sent) - set(current)):
        gone = sent.pop(key)
        payloads.append(_payload(gone.alert, gone.starts_s, now_s))
    return PushState(sent), payloads
