"""Load Sloth ``prometheus/v1`` specs into the rule model, so Sloth users keep their files.

Supported (Sloth's spec reference): ``service``, ``labels``, and per SLO ``name``,
``objective`` (a percentage), ``description``, ``labels``, ``sli.events``
(``error_query``/``total_query``) or ``sli.raw.error_ratio_query``, and ``alerting`` with
``name``, ``labels``, ``annotations``, ``page_alert`` / ``ticket_alert`` (``labels``,
``annotations``, ``disable``). The period is 30 days (Sloth's default) unless the spec's
``slo_period`` names one of our catalogs. Queries are used as written, with
``{{.window}}`` replaced per window; labels keep Sloth's names (``sloth_id`` …). Errors are
:class:`ConfigError` with the field path. SLI plugins are refused (they run Go code).

The Kubernetes CRD (``sloth.slok.dev/v1`` ``PrometheusServiceLevel``) has the same semantics:
:func:`parse_sloth_crd` validates its ``spec`` as this body (see
:mod:`slo.spec.formats.sloth_k8s`) and reports paths in the CRD's camelCase names.

SLO plugins (``slo_plugins`` / per SLO ``plugins``) are never ignored. Sloth's core plugins
are what llmslo does anyway (:data:`CORE_PLUGINS`); a chain with ``overridePrevious`` that
leaves out ``alert_rules/v1`` disables the alerts, as in Sloth. Any other plugin id is
refused by name: its rules would be missing from our output.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from alerts.model import SLOTH_LABELS, WINDOW_PLACEHOLDER, RuleModel, RuleSlo
from pipeline.errors import ConfigError
from slo.naming import alert_name
from slo.spec import format_spec_error
from slo.spec.document import unique_names
from slo.spec.formats.sloth_k8s import CRD_NAMES, sloth_crd_body
from slo.windows import known_periods, load_catalog

__all__ = [
    "CORE_PLUGINS",
    "SlothDocument",
    "is_sloth",
    "load_sloth",
    "parse_sloth",
    "parse_sloth_crd",
]

_VERSION = "prometheus/v1"
_ALERT_PLUGIN = "sloth.dev/core/alert_rules/v1"
#: Sloth's core SLO plugins, which its default chain runs and llmslo's generator covers:
#: id → what llmslo does instead. ``sli_rules/v1`` with ``disableOptimized: true`` is
#: exactly our period SLI (bad / total over the period); without it Sloth averages the 5m
#: ratios instead (see alerts/README.md).
CORE_PLUGINS = {
    "sloth.dev/core/sli_rules/v1": "SLI recordings per window",
    "sloth.dev/core/metadata_rules/v1": "the slo:* metadata recordings",
    _ALERT_PLUGIN: "the multi-window, multi-burn-rate alerts",
    "sloth.dev/core/validate/v1": "spec validation (done when the spec is read)",
    "sloth.dev/core/noop/v1": "nothing",
    "sloth.dev/core/debug/v1": "nothing (Sloth only logs)",
}


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
            raise ValueError(
                f"SLI plugins are not supported ({value.get('id', '<no id>')!r} is Go code "
                "that Sloth runs): expand it into events or raw"
            )
        return None


class _Plugin(_Spec):
    id: str = Field(min_length=1)
    config: dict[str, Any] = {}
    priority: int = 0

    @field_validator("id")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in CORE_PLUGINS:
            raise ValueError(
                f"SLO plugin {value!r} is not supported (its rules would be missing); "
                f"supported: {', '.join(sorted(CORE_PLUGINS))}"
            )
        return value


class _Plugins(_Spec):
    override_previous: bool = False
    chain: list[_Plugin] = []


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
    plugins: _Plugins | None = None
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
    slo_plugins: _Plugins | None = None
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
        return unique_names(value)


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


def _alerts_enabled(doc: SlothDocument, slo: _Slo) -> bool:
    """Whether the effective plugin chain still runs ``alert_rules/v1`` (Sloth's order:
    defaults → spec-level chain → SLO chain, each ``overridePrevious`` dropping the ones before)."""
    ids = set(CORE_PLUGINS)
    for plugins in (doc.slo_plugins, slo.plugins):
        if plugins is not None:
            chain = {p.id for p in plugins.chain}
            ids = chain if plugins.override_previous else ids | chain
    return _ALERT_PLUGIN in ids


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
        pairs=tuple(
            p for p in catalog.pairs if not tiers[p.severity].disable and _alerts_enabled(doc, slo)
        ),
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


def _rename_paths(text: str, prefix: str, names: Mapping[str, str]) -> str:
    """Error lines with ``prefix`` before each path and its field names spelt as ``names``."""
    if not names and not prefix:
        return text
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b") if names else None
    lines = []
    for line in text.splitlines():
        path, sep, message = line.partition(": ")
        if sep and not path.endswith("invalid SLO spec") and " " not in path:
            if pattern is not None:
                path = pattern.sub(lambda m: names[m.group(1)], path)
            path = f"{prefix}{path}"
        lines.append(f"{path}{sep}{message}")
    return "\n".join(lines)


def parse_sloth(
    raw: Any,
    source: str = "<sloth>",
    *,
    path_prefix: str = "",
    names: Mapping[str, str] | None = None,
) -> RuleModel:
    """Validate a loaded Sloth document and build its rule model; ConfigError names the path
    (after ``path_prefix``, with field names spelt as in ``names`` when given)."""
    try:
        doc = SlothDocument.model_validate(raw)
    except ValidationError as exc:
        text = format_spec_error(exc, source)
        raise ConfigError(_rename_paths(text, path_prefix, names or {})) from exc
    try:
        slos = tuple(_rule_slo(doc, slo, i) for i, slo in enumerate(doc.slos))
    except ConfigError as exc:
        text = _rename_paths(str(exc), path_prefix, names or {})
        raise ConfigError(f"{source}: invalid Sloth spec\n{text}") from exc
    return RuleModel(source, slos)


def parse_sloth_crd(raw: dict[str, Any], source: str = "<sloth>") -> RuleModel:
    """A ``PrometheusServiceLevel`` object's rule model, written as a PrometheusRule named
    like the object by default (as Sloth's controller does)."""
    try:
        body, meta = sloth_crd_body(raw)
    except ValueError as exc:
        raise ConfigError(f"{source}: invalid PrometheusServiceLevel\n{exc}") from exc
    model = parse_sloth(body, source, path_prefix="spec.", names=CRD_NAMES)
    return RuleModel(source, model.slos, model.skipped, kubernetes=meta)


def load_sloth(path: str | Path) -> RuleModel:
    """Read a Sloth spec file; ConfigError on unreadable, non-YAML or invalid input."""
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read a Sloth spec: {exc}") from exc
    return parse_sloth(raw, str(path))
