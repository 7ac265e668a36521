"""The Kayenta-style canary judge (NetflixACAJudge-v1.0 semantics) over per-request samples.

Pure logic, no I/O: :func:`judge` takes the canary's and the baseline's
:class:`~api.cohorts.CohortSamples` and a validated :class:`JudgeConfig` and returns a
:class:`Verdict`. Same inputs → same verdict (no randomness anywhere).

Per metric (reference/canary-and-peers.md §1.3):

* latency metrics (TTFT, TPOT, ITL p99 gap, E2E) compare per-request samples with the
  Mann–Whitney U statistic and a 98 % CI on the shift canary − baseline;
* rate metrics (availability, error-before-first-token, interruption, ghost, stall rates)
  over records classed as the SLIs class them by default (:mod:`slo.spec.outcomes`: a
  client's 4xx or cancellation is no event, a 503 is a bad one) compare two proportions (Newcombe CI on the difference, Fisher's exact p-value);
* the dead band is ``±tolerance·|estimate|``; **High** ⇔ CI lower > band and the effect size
  (mean ratio canary/baseline) ≥ ``allowed_increase`` (or is NaN), **Low** symmetrically;
  fewer than ``min_samples`` on a side → **Nodata**.

Score (``WeightedSumScorer``): per group ``100·#Pass/(#Pass+#High+#Low)``, a group with no
scored metric counts 100, weighted by ``group_weights``. Overrides, in Kayenta's order: a
critical metric High or Low → score 0 and ``fail`` (even when other metrics lack data); then
fewer than ``min_requests`` or ≥ 50 % Nodata → score 0 and ``inconclusive``; then a critical
metric still not Pass (Nodata) → score 0 and ``fail``. The verdict then maps as §2.3: score ≥
pass → ``pass``, < marginal → ``fail``, between → ``inconclusive``.
An optional SLO gate (the canary's burn rates and budget left) fails the verdict on its own,
and so does ``prefix_cache_hit_rate`` Low: the canary's engines hit their prefix cache at
less than ``prefix_cache_min_share`` (0.5) of the baseline's rate (hits / queries over the
instances serving each cohort), the rollback threshold of a changed prefix hash or cache key.
It is in no weighted group; without engine samples on either side it is not judged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from api._stats import proportion_shift, rank_shift
from api.cohorts import LATENCY_METRICS, PREFIX_CACHE_METRIC, RATE_METRICS, CohortSamples

__all__ = [
    "DEFAULT_METRICS",
    "JudgeConfig",
    "MetricConfig",
    "MetricResult",
    "SloGateConfig",
    "SloGateInput",
    "SloGateResult",
    "Verdict",
    "judge",
]

Classification = Literal["Pass", "High", "Low", "Nodata"]
Direction = Literal["increase", "decrease", "either"]
VerdictName = Literal["pass", "fail", "inconclusive"]


class MetricConfig(BaseModel):
    """How one metric is judged. Ratios are canary mean / baseline mean (unitless)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    group: str
    direction: Direction = "increase"
    critical: bool = False
    #: Below this many samples (requests) on either side the metric is Nodata.
    min_samples: int = Field(50, ge=1)
    #: Dead band around zero shift, as a fraction of |estimate| (Kayenta: 0.25).
    tolerance: float = Field(0.25, ge=0.0)
    #: High needs mean ratio ≥ this; Low needs mean ratio ≤ ``allowed_decrease``.
    allowed_increase: float = Field(1.1, gt=0.0)
    allowed_decrease: float = Field(0.9, gt=0.0)


def _latency(**kw: Any) -> MetricConfig:
    return MetricConfig(group="latency", **kw)


def _rate(group: str, **kw: Any) -> MetricConfig:
    kw.setdefault("allowed_increase", 1.25)
    kw.setdefault("min_samples", 100)
    return MetricConfig(group=group, **kw)


#: Defaults as data. Per-request samples make CIs narrow, so the effect-size gates
#: (``allowed_increase``) decide what "worse" means: +10 % latency, +25 % bad-event rate.
DEFAULT_METRICS: dict[str, MetricConfig] = {
    "ttft_s": _latency(),
    "tpot_s": _latency(),
    "itl_p99_gap_s": _latency(),
    "e2e_s": _latency(),
    # Availability falls when things go wrong: judge its decrease, 0.2 % relative at most.
    "availability": _rate("errors", direction="decrease", critical=True, allowed_decrease=0.998),
    "error_before_first_token_rate": _rate("errors"),
    "interruption_rate": _rate("errors", critical=True),
    "ghost_rate": _rate("waste"),
    "stall_rate": _rate("waste"),
    # Scored in no weighted group: its Low fails the verdict on its own (the rollback
    # threshold of a changed prefix hash), its Nodata counts like any other metric's.
    PREFIX_CACHE_METRIC: MetricConfig(group="cache", direction="decrease"),
}


