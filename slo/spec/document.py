"""The SLO spec file (``llmslo/v1``): pydantic models for the YAML a user writes.

Validated once, here, at the boundary; every error names its field path
(``slos[2].objective: must be in (0, 1)``) and is raised as :class:`ConfigError`.
:func:`slo.spec.model.build_model` turns a valid spec into the immutable model that the jobs,
the report, the rule generator and the canary verdicts all consume.

Shape (see ``config/slo.example.yaml``)::

    version: llmslo/v1
    service: inference
    slos:
      - name: ttft-p99
        objective: 0.99              # fraction in (0, 1)
        period: 30d                  # picks the alert-window catalog (30d, 28d, 7d)
        sli: {kind: latency, metric: ttft, threshold_s: 2.0, source: tap}  # or engine, probe
        # sli.outcomes / sli.statuses: good, bad or excluded per outcome and per HTTP status
        # (slo.spec.outcomes; defaults: client 4xx and cancellations excluded)
        selector: {pool: llama-3-8b} # model, pool, tenant, route, instance (value or list)
        group_by: [pool]             # evaluate per pool (pool, instance, tenant, route)
        alerting: {min_events: 100}  # low-traffic guard on the long window of each pair
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Protocol, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pipeline.config import STRICT, format_validation_error
from pipeline.errors import ConfigError
from slo.spec.outcomes import OutcomeClass, check_outcome_table, check_status_table
from slo.windows import known_periods, parse_duration_ms

__all__ = [
    "GROUP_DIMENSIONS",
    "LATENCY_METRICS",
    "MAX_OBJECTIVE",
    "AlertingSpec",
    "AvailabilitySpec",
    "GoodputSpec",
    "LatencySpec",
    "SelectorSpec",
    "SloDocument",
    "SloSpec",
    "format_spec_error",
    "parse_spec",
]

#: Latency SLI metrics and the request-record column each reads (DESIGN §3).
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2e")
#: Dimensions an SLO may be grouped by (columns of the rollup tables).
GROUP_DIMENSIONS = ("pool", "instance", "tenant", "route")
_NAME = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]*[A-Za-z0-9]$")
#: A service name: the first part of every SLO id (``<service>-<name>``), a label value.
_SERVICE = re.compile(r"^[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
#: Prometheus label names (``__`` is reserved for Prometheus itself) and alert names.
_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ALERT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
#: The template actions a label or annotation may hold: a label of the alert, its value,
#: an external label. Anything else (``query``, ``range``, a pipeline) could run PromQL or
#: print what its author did not write when Prometheus expands the template.
_SAFE_ACTION = re.compile(
    r"\{\{-?\s*\$(?:value|labels\.[A-Za-z_][A-Za-z0-9_]*|externalLabels\.[A-Za-z_][A-Za-z0-9_]*)"
    r"\s*-?\}\}"
)
_MAX_LABEL_VALUE = 1024
_SLI_TAGS = {"latency", "availability", "goodput"}
#: The highest objective accepted unless the SLO sets ``allow_objective_beyond_five_nines``:
#: beyond it one bad request in the page pair's 5-minute window pages by itself unless that
#: window holds > 1 / (14.4 × (1 − objective)) requests (694,000 at seven nines), and the
#: report's three decimals in % cannot show the objective (see slo/README.md).
MAX_OBJECTIVE = 0.99999


class _Spec(BaseModel):
    model_config = STRICT


def _check_name(value: str) -> str:
    if not _NAME.match(value) or len(value) > 63:
        raise ValueError("must be 2–63 characters of letters, digits, '-', '_', '.'")
    return value


def _check_template(text: str, what: str, *, multiline: bool = False) -> None:
    """Refuse control characters and every template action but a safe reference."""
    if not (text.replace("\n", "").replace("\t", "") if multiline else text).isprintable():
        raise ValueError(f"{what}: control characters are not allowed")
    if "{{" in _SAFE_ACTION.sub("", text):
        raise ValueError(
            f"{what}: only {{{{ $labels.<name> }}}}, {{{{ $value }}}} and "
            "{{ $externalLabels.<name> }} may be templated"
        )


def _check_labels(labels: dict[str, str]) -> dict[str, str]:
    for name, value in labels.items():
        if not _LABEL_NAME.match(name) or name.startswith("__"):
            raise ValueError(
                f"label name {name[:40]!r}: expected [A-Za-z_][A-Za-z0-9_]*, not starting '__'"
            )
        if not 0 < len(value) <= _MAX_LABEL_VALUE:
            raise ValueError(f"label {name}: 1 to {_MAX_LABEL_VALUE} characters")
        _check_template(value, f"label {name}")
    return labels


#: Labels a spec puts on rules and alerts: Prometheus names, values without template code.
_Labels = Annotated[dict[str, str], AfterValidator(_check_labels)]


class _RequestSli(_Spec):
    """What an SLI over request records counts: the outcome classes laid over the defaults
    (:mod:`slo.spec.outcomes`)."""

    outcomes: dict[str, OutcomeClass] = Field(
        default={},
        description="class per outcome (good, bad, excluded), over the defaults; 'ok' is good",
    )
    statuses: dict[str, OutcomeClass] = Field(
        default={},
        description="class per HTTP status the client got ('404' or '4xx'), applied to records "
        "that are not ok before their outcome's; over the defaults {4xx: excluded, 429: bad}",
    )

    @field_validator("outcomes")
    @classmethod
    def _outcomes(cls, value: dict[str, OutcomeClass]) -> dict[str, OutcomeClass]:
        check_outcome_table(value)
        return value

    @field_validator("statuses")
    @classmethod
    def _statuses(cls, value: dict[str, OutcomeClass]) -> dict[str, OutcomeClass]:
        check_status_table(value)
        return value


class LatencySpec(_RequestSli):
    """Good = the request's ``metric`` is at most ``threshold_s`` (and the request succeeded).

    ``source: engine`` counts histogram buckets instead of tap records: the threshold must
    then be an existing bucket bound (checked by :func:`slo.buckets.check_bucket_bounds`).
    ``source: probe`` counts the synthetic prober's records (``llmslo probe``, requests through
    the entry point) instead of the taps' users' requests; it has no ITL statistics.
    ``statistic`` applies to ITL from the tap: the per-request p99 gap (default), the largest
    gap, the mean gap, or ``jitter`` = p99 gap − median gap (DESIGN §4; the tap records it
    per request, for requests with at least 10 token-bearing chunks; others are no event).
    """

    kind: Literal["latency"]
    metric: Literal["ttft", "tpot", "itl", "e2e"]
    threshold_s: float = Field(gt=0, le=86_400)
    source: Literal["tap", "engine", "probe"] = "tap"
    statistic: Literal["p99", "max", "mean", "jitter"] = "p99"
    dialect: str | None = Field(
        default=None, description="engine dialect whose default buckets apply"
    )

    @model_validator(mode="after")
    def _statistic_only_for_itl(self) -> LatencySpec:
        if self.statistic != "p99" and (self.metric != "itl" or self.source != "tap"):
            raise ValueError("statistic applies only to metric itl with source tap")
        if self.source == "probe" and self.metric == "itl":
            raise ValueError("source probe records no ITL: use ttft, tpot or e2e")
        if self.source == "engine" and (self.outcomes or self.statuses):
            raise ValueError("source engine counts histogram buckets: no outcomes or statuses")
        return self


class AvailabilitySpec(_RequestSli):
    """Good = a ``good`` record, bad = a ``bad`` one; ``excluded`` records are no event
    (by default the client's 4xx and cancellations, :mod:`slo.spec.outcomes`).

    ``source: tap`` counts users' requests as the taps saw them; ``source: probe`` the
    prober's requests through the entry point (a gateway refusing connections fails them
    while the taps behind it see nothing)."""

    kind: Literal["availability"]
    source: Literal["tap", "probe"] = "tap"


class GoodputSpec(_RequestSli):
    """Good = a ``good`` record with *every* latency target met (DistServe-style goodput).

    The targets are the spec's (``targets_s``), or with ``own_targets: true`` each request's
    own, as llm-d's router sends them (``x-llm-d-slo-ttft-ms`` / ``x-llm-d-slo-tpot-ms``, the
    tap's ``slo_met``): then only requests that carry targets are events, and the SLI is the
    share of them served within their own targets.
    """

    kind: Literal["goodput"]
    source: Literal["tap"] = "tap"
    own_targets: bool = Field(
        default=False,
        description="judge each request against its own targets (the router's x-llm-d-slo-* "
        "headers) instead of targets_s; requests without targets are no event",
    )
    targets_s: dict[
        Literal["ttft", "tpot", "itl", "e2e"], Annotated[float, Field(gt=0, le=86_400)]
    ] = Field(default={}, validate_default=True)

    @field_validator("targets_s")
    @classmethod
    def _one_set_of_targets(cls, value: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        own = info.data.get("own_targets")
        if own and value:
            raise ValueError("targets_s and own_targets: true exclude each other")
        if not own and not value:
            raise ValueError("needs at least one latency target, or own_targets: true")
        return value


SliSpec = Annotated[LatencySpec | AvailabilitySpec | GoodputSpec, Field(discriminator="kind")]
_Values = str | list[str]


class SelectorSpec(_Spec):
    """Which requests belong to the SLO; each key takes one value or a list of values."""

    model: _Values | None = None
    pool: _Values | None = None
    tenant: _Values | None = None
    route: _Values | None = None
    instance: _Values | None = None

    @field_validator("*")
    @classmethod
    def _non_empty(cls, value: _Values | None) -> _Values | None:
        if isinstance(value, list) and not value:
            raise ValueError("an empty list selects nothing")
        for item in [value] if isinstance(value, str) else value or []:
            if not 0 < len(item) <= 253 or not item.isprintable():
                raise ValueError(f"{item[:40]!r}: 1 to 253 printable characters")
        return value


class AlertingSpec(_Spec):
    """Which tiers alert, and the low-traffic guard."""

    page: bool = True
    ticket: bool = True
    min_events: int = Field(
        default=0, ge=0, description="a pair alerts only if its long window holds this many events"
    )
    name: str | None = Field(
        default=None, description="alert name (default: SLO name in CamelCase + 'BudgetBurn')"
    )
    labels: _Labels = {}
    annotations: dict[str, str] = {}

    @field_validator("name")
    @classmethod
    def _alert_name(cls, value: str | None) -> str | None:
        if value is not None and not _ALERT_NAME.match(value):
            raise ValueError(
                "must be 1–128 characters of letters, digits and '_', not a digit first"
            )
        return value

    @field_validator("annotations")
    @classmethod
    def _annotations(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not _LABEL_NAME.match(name):
                raise ValueError(f"annotation name {name[:40]!r}: expected [A-Za-z_][A-Za-z0-9_]*")
            _check_template(text, f"annotation {name}", multiline=True)
        return value


class SloSpec(_Spec):
    """One service-level objective."""

    name: str
    description: str = ""
    allow_objective_beyond_five_nines: bool = Field(
        default=False,
        description=f"accept an objective above {MAX_OBJECTIVE} (enough traffic to measure it)",
    )
    objective: float
    period: str = "30d"
    sli: SliSpec
    selector: SelectorSpec = SelectorSpec()
    group_by: list[Literal["pool", "instance", "tenant", "route"]] = []
    alerting: AlertingSpec = AlertingSpec()
    labels: _Labels = {}

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _check_name(value)

    @field_validator("description")
    @classmethod
    def _description(cls, value: str) -> str:
        _check_template(value, "description", multiline=True)
        return value

    @field_validator("objective")
    @classmethod
    def _objective(cls, value: float, info: ValidationInfo) -> float:
        if not 0 < value < 1:
            raise ValueError("must be in (0, 1)")
        if value > MAX_OBJECTIVE and not info.data.get("allow_objective_beyond_five_nines"):
            raise ValueError(
                f"{value} leaves an error budget of {1 - value:.1e}, finer than the data can "
                f"measure; at most {MAX_OBJECTIVE} unless allow_objective_beyond_five_nines: true "
                "(see slo/README.md)"
            )
        return value

    @field_validator("period")
    @classmethod
    def _period(cls, value: str) -> str:
        parse_duration_ms(value)
        if value not in known_periods():
            raise ValueError(
                f"no alert-window catalog for {value} (known: {', '.join(known_periods())})"
            )
        return value

    @field_validator("group_by")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("dimensions must not repeat")
        return value

    @model_validator(mode="after")
    def _engine_dimensions(self) -> SloSpec:
        # Engine histograms carry no tenant or route: such an SLO would silently select nothing.
        if self.sli.source == "engine":
            used = {k for k in ("tenant", "route") if getattr(self.selector, k) is not None}
            used |= {k for k in self.group_by if k in ("tenant", "route")}
            if used:
                raise ValueError(
                    f"source engine has no {'/'.join(sorted(used))}: select or group by "
                    "model, pool or instance only"
                )
        return self


class _HasName(Protocol):
    @property
    def name(self) -> str: ...


_Named = TypeVar("_Named", bound=_HasName)


class SloDocument(_Spec):
    """A whole spec file."""

    version: Literal["llmslo/v1"]
    service: str = "llm-inference"
    labels: _Labels = {}
    slos: list[SloSpec] = Field(min_length=1)

    @field_validator("service")
    @classmethod
    def _service(cls, value: str) -> str:
        if not _SERVICE.match(value):
            raise ValueError("must be 1–63 characters of letters, digits, '-', '_', '.'")
        return value

    @field_validator("slos")
    @classmethod
    def _unique_names(cls, value: list[SloSpec]) -> list[SloSpec]:
        return unique_names(value)


def unique_names(slos: list[_Named]) -> list[_Named]:
    """``slos`` unchanged, or ValueError naming the first SLO whose name is used twice."""
    seen: set[str] = set()
    for index, slo in enumerate(slos):
        if slo.name in seen:
            raise ValueError(f"slos[{index}].name {slo.name!r} is used twice")
        seen.add(slo.name)
    return slos


def format_spec_error(exc: ValidationError, source: str) -> str:
    """One line per problem: ``slos[2].objective: must be in (0, 1)``."""
    return f"{source}: invalid SLO spec\n" + format_validation_error(
        exc, skip=_SLI_TAGS, strip_value_error=True
    )


def parse_spec(raw: Any, source: str = "<spec>") -> SloDocument:
    """Validate an already-loaded YAML document; raises :class:`ConfigError`."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping, got {type(raw).__name__}")
    try:
        return SloDocument.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_spec_error(exc, source)) from exc
