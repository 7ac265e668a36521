"""``llmslo slo report``: the SLO table for humans, or JSON for machines."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from slo.evaluate import SloStatus
from slo.metrics import group_label
from slo.own_targets import ViolationComparison
from slo.windows import format_duration

__all__ = ["render_json", "render_own_targets", "render_table"]


def _pct(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value * 100:.{digits}f}%"


def _group_title(group: Mapping[str, str]) -> str:
    """`` [pool=a]``; a grouped SLO without any event yet has no group value to name
    (the evaluation gives it empty ones), so it says that instead of ``[pool=]``."""
    if not group:
        return ""
    if not any(group.values()):
        return f" [by {', '.join(group)}: no events yet]"
    return f" [{group_label(group)}]"


def render_table(statuses: Iterable[SloStatus]) -> str:
    """One block per SLO and group: objective, SLI, budget left, burn rates, alerting pairs."""
    lines = []
    for status in statuses:
        slo = status.slo
        lines.append(f"{slo.id}{_group_title(status.group)}")
        lines.append(
            f"  objective {_pct(slo.objective)} over {format_duration(slo.period_ms)}   "
            f"SLI {_pct(status.sli)}   events {status.period.total} (bad {status.period.bad})   "
            f"budget left {_pct(status.budget_remaining, 1)}"
        )
        burns = "  ".join(f"{format_duration(w)} {b:.2f}" for w, b in status.burn_rates().items())
        lines.append(f"  burn rate  {burns}")
        for pair in status.pairs():
            state = (
                "ALERTING"
                if pair.alerting
                else ("guarded (too few events)" if pair.guarded else "ok")
            )
            lines.append(
                f"  {pair.pair.id:<14} factor {pair.pair.factor:<6g} short {pair.short_burn:8.2f} "
                f"long {pair.long_burn:8.2f}  {state}"
            )
        lines.append("")
    return "\n".join(lines)


def render_json(statuses: Iterable[SloStatus]) -> dict[str, object]:
    """``{"slos": [...]}`` with one entry per SLO and group (see :meth:`SloStatus.as_dict`)."""
    return {"slos": [s.as_dict() for s in statuses]}


def render_own_targets(rows: Iterable[ViolationComparison], window_ms: int) -> str:
    """Requests' own SLO targets over the last ``window_ms``: per pool and type, the taps'
    violations of the targeted requests beside the router's counter increase (``—``: no
    router counter scraped). Empty without any such row."""
    rows = list(rows)
    if not rows:
        return ""
    lines = [f"own SLO targets, last {format_duration(window_ms)}: taps vs router"]
    for row in rows:
        router = "—" if row.router_violations is None else f"{row.router_violations:g}"
        lines.append(
            f"  [pool={row.pool}] {row.type:<4}  taps {row.tap_violations} of "
            f"{row.tap_targeted} missed   router {router}"
        )
    return "\n".join(lines) + "\n"