class SloGateConfig(BaseModel):
    """Limits on the canary's own SLO state; a breach fails the verdict whatever the score."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Window name (as the SLO engine names it, e.g. ``5m``, ``1h``) → highest burn rate allowed.
    max_burn_rate: dict[str, float] = Field(default_factory=lambda: {"5m": 14.4, "1h": 14.4})
    #: Lowest error-budget fraction left (0–1) the canary may have.
    min_budget_remaining: float = Field(0.0, ge=0.0, le=1.0)


class SloGateInput(BaseModel):
    """The canary's SLO state, passed in as data: burn rate per window, budget left (0–1)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    burn_rates: dict[str, float] = Field(default_factory=dict)
    budget_remaining: float | None = None


class JudgeConfig(BaseModel):
    """Everything the judge decides with; validated once, defaults as data."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metrics: dict[str, MetricConfig] = Field(default_factory=lambda: dict(DEFAULT_METRICS))
    group_weights: dict[str, float] = Field(
        default_factory=lambda: {"latency": 50.0, "errors": 35.0, "waste": 15.0}
    )
    #: With the default weights one High latency metric (of 4) scores 87.5 and one High
    #: error metric (of 3) 88.3: both fail; one High waste metric (of 2) scores 92.5:
    #: inconclusive, so the rollout pauses for a human.
    pass_score: float = Field(95.0, ge=0.0, le=100.0)
    marginal_score: float = Field(90.0, ge=0.0, le=100.0)
    confidence: float = Field(0.98, gt=0.5, lt=1.0)
    #: Fewer requests than this on either side → ``inconclusive`` (insufficient_data).
    min_requests: int = Field(100, ge=1)
    #: The canary's prefix-cache hit rate below this share of the baseline's is Low.
    prefix_cache_min_share: float = Field(0.5, gt=0.0, le=1.0)
    slo_gate: SloGateConfig = Field(default_factory=SloGateConfig)

    @model_validator(mode="after")
    def _check(self) -> JudgeConfig:
        unknown = set(self.metrics) - set(LATENCY_METRICS) - set(RATE_METRICS)
        unknown.discard(PREFIX_CACHE_METRIC)
        if unknown:
            raise ValueError(f"metrics: unknown metric(s) {sorted(unknown)}")
        if self.marginal_score > self.pass_score:
            raise ValueError("marginal_score: must not exceed pass_score")
        if sum(self.group_weights.values()) > 100.0 + 1e-9:
            raise ValueError("group_weights: must add up to at most 100")
        return self


@dataclass(frozen=True)
class MetricResult:
    """One metric's evidence. ``canary``/``baseline`` are medians (latency, seconds) or
    proportions (rates); ``shift_*`` the estimate and CI of canary − baseline."""

    name: str
    group: str
    classification: Classification
    critical: bool
    canary_n: int
    baseline_n: int
    canary: float | None = None
    baseline: float | None = None
    ratio: float | None = None
    shift_estimate: float | None = None
    shift_lower: float | None = None
    shift_upper: float | None = None
    p_value: float | None = None
    reason: str = ""


@dataclass(frozen=True)
class SloGateResult:
    """Whether the SLO gate was applied (state given) and passed, and why not."""

    applied: bool
    passed: bool
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class Verdict:
    """The judge's answer; ``score`` 0–100, ``verdict`` pass/fail/inconclusive."""

    verdict: VerdictName
    score: float
    reason: str
    canary_requests: int
    baseline_requests: int
    metrics: list[MetricResult]
    slo_gate: SloGateResult


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _classify_shift(
    cfg: MetricConfig, estimate: float, lower: float, upper: float, ratio: float
) -> Classification:
    band = cfg.tolerance * abs(estimate)
    no_ratio = math.isnan(ratio)
    if cfg.direction != "decrease" and lower > band and (no_ratio or ratio >= cfg.allowed_increase):
        return "High"
    if (
        cfg.direction != "increase"
        and upper < -band
        and (no_ratio or ratio <= cfg.allowed_decrease)
    ):
        return "Low"
    return "Pass"


