"""The strip chart builders: data in, the Vega-Lite spec a browser draws out."""

from __future__ import annotations

from typing import Any

import pandas as pd

from dashboards.charts import (
    ALERT_COLOURS,
    LEVEL_COLOURS,
    VERDICT_COLOURS,
    alert_strip,
    level_strip,
    verdict_strip,
)

T0 = pd.Timestamp("2026-09-21 08:00", tz="UTC")


def _spans(row: str, colour: str, values: list[tuple[str, str]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                row: name,
                colour: value,
                "start": T0 + pd.Timedelta(minutes=5 * i),
                "end": T0 + pd.Timedelta(minutes=5 * (i + 1)),
                "detail": "page ×14.4: 20.0 / 30.0",
                "reason": "kv_free_ratio",
            }
            for i, (name, value) in enumerate(values)
        ]
    )


def _spec(chart: Any) -> dict[str, Any]:
    spec: dict[str, Any] = chart.to_dict()
    return spec


def test_the_alert_strip_is_rectangles_over_time_coloured_page_ticket_ok() -> None:
    df = _spans(
        "slo", "state", [("chat-ttft · instance=a", "page"), ("chat-ttft · instance=b", "ok")]
    )
    spec = _spec(alert_strip(df))
    enc = spec["encoding"]
    assert spec["mark"]["type"] == "rect"
    assert (enc["x"]["field"], enc["x"]["type"], enc["x2"]["field"]) == ("start", "temporal", "end")
    assert (enc["y"]["field"], enc["y"]["type"]) == ("slo", "nominal")
    assert enc["color"]["field"] == "state"
    scale = enc["color"]["scale"]
    assert scale["domain"][:3] == ["page", "ticket", "ok"]  # worst first, fixed colours
    assert dict(zip(scale["domain"], scale["range"], strict=True)) == ALERT_COLOURS
    assert ALERT_COLOURS["page"] != ALERT_COLOURS["ticket"] != ALERT_COLOURS["ok"]
    assert {t["field"] for t in enc["tooltip"]} >= {"slo", "state", "start_utc", "detail"}
    assert enc["x"]["scale"]["type"] == "utc" and enc["x"]["title"] == "UTC"
    assert spec["height"] == 2 * 22  # one row per SLO group


def test_the_level_strip_colours_l0_to_l3_on_a_fixed_scale() -> None:
    df = _spans("instance", "level", [("pod-a", "L0"), ("pod-a", "L2"), ("pod-b", "L0")])
    spec = _spec(level_strip(df))
    enc = spec["encoding"]
    assert spec["mark"]["type"] == "rect"
    assert (enc["x"]["field"], enc["x2"]["field"], enc["y"]["field"]) == (
        "start",
        "end",
        "instance",
    )
    assert enc["color"]["scale"]["domain"] == ["L0", "L1", "L2", "L3"]
    assert enc["color"]["scale"]["range"] == list(LEVEL_COLOURS.values())
    assert enc["y"]["sort"] == ["pod-a", "pod-b"]
    assert {t["field"] for t in enc["tooltip"]} >= {"instance", "level", "reason"}


def test_a_strip_of_many_rows_stays_about_a_screen_tall() -> None:
    many = _spans("instance", "level", [(f"pod-{i:02d}", "L0") for i in range(64)])
    few = _spans("instance", "level", [(f"pod-{i}", "L0") for i in range(3)])
    assert _spec(level_strip(few))["height"] == 3 * 22
    assert _spec(level_strip(many))["height"] == 64 * 10  # 10 px rows, not 64 × 22 = 1,408


def test_strip_rows_sort_pod_2_before_pod_10() -> None:
    df = _spans("instance", "level", [("pod-10", "L0"), ("pod-2", "L1"), ("pod-1", "L0")])
    assert _spec(level_strip(df))["encoding"]["y"]["sort"] == ["pod-1", "pod-2", "pod-10"]


def test_the_verdict_strip_draws_each_judged_window_coloured_by_its_verdict() -> None:
    df = _spans("canary", "verdict", [("chat · instances=pod-1", "fail"), ("chat · v2", "pass")])
    spec = _spec(verdict_strip(df))
    enc = spec["encoding"]
    assert spec["mark"]["type"] == "rect"
    assert (enc["x"]["field"], enc["x2"]["field"], enc["y"]["field"]) == ("start", "end", "canary")
    assert (
        dict(zip(enc["color"]["scale"]["domain"], enc["color"]["scale"]["range"], strict=True))
        == VERDICT_COLOURS
    )
    assert VERDICT_COLOURS["fail"] == ALERT_COLOURS["page"]  # a failed canary reads as a page
    assert {t["field"] for t in enc["tooltip"]} >= {"canary", "verdict", "reason", "start_utc"}
