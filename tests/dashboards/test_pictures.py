"""Pictures first: every page opens on a drawn chart above its first table, and buckets and
time axes fit the data (DESIGN §8, issue 32).

AppTest reads the charts' Vega-Lite specs (what would be drawn: UTC axes, buckets); headless
Chromium at 1,440 px loads every page over the demo-like file and the two-day history and
checks what a user sees: a drawn chart above the first visible table, no exception box,
nothing wider than the window and no metric cut off. Screenshots are kept under
``var/screenshots/dashboards/pictures/``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from dashboards import SOURCE_ENV
from dashboards.filters import deep_link
from dashboards.views import PAGES
from tests.conftest import require_tool
from tests.dashboards.browser import HeadlessChromium, blank
from tests.dashboards.conftest import DEMO_END_MS, DEMO_SPAN_MS, History
from tests.dashboards.test_browser import SHOTS, start_dashboard

PICTURE_SHOTS = SHOTS / "pictures"


def _page(path: str, **query: str) -> AppTest:
    app = AppTest.from_string(
        f"from dashboards.views import PAGES\nPAGES[{path!r}][2]()\n", default_timeout=60
    )
    for key, value in query.items():
        app.query_params[key] = value
    return app.run()


def _specs(app: AppTest) -> list[dict[str, Any]]:
    return [json.loads(chart.proto.spec) for chart in app.get("vega_lite_chart")]


def _chart_rows(app: AppTest) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for chart in app.get("vega_lite_chart"):
        for dataset in chart.proto.datasets:
            rows += pa.ipc.open_stream(dataset.data.data).read_all().to_pylist()
    return rows


def _x_encodings(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every x channel of a (possibly layered) spec."""
    for layer in [spec, *spec.get("layer", [])]:
        x = layer.get("encoding", {}).get("x")
        if x:
            yield x
        yield from (
            e
            for sub in layer.get("layer", [])
            for e in _x_encodings({"encoding": sub.get("encoding", {})})
        )


@pytest.fixture
def on_demo(demo_db: History, monkeypatch: pytest.MonkeyPatch) -> History:
    monkeypatch.setenv(SOURCE_ENV, f"db:{demo_db.path}")
    return demo_db


def test_the_fleet_page_draws_burn_traffic_latency_and_levels_over_the_demo(
    on_demo: History,
) -> None:
    app = _page("fleet")
    assert not app.exception, [e.value for e in app.exception]
    titles = [s.value for s in app.subheader]
    assert titles[:5] == [
        "SLO burn rate",
        "Request rate per pool",
        "p99 TTFT per pool",
        "Degradation level per instance",
        "SLOs",
    ]  # the pictures before the first table's heading
    rows = _chart_rows(app)
    strip = [r for r in rows if "pair" in r]
    assert {r["slo_id"] for r in strip} == {"chat-availability", "chat-ttft"}
    levels = [r for r in rows if "level" in r and "rank" in r]
    # The leaking pod is drawn L0 → L1 → L2, still L2 at the data's end; nobody else moved.
    assert {r["instance"].split()[0] for r in levels} == {on_demo.leaking}
    assert [r["level"] for r in sorted(levels, key=lambda r: r["start_ms"])] == ["L0", "L1", "L2"]
    assert max(r["end_ms"] for r in levels) == DEMO_END_MS + 1
    assert min(r["start_ms"] for r in levels) >= DEMO_END_MS - DEMO_SPAN_MS  # clipped to data
    rates = [r for r in rows if "requests/s" in r]
    assert len({r["time"] for r in rates}) >= 20  # 5-s buckets: a line, not a dot


def test_buckets_follow_the_demos_two_and_a_half_minutes_and_say_so(on_demo: History) -> None:
    for path in ("slo", "latency", "fleet"):
        app = _page(path)
        assert not app.exception, [e.value for e in app.exception]
        captions = " ".join(str(c.value) for c in app.sidebar.caption)
        assert "buckets of 5 s (data covers 2 min" in captions, captions
        assert "SLO charts 1 min" in captions
    latency = _chart_rows(_page("latency"))
    band = [r for r in latency if "p99_s" in r and "bucket_ts_ms" in r]
    assert len({r["bucket_ts_ms"] for r in band}) >= 20
    assert {r["bucket_ts_ms"] % 5_000 for r in band} == {0}


