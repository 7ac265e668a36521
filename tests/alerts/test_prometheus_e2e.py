"""A real Prometheus scrapes a simulated fleet and evaluates the generated rules: a KV leak
on one pod raises LlmDegradationLevel L1–L3 for that pod only, and no other signature fires on
the healthy pods (no false positives)."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from alerts import load_rule_model, render_bundle, write_all
from simulator import EngineConfig, Fleet, FleetConfig, NodeConfig, PodConfig
from tests.alerts.conftest import REPO
from tests.conftest import require_tool

DIALECTS = ["vllm", "vllm-legacy", "sglang", "trtllm"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    pods = [
        PodConfig(name=f"pod-{i}", dialect=d, model="m", node="node-0", gpus=[i],
                  engine=EngineConfig.model_validate({"num_gpu_blocks": 1000}))
        for i, d in enumerate(DIALECTS)
    ]  # fmt: skip
    config = FleetConfig(nodes=[NodeConfig(name="node-0", gpus=4)], pods=pods, speed=1, seed=3)
    with Fleet(config) as running:
        yield running


@pytest.fixture
def prometheus(fleet: Fleet, tmp_path: Path) -> Iterator[str]:
    binary = require_tool("prometheus")
    rules = tmp_path / "rules.yml"
    write_all(render_bundle(load_rule_model(REPO / "config" / "slo.example.yaml"), rules))
    targets = [f"127.0.0.1:{fleet.pod(f'pod-{i}').port}" for i in range(len(DIALECTS))]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {
                "job_name": "engines",
                "static_configs": [{"targets": targets, "labels": {"pool": "llama"}}],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = _free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        assert _eventually(lambda: _ready(url), 30), (tmp_path / "prometheus.log").read_text()[
            -2000:
        ]
        yield url
    finally:
        process.terminate()
        process.wait(timeout=20)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _eventually(check: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.5)


def _firing(url: str) -> list[dict[str, str]]:
    alerts = httpx.get(f"{url}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    return [a["labels"] for a in alerts if a["state"] == "firing"]


def test_kv_leak_raises_its_levels_on_that_pod_only(fleet: Fleet, prometheus: str) -> None:
    rules = httpx.get(f"{prometheus}/api/v1/rules", timeout=5).json()["data"]["groups"]
    assert all(rule["health"] != "err" for group in rules for rule in group["rules"])
    # The healthy fleet first: every target up, recordings present, nothing firing.
    assert _eventually(
        lambda: len(httpx.get(f"{prometheus}/api/v1/query", params={"query": "llmslo:kv_free:ratio"},
                              timeout=5).json()["data"]["result"]) == len(DIALECTS),
        30,
    )  # fmt: skip
    time.sleep(3)
    assert _firing(prometheus) == []

    leaking = f"127.0.0.1:{fleet.pod('pod-0').port}"
    fleet.set_fault("pod-0", "kv_leak", blocks_per_s=400)

    def all_levels() -> list[dict[str, str]] | None:
        firing = _firing(prometheus)
        levels = {a.get("level") for a in firing if a["alertname"] == "LlmDegradationLevel"}
        return firing if levels == {"L1", "L2", "L3"} else None

    firing = _eventually(all_levels, 40)
    assert firing, _firing(prometheus)
    assert {(a["alertname"], a["instance"]) for a in firing} == {("LlmDegradationLevel", leaking)}
    assert all(a["pool"] == "llama" for a in firing)
