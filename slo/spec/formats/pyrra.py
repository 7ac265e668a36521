"""Pyrra's ``pyrra.dev/v1alpha1`` ``ServiceLevelObjective``, read with Pyrra's semantics.

Indicators: ``ratio`` (errors / total selectors), ``latency`` (a classic histogram: total
``_count`` minus the success ``_bucket{le=…}``), ``latencyNative`` (``1 −
histogram_fraction(0, latency, …)``) and ``bool_gauge`` (a 0/1 gauge such as
``probe_success``), each with optional ``grouping``. ``target`` is a percentage written as
a string, ``window`` any duration. Labels and annotations prefixed ``pyrra.dev/`` reach the
rules with the prefix removed; the total selector's equality matchers (those not grouped)
become labels too, as in Pyrra's ``rules.go``.

Alerting follows Pyrra, not llmslo's catalog: :func:`pyrra_windows` scales the 28-day
windows to the SLO window and keeps the factors 14 / 7 / 2 / 1, each tier with a ``for:``
duration and ``severity`` ``critical`` (fast, medium) or ``warning`` (slow, long-term),
overridable by ``alerting.severities``. The numbers are data (:data:`PYRRA_TIERS`).
As Pyrra does by default (``--enable-prometheus-3-migration``), a latency bucket bound
written as an integer (``le="1"``) also matches Prometheus 3's ``le="1.0"``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipeline.config import format_validation_error
from pipeline.units import MINUTE_MS
from slo.spec.formats import ObjectMeta, object_meta
from slo.windows import parse_duration_ms

__all__ = [
    "PYRRA_TIERS",
    "PyrraSlo",
    "PyrraWindow",
    "parse_pyrra",
    "prometheus_duration",
    "pyrra_windows",
]

PREFIX = "pyrra.dev/"
_NS_PER_MS = 1_000_000
_DAY28_MS = 28 * 24 * 60 * MINUTE_MS

#: Pyrra's tiers (``slo/rules.go`` ``Windows``): name, default severity, factor, and the
#: short, long and ``for`` windows as divisors of the SLO window (28d → 5m, 1h, 2m …).
PYRRA_TIERS: tuple[tuple[str, str, float, int, int, int], ...] = (
    ("fastBurn", "critical", 14, 28 * 24 * 12, 28 * 24, 28 * 24 * 30),
    ("mediumBurn", "critical", 7, 28 * 24 * 2, 28 * 4, 28 * 24 * 4),
    ("slowBurn", "warning", 2, 28 * 12, 28, 28 * 24),
    ("longTermBurn", "warning", 1, 28 * 4, 7, 28 * 8),
)

_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_SELECTOR = re.compile(r"^\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*(?:\{(.*)\})?\s*$", re.S)
_INTEGER = re.compile(r"^\d+$")


def _go_round_minute(ns: int) -> int:
    """Go's ``Duration.Round(time.Minute)`` for a positive duration (halves away from zero)."""
    minute = MINUTE_MS * _NS_PER_MS
    rest = ns % minute
    return ns - rest if rest + rest < minute else ns + minute - rest


@dataclass(frozen=True)
class PyrraWindow:
    """One of Pyrra's four burn-rate alerts for an SLO window (durations in ms)."""

    tier: str
    severity: str
    factor: float
    short_ms: int
    long_ms: int
    for_ms: int


