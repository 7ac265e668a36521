"""The rule model: what the generators consume, whatever spec format it came from.

Both loaders (:mod:`alerts.sources` for llmslo/v1 and OpenSLO, :mod:`alerts.sloth` for Sloth
``prometheus/v1``) produce :class:`RuleModel`. An SLI is two PromQL templates, the bad and
the total events per second, with ``{{.window}}`` where the range goes (Sloth's
placeholder), so the generators never branch on where an SLI comes from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from slo.spec.formats import ObjectMeta
from slo.windows import AlertPair, WindowCatalog, format_duration

__all__ = [
    "LLMSLO_LABELS",
    "SLOTH_LABELS",
    "WINDOW_PLACEHOLDER",
    "LabelScheme",
    "RuleModel",
    "RuleSlo",
    "SeriesRecipe",
]

#: Where a template's range goes: ``rate(x[{{.window}}])`` → ``rate(x[5m])``.
WINDOW_PLACEHOLDER = "{{.window}}"


@dataclass(frozen=True)
class LabelScheme:
    """Names of the labels the generated rules put on every series and alert.

    llmslo specs use ``slo_*``; a Sloth spec keeps Sloth's ``sloth_*`` names so that
    routes and dashboards built on Sloth's output keep working after the migration.
    """

    id: str
    service: str
    name: str
    window: str
    severity: str
    info_metric: str


LLMSLO_LABELS = LabelScheme(
    "slo_id", "slo_service", "slo", "slo_window", "severity", "llmslo_slo_info"
)
SLOTH_LABELS = LabelScheme(
    "sloth_id", "sloth_service", "sloth_slo", "sloth_window", "sloth_severity", "sloth_slo_info"
)


@dataclass(frozen=True)
class SeriesRecipe:
    """How to write input series for a generated promtool test of one SLO.

    ``kind`` is ``histogram`` (good = ``<metric>_bucket{le=bound}``, total = ``_count``) or
    ``outcome`` (good = ``<metric>{outcome="ok"}``, bad = ``{outcome="error"}``, and as
    many events as good ones on a series labelled ``excluded``, which the rules must ignore,
    when the SLI excludes any). ``labels`` are the labels every input series carries
    (selector and group-by values).
    """

    kind: str
    metric: str
    labels: Mapping[str, str]
    bound: str = ""
    excluded: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RuleSlo:
    """One SLO, ready to render as PromQL.

    ``error_query`` and ``total_query`` give bad and total events per second with
    ``{{.window}}`` as the range; ``group_labels`` are the labels they keep (one alert per
    group). ``labels`` go on every rule; ``alert_labels`` / ``tier_labels`` on the alerts.
    """

    id: str
    name: str
    service: str
    description: str
    objective: float
    catalog: WindowCatalog
    pairs: tuple[AlertPair, ...]
    error_query: str
    total_query: str
    sli_kind: str
    alert_name: str
    scheme: LabelScheme = LLMSLO_LABELS
    group_labels: tuple[str, ...] = ()
    min_events: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    alert_labels: Mapping[str, str] = field(default_factory=dict)
    tier_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    recipe: SeriesRecipe | None = None
    #: Per window pair (:attr:`AlertPair.id`): the alert's ``for:`` duration in ms and extra
    #: labels. Empty for llmslo's own semantics (no ``for:``, as the Workbook advises);
    #: filled for Pyrra input, whose alerts wait (see alerts/README.md).
    pair_for_ms: Mapping[str, int] = field(default_factory=dict)
    pair_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    @property
    def budget(self) -> float:
        """The allowed bad fraction, 1 − objective."""
        return 1.0 - self.objective

    @property
    def period(self) -> str:
        """The SLO period as a PromQL duration, e.g. ``30d``."""
        return format_duration(self.catalog.period_ms)

    @property
    def id_labels(self) -> dict[str, str]:
        """The labels that identify this SLO's series (id, service, name)."""
        s = self.scheme
        return {s.id: self.id, s.service: self.service, s.name: self.name}


@dataclass(frozen=True)
class RuleModel:
    """Every SLO of one spec file, and what could not be rendered (with why).

    ``kubernetes`` is the identity of the input object when the input is a Kubernetes CRD
    that its own tool turns into a PrometheusRule (Sloth's ``PrometheusServiceLevel``): the
    output is then a PrometheusRule of that name and namespace unless asked otherwise.
    """

    source: str
    slos: tuple[RuleSlo, ...]
    skipped: tuple[str, ...] = ()
    kubernetes: ObjectMeta | None = None
