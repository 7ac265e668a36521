"""Benchmark: request → fully rendered Fleet and Latency pages in headless Chromium over
30 days × 64 instances of history.

Builds a DuckDB file with the history generator (64 pods, 30 days, one incident a day) and
runs the SLO jobs once over it, then serves it with ``llmslo dashboard --db`` and loads each
page over its whole 30 days (``range=30d``) in headless Debian Chromium, timing from
``Page.navigate`` to the first state where Streamlit has finished the script and drawn every
chart (see ``tests/dashboards/browser.py``). ``cold`` is the first load after the server
started (every query runs), ``warm`` the median of the next loads (answers cached by
``st.cache_data``). Target (DESIGN §8): ≤ 2 s each.

``--quick`` (< 60 s on an idle machine) is 3 days × 64 instances scraped hourly with 0.5 % of requests sampled
(a smoke run of the same path); the full run is 30 days × 64 instances scraped every minute
with 5 % sampled (what ``llmslo sim history`` writes). The data volume is printed. The last line is one JSON
object. Usage: ``python bench/dashboard.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))

import simulator.history as history  # noqa: E402
from pipeline.store import Store  # noqa: E402
from slo.jobs import SloJobs  # noqa: E402
from slo.model import build_model  # noqa: E402
from slo.spec import parse_spec  # noqa: E402
from tests.dashboards.browser import HeadlessChromium  # noqa: E402

HOUR_MS = 3_600_000
END_MS = 1_790_000_000_000 // HOUR_MS * HOUR_MS
SPEC = {
    "version": "llmslo/v1",
    "service": "bench",
    "slos": [
        {"name": "availability", "objective": 0.99, "sli": {"kind": "availability"}},
        {
            "name": "ttft",
            "objective": 0.995,
            "sli": {"kind": "latency", "metric": "ttft", "threshold_s": 2.5},
            "group_by": ["instance"],
        },
    ],
}
PAGES = ("fleet", "latency")


def build(path: Path, days: int, pods: int, quick: bool) -> dict[str, object]:
    """Generate the history into ``path`` and run one SLO jobs cycle; the data volume."""
    config = history.HistoryConfig(
        days=days,
        end_ts_ms=END_MS,
        pods=pods,
        interval_s=3600 if quick else 60,
        request_sample=0.005 if quick else 0.05,
        incidents_per_day=1,
        seed=11,
    )
    started = time.perf_counter()
    with Store(path) as store:
        for schema, table in history.HistoryGenerator(config).chunks():
            store.commit_batch({schema.table: [table]}, group_id="b", offsets={}, now_ts_ms=0)
        SloJobs(store.con, build_model(parse_spec(SPEC))).run_once(END_MS)
        rows = {t: store.count(t) for t in ("engine_samples", "gpu_samples", "requests")}
    return {
        "rows": rows,
        "file_mb": round(path.stat().st_size / 1e6, 1),
        "build_s": round(time.perf_counter() - started, 1),
        "scrape_interval_s": config.interval_s,
        "request_sample": config.request_sample,
    }


def serve(path: Path) -> tuple[subprocess.Popen[str], str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "app", "dashboard", "--db", str(path), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("dashboard: "):
        process.kill()
        raise SystemExit(f"llmslo dashboard did not start: {line!r}")
    return process, line.split()[1].rstrip("/")


def measure(url: str, warm_loads: int) -> dict[str, float]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed (apt-get install chromium)")
    figures: dict[str, float] = {}
    with HeadlessChromium(chromium) as browser:
        browser.open(f"{url}/canary", timeout_s=120)  # the app's first script run and imports
        for page in PAGES:
            figures[f"{page}_cold_s"] = round(browser.open(f"{url}/{page}?range=30d", 120), 3)
            warm = [browser.open(f"{url}/{page}?range=30d", 60) for _ in range(warm_loads)]
            figures[f"{page}_warm_s"] = round(statistics.median(warm), 3)
            state = browser.state()
            if state["exceptions"] or state["errors"]:
                raise SystemExit(f"{page}: {state['exceptions'] or state['errors']}")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="3 days, hourly scrapes, 0.5 %% of requests (< 60 s)"
    )
    parser.add_argument("--days", type=int, help="days of history (default 30; 3 with --quick)")
    parser.add_argument("--pods", type=int, default=64)
    parser.add_argument("--warm-loads", type=int, default=3)
    args = parser.parse_args()
    args.days = args.days or (3 if args.quick else 30)
    with tempfile.TemporaryDirectory(prefix="llmslo-bench-dash-") as tmp:
        path = Path(tmp) / "history.duckdb"
        volume = build(path, args.days, args.pods, args.quick)
        print(f"data: {args.days} days × {args.pods} instances, {volume}", flush=True)
        process, url = serve(path)
        try:
            figures = measure(url, args.warm_loads)
        finally:
            process.terminate()
            process.wait(timeout=20)
    for page in PAGES:
        print(
            f"{page:8} cold {figures[f'{page}_cold_s']:.2f} s, warm {figures[f'{page}_warm_s']:.2f} s (target ≤ 2 s)"
        )
    result = {
        "bench": "dashboard",
        "quick": args.quick,
        "days": args.days,
        "instances": args.pods,
        **volume,
        **figures,
        "target_s": 2.0,
        "within_target": all(v <= 2.0 for k, v in figures.items()),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
