"""Altair charts of time series: thresholds drawn as labelled rules, incidents shaded, and a
tooltip on every point. Inputs are pandas frames with a ``time`` column (datetime, UTC).

Every time axis and tooltip is UTC on a 24-hour clock (:func:`time_x`, :func:`time_tip`),
labelled so: the viewer's browser zone and Vega's 12-hour default (``06 PM``) once turned
18:45 UTC into ``06:45``, and the findings, alerts and logs an SRE compares with are UTC.
"""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import pandas as pd
import pyarrow as pa

__all__ = [
    "BELOW_PAIRS",
    "LEVEL_COLOURS",
    "TIME_TITLE",
    "band_chart",
    "frame",
    "incidents_frame",
    "level_chart",
    "line_chart",
    "step_chart",
    "strip_chart",
    "time_tip",
    "time_x",
]

_HEIGHT = 220
TIME_TITLE = "time (UTC)"
#: Tick labels: the date at midnight, seconds when a tick has them, else hours:minutes.
_UTC_LABEL = (
    "utchours(datum.value) == 0 && utcminutes(datum.value) == 0 && utcseconds(datum.value) == 0"
    " ? utcFormat(datum.value, '%b %d') : utcseconds(datum.value) != 0"
    " ? utcFormat(datum.value, '%H:%M:%S') : utcFormat(datum.value, '%H:%M')"
)


def time_x(field: str = "time", *, title: str | None = TIME_TITLE) -> alt.X:
    """The x channel of a time axis: UTC scale, 24-hour labels, titled ``time (UTC)``."""
    return alt.X(
        f"{field}:T",
        title=title,
        scale=alt.Scale(type="utc"),
        axis=alt.Axis(labelExpr=_UTC_LABEL, labelOverlap=True),
    )


def time_tip(field: str = "time", *, seconds: bool = False) -> alt.Tooltip:
    """A tooltip of a time field: ``2026-09-21 18:45 UTC`` (24-hour, UTC)."""
    return alt.Tooltip(
        f"{field}:T",
        title=f"{field} (UTC)",
        format="%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M",
        formatType="utc",
    )


def frame(table: pa.Table, time_column: str = "bucket_ts_ms") -> pd.DataFrame:
    """``table`` as pandas with ``time`` (UTC datetime) from the epoch-ms ``time_column``."""
    df = table.to_pandas()
    if time_column in df:
        df["time"] = pd.to_datetime(df[time_column], unit="ms", utc=True)
    return df


def incidents_frame(findings: pd.DataFrame, end_ms: int) -> pd.DataFrame:
    """Page-severity findings as ``start``/``end`` intervals (open ones end at ``end_ms``)."""
    rows = []
    if not findings.empty:
        ordered = findings.sort_values("ts_ms")
        for (_, _, _), group in ordered.groupby(["signal", "scope", "scope_id"]):
            opened: int | None = None
            for state, ts_ms, severity, label in zip(
                group["state"], group["ts_ms"], group["severity"], group["signal"], strict=True
            ):
                if state == "firing" and severity == "page" and opened is None:
                    opened = int(ts_ms)
                elif state == "resolved" and opened is not None:
                    rows.append((opened, int(ts_ms), label))
                    opened = None
            if opened is not None:
                rows.append((opened, end_ms, group["signal"].iloc[0]))
    df = pd.DataFrame(rows, columns=["start_ms", "end_ms", "incident"])
    df["start"] = pd.to_datetime(df["start_ms"], unit="ms", utc=True)
    df["end"] = pd.to_datetime(df["end_ms"], unit="ms", utc=True)
    return df


