"""The engines/GPUs board: one graph per canonical signal over every exposed metric name the
dialect maps give it (``collectors/dialects/*.yaml``), and the failure-signature alerts
firing. The panels are a table (:data:`ENGINE_PANELS`, :data:`GPU_PANELS`); the PromQL is
derived from the maps, so a new dialect shows up here without touching this module."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from grafana_foundation_sdk.builders import dashboard as dashboard_b
from grafana_foundation_sdk.models import dashboard

from alerts.grafana._panels import (
    DATASOURCE,
    PanelBuilder,
    Query,
    base_dashboard,
    table_panel,
    timeseries_panel,
)
from alerts.signatures import SIGNATURES
from collectors.dialects import MetricRule, load_dialects
from pipeline.signals import ENGINE_SIGNALS, GPU_SIGNALS, Signal

__all__ = ["ENGINE_PANELS", "GPU_PANELS", "QUANTILE", "SignalPanel", "engines_board", "signal_expr"]

#: The latency quantile the histogram panels show (the SLOs' p99).
QUANTILE = 0.99
_ENGINE_BY = "pool, instance"
# dcgm-exporter renamed Hostname to hostname; grouping by both keeps either version's label.
_GPU_BY = "Hostname, hostname, gpu"
_POOL = 'pool=~"$pool"'


@dataclass(frozen=True)
class SignalPanel:
    """One graph: a canonical signal, its title and Grafana unit, and how engines combine
    (``sum`` or ``max`` for gauges; counters are per-second rates, histograms p99)."""

    signal: str
    title: str
    unit: str
    aggregation: str = "sum"


ENGINE_PANELS: tuple[SignalPanel, ...] = (
    SignalPanel("running", "Running requests", "short"),
    SignalPanel("waiting", "Waiting requests", "short"),
    SignalPanel("kv_usage", "KV cache usage", "percentunit", "max"),  # a fraction: never summed
    SignalPanel("generation_tokens", "Generated tokens/s", "short"),
    SignalPanel("prompt_tokens", "Prompt tokens/s", "short"),
    SignalPanel("preemptions", "Preemptions/s", "short"),
    SignalPanel("ttft", "TTFT p99", "s"),
    SignalPanel("tpot", "TPOT p99", "s"),
    SignalPanel("itl", "Inter-token latency p99", "s"),
    SignalPanel("e2e", "End-to-end latency p99", "s"),
    SignalPanel("queue_time", "Queue time p99", "s"),
)
GPU_PANELS: tuple[SignalPanel, ...] = (
    SignalPanel("gpu_util", "GPU utilisation", "percent", "max"),
    SignalPanel("engine_active", "Graphics engine active", "percentunit", "max"),
    SignalPanel("fb_used_mib", "Frame buffer used", "decmbytes", "max"),
    SignalPanel("temperature_c", "GPU temperature", "celsius", "max"),
    SignalPanel("power_w", "GPU power", "watt", "max"),
    SignalPanel("xid", "Last XID error code", "none", "max"),
)


def _selector(name: str, rule: MetricRule, value: str | None, topic: str) -> str:
    matchers = [f'{rule.label}="{value}"'] if rule.label is not None else []
    if topic == "engine":
        matchers.append(_POOL)
    return name + ("{" + ", ".join(matchers) + "}" if matchers else "")


def _term(
    name: str, rule: MetricRule, value: str | None, kind: str, panel: SignalPanel, topic: str
) -> str:
    by = _ENGINE_BY if topic == "engine" else _GPU_BY
    if kind == "histogram":
        bucket = _selector(f"{name}_bucket", rule, value, topic)
        expr = f"histogram_quantile({QUANTILE:g}, sum by (le, {by}) (rate({bucket}[$__rate_interval])))"
    elif kind == "counter":
        expr = f"sum by ({by}) (rate({_selector(name, rule, value, topic)}[$__rate_interval]))"
    else:
        expr = f"{panel.aggregation} by ({by}) ({_selector(name, rule, value, topic)})"
    return expr if rule.scale == 1.0 else f"{expr} * {rule.scale:g}"


def _values_of(rule: MetricRule, signal: str) -> list[str | None]:
    """The label values of ``rule`` that map to ``signal`` (``[None]``: the whole metric)."""
    if rule.label is None:
        return [None] if rule.signal == signal else []
    return [value for value, mapped in rule.values.items() if mapped == signal]


def signal_expr(panel: SignalPanel, topic: str) -> str:
    """The PromQL of ``panel``: one term per exposed metric that maps to its signal, joined
    with ``or``. Deprecated aliases (``unless`` in the map) come last, so where an engine
    exposes both names the current one wins, as in the collectors."""
    vocabulary: Mapping[str, Signal] = ENGINE_SIGNALS if topic == "engine" else GPU_SIGNALS
    kind = vocabulary[panel.signal].kind
    current: list[str] = []
    aliases: list[str] = []
    for dialect in load_dialects().values():
        if dialect.topic != topic:
            continue
        for name, rule in dialect.metrics.items():
            for value in _values_of(rule, panel.signal):
                term = _term(name, rule, value, kind, panel, topic)
                (aliases if rule.unless else current).append(term)
    terms = list(dict.fromkeys(current + aliases))
    return "\nor\n".join(terms)


def _signal_panel(panel: SignalPanel, topic: str) -> PanelBuilder:
    legend = (
        "{{pool}} {{instance}}" if topic == "engine" else "{{Hostname}}{{hostname}} GPU {{gpu}}"
    )
    vocabulary = ENGINE_SIGNALS if topic == "engine" else GPU_SIGNALS
    return timeseries_panel(
        panel.title,
        [Query(signal_expr(panel, topic), legend)],
        panel.unit,
        width=8,
        description=vocabulary[panel.signal].doc,
    )


def _signature_alerts() -> Query:
    names = "|".join(sorted({sig.alert for sig in SIGNATURES}))
    return Query(f'ALERTS{{alertstate="firing", alertname=~"{names}"}}')


def _pool_variable() -> dashboard_b.QueryVariable:
    return (
        dashboard_b.QueryVariable("pool")
        .label("Pool")
        .datasource(DATASOURCE)
        .query("label_values(llmslo:engine_running:sum, pool)")
        .multi(True)
        .include_all(True)
        .all_value(".*")  # also the engines whose scrape sets no pool label
        .refresh(dashboard.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dashboard.VariableSort.ALPHABETICAL_ASC)
    )


def engines_board(
    uid: str = "llmslo-engines", title: str = "llmslo engines and GPUs"
) -> dashboard_b.Dashboard:
    """The engines/GPUs board: failure-signature alerts firing, then engine and GPU rows."""
    board = base_dashboard(
        uid,
        title,
        ["llmslo", "engines", "gpu"],
        "Generated by `llmslo dashboards grafana` from llmslo's engine dialect maps; reads "
        "what the engines and dcgm-exporter expose and the alerts of `llmslo rules generate`.",
    ).with_variable(_pool_variable())
    board = board.with_row(dashboard_b.Row("Failure signatures firing"))
    board = board.with_panel(
        table_panel(
            "Signature alerts firing",
            [_signature_alerts()],
            "Stalls, KV levels, preemption cascades, XIDs, restarts, targets down.",
        )
    )
    board = board.with_row(dashboard_b.Row("Engines"))
    for panel in ENGINE_PANELS:
        board = board.with_panel(_signal_panel(panel, "engine"))
    board = board.with_row(dashboard_b.Row("GPUs"))
    for panel in GPU_PANELS:
        board = board.with_panel(_signal_panel(panel, "gpu"))
    return board
