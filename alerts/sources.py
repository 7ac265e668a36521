"""Where each llmslo SLI lives in Prometheus: metric-name maps (data) and the converter.

:func:`rule_model_from_slo` turns the validated :class:`slo.spec.model.SloModel` (llmslo/v1 or
OpenSLO v1, both through :func:`slo.spec.load_spec`) into a :class:`~alerts.model.RuleModel`.

* ``source: engine`` latency SLIs read the dialect's histogram (:data:`ENGINE_HISTOGRAMS`);
  the threshold must be one of its bucket bounds (the same defaults the DuckDB jobs use,
  :data:`slo.buckets.DEFAULT_BUCKETS`), else :class:`ConfigError` naming the field path.
* ``source: tap`` SLIs read the tap's own ``/metrics`` (:data:`TAP_HISTOGRAMS`,
  :data:`TAP_REQUESTS`, labels ``outcome`` and ``code``). A record's class (good, bad,
  excluded: :mod:`slo.spec.outcomes`) is matched on those two labels exactly as the jobs
  class it on ``outcome`` and ``http_status``. What the tap's
  histograms cannot express exactly (a threshold between two buckets, per-request ITL
  statistics, goodput, tenant/route) is computed by the pipeline only (path B): such an
  SLO is *skipped* with its reason, or refused with ``strict=True``.
* ``source: probe`` SLIs (the synthetic prober's records) exist only in the store: skipped
  the same way.

``le`` is matched by numeric value: the matcher accepts every rendering of the bound that
exporters write (``2``, ``2.0``), so rules keep working across Prometheus 2 and 3. Selector
values are quoted by :mod:`alerts.promql`: a value only ever matches itself.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from alerts.model import WINDOW_PLACEHOLDER, RuleModel, RuleSlo, SeriesRecipe
from alerts.promql import matcher, regex_matcher
from collectors.tap.telemetry import DURATION_BUCKETS_S, TPOT_BUCKETS_S, TTFT_BUCKETS_S
from pipeline.buckets import VLLM_ITL_S, VLLM_REQUEST_LATENCY_S, VLLM_TTFT_S
from pipeline.errors import ConfigError, LlmsloError
from pipeline.schema import OUTCOMES
from slo.buckets import DEFAULT_BUCKETS
from slo.spec import AvailabilitySpec, LatencySpec
from slo.spec.model import Slo, SloModel
from slo.spec.outcomes import OUTCOME_CLASSES, OutcomeClass, OutcomeClasses

__all__ = [
    "ENGINE_HISTOGRAMS",
    "ENGINE_LABELS",
    "TAP_HISTOGRAMS",
    "TAP_LABELS",
    "TAP_REQUESTS",
    "le_matcher",
    "rule_model_from_slo",
]

#: Histogram (base name) and default bucket bounds per engine dialect and latency metric
#: (reference/engine-metrics.md §1–3). A metric a dialect lacks is absent from its row.
ENGINE_HISTOGRAMS: Mapping[str, Mapping[str, tuple[str, Sequence[float]]]] = {
    "vllm": {
        "ttft": ("vllm:time_to_first_token_seconds", DEFAULT_BUCKETS["vllm"]["ttft"]),
        "tpot": ("vllm:request_time_per_output_token_seconds", DEFAULT_BUCKETS["vllm"]["tpot"]),
        "itl": ("vllm:inter_token_latency_seconds", DEFAULT_BUCKETS["vllm"]["itl"]),
        "e2e": ("vllm:e2e_request_latency_seconds", DEFAULT_BUCKETS["vllm"]["e2e"]),
    },
    # ≤ 0.10: time_per_output_token_seconds is observed per engine step, i.e. it is ITL;
    # there is no per-request TPOT histogram in those versions.
    "vllm-legacy": {
        "ttft": ("vllm:time_to_first_token_seconds", DEFAULT_BUCKETS["vllm-legacy"]["ttft"]),
        "itl": ("vllm:time_per_output_token_seconds", DEFAULT_BUCKETS["vllm-legacy"]["itl"]),
        "e2e": ("vllm:e2e_request_latency_seconds", DEFAULT_BUCKETS["vllm-legacy"]["e2e"]),
    },
    "sglang": {
        "ttft": ("sglang:time_to_first_token_seconds", DEFAULT_BUCKETS["sglang"]["ttft"]),
        "tpot": (
            "sglang:request_time_per_output_token_seconds",
            DEFAULT_BUCKETS["sglang"]["tpot"],
        ),
        "itl": ("sglang:inter_token_latency_seconds", DEFAULT_BUCKETS["sglang"]["itl"]),
        "e2e": ("sglang:e2e_request_latency_seconds", DEFAULT_BUCKETS["sglang"]["e2e"]),
    },
    # trtllm-serve's /prometheus/metrics (1.0 names, vLLM V0 bucket sets); Triton has no
    # per-token histograms at all.
    "trtllm": {
        "ttft": ("time_to_first_token_seconds", VLLM_TTFT_S),
        "tpot": ("time_per_output_token_seconds", VLLM_ITL_S),
        "e2e": ("e2e_request_latency_seconds", VLLM_REQUEST_LATENCY_S),
    },
}
#: Selector key → label name on engine series (Prometheus adds ``instance``; ``pool`` is a
#: target label the scrape config sets).
ENGINE_LABELS: Mapping[str, str] = {"model": "model_name", "pool": "pool", "instance": "instance"}

#: The tap's histograms (collectors.tap.telemetry). Its ITL histogram holds every gap
#: (chunk-weighted), not the per-request statistic the SLI defines, so it is not listed.
TAP_HISTOGRAMS: Mapping[str, tuple[str, Sequence[float]]] = {
    "ttft": ("llmslo_tap_ttft_seconds", TTFT_BUCKETS_S),
    "tpot": ("llmslo_tap_tpot_seconds", TPOT_BUCKETS_S),
    "e2e": ("llmslo_tap_e2e_seconds", DURATION_BUCKETS_S),
}
#: The tap's attempt counter, labels ``outcome`` and ``code`` (the HTTP status sent to the
#: client, empty if none); it carries no ``model`` label.
TAP_REQUESTS = "llmslo_tap_requests_total"
#: Selector key → label on the tap's series (scrape taps with ``honor_labels: true`` so
#: their ``instance`` label, the upstream engine, survives).
TAP_LABELS: Mapping[str, str] = {"model": "model", "pool": "pool", "instance": "instance"}


class _Unsupported(LlmsloError):
    """This SLO has no exact PromQL form (path B only); the message says why."""


def _le_renderings(bound: float) -> list[str]:
    forms = {repr(float(bound)), f"{bound:g}"}
    if float(bound).is_integer():
        forms |= {str(int(bound)), f"{int(bound)}.0"}
    return sorted(forms)


def le_matcher(bound: float) -> str:
    """A ``le=~"…"`` matcher that accepts every usual text form of ``bound`` (``2|2\\.0``)."""
    return regex_matcher("le", _le_renderings(bound))


def _matching_bound(bounds: Sequence[float], threshold: float) -> float | None:
    for bound in bounds:
        if math.isclose(bound, threshold, rel_tol=1e-9, abs_tol=1e-12):
            return bound
    return None


def _selector(slo: Slo, names: Mapping[str, str], extra: Sequence[str] = ()) -> list[str]:
    matchers = []
    for key in sorted(slo.selector):
        if key not in names:
            raise _Unsupported(f"its series carry no {key} label")
        values = slo.selector[key]
        if len(values) == 1:
            matchers.append(matcher(names[key], values[0]))
        else:
            matchers.append(regex_matcher(names[key], values))
    return [*matchers, *extra]


def _braces(matchers: Sequence[str]) -> str:
    return "{" + ",".join(matchers) + "}" if matchers else ""


def _sum_rate(series: str, matchers: Sequence[str], group: Sequence[str]) -> str:
    by = f" by ({', '.join(group)})" if group else ""
    return f"sum{by} (rate({series}{_braces(matchers)}[{WINDOW_PLACEHOLDER}]))"


def _recipe_labels(slo: Slo, names: Mapping[str, str], group: Sequence[str]) -> dict[str, str]:
    labels = {names[key]: values[0] for key, values in slo.selector.items()}
    for label in group:
        labels.setdefault(label, f"{label}-a")
    return labels


def _group(slo: Slo, names: Mapping[str, str]) -> tuple[str, ...]:
    for key in slo.group_by:
        if key not in names:
            raise _Unsupported(f"its series carry no {key} label to group by")
    return tuple(names[key] for key in slo.group_by)


def _engine_latency(slo: Slo, sli: LatencySpec, index: int) -> tuple[str, str, SeriesRecipe]:
    where = f"slos[{index}].sli"
    if sli.dialect is None:
        raise ConfigError(
            f"{where}.dialect: rules need the engine dialect whose histogram to read "
            f"({', '.join(ENGINE_HISTOGRAMS)})"
        )
    table = ENGINE_HISTOGRAMS.get(sli.dialect)
    if table is None:
        raise ConfigError(
            f"{where}.dialect: unknown metric source {sli.dialect!r} (known: {', '.join(ENGINE_HISTOGRAMS)})"
        )
    if sli.metric not in table:
        raise ConfigError(f"{where}.metric: dialect {sli.dialect} has no {sli.metric} histogram")
    histogram, bounds = table[sli.metric]
    bound = _matching_bound(bounds, sli.threshold_s)
    if bound is None:
        near = sorted(sorted(bounds, key=lambda b: abs(b - sli.threshold_s))[:2])
        raise ConfigError(
            f"{where}.threshold_s: {sli.threshold_s:g} s is not a bucket bound of {histogram} "
            f"(nearest: {', '.join(f'{b:g}' for b in near)})"
        )
    group = _group(slo, ENGINE_LABELS)
    matchers = _selector(slo, ENGINE_LABELS)
    total = _sum_rate(f"{histogram}_count", matchers, group)
    good = _sum_rate(f"{histogram}_bucket", [*matchers, le_matcher(bound)], group)
    recipe = SeriesRecipe(
        "histogram", histogram, _recipe_labels(slo, ENGINE_LABELS, group), repr(bound)
    )
    return f"({total} - {good})", total, recipe


def _class_matchers(classes: OutcomeClasses, klass: OutcomeClass) -> list[list[str]]:
    """Disjoint matcher sets on the tap's counter whose union is the records of ``klass``,
    in :meth:`OutcomeClasses.classify`'s order: exact status, status class, outcome."""
    exact = [str(code) for k in OUTCOME_CLASSES for code in classes.codes(k)]
    ruled = exact + [f"{family}.." for k in OUTCOME_CLASSES for family in classes.families(k)]
    terms = []
    if codes := classes.codes(klass):
        terms.append(['outcome!="ok"', f'code=~"{"|".join(map(str, codes))}"'])
    if families := classes.families(klass):
        term = ['outcome!="ok"', f'code=~"{"|".join(f"{f}.." for f in families)}"']
        terms.append([*term, f'code!~"{"|".join(exact)}"'] if exact else term)
    unruled = [f'code!~"{"|".join(ruled)}"'] if ruled else []
    if klass == "good":
        terms.append(['outcome="ok"'])  # ok is good whatever its status
    if klass == "bad":  # as in the SQL, an outcome of no other class is bad
        others = [o for o in OUTCOMES if classes.outcomes.get(o, "bad") != "bad"]
        terms.append([f'outcome!~"{"|".join(others)}"', *unruled])
    elif outcomes := [o for o in classes.outcomes_of(klass) if o != "ok"]:
        terms.append([f'outcome=~"{"|".join(outcomes)}"', *unruled])
    return terms