def _mean_ratio(canary_mean: float, baseline_mean: float) -> float:
    return canary_mean / baseline_mean if baseline_mean and canary_mean else math.nan


def _judge_latency(
    name: str, cfg: MetricConfig, c: np.ndarray, b: np.ndarray, conf: float
) -> MetricResult:
    c, b = c[np.isfinite(c)], b[np.isfinite(b)]
    base = MetricResult(name, cfg.group, "Nodata", cfg.critical, int(c.size), int(b.size))
    if c.size < cfg.min_samples or b.size < cfg.min_samples:
        return _replace(base, reason=f"fewer than {cfg.min_samples} samples on a side")
    medians = {"canary": float(np.median(c)), "baseline": float(np.median(b))}
    ratio = _mean_ratio(float(c.mean()), float(b.mean()))
    if np.unique(np.concatenate([c, b])).size == 1:
        return _replace(
            base,
            classification="Pass",
            ratio=_finite_or_none(ratio),
            reason="one value on both sides",
            **medians,
        )
    shift = rank_shift(c, b, conf)
    verdict = _classify_shift(cfg, shift.estimate, shift.lower, shift.upper, ratio)
    return _replace(
        base,
        classification=verdict,
        ratio=_finite_or_none(ratio),
        shift_estimate=shift.estimate,
        shift_lower=shift.lower,
        shift_upper=shift.upper,
        p_value=shift.p_value,
        **medians,
    )


def _judge_rate(
    name: str, cfg: MetricConfig, c: tuple[int, int], b: tuple[int, int], conf: float
) -> MetricResult:
    base = MetricResult(name, cfg.group, "Nodata", cfg.critical, c[1], b[1])
    if c[1] < cfg.min_samples or b[1] < cfg.min_samples:
        return _replace(base, reason=f"fewer than {cfg.min_samples} requests on a side")
    p_c, p_b = c[0] / c[1], b[0] / b[1]
    ratio = _mean_ratio(p_c, p_b)
    shift = proportion_shift(c[0], c[1], b[0], b[1], conf)
    verdict = _classify_shift(cfg, shift.estimate, shift.lower, shift.upper, ratio)
    if p_c == p_b:
        verdict = "Pass"
    return _replace(
        base,
        classification=verdict,
        canary=p_c,
        baseline=p_b,
        ratio=_finite_or_none(ratio),
        shift_estimate=shift.estimate,
        shift_lower=shift.lower,
        shift_upper=shift.upper,
        p_value=shift.p_value,
    )


def _judge_prefix_cache(
    name: str,
    cfg: MetricConfig,
    c: tuple[int, int] | None,
    b: tuple[int, int] | None,
    min_share: float,
) -> MetricResult:
    """Low when the canary's hit rate is below ``min_share`` of the baseline's (seed 003 §8:
    a changed hash or cache key); Nodata without enough queries or baseline hits."""
    base = MetricResult(name, cfg.group, "Nodata", cfg.critical, c[1] if c else 0, b[1] if b else 0)
    if c is None or b is None or c[1] < cfg.min_samples or b[1] < cfg.min_samples:
        return _replace(base, reason=f"fewer than {cfg.min_samples} prefix-cache queries on a side")
    p_c, p_b = c[0] / c[1], b[0] / b[1]
    if p_b == 0:
        return _replace(base, baseline=0.0, canary=p_c, reason="the baseline has no cache hits")
    ratio = p_c / p_b
    low = ratio < min_share
    reason = f"canary hit rate {'<' if low else '>='} {min_share:g} x baseline's"
    return _replace(
        base, classification="Low" if low else "Pass", canary=p_c, baseline=p_b,
        ratio=ratio, reason=reason,
    )  # fmt: skip


def _replace(result: MetricResult, **changes: Any) -> MetricResult:
    return replace(result, **changes)


def _score(results: list[MetricResult], weights: dict[str, float]) -> float:
    groups = sorted({r.group for r in results} | set(weights))
    unweighted = [g for g in groups if g not in weights]
    share = (100.0 - sum(weights.values())) / len(unweighted) if unweighted else 0.0
    total = 0.0
    for group in groups:
        scored = [r for r in results if r.group == group and r.classification != "Nodata"]
        passed = sum(r.classification == "Pass" for r in scored)
        group_score = 100.0 * passed / len(scored) if scored else 100.0
        total += group_score * weights.get(group, share) / 100.0
    return round(total, 2)


