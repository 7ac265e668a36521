"""Benchmark: request → fully rendered Fleet, SLO and Latency pages in headless Chromium over
30 days × 256 instances of history.

Builds a DuckDB file with the history generator (256 pods, 30 days, one incident a day), rolls
up its request records (``slo.rollups.requests``, as ``llmslo sim history`` does) and runs the
SLO jobs once over it, then serves it with ``llmslo dashboard --db`` and loads each page over
its whole 30 days (``range=30d``) in headless Debian Chromium, timing from ``Page.navigate``
to the first state where Streamlit has finished the script and drawn every chart (see
``tests/dashboards/browser.py``). ``cold`` is the first load of a page after a fresh server
started on a new port (every query runs, and the browser meets the frontend's scripts for
the first time at that address: it fetches, parses and compiles them; the median over
``--cold-loads`` servers), ``cold, scripts cached`` the same after a fresh server started at
the address of the one before (every query runs; the browser has the scripts cached, as
when the dashboard restarts under a user who visited it), ``warm`` the median of the next
loads (answers cached by ``st.cache_data``). The pages load in the order Fleet, SLO, Latency,
so only Fleet's ``cold`` meets the chart and table scripts new. Target (DESIGN §8): ≤ 2 s
each.

The built file is kept under ``var/bench/`` (named by its volume and the rollup version)
and reused by later runs: building 30 days takes minutes. ``--rebuild`` builds it again.

``--quick`` (< 60 s on this host, without a cached file) is 1 day × 8 instances scraped
every 10 minutes with 5 % of requests, one load of each kind (a smoke run of the path);
the full run is 30 days × 256 instances scraped every minute (``--interval``) with 5 % of
requests sampled (what ``llmslo sim history`` writes). The data volume is printed, and per
page the bytes its websocket received on a cold load (charts' data and tables) and the CPU
seconds a load cost the dashboard's server (``llmslo dashboard`` and its Streamlit process)
and the browser (Chromium and its helper processes), medians like the times: on a shared
host a load's wall time follows the other processes' load, its CPU time much less. The
last line is one JSON object.

``--baseline DIR`` measures another checkout's code (``git worktree add DIR main``) on the
same file in turns with this one, so a before/after pair shares the machine's load.

``--profile DIR`` times nothing: per checkout it records four loads of one page (``--page``,
Fleet by default) with DevTools: cold, warm, warm with the browser's cache cleared, and cold
with the scripts cached (a JavaScript CPU profile and a trace of every Chromium process,
written under DIR), and prints where the browser's time went, the loads side by side: CPU
seconds per Chromium process kind, self time per thread and category (scripting, compile,
style & layout, paint, GC), the page's scripts and functions by self time, and the main
thread's work 250 ms by 250 ms beside the websocket frames that arrived (see
``tests/dashboards/profiles.py``).
Usage: ``python bench/dashboard.py [--quick] [--rebuild] [--days D] [--pods N] [--interval S]
[--baseline DIR] [--profile DIR [--page PAGE]]``.
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
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import duckdb
import psutil

from pipeline.units import HOUR_MS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import simulator.history as history  # noqa: E402
from pipeline.store import Store  # noqa: E402
from slo.jobs import SloJobs  # noqa: E402
from slo.rollups.requests import REQUEST_ROLLUP_VERSION, rollup_history  # noqa: E402
from slo.spec import parse_spec  # noqa: E402
from slo.spec.model import build_model  # noqa: E402
from tests.dashboards import profiles  # noqa: E402
from tests.dashboards.browser import HeadlessChromium  # noqa: E402

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
PAGES = ("fleet", "slo", "latency")


@dataclass(frozen=True)
class Volume:
    """What to generate."""

    days: float
    pods: int
    interval_s: int
    request_sample: float

    def file_name(self) -> str:
        """Cache file name: the volume and the versions of what the build computes."""
        return (
            f"dashboard-{self.days:g}d-{self.pods}p-{self.interval_s}s-{self.request_sample:g}"
            f"-r{REQUEST_ROLLUP_VERSION}.duckdb"
        )


def build(path: Path, volume: Volume) -> dict[str, object]:
    """Generate the history into ``path``, roll up its requests and run one SLO jobs cycle."""
    config = history.HistoryConfig(
        days=volume.days,
        end_ts_ms=END_MS,
        pods=volume.pods,
        interval_s=volume.interval_s,
        request_sample=volume.request_sample,
        incidents_per_day=1,
        seed=11,
    )
    started = time.perf_counter()
    with Store(path) as store:
        for schema, table in history.HistoryGenerator(config).chunks():
            store.commit_batch({schema.table: [table]}, group_id="b", offsets={}, now_ts_ms=0)
        generated = time.perf_counter()
        rollup_history(store.con)
        rolled = time.perf_counter()
        SloJobs(store.con, build_model(parse_spec(SPEC))).run_once(END_MS)
    print(
        f"built {path.name}: generate {generated - started:.1f} s, request rollup "
        f"{rolled - generated:.1f} s, jobs {time.perf_counter() - rolled:.1f} s",
        flush=True,
    )
    return {"build_s": round(time.perf_counter() - started, 1)}


def prepared(
    volume: Volume, cache: Path | None, rebuild: bool, tmp: Path
) -> tuple[Path, dict[str, object]]:
    """The history file to serve: the cached one, or built now (and cached unless ``cache``
    is None); the data volume."""
    path = (cache or tmp) / volume.file_name()
    facts: dict[str, object] = {"cached": path.exists() and not rebuild}
    if not facts["cached"]:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        for stale in (partial, Path(f"{partial}.wal")):
            stale.unlink(missing_ok=True)
        facts.update(build(partial, volume))
        partial.replace(path)
    with duckdb.connect(str(path), read_only=True) as con:
        facts["rows"] = {
            t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # type: ignore[index]
            for t in ("engine_samples", "gpu_samples", "requests", "request_latency_hour")
        }
    facts["file_mb"] = round(path.stat().st_size / 1e6, 1)
    return path, facts


def serve(path: Path, root: Path = ROOT, port: int = 0) -> tuple[subprocess.Popen[str], str]:
    """``llmslo dashboard --db path --port port`` (0: any free one) with the code of the
    checkout ``root``."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "llmslo", "dashboard", "--db", str(path), "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=root,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("dashboard: "):
        process.kill()
        raise SystemExit(f"llmslo dashboard did not start: {line!r}")
    return process, line.split()[1].rstrip("/")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its living descendants (a helper process
    that exited in between is not counted)."""
    return sum(cpu_by_type(pid).values())


@dataclass(frozen=True)
class Load:
    """One page load: seconds to the rendered page, bytes its websocket received by then,
    and the CPU seconds it cost the server and the browser."""

    seconds: float
    received_bytes: int
    server_cpu_s: float
    browser_cpu_s: float


def _load(browser: HeadlessChromium, url: str, timeout_s: float, server_pid: int) -> Load:
    """Load ``url`` and wait until rendered (see :meth:`HeadlessChromium.open`)."""
    browser.received_bytes = 0
    server, chromium = cpu_s(server_pid), cpu_s(browser.process.pid)
    seconds = browser.open(url, timeout_s)
    state = browser.state()
    if state["exceptions"] or state["errors"]:
        raise SystemExit(f"{url}: {state['exceptions'] or state['errors']}")
    return Load(
        seconds,
        browser.received_bytes,
        cpu_s(server_pid) - server,
        cpu_s(browser.process.pid) - chromium,
    )


def measure(
    path: Path, cold_loads: int, warm_loads: int, roots: dict[str, Path]
) -> dict[str, float]:
    """Per checkout in ``roots`` (label → code) and page: the median cold load (a fresh
    server each) and warm load, in seconds and in server and browser CPU seconds, and the
    bytes a cold load received. The checkouts take turns, so a comparison shares the
    machine's load."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed (apt-get install chromium)")
    cold = {(label, page): list[Load]() for label in roots for page in PAGES}
    cached = {(label, page): list[Load]() for label in roots for page in PAGES}
    warm = {(label, page): list[Load]() for label in roots for page in PAGES}
    with HeadlessChromium(chromium) as browser:
        browser.call("Network.enable")
        for run in range(cold_loads):
            # Turns alternate who goes first, so neither always meets a warmer machine.
            for label, root in list(roots.items())[:: 1 if run % 2 == 0 else -1]:
                process, url = serve(path, root)
                try:
                    # the app's first script run and imports
                    _load(browser, f"{url}/canary", 120, process.pid)
                    for page in PAGES:
                        page_url = f"{url}/{page}?range=30d"
                        cold[label, page].append(_load(browser, page_url, 120, process.pid))
                        if run == 0:
                            warm[label, page] += [
                                _load(browser, page_url, 60, process.pid) for _ in range(warm_loads)
                            ]
                finally:
                    _stop(process)
                # A fresh server at the same address: the browser has its scripts cached.
                process, url = serve(path, root, port=int(url.rsplit(":", 1)[1]))
                try:
                    _load(browser, f"{url}/canary", 120, process.pid)
                    for page in PAGES:
                        page_url = f"{url}/{page}?range=30d"
                        cached[label, page].append(_load(browser, page_url, 120, process.pid))
                finally:
                    _stop(process)
    figures: dict[str, float] = {}
    for (label, page), loads in cold.items():
        prefix = "" if label == "this" else f"{label}_"
        for kind, runs in (
            ("cold", loads),
            ("cold_cached", cached[label, page]),
            ("warm", warm[label, page]),
        ):
            figures[f"{prefix}{page}_{kind}_s"] = _median(runs, "seconds")
            figures[f"{prefix}{page}_{kind}_server_cpu_s"] = _median(runs, "server_cpu_s")
            figures[f"{prefix}{page}_{kind}_browser_cpu_s"] = _median(runs, "browser_cpu_s")
        figures[f"{prefix}{page}_received_kb"] = round(
            max(load.received_bytes for load in loads) / 1000, 1
        )
        print(
            f"{label} {page}: cold loads {[round(v.seconds, 2) for v in loads]} "
            f"(CPU s server/browser {[_cpu_pair(v) for v in loads]}), "
            f"cold, scripts cached {[round(v.seconds, 2) for v in cached[label, page]]} "
            f"({[_cpu_pair(v) for v in cached[label, page]]}), "
            f"warm {[round(v.seconds, 2) for v in warm[label, page]]} "
            f"({[_cpu_pair(v) for v in warm[label, page]]}), "
            f"received {figures[f'{prefix}{page}_received_kb']:,} kB"
        )
    return figures


