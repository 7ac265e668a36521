"""Altair charts of time series: thresholds drawn as labelled rules, incidents shaded, and a
tooltip on every point. Inputs are pandas frames with a ``time`` column (datetime, UTC).

Every time axis and tooltip reads UTC on a 24-hour clock, through :func:`utc_time`: a Vega
time scale otherwise follows the browser's time zone and labels minutes on a 12-hour clock
without AM/PM (``06:45`` for 18:45 UTC)."""

from __future__ import annotations

import re
from collections.abc import Sequence

import altair as alt
import pandas as pd
import pyarrow as pa

__all__ = [
    "ALERT_COLOURS",
    "LEVEL_COLOURS",
    "VERDICT_COLOURS",
    "alert_strip",
    "band_chart",
    "frame",
    "incidents_frame",
    "level_strip",
    "line_chart",
    "step_chart",
    "utc_time",
    "verdict_strip",
]

_HEIGHT = 220
#: Axis label format by the longest span it shows (ms): seconds for a few minutes, the
#: date past a day; all UTC, 24-hour clock.
_AXIS_FORMATS = ((15 * 60_000, "%H:%M:%S"), (24 * 3_600_000, "%H:%M"))
_DATED_AXIS_FORMAT = "%m-%d %H:%M"
#: Tooltip time: the instant in full, as text computed here (Vega would format it in the
#: browser's time zone).
_TOOLTIP_FORMAT = "%Y-%m-%d %H:%M:%S UTC"