def _slo_gate(config: SloGateConfig, state: SloGateInput | None) -> SloGateResult:
    if state is None:
        return SloGateResult(applied=False, passed=True)
    reasons = [
        f"burn rate {window} = {rate:g} > {config.max_burn_rate[window]:g}"
        for window, rate in sorted(state.burn_rates.items())
        if window in config.max_burn_rate and rate > config.max_burn_rate[window]
    ]
    left = state.budget_remaining
    if left is not None and left < config.min_budget_remaining:
        reasons.append(f"budget remaining {left:g} < {config.min_budget_remaining:g}")
    return SloGateResult(applied=True, passed=not reasons, reasons=tuple(reasons))


def _judge_metric(
    name: str,
    cfg: MetricConfig,
    canary: CohortSamples,
    baseline: CohortSamples,
    config: JudgeConfig,
) -> MetricResult:
    conf = config.confidence
    if name == PREFIX_CACHE_METRIC:
        share = config.prefix_cache_min_share
        return _judge_prefix_cache(name, cfg, canary.prefix_cache, baseline.prefix_cache, share)
    if name in LATENCY_METRICS:
        return _judge_latency(name, cfg, canary.latency[name], baseline.latency[name], conf)
    return _judge_rate(name, cfg, canary.rates[name], baseline.rates[name], conf)


def _decide(
    results: list[MetricResult],
    gate: SloGateResult,
    requests: int,
    config: JudgeConfig,
) -> tuple[VerdictName, float, str]:
    """Verdict, score and reason: Kayenta's critical override first, then reference §2.3."""
    score = _score(results, config.group_weights)
    nodata = sum(r.classification == "Nodata" for r in results)
    failing_critical = [r.name for r in results if r.critical and r.classification != "Pass"]
    moved = [f"{r.name} {r.classification}" for r in results if r.classification in ("High", "Low")]
    detail = ("; " + ", ".join(moved)) if moved else "; no High/Low metrics"
    # Kayenta's first override: a critical metric with enough samples to be judged High or
    # Low is evidence of harm, whatever else lacks data (a stalled pod completes too few
    # requests for its latency metrics, yet its cut streams are counted).
    judged_critical = [
        r.name for r in results if r.critical and r.classification in ("High", "Low")
    ]
    if judged_critical:
        return "fail", 0.0, "critical metric not Pass: " + ", ".join(judged_critical) + detail
    if requests < config.min_requests:
        return (
            "inconclusive",
            0.0,
            f"insufficient_data: fewer than {config.min_requests} requests on a side",
        )
    if results and nodata * 2 >= len(results):
        return (
            "inconclusive",
            0.0,
            f"insufficient_data: {nodata} of {len(results)} metrics have no data",
        )
    if not gate.passed:
        return "fail", score, "slo_gate: " + "; ".join(gate.reasons)
    cache_low = [r for r in results if r.name == PREFIX_CACHE_METRIC and r.classification == "Low"]
    if cache_low:
        return "fail", score, f"{PREFIX_CACHE_METRIC} Low: {cache_low[0].reason}{detail}"
    if failing_critical:
        return "fail", 0.0, "critical metric not Pass: " + ", ".join(failing_critical) + detail
    if score >= config.pass_score:
        return "pass", score, f"score {score:g} >= pass {config.pass_score:g}{detail}"
    if score < config.marginal_score:
        return "fail", score, f"score {score:g} < marginal {config.marginal_score:g}{detail}"
    return "inconclusive", score, f"score {score:g} in the marginal band{detail}"


def judge(
    canary: CohortSamples,
    baseline: CohortSamples,
    config: JudgeConfig,
    slo_state: SloGateInput | None = None,
) -> Verdict:
    """Judge a canary against its baseline (see the module docstring for the rules)."""
    # A store without engine samples (taps only) has no prefix-cache evidence on either side:
    # the metric does not apply there, rather than adding a Nodata to every verdict.
    no_engines = canary.prefix_cache is None and baseline.prefix_cache is None
    results = [
        _judge_metric(name, cfg, canary, baseline, config)
        for name, cfg in sorted(config.metrics.items())
        if not (no_engines and name == PREFIX_CACHE_METRIC)
    ]
    gate = _slo_gate(config.slo_gate, slo_state)
    requests = min(canary.requests, baseline.requests)
    verdict, score, reason = _decide(results, gate, requests, config)
    return Verdict(verdict, score, reason, canary.requests, baseline.requests, results, gate)
