"""Instances go by the names people use: file_sd and static labels, one rule, host:port kept.

The rule (``collectors.config.instance_name``): the ``instance`` label, else ``pod``, else
the target's ``host:port``, which every record keeps in its ``address`` column.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pydantic import ValidationError

import simulator
from collectors.collector import Collector
from collectors.config import CollectConfig, TargetConfig
from collectors.discovery import parse_file_sd
from pipeline.schema import RecordSchema
from pipeline.store import Store


def _scrape_once(store: Store, config: CollectConfig) -> None:
    def sink(schema: RecordSchema, table: pa.Table) -> None:
        store.commit_batch({schema.table: [table]}, group_id="names", offsets={}, now_ts_ms=0)

    asyncio.run(Collector(config, sink).run(rounds=1))


@pytest.fixture(scope="module")
def fleet() -> Any:
    node = simulator.NodeConfig(name="node-0", gpus=2)
    pods = [
        simulator.PodConfig(name=f"pod-{i}", dialect="vllm", model="m", node="node-0", gpus=[i])
        for i in range(2)
    ]
    with simulator.Fleet(simulator.FleetConfig(nodes=[node], pods=pods, seed=1)) as running:
        yield running


def test_file_sd_labels_name_the_instances_of_engine_and_gpu_records(
    fleet: Any, tmp_path: Path
) -> None:
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps(fleet.file_sd()), encoding="utf-8")
    with Store(tmp_path / "names.duckdb") as store:
        _scrape_once(store, CollectConfig(file_sd=[str(targets)]))
        engines = store.con.execute(
            "SELECT DISTINCT instance, address FROM engine_samples ORDER BY 1"
        ).fetchall()
        gpus = store.con.execute(
            "SELECT DISTINCT instance, address, pod FROM gpu_samples WHERE pod IS NOT NULL"
            " ORDER BY 3"
        ).fetchall()
    pod0, pod1 = fleet.pods[0].instance, fleet.pods[1].instance
    assert engines == [("pod-0", pod0), ("pod-1", pod1)]
    # DCGM's pod label is the engine's instance name: GPUs join the engine they serve.
    exporter = fleet.dcgm[0].instance
    assert gpus == [("node-0", exporter, "pod-0"), ("node-0", exporter, "pod-1")]


def test_targets_without_names_fall_back_to_host_port(fleet: Any, tmp_path: Path) -> None:
    config = CollectConfig(targets=[TargetConfig(url=fleet.pods[0].url)])
    with Store(tmp_path / "plain.duckdb") as store:
        _scrape_once(store, config)
        rows = store.con.execute("SELECT DISTINCT instance, address FROM engine_samples").fetchall()
    assert rows == [(fleet.pods[0].instance, fleet.pods[0].instance)]


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"instance": "engine-a", "pod": "pod-7"}, "engine-a"),
        ({"pod": "pod-7", "node": "gpu-node-3"}, "pod-7"),
        ({"node": "gpu-node-3"}, "10.0.0.7:8000"),
        ({}, "10.0.0.7:8000"),
    ],
    ids=[
        "an instance label wins over pod",
        "a pod label names it",
        "a node label alone does not",
        "no labels: host:port",
    ],
)
def test_one_rule_names_a_static_target(labels: dict[str, str], expected: str) -> None:
    target = TargetConfig(url="10.0.0.7:8000", labels=labels)
    assert (target.instance, target.address) == (expected, "10.0.0.7:8000")


@pytest.mark.parametrize(
    ("labels", "complaint"),
    [
        ({"pod": "p" * 10_000}, "label 'pod': 10000 characters"),
        ({"pod": "pod-0\n  pod-9 L0 -> L3"}, "label 'pod': control characters"),
        ({"node": "n\x00"}, "label 'node': control characters"),
        ({"pod": ""}, "label 'pod': 0 characters"),
        ({"pod": 7}, "label 'pod': expected a string"),
        ({"bad-name": "x"}, "label name 'bad-name'"),
        ({f"l{i}": "x" for i in range(40)}, "40 labels"),
    ],
    ids=[
        "a 10,000-character name",
        "a newline forging a report line",
        "a NUL byte",
        "an empty name",
        "a number",
        "a label name Prometheus would refuse",
        "too many labels",
    ],
)
def test_hostile_file_sd_labels_fail_the_file_with_an_error_naming_the_label(
    labels: dict[str, Any], complaint: str
) -> None:
    document = json.dumps([{"targets": ["10.0.0.7:8000"], "labels": labels}])
    with pytest.raises(ValueError) as refused:
        parse_file_sd(document, "sd.json")
    assert "sd.json[0].labels" in str(refused.value) and complaint in str(refused.value)


def test_hostile_static_labels_are_a_config_error() -> None:
    with pytest.raises(ValidationError, match="control characters"):
        TargetConfig(url="10.0.0.7:8000", labels={"pod": "pod-0\r\n"})


def test_one_name_for_two_targets_is_refused() -> None:
    document = json.dumps([{"targets": ["a:1", "b:1"], "labels": {"pod": "pod-0"}}])
    with pytest.raises(ValueError, match="names one instance but the group has 2 targets"):
        parse_file_sd(document, "sd.json")
    with pytest.raises(ValidationError, match="both named 'pod-0'"):
        CollectConfig(
            targets=[
                TargetConfig(url="a:1", labels={"pod": "pod-0"}),
                TargetConfig(url="b:1", labels={"pod": "pod-0"}),
            ]
        )
