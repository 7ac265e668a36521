"""Pictures first, on every page: headless Debian Chromium at 1,440 px loads every page of
``llmslo dashboard --db`` over two files a new user opens, and each page must draw a chart
(a Vega canvas or SVG of nonzero size) above its first table, raise no exception and cut
no text off.

The files: what ``llmslo demo --seconds 30`` leaves (a stall and a KV leak on a simulated
fleet) and what ``llmslo sim history`` writes (an hour and a quarter of 4 pods, replayed
by default so it has SLO status, findings and flags). Neither computes a canary verdict
(Argo Rollouts or Flagger ask for one), so each gets one, stored as the API stores it.

Screenshots: ``var/screenshots/dashboards/pictures/{file}-{page}.png`` (CI keeps
``var/screenshots/`` as an artefact); the test output names the directory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from api.verdicts import VerdictStore
from dashboards.filters import deep_link
from dashboards.views import PAGES
from tests.dashboards.browser import HeadlessChromium, blank
from tests.dashboards.conftest import END_MS
from tests.dashboards.test_browser import SHOTS, _llmslo, chromium, start_dashboard  # noqa: F401

pytestmark = pytest.mark.slow

PICTURES = SHOTS / "pictures"
WIDTH_PX = 1440

#: Top (px) of the first drawn chart and of the first visible table; text cut off: leaf
#: elements whose text overflows their box (an ellipsis) or the window's right edge; the
#: warnings shown (a query the page could not read is one).
_LAYOUT_JS = """(() => {
  const main = document.querySelector('[data-testid="stMain"]') || document.body;
  const sized = (e) => { const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  const first = (s) => { const e = Array.from(main.querySelectorAll(s)).find(sized);
                         return e ? e.getBoundingClientRect().top : null; };
  const cut = [];
  for (const e of main.querySelectorAll('*')) {
    if (e.childElementCount > 0 || !sized(e) || e.closest('svg')) continue;
    const text = (e.innerText || '').trim();
    if (!text) continue;
    const r = e.getBoundingClientRect();
    if (e.scrollWidth > e.clientWidth + 1 || r.right > window.innerWidth + 1)
      cut.push(text.slice(0, 80));
  }
  return {chart: first('[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg.marks'),
          table: first('[data-testid="stDataFrame"], [data-testid="stTable"]'),
          cut: cut, width: window.innerWidth,
          warnings: Array.from(main.querySelectorAll('[data-testid="stAlertContentWarning"]'))
                         .map(e => e.innerText.slice(0, 300))};
})()"""


def _add_verdict(path: Path) -> None:
    """One failed canary verdict over the file's last hour, stored as ``/api/v1/verdict`` does."""
    with duckdb.connect(str(path)) as con:
        row = con.execute("SELECT max(received_ts_ms), min(instance), max(instance) FROM requests")
        end_ms, canary, baseline = row.fetchone()  # type: ignore[misc]
        store = VerdictStore(con)
        store.migrate()
        document = {
            "verdict": "fail",
            "metrics": [{"metric": "ttft_p99", "result": "High", "canary": 2.9, "baseline": 0.6}],
        }
        store.insert(
            {
                "verdict_id": "v-1", "idempotency_key": None, "evaluated_ts_ms": end_ms,
                "source": "argo", "namespace": "prod", "service": "chat",
                "canary": f"instances={canary}", "baseline": f"instances={baseline}",
                "window_start_ts_ms": end_ms - 600_000, "window_end_ts_ms": end_ms,
                "verdict": "fail", "score": 42.0, "reason": "ttft_p99 High",
                "canary_requests": 812, "baseline_requests": 790,
                "document_json": json.dumps(document),
            }
        )  # fmt: skip


def _run(args: list[str]) -> None:
    process, _ = _llmslo(*args)
    assert process.wait(timeout=600) == 0, args


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The demo's file and a small replayed history, each with one canary verdict."""
    tmp = tmp_path_factory.mktemp("pictures")
    demo, replayed = tmp / "demo.duckdb", tmp / "history.duckdb"
    _run(["demo", "--seconds", "30", "--db", str(demo)])
    _run(
        ["sim", "history", "--days", "0.05", "--pods", "4", "--interval", "15", "-q",
         "--replay-last", "all", "--end-ts-ms", str(END_MS), "--db", str(replayed)]
    )  # fmt: skip
    for path in (demo, replayed):
        _add_verdict(path)
    return {"demo": demo, "history": replayed}


@pytest.fixture(scope="module", params=["demo", "history"])
def served(request: pytest.FixtureRequest, files: dict[str, Path]) -> Iterator[tuple[str, str]]:
    """(file name, URL of ``llmslo dashboard --db`` over it)."""
    process, url = start_dashboard("--db", str(files[request.param]))
    try:
        yield request.param, url
    finally:
        process.terminate()
        process.wait(timeout=20)


@pytest.mark.parametrize("path", list(PAGES))
def test_every_page_draws_a_chart_above_its_first_table_at_1440_px(
    chromium: HeadlessChromium,  # noqa: F811
    served: tuple[str, str],
    path: str,
) -> None:
    name, url = served
    chromium.call(
        "Emulation.setDeviceMetricsOverride", width=WIDTH_PX, height=2200, deviceScaleFactor=1,
        mobile=False,
    )  # fmt: skip
    try:
        chromium.open(deep_link(url, path), timeout_s=120)
        state = chromium.state()
        answer = chromium.call("Runtime.evaluate", expression=_LAYOUT_JS, returnByValue=True)
        shot = PICTURES / f"{name}-{path}.png"
        png = chromium.screenshot(shot)
    finally:
        chromium.call("Emulation.clearDeviceMetricsOverride")
    print(f"screenshot: {shot}")
    layout: dict[str, Any] = answer["result"]["value"]
    assert state["title"] == PAGES[path][0]
    assert state["exceptions"] == [] and state["errors"] == [], state
    assert layout["width"] == WIDTH_PX
    assert layout["chart"] is not None, (name, path, state["text"][:2000])
    assert layout["table"] is None or layout["chart"] < layout["table"], layout
    assert layout["cut"] == [], layout["cut"]
    assert not [w for w in layout["warnings"] if "Could not read" in w], layout["warnings"]
    assert not blank(png)


def test_the_demo_file_is_what_a_demo_leaves(files: dict[str, Path]) -> None:
    """The demo's file has what its pages draw: engine and GPU samples, requests, flags."""
    with duckdb.connect(str(files["demo"]), read_only=True) as con:
        counts = {
            table: con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[index]
            for table in ("engine_samples", "gpu_samples", "requests", "slo_status_current")
        }
    assert all(counts.values()), counts