def _tap_class(slo: Slo, group: Sequence[str], base: str, klass: OutcomeClass) -> str | None:
    """Events of ``klass`` per second from the tap's counter; None if no record has it."""
    names = {"pool": "pool", "instance": "instance"}
    terms = [
        # `or 0 * base`: no such event yet means no series at all; keep the group with 0.
        f"({_sum_rate(TAP_REQUESTS, _selector(slo, names, term), group)} or 0 * {base})"
        for term in _class_matchers(slo.outcome_classes, klass)
    ]
    return f"({' + '.join(terms)})" if terms else None


def _tap_failures(slo: Slo, group: Sequence[str], base: str) -> str:
    return _tap_class(slo, group, base, "bad") or f"(0 * {base})"


def _tap_latency(slo: Slo, sli: LatencySpec) -> tuple[str, str, SeriesRecipe]:
    if sli.metric not in TAP_HISTOGRAMS or sli.statistic != "p99":
        raise _Unsupported(f"the tap's {sli.metric} histogram is per chunk, not per request")
    histogram, bounds = TAP_HISTOGRAMS[sli.metric]
    bound = _matching_bound(bounds, sli.threshold_s)
    if bound is None:
        raise _Unsupported(f"{sli.threshold_s:g} s is not a bucket bound of {histogram}")
    if "model" in slo.selector:
        raise _Unsupported("the tap's request counter has no model label for the failures")
    group = _group(slo, TAP_LABELS)
    matchers = _selector(slo, TAP_LABELS)
    count = _sum_rate(f"{histogram}_count", matchers, group)
    good = _sum_rate(f"{histogram}_bucket", [*matchers, le_matcher(bound)], group)
    failures = _tap_failures(slo, group, count)
    recipe = SeriesRecipe(
        "histogram", histogram, _recipe_labels(slo, TAP_LABELS, group), repr(bound)
    )
    return f"({count} - {good} + {failures})", f"({count} + {failures})", recipe


