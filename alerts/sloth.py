"""Load Sloth ``prometheus/v1`` specs into the rule model, so Sloth users keep their files.

Supported (Sloth's spec reference): ``service``, ``labels``, and per SLO ``name``,
``objective`` (a percentage), ``description``, ``labels``, ``sli.events``
(``error_query``/``total_query``) or ``sli.raw.error_ratio_query``, and ``alerting`` with
``name``, ``labels``, ``annotations``, ``page_alert`` / ``ticket_alert`` (``labels``,
``annotations``, ``disable``). The period is 30 days (Sloth's default) unless the spec's
``slo_period`` names one of our catalogs. Queries are used as written, with
``{{.window}}`` replaced per window; labels keep Sloth's names (``sloth_id`` …). Errors are
:class:`ConfigError` with the field path. SLI plugins are refused (they run Go code).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from alerts.model import SLOTH_LABELS, WINDOW_PLACEHOLDER, RuleModel, RuleSlo
from pipeline.errors import ConfigError
from slo.naming import alert_name
from slo.spec import format_spec_error
from slo.windows import known_periods, load_catalog

__all__ = ["SlothDocument", "is_sloth", "load_sloth", "parse_sloth"]

_VERSION = "prometheus/v1"


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Events(_Spec):
    error_query: str
    total_query: str


class _Raw(_Spec):
    error_ratio_query: str


class _Sli(_Spec):
    events: _Events | None = None
    raw: _Raw | None = None
    plugin: dict[str, Any] | None = None

    @field_validator("plugin")
    @classmethod
    def _no_plugin(cls, value: dict[str, Any] | None) -> None:
        if value is not None:
            raise ValueError("SLI plugins are not supported: expand them into events or raw")
        return None


class _Tier(_Spec):
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    disable: bool = False


class _Alerting(_Spec):
    name: str = ""
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    page_alert: _Tier = _Tier()
    ticket_alert: _Tier = _Tier()


class _Slo(_Spec):
    name: str = Field(min_length=1)
    objective: float
    description: str = ""
    labels: dict[str, str] = {}
    sli: _Sli
    alerting: _Alerting = _Alerting()

    @field_validator("objective")
    @classmethod
    def _objective(cls, value: float) -> float:
        if not 0 < value < 100:
            raise ValueError("must be a percentage in (0, 100)")
        return value


class SlothDocument(_Spec):
    """A Sloth ``prometheus/v1`` spec file."""

    version: Literal["prometheus/v1"]
    service: str = Field(min_length=1)
    labels: dict[str, str] = {}
    slo_period: str = "30d"
    slos: list[_Slo] = Field(min_length=1)

    @field_validator("slo_period")
    @classmethod
    def _period(cls, value: str) -> str:
        if value not in known_periods():
            raise ValueError(
                f"no alert-window catalog for {value} (known: {', '.join(known_periods())})"
            )
        return value

    @field_validator("slos")
    @classmethod
    def _unique(cls, value: list[_Slo]) -> list[_Slo]:
        seen: set[str] = set()
        for index, slo in enumerate(value):
            if slo.name in seen:
                raise ValueError(f"slos[{index}].name {slo.name!r} is used twice")
            seen.add(slo.name)
        return value


def is_sloth(raw: Any) -> bool:
    """True for a document that declares ``version: prometheus/v1``."""
    return isinstance(raw, dict) and raw.get("version") == _VERSION


def _queries(slo: _Slo, index: int) -> tuple[str, str]:
    if slo.sli.events is not None:
        return slo.sli.events.error_query, slo.sli.events.total_query
    if slo.sli.raw is not None:
        # Sloth's raw SLI is a ratio already: divide it by a total of 1.
        return slo.sli.raw.error_ratio_query, "1"
    raise ConfigError(f"slos[{index}].sli: needs events or raw")


def _rule_slo(doc: SlothDocument, slo: _Slo, index: int) -> RuleSlo:
    error, total = _queries(slo, index)
    for field, query in (("error_query", error), ("total_query", total)):
        if query != "1" and WINDOW_PLACEHOLDER not in query:
            raise ConfigError(f"slos[{index}].sli.events.{field}: needs {WINDOW_PLACEHOLDER}")
    catalog = load_catalog(doc.slo_period)
    tiers = {"page": slo.alerting.page_alert, "ticket": slo.alerting.ticket_alert}
    return RuleSlo(
        id=f"{doc.service}-{slo.name}",
        name=slo.name,
        service=doc.service,
        description=slo.description,
        objective=slo.objective / 100,
        catalog=catalog,
        pairs=tuple(p for p in catalog.pairs if not tiers[p.severity].disable),
        error_query=error,
        total_query=total,
        sli_kind="events",
        alert_name=slo.alerting.name or alert_name(doc.service, slo.name, "slo_burn"),
        scheme=SLOTH_LABELS,
        labels={**doc.labels, **slo.labels},
        alert_labels=dict(slo.alerting.labels),
        tier_labels={name: dict(tier.labels) for name, tier in tiers.items()},
        annotations=dict(slo.alerting.annotations),
    )


def parse_sloth(raw: Any, source: str = "<sloth>") -> RuleModel:
    """Validate a loaded Sloth document and build its rule model; ConfigError names the path."""
    try:
        doc = SlothDocument.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_spec_error(exc, source)) from exc
    try:
        slos = tuple(_rule_slo(doc, slo, i) for i, slo in enumerate(doc.slos))
    except ConfigError as exc:
        raise ConfigError(f"{source}: invalid Sloth spec\n{exc}") from exc
    return RuleModel(source, slos)


def load_sloth(path: str | Path) -> RuleModel:
    """Read a Sloth spec file; ConfigError on unreadable, non-YAML or invalid input."""
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read a Sloth spec: {exc}") from exc
    return parse_sloth(raw, str(path))
