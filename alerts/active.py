"""Path B's input, pure: the alerts one SLO-jobs cycle finds active, with evidence and links.

:func:`active_alerts` turns a cycle's outputs into :class:`~alerts.push.ActiveAlert` values
that :func:`~alerts.push.reconcile` compares with what was sent:

* every SLO window pair that alerts (per SLO group): the same ``alertname`` and labels as
  the generated Prometheus rule of that pair (``slo_id``, ``severity``, ``window``,
  ``sli_kind``, spec labels, the group's ``pool``/``instance``…), so routes and inhibitions
  written for the rules apply;
* every finding (signal) of severity page or ticket, named like its signature rule where
  one exists (``stall`` → ``LlmEngineStalled``), with its evidence;
* every degradation flag at L2 or above (``LlmDegradationLevel``, L3 page, L2 ticket).

Every pushed alert carries ``origin="llmslo"`` (so it never merges with the Prometheus
rule's alert of the same name), a ``summary``, an ``evidence`` and a ``runbook``
annotation (hints from the seeds) and a ``generatorURL`` that opens the dashboard page
of the alert (``{dashboard_url}/{page}?slo=…&pool=…&instance=…&from=…``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlencode

from alerts.push import ActiveAlert
from pipeline.units import MINUTE_MS
from slo.evaluate import SloStatus
from slo.signals.detectors import Finding
from slo.windows import format_duration

__all__ = [
    "FLAG_ALERT",
    "ORIGIN",
    "RUNBOOKS",
    "SIGNAL_ALERTS",
    "FlagLevel",
    "active_alerts",
    "deep_link",
]

#: The label every pushed alert carries.
ORIGIN = {"origin": "llmslo"}
#: Alert name of a degradation flag at L2 or L3.
FLAG_ALERT = "LlmDegradationLevel"
#: Finding signal → alert name, where a generated signature rule has the same meaning.
SIGNAL_ALERTS: Mapping[str, str] = {
    "stall": "LlmEngineStalled",
    "ghost_requests": "LlmGhostRequests",
    "preemption_cascade": "LlmPreemptionCascade",
}
#: Signal (or ``slo:<sli kind>``, ``flag:L2``/``flag:L3``) → the first steps, from the seeds'
#: runbooks (seeds/000, 001, 003).
RUNBOOKS: Mapping[str, str] = {
    "stall": "running > 0 with no tokens: take the pod out of routing, check GPU activity and "
    "py-spy stacks per rank (NCCL hang or a stuck scheduler), then restart the whole group",
    "ghost_requests": "the engine keeps requests whose clients left: check that the tap/router "
    "closes upstream on disconnect and that the engine aborts them (finished_reason=abort)",
    "preemption_cascade": "KV is exhausted and requests are recomputed: shed load or lower "
    "max_num_seqs / long prompts on this pool before the queue runs away",
    "fragmentation": "free KV blocks exist but no contiguous run fits: drain and restart the "
    "instance (or reshard its KV pool) at a quiet moment",
    "queue_growth": "waiting grows without bound: admission control (429 + Retry-After) "
    "beats letting queued requests time out",
    "oom_risk": "KV and frame buffer near full: stop admitting long prompts, move traffic to "
    "the small-model replica (L3)",
    "hot_instance": "one instance takes far more than its share: check the router's hashing "
    "and prefix affinity, warm up a replica",
    "retry_storm": "retries feed the overload: cap client retries (budget, backoff with jitter)",
    "numeric_anomaly": "NaN/corrupted outputs in a batch: fence the batch, fall back to a "
    "smaller batch, check the GPU (XID) and the model build",
    "slo:latency": "see the latency page for the pools and instances that burn; check for "
    "stalls, preemptions and slow prefill before scaling",
    "slo:availability": "see outcomes by instance; errors before the first token point at "
    "admission or crashes, interrupted streams at the engine",
    "slo:goodput": "goodput burns when any latency target is missed: open the latency page",
    "flag:L2": "L2: reject prompts > 16K tokens with 429 + Retry-After until KV recovers",
    "flag:L3": "L3: switch to the small-model replica, front end shows the economy-mode banner",
}
#: Dashboard page per finding signal (the SLO page for SLO alerts, flags for flags).
_PAGES: Mapping[str, str] = {
    "stall": "engines",
    "preemption_cascade": "engines",
    "fragmentation": "engines",
    "queue_growth": "engines",
    "oom_risk": "gpus",
    "ghost_requests": "requests",
    "retry_storm": "requests",
    "numeric_anomaly": "requests",
    "hot_instance": "fleet",
}
_LINK_MARGIN_MS = 15 * MINUTE_MS
_MAX_EVIDENCE_CHARS = 1_000
Key = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class FlagLevel:
    """A scope's current degradation level and since when (event time, ms)."""

    scope: str  # pool | instance
    scope_id: str
    pool: str | None
    level: int
    since_ts_ms: int


def deep_link(
    dashboard_url: str | None,
    page: str,
    *,
    slo: str | None = None,
    pool: str | None = None,
    instance: str | None = None,
    from_ms: int | None = None,
    to_ms: int | None = None,
) -> str:
    """``{dashboard_url}/{page}?slo=…&pool=…&instance=…&from=…&to=…`` (empty values left out);
    ``""`` without a dashboard URL."""
    if not dashboard_url:
        return ""
    query = {
        "slo": slo,
        "pool": pool,
        "instance": instance,
        "from": from_ms,
        "to": to_ms,
    }
    text = urlencode({k: v for k, v in query.items() if v not in (None, "")})
    return f"{dashboard_url.rstrip('/')}/{page}" + (f"?{text}" if text else "")


def _camel(signal: str) -> str:
    return "Llm" + "".join(part.capitalize() for part in signal.split("_"))


