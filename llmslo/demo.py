"""``llmslo demo``: the whole product on loopback, with injected faults, and what it saw.

Starts everything on embedded defaults: the embedded broker, a simulated fleet (``llmslo
sim``), one stream tap per pod (``llmslo tap``), the collector (``llmslo collect``), the
pipeline of ``llmslo run``, and Poisson load through the taps (``llmslo load``). A third
of the way in it leaks KV cache on one pod and hangs another's engine loop, then prints
the SLO report, the failure signals and the degradation-flag transitions.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb

from llmslo.run import Pipeline, load_model
from llmslo.sections import load_config, parse_config
from pipeline.broker import free_port
from pipeline.bus import Bus
from pipeline.config import LlmsloConfig
from pipeline.errors import ConfigError, LlmsloError
from pipeline.processes import stop_process
from pipeline.store import Store
from slo.jobs import CycleResult
from slo.queries.reads import open_findings
from slo.report import render_table

__all__ = ["register"]


#: The demo fleet's chunked-prefill token budget per engine step (vLLM's
#: ``max_num_batched_tokens``, SGLang's ``chunked_prefill_size``). An operator picks it from
#: the ITL target, as Sarathi-Serve and vLLM's tuning guide advise: with the example spec's
#: 30 ms jitter SLO on the TP8 profile, a 512-token step (~57 ms against ~32 ms of decode)
#: leaves ~5 ms of margin, a 256-token step (~33–45 ms) leaves 15 ms or more.
DEMO_PREFILL_CHUNK_TOKENS = 256


def register(subparsers: Any) -> None:
    """Add ``demo``."""
    demo = subparsers.add_parser(
        "demo",
        help="Run the whole product on loopback (simulated fleet, taps, collector, pipeline) and report.",
        description=__doc__,
        epilog=textwrap.dedent(
            """\
            examples:
              llmslo demo                       # about 2 minutes; prints the SLO report, signals and flags
              llmslo demo --seconds 180 --db var/demo.duckdb
            """
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument("--seconds", type=float, default=75.0, help="load duration (default 75)")
    demo.add_argument("--rate", type=float, default=8.0, help="requests per second (default 8)")
    demo.add_argument(
        "--db",
        type=Path,
        default=Path("var/demo.duckdb"),
        help="DuckDB file (default var/demo.duckdb)",
    )
    demo.set_defaults(handler=run_demo)


@contextmanager
def _child(
    args: list[str], log_path: Path, *, read_stdout: bool = False
) -> Iterator[subprocess.Popen[str]]:
    """A ``llmslo`` subcommand as a child process, stopped with SIGTERM on exit. Its output
    goes to ``log_path``; ``read_stdout`` pipes stdout to the demo instead (a pipe nobody
    reads would block the child once its buffer is full)."""
    with log_path.open("w") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "llmslo", *args],
            stdout=subprocess.PIPE if read_stdout else log_file,
            stderr=log_file,
            text=True,
        )
        try:
            yield process
        finally:
            stop_process(process, timeout_s=20)


def _first_json_line(process: subprocess.Popen[str], what: str, log_path: Path) -> dict[str, Any]:
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        raise LlmsloError(f"{what} exited before it started; see {log_path}")
    return dict(json.loads(line))


def _wait_http(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.2)
    raise LlmsloError(f"{url} did not answer within {timeout_s:.0f} s")


def _set_fault(pod_url: str, fault: str, params: dict[str, float]) -> None:
    body = json.dumps({"fault": fault, "params": params}).encode()
    request = urllib.request.Request(
        f"{pod_url}/admin/faults",
        data=body,
        method="POST",
        headers={"content-type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=5).read()


def _named_tap_config(workdir: Path, pod_name: str) -> Path:
    """A config file naming the tap's engine as its scrape target is named (``pod-N``)."""
    path = workdir / f"tap-{pod_name}.yaml"
    path.write_text(json.dumps({"tap": {"instance": pod_name}}), encoding="utf-8")
    return path


