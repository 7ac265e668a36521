"""Generate ``promtool test rules`` files for generated rules.

Per SLO (when its SLI source lets us write input series, :class:`~alerts.model.SeriesRecipe`):

1. a burn just above the page factor: the page pair (and every pair whose factor is lower)
   fires;
2. a 0.5× burn for three hours: nothing fires;
3. a ten-minute total outage after an hour of clean traffic: what fires mid-outage, the last
   minute a page alert is still on, and the first minute it is off.

Expected alerts are computed here from the same maths (Δbad/Δtotal over each window's
samples), independently of PromQL, so a wrong rule fails its test. Per signature rule
(:data:`alerts.signatures.SIGNATURES`): its firing and its silent case.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from alerts.generate import pair_alert
from alerts.model import RuleSlo, SeriesRecipe
from alerts.promql import matcher
from alerts.signatures import SIGNATURES, Case, Signature
from pipeline.units import MINUTE_MS
from slo.windows import AlertPair, format_duration

__all__ = ["Scenario", "encode_values", "signature_test", "slo_test"]

_RATE_PER_MIN = 10_000.0  # events per minute in every scenario


@dataclass(frozen=True)
class Scenario:
    """Per-minute good and bad event increments (index 0 is the first minute's end)."""

    good: tuple[float, ...]
    bad: tuple[float, ...]

    def cumulative(self) -> tuple[list[float], list[float]]:
        """Counter values at minutes 0..N (good, bad), starting from 0."""
        good, bad = [0.0], [0.0]
        for g, b in zip(self.good, self.bad, strict=True):
            good.append(good[-1] + g)
            bad.append(bad[-1] + b)
        return good, bad


def _num(value: float) -> str:
    return f"{value:.12g}"


def encode_values(values: Sequence[float]) -> str:
    """promtool's expanding notation for ``values``: ``0+5x3 15x2`` (runs of equal steps)."""
    parts, i = [], 0
    while i < len(values):
        j = i
        step = values[i + 1] - values[i] if i + 1 < len(values) else 0.0
        while j + 1 < len(values) and abs(values[j + 1] - values[j] - step) < 1e-9:
            j += 1
        if j == i:
            parts.append(_num(values[i]))
        elif step == 0:
            parts.append(f"{_num(values[i])}x{j - i}")
        else:
            sign = "+" if step > 0 else "-"
            parts.append(f"{_num(values[i])}{sign}{_num(abs(step))}x{j - i}")
        i = j + 1
    return " ".join(parts)


def _series_name(metric: str, labels: Mapping[str, str]) -> str:
    inner = ",".join(matcher(k, v) for k, v in sorted(labels.items()))
    return f"{metric}{{{inner}}}"


def _input_series(recipe: SeriesRecipe, scenario: Scenario) -> list[dict[str, str]]:
    good, bad = scenario.cumulative()
    total = [g + b for g, b in zip(good, bad, strict=True)]
    labels = dict(recipe.labels)
    if recipe.kind == "histogram":
        series = [
            (_series_name(f"{recipe.metric}_bucket", {**labels, "le": recipe.bound}), good),
            (_series_name(f"{recipe.metric}_count", labels), total),
        ]
    else:
        series = [
            (_series_name(recipe.metric, {**labels, "outcome": "ok"}), good),
            (_series_name(recipe.metric, {**labels, "outcome": "error"}), bad),
        ]
        if recipe.excluded:  # as many excluded events as good ones: a rule counting them fails
            excluded = {k: v for k, v in recipe.excluded.items() if v}
            series.append((_series_name(recipe.metric, {**labels, **excluded}), good))
    return [{"series": name, "values": encode_values(values)} for name, values in series]


def _window_ratio(good: list[float], bad: list[float], minute: int, window_m: int) -> float | None:
    # Prometheus 2.x ranges include both ends; with samples on whole minutes that start at
    # 0, rate()'s extrapolation is the same for bad and total, so it cancels in the ratio.
    first = max(0, minute - window_m)
    if minute - first < 1:
        return None
    d_bad = bad[minute] - bad[first]
    d_total = d_bad + good[minute] - good[first]
    return d_bad / d_total if d_total > 0 else None


def _pair_fires(slo: RuleSlo, pair: AlertPair, scenario: Scenario, minute: int) -> bool:
    good, bad = scenario.cumulative()
    threshold = pair.factor * slo.budget
    for window_ms in (pair.short_ms, pair.long_ms):
        ratio = _window_ratio(good, bad, minute, window_ms // MINUTE_MS)
        if ratio is None or not ratio > threshold:
            return False
    if slo.min_events:
        first = max(0, minute - pair.long_ms // MINUTE_MS)
        events = good[minute] + bad[minute] - good[first] - bad[first]
        if events < slo.min_events:
            return False
    return True


def _render(text: str, labels: Mapping[str, str]) -> str:
    return re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), text)


def _expected(slo: RuleSlo, scenario: Scenario, minute: int) -> list[dict[str, Any]]:
    base = {**slo.labels, **slo.id_labels}
    if slo.recipe is not None:
        base |= {k: v for k, v in slo.recipe.labels.items() if k in slo.group_labels}
    out = []
    for pair in slo.pairs:
        if _pair_fires(slo, pair, scenario, minute):
            rule = pair_alert(slo, pair)
            labels = {**base, **rule["labels"]}
            annotations = {k: _render(v, labels) for k, v in rule["annotations"].items()}
            out.append({"exp_labels": labels, "exp_annotations": annotations})
    return out


def _constant(slo: RuleSlo, burn: float, minutes: int) -> Scenario:
    bad = min(_RATE_PER_MIN, burn * slo.budget * _RATE_PER_MIN)
    return Scenario((_RATE_PER_MIN - bad,) * minutes, (bad,) * minutes)


def _page_burn(slo: RuleSlo) -> float:
    top = max(pair.factor for pair in slo.pairs)
    # 10 % above the page factor, or halfway to an all-bad stream when that is impossible.
    return min(top * 1.1, (top + 1 / slo.budget) / 2)


def _outage(minutes_clean: int, minutes_down: int, minutes_after: int) -> Scenario:
    good = (
        (_RATE_PER_MIN,) * minutes_clean + (0.0,) * minutes_down + (_RATE_PER_MIN,) * minutes_after
    )
    bad = (0.0,) * minutes_clean + (_RATE_PER_MIN,) * minutes_down + (0.0,) * minutes_after
    return Scenario(good, bad)


def _case(recipe: SeriesRecipe, scenario: Scenario, checks: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "interval": "1m",
        "input_series": _input_series(recipe, scenario),
        "alert_rule_test": checks,
    }


def _check(slo: RuleSlo, scenario: Scenario, minute: int) -> dict[str, Any]:
    return {
        "eval_time": f"{minute}m",
        "alertname": slo.alert_name,
        "exp_alerts": _expected(slo, scenario, minute),
    }


def _page_on(slo: RuleSlo, scenario: Scenario, minute: int) -> bool:
    return any(
        _pair_fires(slo, pair, scenario, minute) for pair in slo.pairs if pair.severity == "page"
    )


def _header(rule_file: str, group_order: Sequence[str]) -> dict[str, Any]:
    # Without group_eval_order promtool evaluates groups in map order, so an alert may see
    # the recordings of this step or of the previous one: flaky by one minute.
    return {
        "rule_files": [rule_file],
        "evaluation_interval": "1m",
        "group_eval_order": list(group_order),
    }


def slo_test(slo: RuleSlo, rule_file: str, group_order: Sequence[str]) -> dict[str, Any] | None:
    """The promtool test document for ``slo``, or None when no input series can be written.

    ``group_order`` lists every group of the rule file in file order (recordings first).
    """
    if slo.recipe is None or not slo.pairs:
        return None
    burning = _constant(slo, _page_burn(slo), 40)
    quiet = _constant(slo, 0.5, 180)
    outage = _outage(60, 10, 120)
    outage_checks = [_check(slo, outage, 68)]
    page_minutes = [m for m in range(61, 190) if _page_on(slo, outage, m)]
    if page_minutes:
        last_on = page_minutes[-1]
        outage_checks += [_check(slo, outage, last_on), _check(slo, outage, last_on + 1)]
    return {
        **_header(rule_file, group_order),
        "tests": [
            _case(slo.recipe, burning, [_check(slo, burning, 30)]),
            _case(slo.recipe, quiet, [_check(slo, quiet, 180)]),
            _case(slo.recipe, outage, outage_checks),
        ],
    }


def _alerts_query(sig: Signature) -> str:
    matchers = [f'alertname="{sig.alert}"', 'alertstate="firing"']
    matchers += [f'{k}="{sig.labels[k]}"' for k in ("dialect", "level") if k in sig.labels]
    return "ALERTS{" + ",".join(matchers) + "}"


def _signature_case(sig: Signature, case: Case) -> dict[str, Any]:
    samples = []
    for extra in case.alerts:
        labels = {"alertname": sig.alert, "alertstate": "firing", **sig.labels, **extra}
        inner = ",".join(matcher(k, v) for k, v in sorted(labels.items()))
        samples.append({"labels": "ALERTS{" + inner + "}", "value": 1})
    return {
        "interval": "1m",
        "input_series": [{"series": k, "values": v} for k, v in case.series.items()],
        "promql_expr_test": [
            {"expr": _alerts_query(sig), "eval_time": case.eval_time, "exp_samples": samples}
        ],
    }


def signature_test(rule_file: str, group_order: Sequence[str]) -> dict[str, Any]:
    """One promtool test document with a firing and a silent case per signature rule."""
    tests = []
    for sig in SIGNATURES:
        tests += [_signature_case(sig, sig.firing), _signature_case(sig, sig.silent)]
    return {**_header(rule_file, group_order), "tests": tests}


def window_label(pair: AlertPair) -> str:
    """``1h-5m`` for the page quick pair."""
    return f"{format_duration(pair.long_ms)}-{format_duration(pair.short_ms)}"
