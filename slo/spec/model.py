"""The validated SLO model: what every evaluator and generator consumes.

:func:`build_model` turns a :class:`~slo.spec.SloDocument` (llmslo/v1, or OpenSLO v1 converted by
:mod:`slo.spec.openslo`) into immutable :class:`Slo` values with their alert-window catalog resolved and
the burn-rate factors derived. Inner code trusts this model; it never re-validates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from slo.naming import alert_name
from slo.spec.document import AvailabilitySpec, GoodputSpec, LatencySpec, SloDocument, SloSpec
from slo.spec.outcomes import OutcomeClasses
from slo.windows import AlertPair, WindowCatalog, load_catalog

__all__ = ["Slo", "SloModel", "build_model"]

Sli = LatencySpec | AvailabilitySpec | GoodputSpec


@dataclass(frozen=True)
class Slo:
    """One SLO, resolved.

    ``budget`` = 1 − objective, the allowed bad fraction. ``pairs`` holds only the tiers the
    spec enables; ``min_events`` guards every pair's long window. ``outcome_classes`` says
    which request records are good, bad or no event (:mod:`slo.spec.outcomes`).
    """

    id: str  # "<service>-<name>", stable label value
    name: str
    service: str
    description: str
    objective: float
    sli: Sli
    catalog: WindowCatalog
    pairs: tuple[AlertPair, ...]
    selector: Mapping[str, tuple[str, ...]]
    group_by: tuple[str, ...]
    min_events: int
    alert_name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    outcome_classes: OutcomeClasses = field(default_factory=OutcomeClasses.resolve)

    @property
    def budget(self) -> float:
        return 1.0 - self.objective

    @property
    def period_ms(self) -> int:
        return self.catalog.period_ms


@dataclass(frozen=True)
class SloModel:
    """All SLOs of one spec, plus warnings found while building (unreachable factors)."""

    service: str
    slos: tuple[Slo, ...]
    warnings: tuple[str, ...] = ()

    def by_id(self, slo_id: str) -> Slo:
        for slo in self.slos:
            if slo.id == slo_id:
                return slo
        raise KeyError(slo_id)


def _build_slo(document: SloDocument, spec: SloSpec, index: int, warnings: list[str]) -> Slo:
    catalog = load_catalog(spec.period)
    enabled = {"page": spec.alerting.page, "ticket": spec.alerting.ticket}
    pairs = tuple(pair for pair in catalog.pairs if enabled.get(pair.severity, True))
    budget = 1.0 - spec.objective
    for pair in pairs:
        if pair.factor * budget >= 1.0:
            warnings.append(
                f"slos[{index}] {spec.name}: pair {pair.id} can never fire "
                f"(factor {pair.factor:g} × budget {budget:g} ≥ 1)"
            )
    selector = {
        key: (value,) if isinstance(value, str) else tuple(value)
        for key, value in spec.selector.model_dump(exclude_none=True).items()
    }
    return Slo(
        id=f"{document.service}-{spec.name}",
        name=spec.name,
        service=document.service,
        description=spec.description,
        objective=spec.objective,
        sli=spec.sli,
        catalog=catalog,
        pairs=pairs,
        selector=selector,
        group_by=tuple(spec.group_by),
        min_events=spec.alerting.min_events,
        alert_name=spec.alerting.name or alert_name(spec.name, "budget_burn"),
        labels={**document.labels, **spec.labels, **spec.alerting.labels},
        annotations=dict(spec.alerting.annotations),
        outcome_classes=OutcomeClasses.resolve(spec.sli.outcomes, spec.sli.statuses),
    )


def build_model(document: SloDocument) -> SloModel:
    """Resolve catalogs and factors for every SLO of ``document`` (which is already valid)."""
    warnings: list[str] = []
    slos = tuple(_build_slo(document, spec, i, warnings) for i, spec in enumerate(document.slos))
    return SloModel(document.service, slos, tuple(warnings))