def _file_sd_config(workdir: Path, groups: list[dict[str, Any]]) -> Path:
    """A config file whose collector discovers the fleet through file_sd, pods by name."""
    targets = workdir / "targets.json"
    targets.write_text(json.dumps(groups, indent=1), encoding="utf-8")
    path = workdir / "collect.yaml"
    path.write_text(json.dumps({"collect": {"file_sd": [str(targets)]}}), encoding="utf-8")
    return path


def _demo_config(bootstrap: str, db: Path) -> LlmsloConfig:
    """Embedded defaults, with detector windows short enough for a 75-second run."""
    raw = {
        "bus": {"bootstrap_servers": bootstrap, "partitions": 4},
        "store": {"path": str(db)},
        "ingest": {"group_id": "llmslo-demo", "batch_max_ms": 250},
        "slo": {"interval_s": 5, "detectors": {"stall_for_s": 20}, "flags": {"dwell_s": 20}},
    }
    return parse_config(raw, source="demo defaults")


def run_demo(args: argparse.Namespace) -> int:
    if args.seconds < 30:
        raise ConfigError("demo: --seconds must be at least 30 (the stall signature needs 20 s)")
    workdir = args.db.parent / "demo-logs"
    workdir.mkdir(parents=True, exist_ok=True)
    for stale in (args.db, args.db.with_suffix(args.db.suffix + ".wal")):
        stale.unlink(missing_ok=True)
    say = lambda text: print(text, flush=True)  # noqa: E731 - progress for a person watching
    with ExitStack() as stack:
        bus = stack.enter_context(Bus(load_config(None).bus))
        say(f"[demo] embedded Kafka-protocol broker on {bus.bootstrap_servers}")
        config = _demo_config(bus.bootstrap_servers, args.db)
        pipeline = Pipeline(config, load_model(None))
        stack.callback(pipeline.stop)
        pipeline.start()

        sim = stack.enter_context(
            _child(
                [
                    "sim",
                    "--pods",
                    "4",
                    "--dialects",
                    "vllm,sglang,trtllm,vllm-legacy",
                    "--prefill-chunk-tokens",
                    str(DEMO_PREFILL_CHUNK_TOKENS),
                ],
                workdir / "sim.log",
                read_stdout=True,  # its first line describes the fleet
            )
        )
        fleet = _first_json_line(sim, "llmslo sim", workdir / "sim.log")
        pods, dcgm = fleet["pods"], fleet["dcgm"]
        say(
            f"[demo] simulated fleet: {', '.join(p['name'] + ' (' + p['dialect'] + ')' for p in pods)}, "
            f"{len(dcgm)} dcgm-exporter node(s)"
        )

        taps = []
        for pod in pods:
            port = free_port()
            stack.enter_context(
                _child(
                    [
                        "tap",
                        "--config",
                        str(_named_tap_config(workdir, pod["name"])),
                        "--port",
                        str(port),
                        "--upstream",
                        pod["url"],
                        "--bootstrap-servers",
                        bus.bootstrap_servers,
                        "--follow-flags",
                    ],
                    workdir / f"tap-{pod['name']}.log",
                )
            )
            taps.append(f"http://127.0.0.1:{port}")
        collector_args = [
            "collect",
            "--config",
            str(_file_sd_config(workdir, fleet["file_sd"])),
            "--bootstrap-servers",
            bus.bootstrap_servers,
            "--interval",
            "2",
        ]
        stack.enter_context(_child(collector_args, workdir / "collect.log"))
        for tap in taps:
            # Four Python processes starting at once on a busy 2-core host took over 30 s.
            _wait_http(f"{tap}/health", timeout_s=90.0)
        say(f"[demo] {len(taps)} stream taps (one sidecar per pod) and the collector are running")

        load = stack.enter_context(
            _child(
                [
                    "load",
                    "--targets",
                    ",".join(taps),
                    "--rate",
                    str(args.rate),
                    "--duration",
                    str(args.seconds),
                ],
                workdir / "load.log",
            )
        )
        say(f"[demo] Poisson load: {args.rate:g} req/s for {args.seconds:g} s through the taps")
        time.sleep(args.seconds / 3)
        # The leak fills the 2,048-block pool to 96 % in about half a minute: through L1
        # (KV free < 10 %) into L2 (< 5 %). The stall hangs a vLLM pod's engine loop.
        leaking, hung = pods[1], pods[0]
        _set_fault(leaking["url"], "kv_leak", {"blocks_per_s": 60, "max_fraction": 0.96})
        _set_fault(hung["url"], "stall", {})
        say(
            f"[demo] injected: kv_leak on {leaking['instance']} ({leaking['address']}), "
            f"stall (NCCL-hang signature) on {hung['instance']} ({hung['address']})"
        )
        try:
            load.wait(timeout=args.seconds * 2 / 3 + 20)  # its last requests end by their deadline
        except subprocess.TimeoutExpired:
            load.terminate()
        time.sleep(6)  # the last scrape round, ingest batch and job cycle
        result = pipeline.final_cycle()
    _print_demo_result(args.db, result)
    return 0