def pyrra_windows(window_ms: int, severities: dict[str, str] | None = None) -> list[PyrraWindow]:
    """Pyrra's alert windows for an SLO window: 28d gives 5m/1h (for 2m), 30m/6h (15m),
    2h/1d (1h), 6h/4d (3h); other windows scale and round to the minute like Pyrra's Go code."""
    window_ns = window_ms * _NS_PER_MS
    out = []
    for tier, severity, factor, short_div, long_div, for_div in PYRRA_TIERS:
        short, long, wait = (
            _go_round_minute(window_ns // div) // _NS_PER_MS
            for div in (short_div, long_div, for_div)
        )
        out.append(
            PyrraWindow(tier, (severities or {}).get(tier) or severity, factor, short, long, wait)
        )
    return out


def prometheus_duration(ms: int) -> str:
    """Prometheus' ``model.Duration`` text, as Pyrra writes its labels: ``1h4m``, ``2w``, ``4w``."""
    if ms == 0:
        return "0s"
    parts = []
    for unit, size in (
        ("y", 365 * 24 * 60 * MINUTE_MS),
        ("w", 7 * 24 * 60 * MINUTE_MS),
        ("d", 24 * 60 * MINUTE_MS),
        ("h", 60 * MINUTE_MS),
        ("m", MINUTE_MS),
        ("s", 1000),
        ("ms", 1),
    ):
        if ms >= size:
            parts.append(f"{ms // size}{unit}")
            ms %= size
    return "".join(parts)


@dataclass(frozen=True)
class Selector:
    """A PromQL vector selector: metric name and matchers ``(label, op, escaped value)``."""

    metric: str
    matchers: tuple[tuple[str, str, str], ...]

    def render(self, migrate_le: bool = False) -> str:
        """The selector as PromQL; ``migrate_le`` widens ``le="1"`` to ``le=~"1(\\\\.0)?"``."""
        parts = []
        for label, op, value in self.matchers:
            if migrate_le and label == "le" and op == "=" and _INTEGER.match(value):
                op, value = "=~", value + r"(\\.0)?"
            parts.append(f'{label}{op}"{value}"')
        return f"{self.metric}{{{','.join(parts)}}}" if parts else self.metric


def parse_selector(text: str) -> Selector:
    """Parse ``name{label="v", other=~"x"}``; ValueError when it is not a vector selector."""
    match = _SELECTOR.match(text)
    if not match:
        raise ValueError(f'not a PromQL vector selector like name{{label="value"}}: {text!r}')
    body, matchers, pos = match.group(2) or "", [], 0
    while pos < len(body.rstrip()):
        found = _MATCHER.match(body, pos)
        if not found:
            raise ValueError(f"cannot read the label matchers of {text!r}")
        matchers.append((found.group(1), found.group(2), found.group(3)))
        pos = found.end()
    return Selector(match.group(1), tuple(matchers))


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class _Metric(_Spec):
    metric: str

    @field_validator("metric")
    @classmethod
    def _selector(cls, value: str) -> str:
        parse_selector(value)
        return value


class _Grouped(_Spec):
    grouping: list[str] = []


class _Ratio(_Grouped):
    errors: _Metric
    total: _Metric


class _Latency(_Grouped):
    success: _Metric
    total: _Metric

    @field_validator("success")
    @classmethod
    def _le(cls, value: _Metric) -> _Metric:
        le = [v for k, op, v in parse_selector(value.metric).matchers if k == "le" and op == "="]
        try:
            float(le[0])
        except (IndexError, ValueError):
            raise ValueError('needs a numeric le="…" matcher (a bucket bound)') from None
        return value


class _LatencyNative(_Grouped):
    latency: str
    total: _Metric


class _BoolGauge(_Metric, _Grouped):
    pass


class _Indicator(_Spec):
    ratio: _Ratio | None = None
    latency: _Latency | None = None
    latency_native: _LatencyNative | None = Field(None, alias="latencyNative")
    bool_gauge: _BoolGauge | None = Field(None, alias="bool_gauge")

    @model_validator(mode="after")
    def _one(self) -> _Indicator:
        given = [
            k for k in ("ratio", "latency", "latency_native", "bool_gauge") if getattr(self, k)
        ]
        if len(given) != 1:
            raise ValueError("exactly one of ratio, latency, latencyNative, bool_gauge is required")
        return self


class _Severities(_Spec):
    fast_burn: str = Field("", alias="fastBurn")
    medium_burn: str = Field("", alias="mediumBurn")
    slow_burn: str = Field("", alias="slowBurn")
    long_term_burn: str = Field("", alias="longTermBurn")
    absent: str = ""


class _Alerting(_Spec):
    burnrates: bool = True
    absent: bool = True
    disabled: bool = False
    name: str = "ErrorBudgetBurn"
    absent_name: str = Field("SLOMetricAbsent", alias="absentName")
    severities: _Severities = _Severities()


class _PyrraSpec(_Spec):
    description: str = ""
    target: str
    window: str
    indicator: _Indicator
    alerting: _Alerting = _Alerting()
    performance_over_accuracy: bool = Field(False, alias="performanceOverAccuracy")

    @field_validator("target")
    @classmethod
    def _target(cls, value: str) -> str:
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f'a percentage written as a string, like "99.5": {value!r}') from None
        if not 0 < number < 100:
            raise ValueError("must be a percentage in (0, 100)")
        return value

    @field_validator("window")
    @classmethod
    def _window(cls, value: str) -> str:
        parse_duration_ms(value)
        return value