def _tap_availability(slo: Slo) -> tuple[str, str, SeriesRecipe]:
    names = {"pool": "pool", "instance": "instance"}
    group = _group(slo, names)
    matchers = _selector(slo, names)
    every = _sum_rate(TAP_REQUESTS, matchers, group)
    excluded = _tap_class(slo, group, every, "excluded")
    total = f"({every} - {excluded})" if excluded else every
    recipe = SeriesRecipe(
        "outcome", TAP_REQUESTS, _recipe_labels(slo, names, group), excluded=_excluded_series(slo)
    )
    return _tap_failures(slo, group, every), total, recipe


#: Records a promtool test may use as excluded events, by preference.
_EXCLUDED_CANDIDATES = (("error_before_first_token", 404), ("client_cancelled", None))


def _excluded_series(slo: Slo) -> Mapping[str, str]:
    """Labels (outcome, code) of one series of excluded records, for generated tests."""
    for outcome, status in _EXCLUDED_CANDIDATES:
        if slo.outcome_classes.classify(outcome, status) == "excluded":
            return {"outcome": outcome, "code": "" if status is None else str(status)}
    return {}


def _queries(slo: Slo, index: int) -> tuple[str, str, SeriesRecipe]:
    sli = slo.sli
    if sli.source == "probe":
        raise _Unsupported("the prober's records are stored, not exported to Prometheus")
    if isinstance(sli, LatencySpec):
        if sli.source == "engine":
            return _engine_latency(slo, sli, index)
        return _tap_latency(slo, sli)
    if isinstance(sli, AvailabilitySpec):
        return _tap_availability(slo)
    raise _Unsupported("goodput needs every latency of one request at once")