def utc_time(df: pd.DataFrame, field: str = "time") -> tuple[pd.DataFrame, alt.X, alt.Tooltip]:
    """The encodings of the datetime column ``field`` of ``df`` in UTC on a 24-hour clock:
    ``df`` with a ``{field}_utc`` text column, the x encoding (UTC scale titled "UTC",
    labels ``%H:%M``, with seconds for a span under 15 minutes and the date past a day),
    and the tooltip showing that text."""
    times = pd.to_datetime(df[field], utc=True)
    span_ms = (times.max() - times.min()).total_seconds() * 1000 if len(times) else 0.0
    axis_format = next((f for most, f in _AXIS_FORMATS if span_ms <= most), _DATED_AXIS_FORMAT)
    x = alt.X(
        f"{field}:T",
        title="UTC",
        scale=alt.Scale(type="utc"),
        axis=alt.Axis(format=axis_format, labelOverlap=True),
    )
    tooltip = alt.Tooltip(f"{field}_utc:N", title=f"{field} (UTC)")
    return df.assign(**{f"{field}_utc": times.dt.strftime(_TOOLTIP_FORMAT)}), x, tooltip


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
    x: alt.X,
    thresholds: Sequence[tuple[float, str]],
    incidents: pd.DataFrame | None,
) -> alt.LayerChart | alt.Chart:
    """``chart`` (time on ``x``) over shaded ``incidents`` and under ``thresholds``."""
    layers: list[alt.Chart] = []
    if incidents is not None and not incidents.empty:
        shaded, _, start_tip = utc_time(incidents, "start")
        shaded, _, end_tip = utc_time(shaded, "end")
        # The chart's own axis (its span's label format), not one fitted to the incidents.
        spec = x.to_dict()
        assert isinstance(spec, dict)
        start_x = alt.X.from_dict({**spec, "field": "start"})
        layers.append(
            alt.Chart(shaded)
            .mark_rect(color="#d62728", opacity=0.12)
            .encode(x=start_x, x2="end:T", tooltip=[alt.Tooltip("incident:N"), start_tip, end_tip])
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
    df, x, when = utc_time(df)
    tooltip = [when, alt.Tooltip(f"{y}:Q", format=y_format)]
    encoding: dict[str, object] = {
        "x": x,
        "y": alt.Y(f"{y}:Q", title=y_title, axis=alt.Axis(format=y_format)),
    }
    if color:
        encoding["color"] = alt.Color(f"{color}:N", title=color)
        tooltip.insert(0, alt.Tooltip(f"{color}:N"))
    chart = alt.Chart(df).mark_line(point=len(df) < 60).encode(**encoding, tooltip=tooltip)
    return _decorate(chart.properties(height=_HEIGHT), x, thresholds, incidents).properties(
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
    df, x, when = utc_time(df)
    tooltip = [
        alt.Tooltip(f"{color}:N"),
        when,
        alt.Tooltip(f"{low}:Q", format=y_format),
        alt.Tooltip(f"{mid}:Q", format=y_format),
        alt.Tooltip(f"{high}:Q", format=y_format),
    ]
    base = alt.Chart(df).encode(x=x, color=alt.Color(f"{color}:N", title=color))
    band = base.mark_area(opacity=0.2).encode(
        y=alt.Y(f"{low}:Q", title=y_title, axis=alt.Axis(format=y_format)), y2=f"{high}:Q"
    )
    line = base.mark_line().encode(y=f"{mid}:Q", tooltip=tooltip)
    points = base.mark_point(opacity=0, size=60).encode(y=f"{high}:Q", tooltip=tooltip)
    chart = alt.layer(band, line, points)
    return _decorate(chart, x, thresholds, incidents).properties(height=_HEIGHT)  # type: ignore[arg-type]


def step_chart(df: pd.DataFrame, *, y: str, y_title: str, color: str) -> alt.Chart:
    """Levels that hold until the next change (degradation flags), one line per ``color``."""
    shown, x, when = utc_time(df)
    return (
        alt.Chart(shown)
        .mark_line(interpolate="step-after", point=True)
        .encode(
            x=x,
            y=alt.Y(
                f"{y}:Q", title=y_title, scale=alt.Scale(domain=[0, 3]), axis=alt.Axis(tickCount=4)
            ),
            color=alt.Color(f"{color}:N", title=color),
            tooltip=[c for c in df.columns if c not in ("time",)] + [when],
        )
        .properties(height=_HEIGHT)
    )


#: Alert-state colours of the SLO strip, worst first (red page, amber ticket, green ok).
ALERT_COLOURS = {"page": "#d62728", "ticket": "#ff9f1c", "ok": "#2ca02c", "no events": "#d9d9d9"}
#: Degradation-level colours of the instance strip, L0 (normal) to L3 (economy mode).
LEVEL_COLOURS = {"L0": "#2ca02c", "L1": "#f2cc0c", "L2": "#ff7f0e", "L3": "#d62728"}
#: Canary verdict colours (fail red, inconclusive grey, pass green).
VERDICT_COLOURS = {"fail": "#d62728", "inconclusive": "#9e9e9e", "pass": "#2ca02c"}
#: A strip row's height (px): full for a few rows, thinner for many so that a fleet of 64
#: still fits in about 640 px (labels shrink with the rows).
_ROW_PX, _MIN_ROW_PX, _STRIP_PX = 22, 10, 400


def _natural(label: str) -> list[tuple[int, str]]:
    """Sort key reading digit runs as numbers: ``pod-2`` before ``pod-10``."""
    return [(int(part), "") if part.isdigit() else (-1, part) for part in re.split(r"(\d+)", label)]


def _strip(
    df: pd.DataFrame,
    *,
    row: str,
    colour: str,
    colours: dict[str, str],
    legend: str,
    tooltip: Sequence[alt.Tooltip],
) -> alt.Chart:
    """Rows × time of rectangles ``start``–``end`` coloured by ``colour`` on a fixed scale."""
    rows = max(1, df[row].nunique()) if row in df else 1
    row_px = max(_MIN_ROW_PX, min(_ROW_PX, _STRIP_PX // rows))
    if "start" in df:
        df, x, start_tip = utc_time(df, "start")
        df, _, end_tip = utc_time(df, "end")
        tooltip = [*tooltip, start_tip, end_tip]
    else:
        x = alt.X("start:T", title="UTC", scale=alt.Scale(type="utc"))
    return (
        alt.Chart(df)
        .mark_rect()
        .encode(
            x=x,
            x2="end:T",
            y=alt.Y(
                f"{row}:N",
                title=None,
                sort=sorted(set(df[row]), key=_natural) if row in df else None,
                axis=alt.Axis(labelLimit=320, labelFontSize=min(11, row_px - 2)),
            ),
            color=alt.Color(
                f"{colour}:N",
                title=legend,
                scale=alt.Scale(domain=list(colours), range=list(colours.values())),
                legend=alt.Legend(orient="top"),
            ),
            tooltip=list(tooltip),
        )
        # Streamlit's default autosize ("fit", padding included) would squeeze a short
        # strip's rows under its legend and axis: fit the width only, the height is the rows'.
        .properties(
            height=rows * row_px, autosize=alt.AutoSizeParams(type="fit-x", contains="padding")
        )
    )


def alert_strip(df: pd.DataFrame) -> alt.Chart:
    """SLO groups × time, each cell the worst alert pair firing then (:data:`ALERT_COLOURS`).

    ``df``: ``slo`` (row label), ``start``/``end`` (UTC datetimes), ``state``, ``detail``."""
    return _strip(
        df,
        row="slo",
        colour="state",
        colours=ALERT_COLOURS,
        legend="alert",
        tooltip=[
            alt.Tooltip("slo:N"),
            alt.Tooltip("state:N", title="alert"),
            alt.Tooltip("detail:N", title="burn long / short (× budget) at the end"),
        ],
    )


def level_strip(df: pd.DataFrame) -> alt.Chart:
    """Instances × time, each span its degradation level (:data:`LEVEL_COLOURS`).

    ``df``: ``instance`` (row label), ``start``/``end`` (UTC datetimes), ``level``, ``reason``."""
    return _strip(
        df,
        row="instance",
        colour="level",
        colours=LEVEL_COLOURS,
        legend="level",
        tooltip=[
            alt.Tooltip("instance:N"),
            alt.Tooltip("level:N"),
            alt.Tooltip("reason:N"),
        ],
    )


def verdict_strip(df: pd.DataFrame) -> alt.Chart:
    """Canaries × time, each span the window a verdict judged (:data:`VERDICT_COLOURS`).

    ``df``: ``canary`` (row label), ``start``/``end`` (UTC datetimes), ``verdict``,
    ``reason``."""
    return _strip(
        df,
        row="canary",
        colour="verdict",
        colours=VERDICT_COLOURS,
        legend="verdict",
        tooltip=[alt.Tooltip("canary:N"), alt.Tooltip("verdict:N"), alt.Tooltip("reason:N")],
    )
