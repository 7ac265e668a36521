"""The run: every rule of the table through its static and live evaluator."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from checks.catalog import load_rules
from checks.live import LIVE_CHECKS, LiveInputs
from checks.results import CheckReport, RuleResult
from checks.static import STATIC_CHECKS, StaticInputs

__all__ = ["run_checks"]


def run_checks(
    static: StaticInputs,
    live: LiveInputs,
    *,
    silences: Mapping[str, str] | None = None,
    only: Sequence[str] = (),
) -> CheckReport:
    """Evaluate every rule (or those whose id starts with one of ``only``); ``silences``:
    rule id → the reason it is accepted as failing."""
    silences = silences or {}
    results = []
    for rule in load_rules():
        if only and not any(rule.id.startswith(prefix) for prefix in only):
            continue
        static_side = STATIC_CHECKS[rule.static.check](rule.static.params, static)
        live_side = LIVE_CHECKS[rule.live.check](rule.live.params, live)
        results.append(RuleResult(rule, static_side, live_side, silences.get(rule.id)))
    return CheckReport(tuple(results))
