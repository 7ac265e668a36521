"""A real browser: headless Debian Chromium loads the app that `llmslo dashboard --api` serves
(reading the real `llmslo api` over the history with faults) and visits every page.

Screenshots are kept under ``var/screenshots/dashboards/`` as artifacts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import duckdb
import pytest

from dashboards.filters import deep_link
from dashboards.views import PAGES
from tests.conftest import require_tool
from tests.dashboards import profiles
from tests.dashboards.browser import HeadlessChromium, blank
from tests.dashboards.conftest import END_MS, HOUR_MS, History
from tests.loopback import RecordingServer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "var" / "screenshots" / "dashboards"
#: page → charts it must draw on the history.
LEAST_CHARTS = {
    "fleet": 4,
    "slo": 4,
    "latency": 3,
    "engines": 5,
    "gpus": 4,
    "requests": 3,
    "flags": 2,
    "canary": 1,
}


def _llmslo(*args: str) -> tuple[subprocess.Popen[str], str]:
    """``llmslo ARGS`` as a subprocess; (process, its first line of output)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "llmslo", *args],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert process.stdout is not None
    return process, process.stdout.readline()


def start_dashboard(*source: str) -> tuple[subprocess.Popen[str], str]:
    """``llmslo dashboard SOURCE --port 0`` as a subprocess; (process, URL it printed)."""
    process, line = _llmslo("dashboard", *source, "--port", "0")
    assert line.startswith("dashboard: http://127.0.0.1:"), line
    return process, line.split()[1].rstrip("/")


def start_api(db: Path) -> tuple[subprocess.Popen[str], str]:
    """``llmslo api --db DB --read-only --api-port 0``; (process, URL it serves on)."""
    process, line = _llmslo("api", "--db", str(db), "--read-only", "--api-port", "0")
    assert line.startswith("serving the API (read-only) on http://127.0.0.1:"), line
    return process, line.split()[5]


@pytest.fixture(scope="module")
def chromium() -> Iterator[HeadlessChromium]:
    with HeadlessChromium(require_tool("chromium", "chromium-browser")) as browser:
        yield browser


@pytest.fixture(scope="module")
def dashboard(history_db: History) -> Iterator[str]:
    api, api_url = start_api(history_db.path)
    process, url = start_dashboard("--api", api_url)
    try:
        yield url
    finally:
        for child in (process, api):
            child.terminate()
        for child in (process, api):
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


@pytest.mark.parametrize("path", list(PAGES))
def test_every_page_renders_in_chromium_without_an_exception(
    chromium: HeadlessChromium, dashboard: str, path: str
) -> None:
    chromium.open(deep_link(dashboard, path, range="30d"), timeout_s=90)
    state = chromium.state()
    png = chromium.screenshot(SHOTS / f"{path}.png")
    assert state["title"] == PAGES[path][0]
    assert state["exceptions"] == [] and state["errors"] == []
    assert state["drawn"] >= LEAST_CHARTS[path], state
    assert "No data yet" not in state["text"] and "Page not found" not in state["text"]
    assert not blank(png)


def test_a_recorded_load_says_where_the_browsers_time_went(
    chromium: HeadlessChromium, dashboard: str
) -> None:
    seconds, cpu_profile, trace = chromium.record(deep_link(dashboard, "fleet", range="30d"), 90)
    threads = profiles.trace_self_ms(trace)
    main = threads["Renderer/CrRendererMain"]
    scripts = dict(profiles.js_self_ms(cpu_profile, by="file"))
    slices = profiles.timeline(trace)
    assert seconds > 0 and chromium.state()["drawn"] >= 4
    assert main["busy"] > 0 and main["scripting"] > 0 and main["style & layout"] > 0
    assert any(name.endswith(".js") for name in scripts), scripts  # the frontend's own scripts
    assert sum(row["frames"] for row in slices) > 0  # Streamlit's deltas, on the timeline
    assert sum(row.get("scripting", 0.0) for row in slices) > 0
    # Recording ends with the load: the next load is an ordinary one.
    assert chromium.events == {}
    chromium.open(deep_link(dashboard, "latency", range="30d"), timeout_s=90)
    assert chromium.state()["title"] == "Latency"


#: Top edges (px, in the page) of the first drawn chart and of the first table.
_FIRST_JS = """(() => {
  const top = (s) => { const e = document.querySelector(s);
                       return e ? e.getBoundingClientRect().top : null; };
  return {chart: top('[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg.marks'),
          table: top('[data-testid="stDataFrame"]'),
          width: window.innerWidth};
})()"""


def test_the_fleet_page_opens_with_pictures_above_its_tables(
    chromium: HeadlessChromium, dashboard: str
) -> None:
    chromium.call(
        "Emulation.setDeviceMetricsOverride", width=1440, height=2200, deviceScaleFactor=1,
        mobile=False,
    )  # fmt: skip
    try:
        chromium.open(deep_link(dashboard, "fleet", range="24h"), timeout_s=90)
        state = chromium.state()
        tops = chromium.call("Runtime.evaluate", expression=_FIRST_JS, returnByValue=True)
        png = chromium.screenshot(SHOTS / "fleet-pictures.png")
    finally:
        chromium.call("Emulation.clearDeviceMetricsOverride")
    first = tops["result"]["value"]
    assert state["exceptions"] == [] and state["errors"] == []
    assert first["width"] == 1440
    assert state["drawn"] >= 4, state  # alert strip, requests/s, p99 TTFT, level strip
    assert first["chart"] is not None and first["table"] is not None, first
    assert first["chart"] < first["table"], first
    assert "SLO alerts over time" in state["text"] and not blank(png)


