"""Every page rendered by Streamlit's AppTest on a history with faults, and on an empty file."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from dashboards import SOURCE_ENV
from dashboards.views import PAGES
from dashboards.views.fleet import EVERY_GROUP_KEY, TABLE_TABS, TABLES_KEY
from pipeline.schema import REQUEST_RECORDS
from pipeline.store import Store
from tests.dashboards.conftest import DEMO_SPAN_MS, DEMO_START_MS, END_MS, HOUR_MS, History
from tests.dashboards.test_charts import time_encodings_problems

_TIMEOUT_S = 60


def _page(path: str, **query: str) -> AppTest:
    app = AppTest.from_string(
        f"from dashboards.views import PAGES\nPAGES[{path!r}][2]()\n", default_timeout=_TIMEOUT_S
    )
    for key, value in query.items():
        app.query_params[key] = value
    return app.run()


def _text(app: AppTest) -> str:
    """Everything a reader sees as text: headings, metrics, captions, alerts, tables."""
    parts: list[str] = []
    for kind in (
        "title",
        "subheader",
        "caption",
        "info",
        "warning",
        "success",
        "error",
        "markdown",
        "text",
    ):
        parts += [str(e.value) for e in getattr(app, kind)]
    parts += [f"{m.label}={m.value}" for m in app.metric]
    parts += [df.value.to_csv() for df in app.dataframe]
    return "\n".join(parts)


@pytest.fixture
def on_history(history_db: History, monkeypatch: pytest.MonkeyPatch) -> Iterator[History]:
    monkeypatch.setenv(SOURCE_ENV, f"db:{history_db.path}")
    yield history_db


@pytest.fixture
def on_demo(demo_db: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv(SOURCE_ENV, f"db:{demo_db}")
    yield demo_db


@pytest.fixture
def on_empty(empty_db: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv(SOURCE_ENV, f"db:{empty_db}")
    yield empty_db


def _charts(app: AppTest) -> list[dict[str, Any]]:
    return [json.loads(chart.proto.spec) for chart in app.get("vega_lite_chart")]


def _chart_rows(app: AppTest) -> list[dict[str, Any]]:
    """Every row of every dataset the page's charts draw (Arrow IPC in the protobuf)."""
    rows: list[dict[str, Any]] = []
    for chart in app.get("vega_lite_chart"):
        for dataset in chart.proto.datasets:
            rows += pa.ipc.open_stream(dataset.data.data).read_all().to_pylist()
    return rows


def _requests(history: History, where: str = "true", *params: object) -> int:
    with duckdb.connect(str(history.path), read_only=True) as con:
        row = con.execute(f"SELECT count(*) FROM requests WHERE {where}", list(params)).fetchone()
    assert row is not None
    return int(row[0])


#: page → (least number of charts, texts that must appear) on the 2-day history.
EXPECTED = {
    "fleet": (4, ["chat-availability", "chat-ttft", "FIRING"]),
    "slo": (4, ["objective=99.000 %", "budget left=", "Bad events behind it"]),
    "latency": (3, ["TTFT p99 (worst bucket)=", "samples="]),
    "engines": (5, ["KV cache usage", "stall", "signature"]),
    "gpus": (4, ["Utilisation", "No XID error reported"]),
    "requests": (3, ["client requests=", "disconnects="]),
    "flags": (2, ["L1 → L2", "kv_usage", "resolved,stall"]),
    "canary": (1, ["fail=1", "ttft_p99,High", "Verdicts over time"]),
}


@pytest.mark.parametrize("path", list(PAGES))
def test_every_page_shows_the_history_without_an_exception(on_history: History, path: str) -> None:
    app = _page(path, range="30d")
    assert not app.exception, [e.value for e in app.exception]
    assert not app.error, [e.value for e in app.error]
    assert app.title[0].value == PAGES[path][0]
    least_charts, texts = EXPECTED[path]
    text = _text(app)
    assert len(_charts(app)) >= least_charts
    for expected in texts:
        assert expected in text, f"{expected!r} missing from the {path} page"
    assert "No data yet" not in text