def cpu_by_type(pid: int) -> dict[str, float]:
    """CPU seconds per kind of Chromium process (``browser`` the one started, the others by
    their ``--type=``: renderer, gpu-process, utility, zygote…)."""
    seconds: dict[str, float] = defaultdict(float)
    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return seconds
    for process in family:
        try:
            kind = next(
                (a.split("=", 1)[1] for a in process.cmdline() if a.startswith("--type=")),
                "browser",
            )
            seconds[kind] += sum(process.cpu_times()[:2])
        except psutil.NoSuchProcess:
            continue
    return seconds


def profile(path: Path, roots: dict[str, Path], page: str, directory: Path) -> None:
    """Per checkout, four loads of ``page`` recorded by DevTools
    (:meth:`HeadlessChromium.record`): ``cold`` (a fresh server at a new address: the
    browser also fetches and compiles the frontend's scripts), ``warm`` (after one more
    load), ``cleared`` (warm, the browser's cache cleared) and ``cached`` (a fresh server at
    the same address: every query runs, the scripts are cached). Writes the raw profiles and
    traces under ``directory`` (``LABEL-PAGE-KIND.cpuprofile``, open in Chromium's DevTools;
    ``….trace.json``, open in Perfetto) and prints where the browser's time went, the loads
    side by side."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed (apt-get install chromium)")
    directory.mkdir(parents=True, exist_ok=True)
    with HeadlessChromium(chromium) as browser:
        for label, root in roots.items():
            recorded: dict[str, tuple[Any, ...]] = {}
            port = 0
            for kinds in (("cold", "warm", "cleared"), ("cached",)):
                process, url = serve(path, root, port)
                port = int(url.rsplit(":", 1)[1])
                try:
                    _load(browser, f"{url}/canary", 120, process.pid)
                    for kind in kinds:
                        if kind == "warm":
                            _load(browser, f"{url}/{page}?range=30d", 60, process.pid)
                        if kind == "cleared":
                            browser.call("Network.clearBrowserCache")
                        recorded[kind] = _recorded(browser, f"{url}/{page}?range=30d", process.pid)
                        _write_profile(directory / f"{label}-{page}-{kind}", recorded[kind])
                finally:
                    _stop(process)
            _print_profiles(f"{label} {page}", recorded)


def _recorded(browser: HeadlessChromium, url: str, server_pid: int) -> tuple[Any, ...]:
    """One recorded load: seconds, server CPU s, browser CPU s per process kind, the
    JavaScript profile and the trace."""
    server, before = cpu_s(server_pid), cpu_by_type(browser.process.pid)
    seconds, cpu_profile, trace = browser.record(url, 120)
    after = cpu_by_type(browser.process.pid)
    by_type = {k: v - before.get(k, 0.0) for k, v in after.items()}
    return seconds, cpu_s(server_pid) - server, by_type, cpu_profile, trace


def _write_profile(stem: Path, recorded: tuple[Any, ...]) -> None:
    stem.with_suffix(".cpuprofile").write_text(json.dumps(recorded[3]))
    stem.with_suffix(".trace.json").write_text(json.dumps({"traceEvents": recorded[4]}))


def _print_profiles(title: str, recorded: dict[str, tuple[Any, ...]]) -> None:
    """Cold beside warm: wall, CPU per process kind, per thread and category, JavaScript
    per script and function, and the main thread's timeline."""
    print(f"== profile: {title} ({' | '.join(recorded)}), load average {os.getloadavg()[0]:.1f}")
    for kind, (seconds, server, by_type, _, _) in recorded.items():
        kinds = ", ".join(f"{k} {v:.2f}" for k, v in sorted(by_type.items(), key=lambda kv: -kv[1]))
        print(f"{kind}: {seconds:.2f} s wall; CPU s server {server:.2f}, browser {kinds}")
    threads = {kind: profiles.trace_self_ms(r[4]) for kind, r in recorded.items()}
    busiest = sorted(
        {t for per in threads.values() for t in per},
        key=lambda t: -max(per.get(t, {}).get("busy", 0.0) for per in threads.values()),
    )[:6]
    print("trace, ms of self time per thread and category (busy = inside top-level tasks):")
    for thread in busiest:
        for kind, per in threads.items():
            row = per.get(thread, {})
            print(f"  {kind:4} {thread:40} " + ", ".join(f"{k} {v:,.0f}" for k, v in row.items()))
    for by, top in (("file", 8), ("function", 15)):
        print(f"JavaScript self ms per {by} (the page's renderer):")
        tables = {kind: profiles.js_self_ms(r[3], by) for kind, r in recorded.items()}
        width = max(len(k) for rows in tables.values() for k, _ in rows[:top])
        for i in range(top):
            cells = [
                f"{rows[i][0]:{width}} {rows[i][1]:7,.0f}" if i < len(rows) else ""
                for rows in tables.values()
            ]
            print("  " + " | ".join(cells))
    for kind, r in recorded.items():
        print(f"main thread, {kind}, per 250 ms from the navigation (frames, kB, ms per category):")
        for row in profiles.timeline(r[4]):
            print(
                "  "
                + ", ".join(
                    f"{k} {v:,}" if isinstance(v, int) else f"{k} {v:,.0f}" for k, v in row.items()
                )
            )