def test_an_alert_link_opens_the_slo_page_with_its_filters(
    chromium: HeadlessChromium, dashboard: str, history_db: History
) -> None:
    pod = history_db.instances[0]
    start_ms, end_ms = END_MS - 6 * HOUR_MS, END_MS
    link = deep_link(
        dashboard,
        "slo",
        slo="chat-ttft",
        pool="llama-3-8b",
        instance=pod,
        from_ms=start_ms,
        to_ms=end_ms,
    )
    chromium.open(link, timeout_s=90)
    state = chromium.state()
    chromium.screenshot(SHOTS / "slo-deep-link.png")
    assert state["title"] == "SLO" and state["exceptions"] == []
    text = " ".join(state["text"].split())
    assert "objective 99.500 %" in text and pod in text  # chat-ttft's objective, this pod
    assert f"events {_group_events(history_db, pod):,}" in text  # this pod's group, not all four
    assert "2026-09-21 08:00 → 2026-09-21 14:00 UTC" in text  # the link's range, not the default
    assert "slo=chat-ttft" in state["url"] and "instance=" + pod in state["url"].replace("%3A", ":")


def _group_events(history: History, pod: str) -> int:
    with duckdb.connect(str(history.path), read_only=True) as con:
        row = con.execute(
            "SELECT (status_json->>'events')::BIGINT FROM slo_status_current "
            "WHERE slo_id = 'chat-ttft' AND group_json = ?",
            [json.dumps({"instance": pod})],
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_an_empty_database_shows_no_data_yet_in_the_browser(
    chromium: HeadlessChromium, empty_db: Path
) -> None:
    process, url = start_dashboard("--db", str(empty_db))
    try:
        chromium.open(deep_link(url, "latency"), timeout_s=90)
        state = chromium.state()
        chromium.screenshot(SHOTS / "empty-latency.png")
    finally:
        process.terminate()
        process.wait(timeout=20)
    assert state["exceptions"] == [] and "No data yet" in state["text"]


@pytest.fixture
def beacon() -> Iterator[RecordingServer]:
    """An image server on loopback that remembers every request it received."""
    with RecordingServer(content_type="image/png") as server:
        yield server


_LINKS_JS = "Array.from(document.querySelectorAll('a[href], img[src]')).map(e => e.href || e.src)"


def test_a_hostile_link_renders_no_link_and_fetches_no_image(
    chromium: HeadlessChromium, dashboard: str, beacon: RecordingServer
) -> None:
    hostile = f"[re-login](http://evil.example) ![b]({beacon.url}/beacon.png)"
    query = urlencode({"from": hostile, "pool": hostile, "instance": hostile, "slo": hostile})
    for path in ("latency", "slo"):
        chromium.open(f"{dashboard}/{path}?{query}", timeout_s=90)
        state = chromium.state()
        chromium.screenshot(SHOTS / f"hostile-{path}.png")
        targets = chromium.call("Runtime.evaluate", expression=_LINKS_JS, returnByValue=True)
        assert state["exceptions"] == [], state["exceptions"]
        elsewhere = [t for t in targets["result"]["value"] if not t.startswith(dashboard)]
        assert not [t for t in elsewhere if "evil" in t or beacon.url in t], elsewhere
        assert "from='[re-login](http://evil.example) ![b](" in state["text"]  # quoted as text
    assert beacon.received == []


def test_an_out_of_range_time_is_a_message_not_a_traceback(
    chromium: HeadlessChromium, dashboard: str
) -> None:
    chromium.open(f"{dashboard}/fleet?from=1&to=99999999999999999999", timeout_s=90)
    state = chromium.state()
    assert state["exceptions"] == [] and "OutOfBoundsDatetime" not in state["text"]
    assert "to='99999999999999999999' is not epoch milliseconds" in state["text"]
    assert "2026-09-20 14:01 → 2026-09-21 14:01 UTC" in state["text"]  # the default range


#: Per chart on the page, its Vega marks as drawn (SVG): each layer's mark kind, how many
#: items it drew and how wide (px) they spread.
_MARKS_JS = """Array.from(document.querySelectorAll('[data-testid="stVegaLiteChart"]')).map(c =>
  Array.from(c.querySelectorAll('svg.marks g.role-mark')).map(g => ({
    mark: (g.getAttribute('class').match(/mark-([a-z]+)/) || [])[1],
    items: g.children.length, width_px: Math.round(g.getBBox().width)})))"""


def test_a_two_minute_demo_draws_a_latency_band_not_a_dot(
    chromium: HeadlessChromium, demo_db: Path
) -> None:
    process, url = start_dashboard("--db", str(demo_db))
    try:
        chromium.open(deep_link(url, "latency"), timeout_s=90)
        state = chromium.state()
        answer = chromium.call("Runtime.evaluate", expression=_MARKS_JS, returnByValue=True)
        chromium.screenshot(SHOTS / "demo-latency.png")
    finally:
        process.terminate()
        process.wait(timeout=20)
    assert state["exceptions"] == [] and state["errors"] == []
    band_chart = {layer["mark"]: layer for layer in answer["result"]["value"][0]}
    # One bucket draws one (invisible) point and a band of no width.
    assert band_chart["symbol"]["items"] == 30, band_chart  # 2.5 min in 5 s buckets
    assert band_chart["area"]["width_px"] > 300, band_chart  # the p50–p99 band spans them
    assert "24h selected · data covers 2.5 min · buckets of 5 s" in state["text"]