def test_fleet_counts_every_request_of_the_period(on_history: History) -> None:
    table = _page("fleet", range="30d").dataframe[0].value
    availability = table[table["SLO"] == "chat-availability"].iloc[0]
    assert availability["events"] == f"{_requests(on_history):,}"
    # What an on-call reads first leads, then the burn rates (shortest window first).
    assert list(table.columns[:7]) == [
        "SLO", "group", "budget left", "alert", "burn 5m", "burn 30m", "burn 1h",
    ]  # fmt: skip


def test_fleet_draws_every_slo_groups_alerts_and_every_instances_level(
    on_history: History,
) -> None:
    app = _page("fleet", range="24h")
    rows = _chart_rows(app)
    alerts = [r for r in rows if "state" in r]
    pods = [f"chat-ttft · instance={pod}" for pod in on_history.instances]
    assert {r["slo"] for r in alerts} == {"chat-availability · all", *pods}
    assert {r["state"] for r in alerts} <= {"page", "ticket", "ok", "no events"}
    assert "page" in {r["state"] for r in alerts}  # the day's incident pages
    levels = [r for r in rows if "level" in r and "instance" in r]
    leaking = {r["level"] for r in levels if r["instance"].startswith(on_history.leaking)}
    assert leaking == {"L0", "L1", "L2"}  # L0 → L1 → L2 → L1 over the last 5 hours
    assert {r["instance"].split()[0] for r in levels} == set(on_history.instances)
    pools = [r for r in rows if "requests/s" in r or "p99_s" in r]
    assert {r["pool"] for r in pools} == {"llama-3-8b"}


def test_the_instance_filter_narrows_the_slo_rows_and_the_latency(on_history: History) -> None:
    pod = on_history.instances[2]
    fleet = _page("fleet", range="30d", instance=pod).dataframe[0].value
    assert set(fleet["group"]) == {"all", f"instance={pod}"}
    everyone = _page("latency", range="30d").metric
    one = _page("latency", range="30d", instance=pod).metric
    samples = {m.label: m.value for m in everyone}["samples"]
    narrowed = {m.label: m.value for m in one}["samples"]
    expected = _requests(on_history, "instance = ? AND ttft_s IS NOT NULL", pod)
    assert narrowed == f"{expected:,}" and int(samples.replace(",", "")) > expected


def test_the_slo_page_numbers_are_those_of_the_filtered_group(on_history: History) -> None:
    pod = on_history.instances[3]
    every = {m.label: m.value for m in _page("slo", range="30d", slo="chat-ttft").metric}
    one = {
        m.label: m.value for m in _page("slo", range="30d", slo="chat-ttft", instance=pod).metric
    }
    with duckdb.connect(str(on_history.path), read_only=True) as con:
        events = con.execute(
            "SELECT (status_json->>'events')::BIGINT, group_json FROM slo_status_current "
            "WHERE slo_id = 'chat-ttft'"
        ).fetchall()
    assert one["events"] == f"{dict((g, e) for e, g in events)[json.dumps({'instance': pod})]:,}"
    assert every["events"] == f"{sum(e for e, _ in events):,}"


def test_a_shorter_range_shows_fewer_requests(on_history: History) -> None:
    def requests(app: AppTest) -> int:
        return int({m.label: m.value for m in app.metric}["client requests"].replace(",", ""))

    day = requests(_page("requests"))
    hour = requests(_page("requests", range="1h"))
    assert 0 < hour < day < requests(_page("requests", range="30d"))
    assert day == _requests(on_history, "received_ts_ms >= ?", END_MS + 60_000 - 24 * HOUR_MS)