def _decorate(
    chart: alt.Chart,
    thresholds: Sequence[tuple[float, str]],
    incidents: pd.DataFrame | None,
) -> alt.LayerChart | alt.Chart:
    layers: list[alt.Chart] = []
    if incidents is not None and not incidents.empty:
        layers.append(
            alt.Chart(incidents)
            .mark_rect(color="#d62728", opacity=0.12)
            .encode(
                x=time_x("start"),
                x2="end:T",
                tooltip=[alt.Tooltip("incident:N"), time_tip("start"), time_tip("end")],
            )
        )
    layers.append(chart)
    if thresholds:
        rules = pd.DataFrame(thresholds, columns=["value", "threshold"])
        base = alt.Chart(rules)
        layers.append(
            base.mark_rule(strokeDash=[6, 4], color="#b22222").encode(
                y="value:Q", tooltip=["threshold:N", "value:Q"]
            )
        )
        for index, (value, label) in enumerate(thresholds):
            # Close thresholds (KV 90/95/99 %) would print over each other: stagger labels.
            layers.append(
                alt.Chart(pd.DataFrame([{"value": value, "threshold": label}]))
                .mark_text(align="left", dx=4 + 150 * index, dy=-6, color="#b22222", fontSize=11)
                .encode(y="value:Q", text="threshold:N", x=alt.value(0))
            )
    if len(layers) == 1:
        return chart
    return alt.layer(*layers).resolve_scale(color="independent")


def line_chart(
    df: pd.DataFrame,
    y: str,
    *,
    y_title: str,
    color: str | None = None,
    y_format: str = ",.2f",
    thresholds: Sequence[tuple[float, str]] = (),
    incidents: pd.DataFrame | None = None,
) -> alt.LayerChart | alt.Chart:
    """A line per ``color`` value of ``y`` over ``time``."""
    tooltip = [time_tip(), alt.Tooltip(f"{y}:Q", format=y_format)]
    encoding: dict[str, object] = {
        "x": time_x(),
        "y": alt.Y(f"{y}:Q", title=y_title, axis=alt.Axis(format=y_format)),
    }
    if color:
        encoding["color"] = alt.Color(f"{color}:N", title=color)
        tooltip.insert(0, alt.Tooltip(f"{color}:N"))
    chart = alt.Chart(df).mark_line(point=len(df) < 60).encode(**encoding, tooltip=tooltip)
    return _decorate(chart.properties(height=_HEIGHT), thresholds, incidents).properties(
        height=_HEIGHT
    )


def band_chart(
    df: pd.DataFrame,
    *,
    low: str,
    high: str,
    mid: str,
    y_title: str,
    color: str,
    y_format: str = ",.3f",
    thresholds: Sequence[tuple[float, str]] = (),
    incidents: pd.DataFrame | None = None,
) -> alt.LayerChart | alt.Chart:
    """A shaded ``low``–``high`` band and a ``mid`` line per ``color`` value over ``time``."""
    tooltip = [
        alt.Tooltip(f"{color}:N"),
        time_tip(),
        alt.Tooltip(f"{low}:Q", format=y_format),
        alt.Tooltip(f"{mid}:Q", format=y_format),
        alt.Tooltip(f"{high}:Q", format=y_format),
    ]
    base = alt.Chart(df).encode(x=time_x(), color=alt.Color(f"{color}:N", title=color))
    band = base.mark_area(opacity=0.2).encode(
        y=alt.Y(f"{low}:Q", title=y_title, axis=alt.Axis(format=y_format)), y2=f"{high}:Q"
    )
    line = base.mark_line().encode(y=f"{mid}:Q", tooltip=tooltip)
    points = base.mark_point(opacity=0, size=60).encode(y=f"{high}:Q", tooltip=tooltip)
    chart = alt.layer(band, line, points)
    return _decorate(chart, thresholds, incidents).properties(height=_HEIGHT)  # type: ignore[arg-type]