def _stop(process: subprocess.Popen[str]) -> None:
    """Stop a dashboard server: SIGTERM, then SIGKILL if it has not exited in 20 s (on a
    loaded host Streamlit's shutdown can take longer, and the file is only read)."""
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=20)


def _median(loads: list[Load], field: str) -> float:
    return round(statistics.median(getattr(load, field) for load in loads), 3)


def _cpu_pair(load: Load) -> str:
    return f"{load.server_cpu_s:.2f}/{load.browser_cpu_s:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="1 day × 8 instances, 10-minute scrapes (< 60 s)"
    )
    parser.add_argument("--days", type=float, help="days of history (default 30; 1 with --quick)")
    parser.add_argument("--pods", type=int, help="instances (default 256; 8 with --quick)")
    parser.add_argument(
        "--interval", type=int, help="scrape interval, seconds (default 60; 600 with --quick)"
    )
    parser.add_argument("--cold-loads", type=int, help="fresh servers (default 3; 1 with --quick)")
    parser.add_argument("--warm-loads", type=int, help="default 3; 1 with --quick")
    parser.add_argument(
        "--cache", type=Path, default=ROOT / "var" / "bench", help="where built files are kept"
    )
    parser.add_argument("--no-cache", action="store_true", help="build into a temporary dir")
    parser.add_argument("--rebuild", action="store_true", help="build even if cached")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout (e.g. `git worktree add /tmp/main main`) measured in turns "
        "with this one on the same file; its figures are prefixed baseline_",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="instead of timing: record a DevTools profile and trace of a cold and a warm "
        "load of --page per checkout, write them under DIR and print where the browser's "
        "time went",
    )
    parser.add_argument("--page", choices=PAGES, default="fleet", help="the page --profile records")
    args = parser.parse_args()
    volume = Volume(
        days=args.days or (1 if args.quick else 30),
        pods=args.pods or (8 if args.quick else 256),
        interval_s=args.interval or (600 if args.quick else 60),
        request_sample=0.05,
    )
    cold_loads = args.cold_loads or (1 if args.quick else 3)
    warm_loads = args.warm_loads or (1 if args.quick else 3)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="llmslo-bench-dash-") as tmp:
        cache = None if args.no_cache else args.cache
        path, facts = prepared(volume, cache, args.rebuild, Path(tmp))
        print(
            f"data: {volume.days:g} days × {volume.pods} instances, scraped every "
            f"{volume.interval_s} s, {volume.request_sample:.0%} of requests: {facts}",
            flush=True,
        )
        roots = {"this": ROOT, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
        if args.profile:
            profile(path, roots, args.page, args.profile)
            return
        figures = measure(path, cold_loads, warm_loads, roots)
    for label in roots:
        prefix = "" if label == "this" else f"{label}_"
        for page in PAGES:
            at = f"{prefix}{page}"
            print(
                f"{label:8} {page:8} cold {figures[f'{at}_cold_s']:.2f} s "
                f"(scripts cached {figures[f'{at}_cold_cached_s']:.2f} s), "
                f"warm {figures[f'{at}_warm_s']:.2f} s "
                f"(medians of {cold_loads} and {warm_loads} loads; target ≤ 2 s); CPU s "
                f"server/browser cold {figures[f'{at}_cold_server_cpu_s']:.2f}/"
                f"{figures[f'{at}_cold_browser_cpu_s']:.2f} (scripts cached "
                f"{figures[f'{at}_cold_cached_server_cpu_s']:.2f}/"
                f"{figures[f'{at}_cold_cached_browser_cpu_s']:.2f}), warm "
                f"{figures[f'{at}_warm_server_cpu_s']:.2f}/"
                f"{figures[f'{at}_warm_browser_cpu_s']:.2f}; "
                f"{figures[f'{at}_received_kb']:,} kB received cold"
            )
    result = {
        "bench": "dashboard",
        "quick": args.quick,
        **asdict(volume),
        **facts,
        "cold_loads": cold_loads,
        "warm_loads": warm_loads,
        **figures,
        "total_s": round(time.perf_counter() - started, 1),
        "target_s": 2.0,
        "within_target": all(
            figures[f"{page}_{load}_s"] <= 2.0 for page in PAGES for load in ("cold", "warm")
        ),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
