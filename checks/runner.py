"""The run: every rule of the table through its static and live evaluator."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from checks.catalog import load_rules
from checks.live import LIVE_CHECKS, LiveInputs
from checks.results import CheckReport, Evidence, RuleResult
from checks.static import STATIC_CHECKS, StaticInputs

__all__ = ["run_checks"]

_log = logging.getLogger(__name__)


def _evaluate(
    rule_id: str, evaluator: Callable[[Mapping[str, Any], Any], Evidence],
    params: Mapping[str, Any], inputs: StaticInputs | LiveInputs,
) -> Evidence:  # fmt: skip
    """The evaluator's answer; a manifest shaped unlike Kubernetes' (a string where a map
    belongs, ``"30s"`` for seconds) makes the side ``unknown`` with the reason, not a crash."""
    try:
        return evaluator(params, inputs)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        _log.info("check %s: could not evaluate: %r", rule_id, exc)
        return Evidence("unknown", f"could not read the input: {type(exc).__name__}: {exc}")


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
        static_side = _evaluate(
            rule.id, STATIC_CHECKS[rule.static.check], rule.static.params, static
        )
        live_side = _evaluate(rule.id, LIVE_CHECKS[rule.live.check], rule.live.params, live)
        results.append(RuleResult(rule, static_side, live_side, silences.get(rule.id)))
    return CheckReport(tuple(results))
