"""Live rules over a recorded simulator fleet: NaN bursts on a pod, the prefix cache on."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.checks.fleet import record_fleet
from tests.checks.helpers import MANIFESTS, run_check

V11 = ("--command", "vllm serve m --max-num-seqs 64 --gpu-memory-utilization 0.8",
       "--image", "vllm/vllm-openai:v0.11.0")  # fmt: skip


@pytest.fixture(scope="module")
def nan_fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("live") / "fleet.duckdb"
    record_fleet(path, {"a": {}, "b": {}}, {"a": ("nan_burst", {"fraction": 0.5})})
    return path


def test_nan_bursts_without_the_nan_check_fail_the_rule_with_the_count_seen(
    tmp_path: Path, nan_fleet: Path
) -> None:
    status, rules = run_check(tmp_path, *V11, "--db", str(nan_fleet))
    rule = rules["D04-nan-detection"]
    assert rule["status"] == "fail"
    assert rule["static"]["status"] == "fail"
    assert "VLLM_COMPUTE_NANS_IN_LOGITS not set" in rule["static"]["evidence"]
    counted = float(rule["live"]["evidence"].split(", ")[1].split()[0])
    assert counted > 0  # the bursts reached the store
    assert status == 1


def test_the_same_fleet_with_the_nan_check_on_passes_it(tmp_path: Path, nan_fleet: Path) -> None:
    _, rules = run_check(tmp_path, "-f", str(MANIFESTS / "vllm-good.yaml"), "--db", str(nan_fleet))
    assert rules["D04-nan-detection"]["status"] == "pass"


def test_a_fleet_with_the_prefix_cache_on_passes_the_hit_metric_rule(
    tmp_path: Path, nan_fleet: Path
) -> None:
    _, rules = run_check(tmp_path, *V11, "--db", str(nan_fleet))
    rule = rules["D03-prefix-cache-metric"]
    assert rule["live"]["status"] == "pass", rule["live"]["evidence"]
    assert "prefix_cache_hits" in rule["live"]["evidence"]
    assert rule["status"] == "pass"


def test_a_store_whose_engines_export_no_prefix_cache_metric_fails_it(tmp_path: Path) -> None:
    from llmslo.cli import main

    db = tmp_path / "history.duckdb"
    # the history generator's vLLM rows carry no prefix-cache counters
    assert (
        main(["sim", "history", "--days", "0.02", "--pods", "2", "--db", str(db), "--no-replay"])
        == 0
    )
    _, rules = run_check(tmp_path, *V11, "--db", str(db))
    assert rules["D03-prefix-cache-metric"]["live"]["status"] == "fail"
    assert rules["D04-nan-detection"]["live"]["status"] == "fail"


def test_no_store_leaves_every_live_side_unknown(tmp_path: Path) -> None:
    _, rules = run_check(tmp_path, *V11)
    assert {rule["live"]["status"] for rule in rules.values()} == {"unknown"}
