"""Chart specs: every time axis and tooltip reads UTC on a 24-hour clock, whatever the
browser's time zone."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest

from dashboards.charts import band_chart, incidents_frame, line_chart, step_chart
from pipeline.units import DAY_MS, HOUR_MS, MINUTE_MS, SECOND_MS

#: 18:45:05 UTC, an hour a 12-hour clock shows as 06:45.
T0_MS = 1_790_016_305_000


def _frame(span_ms: int, points: int = 6) -> pd.DataFrame:
    times = [T0_MS + i * span_ms // (points - 1) for i in range(points)]
    return pd.DataFrame(
        {
            "time": pd.to_datetime(times, unit="ms", utc=True),
            "value": [float(i) for i in range(points)],
            "pool": "p",
            "to_level": 1,
        }
    )


def _incidents() -> pd.DataFrame:
    findings = pd.DataFrame(
        {
            "ts_ms": [T0_MS, T0_MS + MINUTE_MS],
            "state": ["firing", "resolved"],
            "signal": ["stall", "stall"],
            "scope": ["instance", "instance"],
            "scope_id": ["pod-0", "pod-0"],
            "severity": ["page", "page"],
        }
    )
    return incidents_frame(findings, T0_MS + HOUR_MS)


CHARTS = {
    "line": lambda df: line_chart(df, "value", y_title="v", incidents=_incidents()),
    "band": lambda df: band_chart(
        df, low="value", high="value", mid="value", y_title="v", color="pool",
        incidents=_incidents(),
    ),
    "step": lambda df: step_chart(df, y="to_level", y_title="level", color="pool"),
}  # fmt: skip


def _encodings(spec: Any) -> Iterator[tuple[str, Any]]:
    """Every (channel, definition) of every layer of ``spec``."""
    if isinstance(spec, dict):
        yield from (spec.get("encoding") or {}).items()
        for value in spec.values():
            yield from _encodings(value)
    elif isinstance(spec, list):
        for value in spec:
            yield from _encodings(value)


def time_encodings_problems(spec: dict[str, Any]) -> list[str]:
    """What in ``spec`` would show a time in the browser's zone or on a 12-hour clock."""
    problems = []
    for channel, definition in _encodings(spec):
        for item in definition if isinstance(definition, list) else [definition]:
            if not isinstance(item, dict) or item.get("type") != "temporal":
                continue
            if channel == "x2":  # shares the x scale and axis
                continue
            if channel != "x":
                problems.append(f"{channel} {item.get('field')}: a time outside the x axis")
                continue
            scale, axis = item.get("scale") or {}, item.get("axis") or {}
            label = axis.get("format", "")
            if scale.get("type") != "utc" or item.get("title") != "UTC":
                problems.append(f"x {item.get('field')}: scale {scale}, title {item.get('title')}")
            if "%H" not in label or "%I" in label or "%p" in label:
                problems.append(f"x {item.get('field')}: label format {label!r}")
    return problems


@pytest.mark.parametrize("kind", list(CHARTS))
def test_every_time_encoding_is_utc_on_a_24_hour_clock(kind: str) -> None:
    spec = CHARTS[kind](_frame(2 * MINUTE_MS)).to_dict()
    assert time_encodings_problems(spec) == []
    tooltips = [
        item
        for channel, definition in _encodings(spec)
        if channel == "tooltip"
        for item in (definition if isinstance(definition, list) else [definition])
        if isinstance(item, dict)
    ]
    assert {"time_utc"} <= {t["field"] for t in tooltips}


@pytest.mark.parametrize("kind", list(CHARTS))
def test_tooltips_show_the_utc_time_as_text(kind: str) -> None:
    chart = CHARTS[kind](_frame(2 * MINUTE_MS))
    rows = [
        row
        for data in chart.to_dict()["datasets"].values()
        for row in data
        if "time_utc" in row or "start_utc" in row
    ]
    texts = {row.get("time_utc") or row.get("start_utc") for row in rows}
    assert "2026-09-21 18:45:05 UTC" in texts  # not 06:45, not the browser's zone


@pytest.mark.parametrize(
    ("span_ms", "label"),
    [
        (2 * MINUTE_MS + 30 * SECOND_MS, "%H:%M:%S"),
        (6 * HOUR_MS, "%H:%M"),
        (DAY_MS, "%H:%M"),
        (2 * DAY_MS, "%m-%d %H:%M"),
    ],
    ids=["a demo's minutes", "hours", "a day", "days"],
)
def test_time_labels_carry_seconds_for_minutes_and_the_date_past_a_day(
    span_ms: int, label: str
) -> None:
    spec = line_chart(_frame(span_ms), "value", y_title="v").to_dict()
    assert spec["encoding"]["x"]["axis"]["format"] == label


def test_the_incident_shading_keeps_the_charts_axis() -> None:
    """An hour-long incident on a two-day chart: the shared axis stays dated."""
    spec = line_chart(_frame(2 * DAY_MS), "value", y_title="v", incidents=_incidents()).to_dict()
    formats = {
        item["axis"]["format"]
        for channel, item in _encodings(spec)
        if channel == "x" and isinstance(item, dict)
    }
    assert formats == {"%m-%d %H:%M"}
