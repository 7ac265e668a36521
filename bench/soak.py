"""Soak: the pipeline on embedded defaults for a long while, with one restart in the middle.

``llmslo -v run --bootstrap-servers embedded`` (its broker's log beside the DuckDB file)
ingests simulated fleet histories, published every ``--publish-every-s`` by ``llmslo sim
history`` at ``--load-multiple`` × the demo's four pods (each publish a new seed: new GPU
ids and series, like a fleet rolled out again). Each minute it samples the RSS of every
process (``llmslo run``, its broker and the broker's object store), where ``llmslo run``'s
memory is (its ``llmslo_memory_bytes`` parts: DuckDB's own accounting and limit, glibc's
heap in use and kept free, pyarrow's pool; anonymous and file-backed RSS) and the DuckDB
file's size; at half time it stops ``llmslo run`` right after a publish (un-ingested
records sit in the broker) and starts it again on the same file. At the end it compares
the rows the histories published with the rows stored.

Targets: nothing lost or doubled; the broker's stored bytes under ``bus.embedded_max_bytes``;
over the second half (from a minute after the restart) every process's RSS slope ≤ 1
MB/min, ``llmslo run``'s taken net of what DuckDB says it holds. DuckDB caches the file's
blocks, and keeps the rows not yet checkpointed, up to its ``memory_limit``: while the file
is smaller than that limit (176 MB at the default ``ingest.memory_mb``; a 30-minute soak
writes ~30 MB) that cache grows with the file, toward a bound DuckDB enforces, and is
judged on staying under it. ``--duckdb-memory-limit 24MB`` gives a pool that fills within
the run. The raw RSS slope is reported beside the judged one.

    python -m bench.soak --quick               # 3 minutes
    python -m bench.soak --minutes 30          # the full run

The last line is JSON with the figures.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import duckdb
import psutil

from pipeline.processes import stop_process

#: The demo's fleet: four simulated pods.
DEMO_PODS = 4
#: Target: an RSS slope over the run's second half at most this (MB per minute).
RSS_SLOPE_MAX_MB_PER_MIN = 1.0
_READY = re.compile(r"embedded broker ready on tcp://([\d.]+:\d+)")
_METRICS = re.compile(r"serving /metrics on (http://\S+/metrics)")
_MEMORY = re.compile(r'^llmslo_memory_bytes\{part="(\w+)"\} (\S+)$', re.MULTILINE)


def _llmslo(*args: str) -> list[str]:
    return [sys.executable, "-m", "llmslo", *args]


def _start_run(db: Path, config: Path, log_path: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    """``llmslo run`` on ``db``: the process, its broker's address, its /metrics URL."""
    seen = log_path.stat().st_size if log_path.exists() else 0  # the last run's lines
    log_file = log_path.open("ab")
    process = subprocess.Popen(
        _llmslo("-v", "run", "-c", str(config), "--db", str(db), "--metrics-port", "0"),
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with log_path.open("rb") as log_text:
            log_text.seek(seen)
            text = log_text.read().decode(errors="replace")
        found, metrics = _READY.findall(text), _METRICS.findall(text)
        if found and metrics and process.poll() is None:
            return process, found[-1], metrics[-1]
        if process.poll() is not None:
            raise SystemExit(f"llmslo run exited ({process.returncode}); see {log_path}")
        time.sleep(0.5)
    raise SystemExit(f"llmslo run's broker did not come up; see {log_path}")


def _start_publish(bootstrap: str, pods: int, end_ts_ms: int, seed: int) -> subprocess.Popen[str]:
    """``llmslo sim history`` in the background: sampling goes on while it publishes."""
    return subprocess.Popen(
        _llmslo(
            "sim",
            "history",
            "--days",
            "0.002",  # ~3 simulated minutes per publish
            "--pods",
            str(pods),
            "--seed",
            str(seed),
            "--end-ts-ms",
            str(end_ts_ms),
            "--bootstrap-servers",
            bootstrap,
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _published_rows(publish: subprocess.Popen[str]) -> dict[str, int]:
    """The rows a finished publish reported, by table."""
    out, err = publish.communicate()
    if publish.returncode != 0:
        raise SystemExit(f"llmslo sim history failed ({publish.returncode}): {err[-2000:]}")
    rows: dict[str, int] = json.loads(out)["rows"]
    return rows


def _rss_mb(root_pid: int) -> dict[str, float]:
    """RSS of ``llmslo run`` and each child (the broker, its object store), by name."""
    root = psutil.Process(root_pid)
    sizes = {"llmslo-run": root.memory_info().rss / 1e6}
    for child in root.children(recursive=True):
        try:
            name = "broker" if child.name().startswith("tansu") else "object-store"
            sizes[name] = sizes.get(name, 0.0) + child.memory_info().rss / 1e6
        except psutil.NoSuchProcess:
            continue
    return sizes


def _memory_mb(metrics_url: str, pid: int) -> dict[str, float]:
    """Where ``llmslo run``'s memory is: its ``llmslo_memory_bytes`` parts (DuckDB's own
    accounting and limit, glibc's heap, pyarrow's pool) and its RSS split into anonymous
    and file-backed pages (/proc/PID/smaps_rollup), in MB."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=10) as answer:
            text = answer.read().decode()
    except OSError:  # one missed scrape: the sample goes without
        text = ""
    parts = {part: float(value) / 1e6 for part, value in _MEMORY.findall(text)}
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return parts
    fields = dict(re.findall(r"^(\w+):\s+(\d+) kB$", rollup, re.MULTILINE))
    parts["rss_anon"] = int(fields.get("Anonymous", 0)) * 1024 / 1e6
    parts["rss_file"] = (int(fields.get("Rss", 0)) - int(fields.get("Anonymous", 0))) * 1024 / 1e6
    return parts


def _slope_mb_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (minute, MB) points."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / var if var else 0.0


def _stored_rows(db: Path, tables: list[str]) -> dict[str, int]:
    with duckdb.connect(str(db), read_only=True) as con:
        return {t: int(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t in tables}  # type: ignore[index]


def soak(
    minutes: float,
    load_multiple: int,
    publish_every_s: float,
    sample_every_s: float,
    duckdb_memory_limit: str | None = None,
) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="llmslo-soak-"))
    db, log_path, config = workdir / "soak.duckdb", workdir / "run.log", workdir / "soak.yaml"
    max_bytes = 256 * 1024 * 1024
    config.write_text(
        json.dumps(
            {
                "bus": {"bootstrap_servers": "embedded", "embedded_max_bytes": max_bytes},
                "api": {"port": 0},  # the default port may be taken on a shared machine
                "ingest": {"duckdb_memory_limit": duckdb_memory_limit}
                if duckdb_memory_limit
                else {},
            }
        ),
        encoding="utf-8",
    )
    run, bootstrap, metrics_url = _start_run(db, config, log_path)
    pods = DEMO_PODS * load_multiple
    published: dict[str, int] = {}
    samples: list[dict[str, Any]] = []
    start = time.monotonic()
    end_s, restart_at_s = minutes * 60, minutes * 30
    next_publish = next_sample = 0.0
    restarted = False
    restart_s = end_s / 2
    seed = 0
    end_ts_ms = int(time.time() * 1000) - 86_400_000  # a day back, one batch after another
    publishing: subprocess.Popen[str] | None = None
    while (elapsed := time.monotonic() - start) < end_s:
        if publishing is not None and publishing.poll() is not None:
            for table, count in _published_rows(publishing).items():
                published[table] = published.get(table, 0) + count
            publishing = None
            if not restarted and elapsed >= restart_at_s:
                # Right after a publish: its records are not all ingested yet.
                stop_process(run, timeout_s=60)
                run, bootstrap, metrics_url = _start_run(db, config, log_path)
                restarted, restart_s = True, time.monotonic() - start
        if publishing is None and elapsed >= next_publish:
            seed += 1
            end_ts_ms += 180_000
            publishing = _start_publish(bootstrap, pods, end_ts_ms, seed)
            next_publish = max(next_publish + publish_every_s, elapsed)
        if elapsed >= next_sample:
            samples.append(
                {
                    "minute": round(elapsed / 60, 2),
                    "rss_mb": _rss_mb(run.pid),
                    "run_memory_mb": {
                        k: round(v, 1) for k, v in _memory_mb(metrics_url, run.pid).items()
                    },
                    "db_mb": round(_db_bytes(db) / 1e6, 1),
                    "broker_log_mb": round(_dir_bytes(Path(f"{db}.broker")) / 1e6, 1),
                }
            )
            print(json.dumps(samples[-1]), flush=True)
            next_sample += sample_every_s
        time.sleep(0.5)
    if publishing is not None:
        for table, count in _published_rows(publishing).items():
            published[table] = published.get(table, 0) + count
    time.sleep(30)  # the last publish reaches DuckDB
    stop_process(run, timeout_s=60)
    stored = _stored_rows(db, sorted(published))
    # The second half starts with the restart: its first minute is the new process warming
    # up (imports, DuckDB's buffer pool), not a leak.
    second_half = [s for s in samples if s["minute"] * 60 >= restart_s + 60]
    slopes = {
        name: round(
            _slope_mb_per_min([(s["minute"], s["rss_mb"].get(name, 0.0)) for s in second_half]), 2
        )
        for name in samples[-1]["rss_mb"]
    }
    parts = sorted({part for s in second_half for part in s["run_memory_mb"]})
    part_slopes = {
        part: round(
            _slope_mb_per_min(
                [
                    (s["minute"], s["run_memory_mb"][part])
                    for s in second_half
                    if part in s["run_memory_mb"]
                ]
            ),
            2,
        )
        for part in parts
    }
    # DuckDB's buffer pool caches the file's blocks up to its memory_limit: while the file is
    # smaller than the limit, it grows with the file. That is a cache filling toward a bound
    # DuckDB enforces, so llmslo run is judged on its RSS net of what DuckDB says it holds,
    # and DuckDB on staying under its limit.
    net = [
        (s["minute"], s["rss_mb"]["llmslo-run"] - s["run_memory_mb"]["duckdb"])
        for s in second_half
        if "duckdb" in s["run_memory_mb"]
    ]
    judged = {**slopes, "llmslo-run": round(_slope_mb_per_min(net), 2)}
    duckdb_peak = max((s["run_memory_mb"].get("duckdb", 0.0) for s in samples), default=0.0)
    duckdb_limit = min(
        (
            s["run_memory_mb"]["duckdb_limit"]
            for s in samples
            if "duckdb_limit" in s["run_memory_mb"]
        ),
        default=0.0,
    )
    peak_log_bytes = max(s["broker_log_mb"] for s in samples) * 1e6
    return {
        "minutes": minutes,
        "pods": pods,
        "published": published,
        "stored": stored,
        "lost_or_doubled": {t: stored.get(t, 0) - n for t, n in published.items()},
        "rss_slope_second_half_mb_per_min": slopes,
        "run_memory_slope_second_half_mb_per_min": part_slopes,
        "judged_slope_second_half_mb_per_min": judged,
        "judged_as": "llmslo-run: RSS minus DuckDB's own accounting (a cache bounded by "
        "duckdb_limit); the others: RSS",
        "rss_last_mb": {k: round(v, 1) for k, v in samples[-1]["rss_mb"].items()},
        "run_memory_last_mb": samples[-1]["run_memory_mb"],
        "duckdb_peak_mb": round(duckdb_peak, 1),
        "duckdb_limit_mb": round(duckdb_limit, 1),
        "db_mb_last": samples[-1]["db_mb"],
        "broker_log_peak_mb": round(peak_log_bytes / 1e6, 1),
        "broker_max_mb": round(max_bytes / 1e6, 1),
        "ok": all(stored.get(t, 0) == n for t, n in published.items())
        and all(v <= RSS_SLOPE_MAX_MB_PER_MIN for v in judged.values())
        and bool(net)
        and duckdb_peak <= duckdb_limit
        and peak_log_bytes <= max_bytes,
        "workdir": str(workdir),
    }


def _db_bytes(db: Path) -> int:
    """The DuckDB file and its write-ahead log (rows sit there until a checkpoint)."""
    return sum(p.stat().st_size for p in (db, Path(f"{db}.wal")) if p.exists())


def _dir_bytes(path: Path) -> int:
    return (
        sum(f.stat().st_size for f in path.rglob("*.batch") if f.is_file()) if path.exists() else 0
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, help="run length (default 30; 3 with --quick)")
    parser.add_argument("--quick", action="store_true", help="3 minutes, samples every 20 s")
    parser.add_argument(
        "--duckdb-memory-limit",
        help="ingest.duckdb_memory_limit of llmslo run (default: its share of ingest.memory_mb); "
        "a small pool fills within the run, so its plateau shows",
    )
    parser.add_argument("--load-multiple", type=int, default=2, help="× the demo's 4 pods")
    parser.add_argument("--publish-every-s", type=float, default=20.0)
    args = parser.parse_args(argv)
    minutes = args.minutes or (3.0 if args.quick else 30.0)
    if not args.quick and minutes < 30:
        parser.error("--minutes must be at least 30 without --quick")
    figures = soak(
        minutes,
        args.load_multiple,
        args.publish_every_s,
        20.0 if args.quick else 60.0,
        args.duckdb_memory_limit,
    )
    print(json.dumps(figures), flush=True)
    return 0 if figures["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