_SEVERITY_ORDER = {"page": 0, "ticket": 1, "info": 2}


def open_findings_lines(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The findings still open in ``slo_findings`` (the query of ``/api/v1/findings/open``),
    pages first, each with the time it fired. Not the last cycle's detector output: a
    finding a detector stopped re-confirming in the very last cycle (a stalled pod whose
    tokens stopped long ago) is still open, and is what the on-call must see."""
    rows = open_findings(con).to_pylist()
    rows.sort(
        key=lambda r: (_SEVERITY_ORDER.get(r["severity"] or "", 9), r["signal"], r["scope_id"])
    )
    lines = []
    for row in rows:
        evidence = json.loads(row["evidence_json"] or "{}")
        shown = ", ".join(f"{k}={v}" for k, v in list(evidence.items())[:4])
        since = datetime.fromtimestamp(row["ts_ms"] / 1000, UTC).strftime("%H:%M:%S")
        lines.append(
            f"  {row['severity'] or '':<6} {row['signal']:<20} {row['scope_id']:<22} "
            f"since {since} UTC  {row['basis'] or ''}: {shown}"
        )
    return lines or ["  (none)"]


def _print_demo_result(db: Path, result: CycleResult | None) -> None:
    print("\n=== SLOs (from tap request records and engine histograms) ===")
    if result is not None:
        print(render_table(result.statuses), end="")
    with Store(db, read_only=True) as store:
        print("\n=== signals ===")  # the open findings, as /api/v1/findings/open
        print("\n".join(open_findings_lines(store.con)))
        flags = store.con.execute(
            "SELECT scope_id, from_level, to_level, reason FROM flag_transitions ORDER BY ts_ms"
        ).fetchall()
        addresses = store.con.execute(
            "SELECT instance, min(address), min(dialect) FROM engine_samples"
            " WHERE address IS NOT NULL AND dialect IS DISTINCT FROM 'tap'"
            " GROUP BY instance ORDER BY instance"
        ).fetchall()
        actions = store.con.execute(
            "SELECT instance, degradation_level, enforced_action, count(*) FROM requests "
            "WHERE enforced_action IS NOT NULL GROUP BY ALL ORDER BY ALL"
        ).fetchall()
        counts = {
            t: store.count(t)
            for t in ("engine_samples", "gpu_samples", "requests", "flag_transitions")
        }
    print("\n=== instances (names in the report above, and where they were reached) ===")
    for instance, address, dialect in addresses:
        print(f"  {instance:<22} {address:<22} {dialect or ''}")
    print("\n=== degradation flag transitions ===")
    for scope_id, before, after, reason in flags:
        print(f"  {scope_id:<22} L{before} -> L{after}  ({reason})")
    if not flags:
        print("  (none)")
    print("\n=== degradation actions taken by the taps ===")
    for instance, level, action, n in actions:
        shown = "stale" if level is None else f"L{level}"
        print(f"  {instance:<22} {shown:<6} {action:<22} {n:,} requests")
    if not actions:
        print("  (none)")
    print(f"\nDuckDB {db}: " + ", ".join(f"{name} {n:,}" for name, n in counts.items()))
    # The file stays (the next demo replaces it); nothing writes it now, so it opens read-only.
    print(f"\nDashboards on this data: llmslo dashboard --db {db}  (then open the URL it prints)")