def test_slo_charts_draw_the_alert_thresholds_and_shade_the_incident(on_history: History) -> None:
    app = _page("slo", range="30d", slo="chat-ttft")
    rows = _chart_rows(app)
    thresholds = {r["threshold"]: r["value"] for r in rows if "threshold" in r}
    assert thresholds["budget exhausted"] == 0.0
    assert {14.4, 6.0, 3.0, 1.0} <= set(thresholds.values())  # page and ticket pairs, 30d
    shaded = [r for r in rows if "incident" in r]
    assert [r["incident"] for r in shaded][:1] == ["stall"]
    assert shaded[0]["end_ms"] - shaded[0]["start_ms"] == HOUR_MS  # firing → resolved
    marks = json.dumps(_charts(app))
    assert '"rect"' in marks and '"rule"' in marks and '"tooltip"' in marks


def test_an_empty_database_says_no_data_yet_on_every_page(on_empty: Path) -> None:
    for path in PAGES:
        app = _page(path)
        assert not app.exception, (path, [e.value for e in app.exception])
        assert any("No data yet" in str(i.value) for i in app.info), path


def test_a_bad_link_parameter_is_reported_and_ignored(on_history: History) -> None:
    app = _page("slo", **{"from": "yesterday", "to": "1", "range": "2y"})
    assert not app.exception
    assert app.warning[0].value == "Some link parameters were not used:"
    reported = app.text[0].value
    assert "'yesterday' is not epoch milliseconds" in reported and "range='2y'" in reported
    assert {m.label: m.value for m in app.metric}["objective"] == "99.000 %"