@dataclass(frozen=True)
class PyrraSlo:
    """A validated Pyrra SLO, ready for the rule generator.

    ``error_query`` / ``total_query`` are PromQL templates with ``{{.window}}`` for the range
    (bad and total events per second; ``total_query`` is ``1`` when ``error_query`` is a
    ratio already). ``labels`` go on every rule, ``annotations`` on the alerts.
    """

    meta: ObjectMeta
    description: str
    objective: float
    window_ms: int
    indicator: str
    error_query: str
    total_query: str
    grouping: tuple[str, ...]
    labels: dict[str, str]
    annotations: dict[str, str]
    alert_name: str
    windows: tuple[PyrraWindow, ...]
    burnrates: bool = True

    def exhaustion(self, factor: float) -> str:
        """Pyrra's ``exhaustion`` label: the time a burn at ``factor`` takes to spend the budget."""
        return prometheus_duration(int(self.window_ms / factor))


def _sum(grouping: tuple[str, ...], inner: str) -> str:
    by = f" by ({', '.join(grouping)})" if grouping else ""
    return f"sum{by} ({inner})"


def _queries(ind: _Indicator, grouping: tuple[str, ...]) -> tuple[str, str, str, Selector]:
    w = "{{.window}}"
    if ind.ratio is not None:
        errors, total = (
            parse_selector(ind.ratio.errors.metric),
            parse_selector(ind.ratio.total.metric),
        )
        return (
            "ratio",
            _sum(grouping, f"rate({errors.render()}[{w}])"),
            _sum(grouping, f"rate({total.render()}[{w}])"),
            total,
        )
    if ind.latency is not None:
        success = parse_selector(ind.latency.success.metric).render(migrate_le=True)
        total = parse_selector(ind.latency.total.metric)
        count = _sum(grouping, f"rate({total.render(migrate_le=True)}[{w}])")
        return (
            "latency",
            f"{count} - {_sum(grouping, f'rate({success}[{w}])')}",
            count,
            total,
        )
    if ind.latency_native is not None:
        total = parse_selector(ind.latency_native.total.metric)
        bound_s = parse_duration_s(ind.latency_native.latency)
        inner = _sum(grouping, f"rate({total.render()}[{w}])")
        return "latencyNative", f"1 - histogram_fraction(0, {bound_s:g}, {inner})", "1", total
    assert ind.bool_gauge is not None  # the validator demands one indicator
    gauge = parse_selector(ind.bool_gauge.metric)
    count = _sum(grouping, f"count_over_time({gauge.render()}[{w}])")
    return (
        "bool_gauge",
        f"{count} - {_sum(grouping, f'sum_over_time({gauge.render()}[{w}])')}",
        count,
        gauge,
    )


def parse_duration_s(text: str) -> float:
    """A Go duration such as ``200ms``, ``1s`` or ``1.5s`` in seconds; ValueError otherwise."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", text.strip())
    if not match:
        raise ValueError(f"not a latency like 200ms or 1s: {text!r}")
    return float(match.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[match.group(2)]


def _prefixed(values: Any) -> dict[str, str]:
    if not isinstance(values, dict):
        return {}
    return {k.removeprefix(PREFIX): str(v) for k, v in values.items() if k.startswith(PREFIX)}


def parse_pyrra(raw: dict[str, Any], path: str = "") -> PyrraSlo:
    """Validate one ``ServiceLevelObjective`` document; ValueError lists each failing field
    path (``spec.indicator.latency.success: needs a numeric le=… matcher``)."""
    meta = object_meta(raw, path)
    try:
        spec = _PyrraSpec.model_validate(raw.get("spec"))
    except ValidationError as exc:
        raise ValueError(
            format_validation_error(exc, f"{path}spec", strip_value_error=True)
        ) from exc
    ind = spec.indicator
    grouping_list = next(
        i.grouping for i in (ind.ratio, ind.latency, ind.latency_native, ind.bool_gauge) if i
    )
    grouping = tuple(sorted(set(grouping_list)))
    kind, error, total, total_selector = _queries(ind, grouping)
    metadata = raw.get("metadata") or {}
    labels = _prefixed(metadata.get("labels"))
    for label, op, value in total_selector.matchers:
        if op == "=" and label not in grouping and label != "le":
            labels[label] = value
    alerting = spec.alerting
    severities = {
        "fastBurn": alerting.severities.fast_burn,
        "mediumBurn": alerting.severities.medium_burn,
        "slowBurn": alerting.severities.slow_burn,
        "longTermBurn": alerting.severities.long_term_burn,
    }
    window_ms = parse_duration_ms(spec.window)
    return PyrraSlo(
        meta=meta,
        description=spec.description,
        objective=float(spec.target) / 100,
        window_ms=window_ms,
        indicator=kind,
        error_query=error,
        total_query=total,
        grouping=grouping,
        labels=labels,
        annotations=_prefixed(metadata.get("annotations")),
        alert_name=alerting.name,
        windows=tuple(pyrra_windows(window_ms, severities)),
        burnrates=alerting.burnrates and not alerting.disabled,
    )