@pytest.mark.parametrize("path", ["fleet", "slo", "latency", "engines", "requests", "flags"])
def test_every_time_axis_is_utc_on_a_24_hour_clock(on_demo: History, path: str) -> None:
    specs = _specs(_page(path))
    axes = [x for spec in specs for x in _x_encodings(spec) if x.get("type") == "temporal"]
    assert axes, f"no time axis on the {path} page"
    for x in axes:
        assert x.get("scale", {}).get("type") == "utc", x
    titled = [x for x in axes if x.get("title")]
    assert titled and all(x["title"] == "time (UTC)" for x in titled)
    labels = [x["axis"]["labelExpr"] for x in axes if "axis" in x]
    assert labels and all("utcFormat" in e and "%H:%M" in e and "%I" not in e for e in labels)


def test_the_slo_table_leads_with_the_alert_and_the_budget(on_demo: History) -> None:
    table = _page("fleet").dataframe[0].value
    assert list(table.columns[:4]) == ["SLO", "group", "alert", "budget left"]


#: Where a user would see the page break: what is above the first table, what overflows.
_LAYOUT_JS = """(() => {
  const shown = (e) => { const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  const top = (e) => e.getBoundingClientRect().top;
  const charts = Array.from(document.querySelectorAll('[data-testid="stVegaLiteChart"]'))
    .filter(e => shown(e) && e.querySelector('canvas, svg.marks'));
  const tables = Array.from(document.querySelectorAll(
    '[data-testid="stDataFrame"], [data-testid="stTable"]')).filter(shown);
  const main = document.querySelector('[data-testid="stMain"]') || document.body;
  // Wider than the window and not inside a frame that clips it (a table scrolls inside).
  const clipped = (e) => {
    for (let a = e.parentElement; a && a !== main; a = a.parentElement) {
      const o = getComputedStyle(a).overflowX;
      if (o !== 'visible' && a.getBoundingClientRect().right <= window.innerWidth + 1) return true;
    }
    return false;
  };
  const name = (e) => {
    const owner = e.closest('[data-testid]');
    return (owner ? owner.getAttribute('data-testid') + '>' : '') + e.tagName;
  };
  const wide = Array.from(main.querySelectorAll('*')).filter(e => shown(e) &&
    e.getBoundingClientRect().right > window.innerWidth + 1 && !clipped(e)).map(e =>
    name(e) + ' ' + Math.round(e.getBoundingClientRect().right));
  const cut = Array.from(document.querySelectorAll(
    '[data-testid="stMetricValue"] div, [data-testid="stMetricLabel"] p, h1, h2, h3'))
    .filter(e => shown(e) && e.scrollWidth > e.clientWidth + 1).map(e => e.innerText.slice(0, 80));
  return {
    first_chart: charts.length ? top(charts[0]) : null,
    first_table: tables.length ? top(tables[0]) : null,
    charts: charts.length, tables: tables.length,
    page_width: document.scrollingElement.scrollWidth, window_width: window.innerWidth,
    main_width: main.scrollWidth, main_client: main.clientWidth,
    wide: wide.slice(0, 10), cut: cut.slice(0, 10),
  };
})()"""


@pytest.fixture(scope="module")
def chromium() -> Iterator[HeadlessChromium]:
    with HeadlessChromium(require_tool("chromium", "chromium-browser")) as browser:
        browser.call(
            "Emulation.setDeviceMetricsOverride", width=1440, height=2200, deviceScaleFactor=1,
            mobile=False,
        )  # fmt: skip
        yield browser


@pytest.fixture(scope="module", params=["demo", "history"])
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(name, URL) of ``llmslo dashboard --db`` over the demo-like file or the history."""
    db: History = request.getfixturevalue(f"{request.param}_db")
    process, url = start_dashboard("--db", str(db.path))
    try:
        yield request.param, url
    finally:
        process.terminate()
        process.wait(timeout=20)


@pytest.mark.slow
@pytest.mark.parametrize("path", list(PAGES))
def test_every_page_opens_on_a_drawn_chart_above_its_first_table_at_1440_px(
    chromium: HeadlessChromium, served: tuple[str, str], path: str
) -> None:
    name, url = served
    query = {} if name == "demo" else {"range": "30d"}
    chromium.open(deep_link(url, path, **query), timeout_s=90)
    state = chromium.state()
    png = chromium.screenshot(PICTURE_SHOTS / name / f"{path}.png")
    layout = chromium.call("Runtime.evaluate", expression=_LAYOUT_JS, returnByValue=True)
    found = layout["result"]["value"]
    assert state["title"] == PAGES[path][0]
    assert state["exceptions"] == [] and state["errors"] == [], state["exceptions"]
    assert "No data yet" not in state["text"], state["text"][:2000]
    assert found["charts"] >= 1, found
    if found["first_table"] is not None:
        assert found["first_chart"] < found["first_table"], found
    assert found["page_width"] <= found["window_width"], found
    assert found["main_width"] <= found["main_client"] + 1, found
    assert found["wide"] == [] and found["cut"] == [], found
    assert not blank(png)