def _significant(value: float) -> str:
    return f"{value:.2g}"


def _key(labels: Mapping[str, str]) -> Key:
    return tuple(sorted(labels.items()))


class _Builder:
    def __init__(
        self, now_ms: int, dashboard_url: str | None, starts_ms: Mapping[Key, int]
    ) -> None:
        self.now_ms = now_ms
        self.dashboard_url = dashboard_url
        self.starts_ms = starts_ms

    def alert(
        self,
        labels: dict[str, str],
        annotations: dict[str, str],
        page: str,
        since_ms: int | None,
        slo: str | None = None,
    ) -> ActiveAlert:
        labels = {**labels, **ORIGIN}
        start = self.starts_ms.get(_key(labels), since_ms if since_ms is not None else self.now_ms)
        url = deep_link(
            self.dashboard_url,
            page,
            slo=slo,
            pool=labels.get("pool"),
            instance=labels.get("instance"),
            from_ms=start - _LINK_MARGIN_MS,
        )
        since_s = None if since_ms is None else since_ms / 1000
        return ActiveAlert(labels, annotations, url, since_s)


def _slo_alerts(builder: _Builder, statuses: Iterable[SloStatus]) -> list[ActiveAlert]:
    alerts = []
    for status in statuses:
        slo = status.slo
        for state in status.pairs():
            if not state.alerting:
                continue
            pair = state.pair
            window = f"{format_duration(pair.long_ms)}-{format_duration(pair.short_ms)}"
            labels = {
                **slo.labels,
                **{k: v for k, v in status.group.items() if v},
                "alertname": slo.alert_name,
                "slo_id": slo.id,
                "slo_service": slo.service,
                "slo": slo.name,
                "severity": pair.severity,
                "window": window,
                "sli_kind": slo.sli.kind,
            }
            group = ", ".join(f"{k}={v}" for k, v in sorted(status.group.items()) if v)
            annotations = {
                "summary": f"{slo.service} {slo.name}"
                + (f" ({group})" if group else "")
                + f": error budget burning {pair.factor:g}× too fast",
                "evidence": (
                    f"burn rate {format_duration(pair.long_ms)} {_significant(state.long_burn)}, "
                    f"{format_duration(pair.short_ms)} {_significant(state.short_burn)} "
                    f"(threshold {pair.factor:g}); objective {slo.objective * 100:g} %, "
                    f"budget left {_significant(status.budget_remaining * 100)} %"
                ),
                "runbook": RUNBOOKS.get(f"slo:{slo.sli.kind}", ""),
                **slo.annotations,
            }
            alerts.append(builder.alert(labels, annotations, "slo", None, slo=slo.id))
    return alerts


def _finding_alerts(
    builder: _Builder, findings: Iterable[Finding], include_info: bool
) -> list[ActiveAlert]:
    alerts = []
    for finding in findings:
        if finding.severity not in ("page", "ticket") and not include_info:
            continue
        where = "instance" if finding.scope == "instance" else "pool"
        labels = {
            "alertname": SIGNAL_ALERTS.get(finding.signal, _camel(finding.signal)),
            "signal": finding.signal,
            "severity": finding.severity,
            "scope": finding.scope,
            where: finding.scope_id,
            "basis": finding.basis,
        }
        if finding.pool:
            labels["pool"] = finding.pool
        evidence = json.dumps(finding.evidence, sort_keys=True, default=str)
        annotations = {
            "summary": f"{finding.signal.replace('_', ' ')} on {finding.scope} {finding.scope_id}",
            "evidence": evidence[:_MAX_EVIDENCE_CHARS],
            "runbook": RUNBOOKS.get(finding.signal, ""),
        }
        page = _PAGES.get(finding.signal, "fleet")
        alerts.append(builder.alert(labels, annotations, page, None))
    return alerts


def _flag_alerts(builder: _Builder, flags: Iterable[FlagLevel]) -> list[ActiveAlert]:
    alerts = []
    for flag in flags:
        if flag.level < 2:
            continue
        where = "instance" if flag.scope == "instance" else "pool"
        labels = {
            "alertname": FLAG_ALERT,
            "signal": "degradation",
            "level": f"L{flag.level}",
            "severity": "page" if flag.level >= 3 else "ticket",
            "scope": flag.scope,
            where: flag.scope_id,
        }
        if flag.pool:
            labels["pool"] = flag.pool
        annotations = {
            "summary": f"{flag.scope} {flag.scope_id} degraded to L{flag.level}",
            "evidence": f"L{flag.level} since {flag.since_ts_ms} ms (KV free ratio below the "
            f"L{flag.level} threshold, or OOM risk for L3)",
            "runbook": RUNBOOKS.get(f"flag:L{min(flag.level, 3)}", ""),
        }
        alerts.append(builder.alert(labels, annotations, "flags", flag.since_ts_ms))
    return alerts


def active_alerts(
    now_ms: int,
    statuses: Iterable[SloStatus] = (),
    findings: Iterable[Finding] = (),
    flags: Iterable[FlagLevel] = (),
    *,
    dashboard_url: str | None = None,
    starts_ms: Mapping[Key, int] | None = None,
    include_info: bool = False,
) -> list[ActiveAlert]:
    """The alerts active at ``now_ms`` (event time): alerting SLO pairs, page/ticket findings
    (every severity with ``include_info``) and flags at L2+.

    ``starts_ms`` (alert key → start, ms) keeps an already firing alert's link stable; a new
    alert's link starts 15 minutes before its condition (or ``now_ms``).
    """
    builder = _Builder(now_ms, dashboard_url, starts_ms or {})
    return (
        _slo_alerts(builder, statuses)
        + _finding_alerts(builder, findings, include_info)
        + _flag_alerts(builder, flags)
    )