def test_a_source_that_cannot_be_read_is_a_message(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(SOURCE_ENV, f"db:{tmp_path / 'missing.duckdb'}")
    app = _page("fleet")
    assert not app.exception
    assert app.error[0].value == "Cannot read the data source:"
    assert "no such DuckDB file" in app.text[0].value


def test_fresh_data_makes_the_page_live_and_refreshing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "live.duckdb"
    now_ms = int(time.time() * 1000)
    row = {"request_id": "r1", "received_ts_ms": now_ms - 10_000, "attempt": 1, "instance": "pod-0",
           "pool": "p", "outcome": "ok", "ttft_s": 0.2}  # fmt: skip
    table = pa.Table.from_pylist(
        [{f.name: row.get(f.name) for f in REQUEST_RECORDS.arrow}], schema=REQUEST_RECORDS.arrow
    )
    with Store(path) as store:
        store.commit_batch({"requests": [table]}, group_id="t", offsets={}, now_ts_ms=0)
    monkeypatch.setenv(SOURCE_ENV, f"db:{path}")
    app = _page("requests")
    assert not app.exception
    assert any("live, refreshing every 30 s" in str(c.value) for c in app.caption)
    assert {m.label: m.value for m in app.metric}["client requests"] == "1"


def test_fleet_shows_the_client_requests_of_the_views_last_hour(on_history: History) -> None:
    app = _page("fleet", **{"from": str(END_MS - 6 * HOUR_MS), "to": str(END_MS)})
    shown = {m.label: m.value for m in app.metric}
    with duckdb.connect(str(on_history.path), read_only=True) as con:
        row = con.execute(
            "SELECT count(DISTINCT coalesce(original_request_id, request_id)), "
            "count(DISTINCT coalesce(original_request_id, request_id)) FILTER (outcome <> 'ok') "
            "FROM requests WHERE received_ts_ms >= ? AND received_ts_ms < ?",
            [END_MS - HOUR_MS, END_MS],
        ).fetchone()
    assert row is not None and row[0] > 0
    assert shown["client requests (last hour)"] == f"{row[0]:,}"
    assert shown["not ok (last hour)"] == f"{row[1]:,}"


def test_finding_rows_link_their_signals_runbook(
    on_history: History, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMSLO_RUNBOOK_BASE_URL", "https://runbooks.example/llm")
    tables = [df.value for df in _page("flags", range="30d").dataframe]
    (found,) = [t for t in tables if "signal" in t.columns and "runbook" in t.columns]
    assert len(found) > 0
    for signal, url in zip(found["signal"], found["runbook"], strict=True):
        assert url == f"https://runbooks.example/llm/{signal}.md"


#: A link a phisher could send: Markdown that would render as a link and fetch an image.
HOSTILE = "[re-login](http://evil.example) ![b](http://127.0.0.1:9/beacon.png) :red[x] $y$"


@pytest.mark.parametrize("path", ["latency", "slo", "fleet"])
def test_a_hostile_link_parameter_is_quoted_as_text_not_rendered(
    on_history: History, path: str
) -> None:
    app = _page(path, **{"from": HOSTILE, "pool": HOSTILE, "slo": HOSTILE, "range": HOSTILE})
    assert not app.exception, [e.value for e in app.exception]
    reported = app.text[0].value.splitlines()
    assert [line.split("=")[0] for line in reported] == ["from", "range"]
    assert reported[0].startswith("from='[re-login](http://evil.example) ![b](http://127.0.0.1:9/")
    if path == "slo":
        assert app.text[1].value.startswith("slo='[re-login](http://evil.example)")
    markdown = (*app.title, *app.subheader, *app.markdown, *app.caption, *app.info,
                *app.warning, *app.error, *app.success)  # fmt: skip
    for element in markdown:
        assert "evil" not in str(element.value) and "beacon" not in str(element.value)
    assert not [m.label for m in app.metric if "evil" in m.label]


@pytest.mark.parametrize(
    ("query", "problem"),
    [
        ({"from": "1", "to": "99999999999999999999"}, "to='99999999999999999999' is not epoch"),
        ({"from": "1", "to": "9999999999999"}, "to='9999999999999' is after 2100-01-01"),
        ({"from": "-5", "to": "1000"}, "from='-5' is not epoch milliseconds"),
        ({"from": "1", "to": "4102444800000"}, "from–to spans more than 366 days"),
        ({"instance": "pod\u202e-0"}, "instance='pod\\u202e-0' has control characters"),
    ],
    ids=["a time past pandas' datetimes", "a time past 2100", "a negative time",
         "a century-long range", "a bidi override in a name"],
)  # fmt: skip
def test_an_out_of_range_link_is_a_clear_message_and_the_default_range(
    on_history: History, query: dict[str, str], problem: str
) -> None:
    app = _page("fleet", **query)
    assert not app.exception, [e.value for e in app.exception]
    assert app.warning[0].value == "Some link parameters were not used:"
    assert problem in app.text[0].value
    assert "2026-09-20 14:01 → 2026-09-21 14:01 UTC" in " ".join(c.value for c in app.caption)


def _open_tab(app: AppTest, label: str) -> AppTest:
    """``app`` run again with its Fleet table tab ``label`` open (as a click on it does)."""
    app.session_state[TABLES_KEY] = label
    return app.run()


def test_fleet_counts_instances_that_never_left_l0_as_l0(on_history: History) -> None:
    app = _open_tab(_page("fleet", range="30d"), "Instances by level")
    counts = {m.label: m.value for m in app.metric}
    assert counts["L0 normal"] == "3" and counts["L1 no speculative decoding"] == "1"
    levels = next(df.value for df in app.dataframe if "level" in df.value.columns)
    assert sorted(i.split()[0] for i in levels["instance"]) == sorted(on_history.instances)
    assert set(levels[levels["level"] == "L0 normal"]["reason"]) == {"no transition"}


@pytest.mark.parametrize("path", list(PAGES))
def test_every_pages_time_axes_and_tooltips_are_utc_on_a_24_hour_clock(
    on_history: History, path: str
) -> None:
    specs = _charts(_page(path, range="30d"))
    assert [problem for spec in specs for problem in time_encodings_problems(spec)] == []


def _buckets(app: AppTest, column: str) -> list[int]:
    """The distinct buckets of the chart rows that have ``column``."""
    return sorted({r["bucket_ts_ms"] for r in _chart_rows(app) if r.get(column) is not None})


def test_a_two_minute_demo_under_the_default_day_draws_five_second_buckets(
    on_demo: Path,
) -> None:
    app = _page("latency")
    assert not app.exception, [e.value for e in app.exception]
    captions = " ".join(str(c.value) for c in app.caption)
    assert "24h selected · data covers 2.5 min · buckets of 5 s" in captions
    band = _buckets(app, "p90_s")
    assert len(band) == DEMO_SPAN_MS // 5_000  # a band, not one dot
    assert band[0] == DEMO_START_MS and all(b % 5_000 == 0 for b in band)


def test_the_demos_slo_budget_is_drawn_per_minute_from_its_rollups(on_demo: Path) -> None:
    app = _page("slo", slo="chat-availability")
    assert not app.exception, [e.value for e in app.exception]
    assert not app.warning, [w.value for w in app.warning]
    budget = _buckets(app, "budget_remaining")
    assert len(budget) >= 3 and all(b % 60_000 == 0 for b in budget)
    captions = " ".join(str(c.value) for c in app.caption)
    assert "buckets of 5 s (1 min for SLO budgets, from per-minute rollups)" in captions


def test_fleet_draws_one_table_a_load_and_each_other_is_one_tab_away(
    on_history: History,
) -> None:
    tables = {
        "SLOs": "SLOs",
        "Instances by level": "Instances by degradation level",
        "Active findings": "Active findings",
        "Changed in the last hour": "What changed in the last hour",
    }
    app = _page("fleet", range="30d")
    assert [tab.label for tab in app.tabs] == list(TABLE_TABS) == list(tables)
    assert len(app.dataframe) == 1 and "budget left" in app.dataframe[0].value.columns
    for label, heading in tables.items():
        opened = _open_tab(app, label) if label != "SLOs" else app
        assert not opened.exception, [e.value for e in opened.exception]
        headings = {h.value for h in opened.subheader}
        assert headings & set(tables.values()) == {heading}, label
        assert len(opened.dataframe) <= 1, label
    levels = _open_tab(app, "Instances by level").dataframe[0].value
    assert len(levels) == len(on_history.instances)


def test_past_the_strips_row_limit_the_page_says_how_many_groups_share_a_row(
    on_history: History, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dashboards.views.fleet.STRIP_ROWS", 2)
    app = _page("fleet", range="24h")
    drawn = {r["slo"] for r in _chart_rows(app) if "state" in r}
    own = {label for label in drawn if "other group" not in label}
    assert len(own) == 2
    assert drawn - own == {"chat-availability · 1 other group", "chat-ttft · 2 other groups"}
    captions = " ".join(str(c.value) for c in app.caption)
    assert "2 of 5 SLO groups have a row each" in captions
    assert "3 more share one row per SLO (chat-availability: 1, chat-ttft: 2)" in captions
    app.toggle(key=EVERY_GROUP_KEY).set_value(True)
    every = app.run()
    pods = {f"chat-ttft · instance={pod}" for pod in on_history.instances}
    assert {r["slo"] for r in _chart_rows(every) if "state" in r} == {
        "chat-availability · all",
        *pods,
    }
    assert "share one row" not in " ".join(str(c.value) for c in every.caption)


def _bad_per_instance(app: AppTest) -> dict[str, int]:
    """Bad requests per instance as the SLO page's "bad events" chart draws them."""
    totals: dict[str, int] = {}
    for row in _chart_rows(app):
        if {"instance", "outcome", "requests"} <= row.keys():
            totals[row["instance"]] = totals.get(row["instance"], 0) + int(row["requests"])
    return totals


def test_the_slo_pages_bad_events_draw_the_worst_instances_and_count_the_rest(
    on_history: History, monkeypatch: pytest.MonkeyPatch
) -> None:
    every = _bad_per_instance(_page("slo", range="30d"))
    assert len(every) == len(on_history.instances) == 4
    monkeypatch.setattr("dashboards.views.slo.BAD_INSTANCES", 2)
    app = _page("slo", range="30d")
    drawn = _bad_per_instance(app)
    assert drawn == {i: n for i, n in every.items() if i in drawn} and len(drawn) == 2
    assert min(drawn.values()) >= max(n for i, n in every.items() if i not in drawn)
    hidden = sum(n for i, n in every.items() if i not in drawn)
    captions = " ".join(str(c.value) for c in app.caption)
    assert (
        f"The 2 instances with the most bad requests; 2 more instances had {hidden:,}" in captions
    )
