"""The few panel shapes both boards use, built with the Grafana Foundation SDK, and the JSON
rendering (sorted keys, sequential panel ids: the same input gives the same bytes)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, Self, TypeVar

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dashboard_b
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common, dashboard
from grafana_foundation_sdk.models import prometheus as prometheus_m

__all__ = [
    "DATASOURCE",
    "PanelBuilder",
    "Query",
    "base_dashboard",
    "render_dashboard",
    "stat_panel",
    "table_panel",
    "thresholds",
    "timeseries_panel",
]

#: What a dashboard's ``with_panel`` takes: a builder of any panel type.
PanelBuilder = cogbuilder.Builder[dashboard.Panel]

#: Every panel reads the Prometheus the dashboard's ``datasource`` variable picks.
DATASOURCE = dashboard.DataSourceRef(type_val="prometheus", uid="${datasource}")


@dataclass(frozen=True)
class Query:
    """One PromQL target: the expression and the legend Grafana draws for its series."""

    expr: str
    legend: str = ""


class _PanelMethods(Protocol):
    """What every panel builder of the SDK has (each type defines its own copy)."""

    def title(self, title: str) -> Self: ...
    def description(self, description: str) -> Self: ...
    def datasource(self, datasource: dashboard.DataSourceRef) -> Self: ...
    def span(self, w: int) -> Self: ...
    def height(self, h: int) -> Self: ...
    def with_target(self, target: prometheus.Dataquery) -> Self: ...


_P = TypeVar("_P", bound=_PanelMethods)


def _framed(
    panel: _P,
    title: str,
    description: str,
    queries: Sequence[Query],
    size: tuple[int, int],
    instant: bool = False,
    table: bool = False,
) -> _P:
    """``panel`` titled, on the ``datasource`` variable, ``size`` (width, height) in grid
    units, with one target per query (refIds A, B, …)."""
    width, height = size
    panel = panel.title(title).description(description).datasource(DATASOURCE)
    panel = panel.span(width).height(height)
    for index, query in enumerate(queries):
        target = prometheus.Dataquery().expr(query.expr).ref_id(chr(ord("A") + index))
        if query.legend:
            target = target.legend_format(query.legend)
        target = target.instant() if instant else target.range()
        if table:
            target = target.format(prometheus_m.PromQueryFormat.TABLE)
        panel = panel.with_target(target)
    return panel


def thresholds(*steps: tuple[float | None, str]) -> dashboard_b.ThresholdsConfig:
    """Absolute threshold steps ``(from value, colour)``; the first step's value is ``None``."""
    return (
        dashboard_b.ThresholdsConfig()
        .mode(dashboard.ThresholdsMode.ABSOLUTE)
        .steps([dashboard.Threshold(value=value, color=color) for value, color in steps])
    )


def stat_panel(
    title: str,
    queries: Sequence[Query],
    unit: str,
    steps: dashboard_b.ThresholdsConfig,
    width: int = 6,
    description: str = "",
) -> stat.Panel:
    """A single-value panel showing each series' last value, coloured by ``steps``."""
    panel = (
        stat.Panel()
        .unit(unit)
        .thresholds(steps)
        .color_scheme(dashboard_b.FieldColor().mode(dashboard.FieldColorModeId.THRESHOLDS))
        .graph_mode(common.BigValueGraphMode.NONE)
        .color_mode(common.BigValueColorMode.BACKGROUND)
        .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    return _framed(panel, title, description, queries, (width, 4), instant=True)


def timeseries_panel(
    title: str,
    queries: Sequence[Query],
    unit: str,
    steps: dashboard_b.ThresholdsConfig | None = None,
    width: int = 12,
    description: str = "",
) -> timeseries.Panel:
    """A line graph; with ``steps`` their values are drawn as dashed threshold lines."""
    panel = (
        timeseries.Panel()
        .unit(unit)
        .legend(
            common_b.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .line_width(1)
        .fill_opacity(10)
    )
    if steps is not None:
        panel = panel.thresholds(steps).thresholds_style(
            common_b.GraphThresholdsStyleConfig().mode(common.GraphTresholdsStyleMode.DASHED)
        )
    return _framed(panel, title, description, queries, (width, 8))


def table_panel(title: str, queries: Sequence[Query], description: str = "") -> table.Panel:
    """A table of the series an instant query returns, one row per series."""
    panel = table.Panel().show_header(True)
    return _framed(panel, title, description, queries, (24, 6), instant=True, table=True)


def base_dashboard(
    uid: str, title: str, tags: Sequence[str], description: str
) -> dashboard_b.Dashboard:
    """A dashboard with the ``datasource`` variable (any Prometheus), refreshing every minute."""
    return (
        dashboard_b.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(list(tags))
        .refresh("1m")
        .time("now-6h", "now")
        .timezone("browser")
        .editable()
        .with_variable(
            dashboard_b.DatasourceVariable("datasource").label("Data source").type("prometheus")
        )
    )


def render_dashboard(builder: dashboard_b.Dashboard) -> str:
    """The dashboard as JSON text (two-space indent, sorted keys, trailing newline); panels
    are numbered 1, 2, … in layout order, since Grafana needs ids unique within a board."""
    model = builder.build()
    next_id = 1
    for panel in model.panels or []:
        panel.id_val = next_id
        next_id += 1
    return json.dumps(model, cls=JSONEncoder, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
