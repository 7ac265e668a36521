"""End to end: ``llmslo run`` serves the API from the process that writes, while it writes.

A simulated fleet (two vLLM pods) behind real taps, a real collector and Poisson load;
``llmslo run`` on the session's embedded broker ingests and evaluates, and its API answers
``/api/v1/slos`` and ``/api/v1/flags`` (JSON and Arrow) meanwhile. A manual override set
through it is published to the ``flags`` topic and comes back ingested in the timeline.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
import yaml

from api.reads import ARROW_STREAM
from pipeline.broker import free_port
from pipeline.bus import Bus
from simulator import Fleet, FleetConfig, NodeConfig, PodConfig
from slo.queries import FLAGS_SCHEMA, STATUS_SCHEMA
from tests.processes import line_matching

TOKEN = "e2e-token"


def _child(stack: ExitStack, args: list[str], log: Path, **kwargs: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "LLMSLO_API_TOKEN": TOKEN}
    out = kwargs.pop("stdout", None) or log.open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "llmslo", *args],
        stdout=out,
        stderr=log.open("a"),
        text=True,
        env=env,
    )

    def stop() -> None:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()

    stack.callback(stop)
    return process


def _answers(url: str) -> bool:
    return httpx.get(url, timeout=2).status_code == 200


def _until(
    check: Callable[[], Any],
    what: str,
    process: subprocess.Popen[str],
    log: Path,
    timeout_s: float = 90,
) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result = check()
        except httpx.HTTPError:
            result = None
        if result:
            return result
        assert process.poll() is None, f"llmslo run exited: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{what} not seen within {timeout_s:.0f} s"
        time.sleep(0.5)


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    config = FleetConfig(
        nodes=[NodeConfig(name="node-0", gpus=2)],
        pods=[
            PodConfig(name=f"pod-{i}", dialect="vllm", model="llama-3-8b", node="node-0", gpus=[i])
            for i in (0, 1)
        ],
        speed=5.0,
        seed=3,
    )
    with Fleet(config) as running:
        yield running


def test_run_serves_slos_and_flags_as_json_and_arrow_while_it_writes(
    bus: Bus, fleet: Fleet, tmp_path: Path
) -> None:
    config = {
        "bus": {
            "bootstrap_servers": bus.bootstrap_servers,
            "topic_prefix": bus.prefix,
            "partitions": bus.config.partitions,
        },
        "store": {"path": str(tmp_path / "run.duckdb")},
        "ingest": {"group_id": f"run-{bus.prefix}", "batch_max_ms": 200},
        "slo": {"interval_s": 1},
        "api": {"port": 0, "flags_tick_s": 0.2},
    }
    (tmp_path / "llmslo.yaml").write_text(yaml.safe_dump(config))
    cfg = ["-c", str(tmp_path / "llmslo.yaml")]
    run_log = tmp_path / "run.log"
    with ExitStack() as stack:
        run = _child(stack, ["run", *cfg], run_log, stdout=subprocess.PIPE)
        assert run.stdout is not None
        found, lines = line_matching(run.stdout, r"serving the API on (http://\S+) ")
        assert found, f"{lines!r} {run_log.read_text()[-2000:]}"
        url = found[1]
        taps = []
        for pod in fleet.pods:
            port = free_port()
            _child(
                stack,
                ["tap", *cfg, "--listen", f"127.0.0.1:{port}", "--upstream", pod.url],
                tmp_path / f"tap-{port}.log",
            )
            taps.append(f"http://127.0.0.1:{port}")
        targets = [arg for pod in fleet.pods for arg in ("--target", f"{pod.url}/metrics")]
        _child(stack, ["collect", *cfg, "--interval", "1", *targets], tmp_path / "collect.log")
        for tap in taps:
            _until(
                partial(_answers, f"{tap}/health"),
                "tap health",
                run,
                run_log,
            )
        _child(
            stack,
            ["load", "--targets", ",".join(taps), "--rate", "6", "--duration", "60"],
            tmp_path / "load.log",
        )

        with httpx.Client(base_url=url, timeout=10) as api:
            assert api.get("/readyz").json()["status"] == "ready"
            slos = _until(
                lambda: api.get("/api/v1/slos").json()["count"] > 0 and api.get("/api/v1/slos"),
                "SLO status",
                run,
                run_log,
            )
            assert {r["slo_id"] for r in slos.json()["data"]} >= {"inference-availability"}
            arrow = api.get("/api/v1/slos", headers={"Accept": ARROW_STREAM})
            assert pa.ipc.open_stream(arrow.content).read_all().schema == STATUS_SCHEMA
            meta = api.get("/api/v1/meta").json()
            assert {p.instance for p in fleet.pods} <= {i["instance"] for i in meta["instances"]}

            flags = api.get("/api/v1/flags")
            assert flags.status_code == 200 and flags.headers["etag"].startswith('"')
            flags_arrow = api.get("/api/v1/flags", headers={"Accept": ARROW_STREAM})
            assert pa.ipc.open_stream(flags_arrow.content).read_all().schema == FLAGS_SCHEMA
            pod_instance = fleet.pods[0].instance
            body = {
                "scope": "instance",
                "scope_id": pod_instance,
                "level": 2,
                "expires_in_s": 300,
                "reason": "e2e",
            }
            assert api.post("/api/v1/flags/overrides", json=body).status_code == 401
            made = api.post(
                "/api/v1/flags/overrides", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
            )
            assert made.status_code == 201 and made.json()["published"] is True
            current = {
                r["scope_id"]: r["to_level"] for r in api.get("/api/v1/flags").json()["data"]
            }
            assert current[pod_instance] == 2
            # Published to the flags topic, the override comes back through ingest.
            now_ms = int(time.time() * 1000)
            window = {"start_ms": now_ms - 3_600_000, "end_ms": now_ms + 60_000}
            timeline = _until(
                lambda: [
                    r
                    for r in api.get("/api/v1/flags/timeline", params=window).json()["data"]
                    if r["reason"] == "manual_override"
                ],
                "the override in flag_transitions",
                run,
                run_log,
            )
            assert timeline[0]["scope_id"] == pod_instance and timeline[0]["to_level"] == 2
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=60) == 0, run_log.read_text()[-3000:]


def test_run_with_its_api_port_taken_is_a_clear_error_and_closes_the_store(
    bus: Bus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    from llmslo.cli import main
    from pipeline.store import Store

    config = {
        "bus": {"bootstrap_servers": bus.bootstrap_servers, "topic_prefix": bus.prefix},
        "store": {"path": str(tmp_path / "run.duckdb")},
    }
    (tmp_path / "llmslo.yaml").write_text(yaml.safe_dump(config))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["run", "-c", str(tmp_path / "llmslo.yaml"), "--api-port", str(port)])
    assert code == 2
    assert f"127.0.0.1:{port}" in capsys.readouterr().err
    with Store(tmp_path / "run.duckdb", read_only=True) as store:  # closed by the failed run
        assert store.count("requests") == 0