def rule_model_from_slo(model: SloModel, source: str = "<spec>", strict: bool = False) -> RuleModel:
    """Convert a validated SLO model; ConfigError names the field path of an impossible SLI.

    An SLO that only the pipeline can compute exactly is skipped with its reason (listed in
    ``RuleModel.skipped``), or refused when ``strict``.
    """
    slos, skipped = [], []
    for index, slo in enumerate(model.slos):
        try:
            error, total, recipe = _queries(slo, index)
        except _Unsupported as why:
            message = (
                f"slos[{index}] {slo.name}: no Prometheus rule: {why} (the SLO jobs compute it)"
            )
            if strict:
                raise ConfigError(f"{source}: {message}") from None
            skipped.append(message)
            continue
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from exc
        slos.append(
            RuleSlo(
                id=slo.id,
                name=slo.name,
                service=slo.service,
                description=slo.description,
                objective=slo.objective,
                catalog=slo.catalog,
                pairs=slo.pairs,
                error_query=error,
                total_query=total,
                sli_kind=slo.sli.kind,
                alert_name=slo.alert_name,
                group_labels=_group_names(slo),
                min_events=slo.min_events,
                labels=dict(slo.labels),
                annotations=dict(slo.annotations),
                recipe=recipe,
            )
        )
    return RuleModel(source, tuple(slos), tuple(skipped))


def _group_names(slo: Slo) -> tuple[str, ...]:
    return tuple(ENGINE_LABELS.get(key, key) for key in slo.group_by)