def step_chart(df: pd.DataFrame, *, y: str, y_title: str, color: str) -> alt.Chart:
    """Levels that hold until the next change (degradation flags), one line per ``color``."""
    return (
        alt.Chart(df)
        .mark_line(interpolate="step-after", point=True)
        .encode(
            x=time_x(),
            y=alt.Y(
                f"{y}:Q", title=y_title, scale=alt.Scale(domain=[0, 3]), axis=alt.Axis(tickCount=4)
            ),
            color=alt.Color(f"{color}:N", title=color),
            tooltip=[c for c in df.columns if c not in ("time",)] + [time_tip(seconds=True)],
        )
        .properties(height=_HEIGHT)
    )


#: Degradation levels L0–L3: green to dark red (DESIGN §3's names are on the Fleet page).
LEVEL_COLOURS = ("#a1d99b", "#fdae6b", "#e6550d", "#a50f15")
#: Burn-strip colours: the page pairs' reds, the ticket pairs' oranges, then below them all.
_PAGE_COLOURS = ("#67000d", "#a50f15", "#d7301f", "#ef3b2c")
_TICKET_COLOURS = ("#fd8d3c", "#fdae6b", "#fdd0a2", "#feedde")
BELOW_PAIRS = "below every pair"
_BELOW_COLOUR = "#c7e9c0"


def strip_chart(df: pd.DataFrame, pairs: Sequence[tuple[str, str]]) -> alt.Chart:
    """The burn-rate strip: one row per ``slo_id``, one cell per bucket (``time``–``end``)
    coloured by ``pair``, the highest window pair whose factor the burn rate reaches.

    ``pairs`` are (label, severity) from the highest factor down; the legend lists them in
    that order, then :data:`BELOW_PAIRS`."""
    pages = iter(_PAGE_COLOURS)
    tickets = iter(_TICKET_COLOURS)
    colours = [
        next(pages, _PAGE_COLOURS[-1]) if sev == "page" else next(tickets, _TICKET_COLOURS[-1])
        for _, sev in pairs
    ]
    domain = [label for label, _ in pairs] + [BELOW_PAIRS]
    rows = df["slo_id"].nunique()
    return (
        alt.Chart(df)
        .mark_rect()
        .encode(
            x=time_x(),
            x2="end:T",
            y=alt.Y("slo_id:N", title=None, axis=alt.Axis(labelLimit=260)),
            color=alt.Color(
                "pair:N",
                title="highest pair reached",
                scale=alt.Scale(domain=domain, range=[*colours, _BELOW_COLOUR]),
                legend=alt.Legend(orient="right", labelLimit=220),
            ),
            tooltip=[
                alt.Tooltip("slo_id:N", title="SLO"),
                time_tip(),
                alt.Tooltip("burn_rate:Q", title="burn rate (× budget)", format=",.2f"),
                alt.Tooltip("pair:N", title="highest pair reached"),
                alt.Tooltip("total:Q", title="events", format=","),
                alt.Tooltip("bad:Q", title="bad events", format=","),
            ],
        )
        .properties(height=max(60, 28 * rows))
    )


def level_chart(df: pd.DataFrame) -> alt.Chart:
    """Degradation level over time: one row per ``instance``, intervals ``time``–``end``
    coloured by ``level`` (``L0`` … ``L3``), the worst instances first (``rank``)."""
    rows = df["instance"].nunique()
    return (
        alt.Chart(df)
        .mark_rect()
        .encode(
            x=time_x(),
            x2="end:T",
            y=alt.Y(
                "instance:N",
                title=None,
                sort=alt.EncodingSortField("rank", order="ascending"),
                axis=alt.Axis(labelLimit=260),
            ),
            color=alt.Color(
                "level:N",
                title="level",
                scale=alt.Scale(domain=["L0", "L1", "L2", "L3"], range=list(LEVEL_COLOURS)),
            ),
            tooltip=[
                alt.Tooltip("instance:N"),
                alt.Tooltip("level:N"),
                time_tip(seconds=True),
                time_tip("end", seconds=True),
                alt.Tooltip("reason:N"),
            ],
        )
        .properties(height=max(60, 24 * rows))
    )
