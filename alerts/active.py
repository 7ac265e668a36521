"""Path B's input, pure: the alerts one SLO-jobs cycle finds active, with evidence and links.

:func:`active_alerts` turns a cycle's outputs into :class:`~alerts.push.ActiveAlert` values
that :func:`~alerts.push.reconcile` compares with what was sent:

* every SLO window pair that alerts (per SLO group): the same ``alertname`` and labels as
  the generated Prometheus rule of that pair (``slo_id``, ``severity``, ``window``,
  ``sli_kind``, spec labels, the group's ``pool``/``instance``…), so routes and inhibitions
  written for the rules apply;
* every finding (signal) of severity page or ticket, named by its row of the signal catalog
  (``stall`` → ``LlmEngineStalled``, the signature rule's name too), with its evidence;
* every degradation flag at L2 or above (``LlmDegradationLevel``, L3 page, L2 ticket).

Every pushed alert carries ``origin="llmslo"`` (so it never merges with the Prometheus
rule's alert of the same name), a ``summary``, an ``evidence``, a ``runbook``
annotation (first steps, from the signal catalog) a ``runbook_url``
(``{runbook_base_url}/{signal}.md``) and a ``generatorURL`` that opens the dashboard page
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
from slo.naming import alert_name
from slo.signals.catalog import FLAG, NOTICES, RUNBOOK_BASE_URL, SIGNALS, runbook_url
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
FLAG_ALERT = NOTICES[FLAG].alert
#: Finding signal → alert name, from the signal catalog (the signature rule's name too).
SIGNAL_ALERTS: Mapping[str, str] = {name: row.alert for name, row in SIGNALS.items()}
#: Signal (or ``slo:<sli kind>``, ``flag:L2``/``flag:L3``) → the first steps, from the catalog.
RUNBOOKS: Mapping[str, str] = {
    **{name: row.first_steps for name, row in SIGNALS.items()},
    **{
        key if not level else f"{key}:{level}": text
        for key, notice in NOTICES.items()
        for level, text in notice.first_steps.items()
    },
}
#: Dashboard page per finding signal.
_PAGES: Mapping[str, str] = {name: row.page for name, row in SIGNALS.items()}
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


def _significant(value: float) -> str:
    return f"{value:.2g}"


def _key(labels: Mapping[str, str]) -> Key:
    return tuple(sorted(labels.items()))


class _Builder:
    def __init__(
        self,
        now_ms: int,
        dashboard_url: str | None,
        starts_ms: Mapping[Key, int],
        runbook_base_url: str,
    ) -> None:
        self.now_ms = now_ms
        self.dashboard_url = dashboard_url
        self.starts_ms = starts_ms
        self.runbook_base_url = runbook_base_url

    def runbook_url(self, runbook: str) -> str:
        return runbook_url(self.runbook_base_url, runbook)

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


def _notice_url(builder: _Builder, key: str) -> dict[str, str]:
    notice = NOTICES.get(key)
    return {} if notice is None else {"runbook_url": builder.runbook_url(notice.runbook)}


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
                **_notice_url(builder, f"slo:{slo.sli.kind}"),
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
            "alertname": SIGNAL_ALERTS.get(finding.signal) or alert_name("llm", finding.signal),
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
            "runbook_url": builder.runbook_url(finding.signal),
        }
        page = _PAGES.get(finding.signal, "fleet")
        alerts.append(builder.alert(labels, annotations, page, None))
    return alerts


def _flag_alerts(builder: _Builder, flags: Iterable[FlagLevel]) -> list[ActiveAlert]:
    notice = NOTICES[FLAG]
    alerts = []
    for flag in flags:
        if flag.level < 2:
            continue
        where = "instance" if flag.scope == "instance" else "pool"
        level = f"L{min(flag.level, 3)}"
        labels = {
            "alertname": notice.alert,
            "signal": notice.signal,
            "level": f"L{flag.level}",
            "severity": notice.severities[level],
            "scope": flag.scope,
            where: flag.scope_id,
        }
        if flag.pool:
            labels["pool"] = flag.pool
        annotations = {
            "summary": f"{flag.scope} {flag.scope_id} degraded to L{flag.level}",
            "evidence": f"L{flag.level} since {flag.since_ts_ms} ms (KV free ratio below the "
            f"L{flag.level} threshold, or OOM risk for L3)",
            "runbook": notice.first_steps[level],
            "runbook_url": builder.runbook_url(notice.runbook),
        }
        alerts.append(builder.alert(labels, annotations, notice.page, flag.since_ts_ms))
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
    runbook_base_url: str = RUNBOOK_BASE_URL,
) -> list[ActiveAlert]:
    """The alerts active at ``now_ms`` (event time): alerting SLO pairs, page/ticket findings
    (every severity with ``include_info``) and flags at L2+.

    ``starts_ms`` (alert key → start, ms) keeps an already firing alert's link stable; a new
    alert's link starts 15 minutes before its condition (or ``now_ms``).
    """
    builder = _Builder(now_ms, dashboard_url, starts_ms or {}, runbook_base_url)
    return (
        _slo_alerts(builder, statuses)
        + _finding_alerts(builder, findings, include_info)
        + _flag_alerts(builder, flags)
    )
