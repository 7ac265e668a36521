"""Every YAML we load refuses nonsense with an error naming the field (or key and line).

Repeated keys (PyYAML keeps the last one silently), booleans where numbers are expected
(pydantic's lax mode reads ``true`` as 1) and ports beyond 65535, for each loader: the
config file and its sections (bus, ingest, collect, tap, simulator), the SLO spec, the
simulator's fleet config and scenario, and file_sd target files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from collectors.config import CollectConfig
from collectors.discovery import parse_file_sd
from collectors.tap.config import TapConfig
from pipeline.config import format_validation_error, load_config, load_yaml, parse_config
from pipeline.errors import ConfigError
from simulator.config import FleetConfig, load_fleet_config
from simulator.faults import validate_fault
from simulator.scenario import load_scenario
from slo.jobs import JobsConfig
from slo.spec.loader import load_spec


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "file.yaml"
    path.write_text(text)
    return path


# --- repeated keys ---------------------------------------------------------------------------

_SPEC_WITH_REPEAT = """\
version: llmslo/v1
slos:
  - name: availability
    objective: 0.999
    sli: {kind: availability}
    objective: 0.5
"""


@pytest.mark.parametrize(
    ("load", "text", "key", "line", "first"),
    [
        (load_config, "ingest:\n  batch_max_ms: 100\n  batch_max_ms: 9000\n", "batch_max_ms", 3, 2),
        (load_config, "bus: {partitions: 2}\nstore: {}\nbus: {partitions: 8}\n", "bus", 3, 1),
        (load_spec, _SPEC_WITH_REPEAT, "objective", 6, 4),
        (load_fleet_config, "pods: []\nspeed: 2\nspeed: 50\n", "speed", 3, 2),
        (load_scenario, "events: []\nevents: []\n", "events", 2, 1),
    ],
    ids=["config ingest key", "config section", "slo spec", "fleet config", "scenario"],
)
def test_a_repeated_key_is_an_error_naming_the_key_and_both_lines(
    tmp_path: Path, load: Any, text: str, key: str, line: int, first: int
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load(path)
    message = str(caught.value)
    assert f"duplicate key {key!r} (first at line {first})" in message
    assert f'"{path}", line {line}' in message


def test_a_repeated_key_in_a_file_sd_file_is_an_error() -> None:
    text = "- targets: [a:1]\n  labels: {pool: x}\n  targets: [b:2]\n"
    with pytest.raises(ValueError, match="duplicate key 'targets' \\(first at line 1\\)"):
        parse_file_sd(text, "sd.yaml")


def test_merge_keys_may_still_be_overridden() -> None:
    text = "base: &b {interval_s: 5, timeout_s: 3}\ncollect:\n  <<: *b\n  timeout_s: 1\n"
    assert load_yaml(text)["collect"] == {"interval_s": 5, "timeout_s": 1}


def test_distinct_keys_that_look_alike_are_not_repeats() -> None:
    assert load_yaml("a: 1\nA: 2\n'1': 3\n1: 4\n") == {"a": 1, "A": 2, "1": 3, 1: 4}


def test_the_loader_stays_safe() -> None:
    with pytest.raises(yaml.YAMLError):
        load_yaml("!!python/object/apply:os.system ['true']\n")


# --- booleans where numbers belong, ports out of range ----------------------------------------


def _section_error(model: type[BaseModel], raw: dict[str, Any], prefix: str) -> str:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(raw)
    return format_validation_error(caught.value, prefix=prefix)


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        ({"ingest": {"batch_max_ms": True}}, "ingest.batch_max_ms"),
        ({"ingest": {"session_timeout_ms": "10000"}}, "ingest.session_timeout_ms"),
        ({"ingest": {"metrics_port": 99999}}, "ingest.metrics_port"),
        ({"bus": {"partitions": True}}, "bus.partitions"),
        ({"bus": {"bootstrap_servers": "kafka-0:99999"}}, "bus.bootstrap_servers"),
        ({"bus": {"bootstrap_servers": "kafka-0:9092,kafka-1"}}, "bus.bootstrap_servers"),
        ({"store": {"raw_retention_days": True}}, "store.raw_retention_days"),
    ],
)
def test_the_config_file_refuses_booleans_for_numbers_and_impossible_ports(
    raw: dict[str, Any], path: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    assert f"\n{path}: " in str(caught.value)


def test_store_paths_are_still_read_from_strings() -> None:
    config = parse_config({"store": {"path": "var/x.duckdb", "lake_dir": "lake"}})
    assert config.store.path == Path("var/x.duckdb") and config.store.lake_dir == Path("lake")


@pytest.mark.parametrize(
    ("model", "raw", "path"),
    [
        (CollectConfig, {"interval_s": True}, "collect.interval_s"),
        (CollectConfig, {"concurrency": True}, "collect.concurrency"),
        (CollectConfig, {"metrics_port": 99999}, "collect.metrics_port"),
        (CollectConfig, {"targets": [{"url": "10.0.0.7:99999"}]}, "collect.targets[0].url"),
        (TapConfig, {"connect_timeout_s": True}, "tap.connect_timeout_s"),
        (TapConfig, {"max_attempts": True}, "tap.max_attempts"),
        (TapConfig, {"retry_on_status": [True]}, "tap.retry_on_status[0]"),
        (TapConfig, {"listen": "127.0.0.1:99999"}, "tap.listen"),
        (TapConfig, {"upstreams": ["http://127.0.0.1:99999"]}, "tap.upstreams"),
        (TapConfig, {"metrics_port": 70000}, "tap.metrics_port"),
        (TapConfig, {"otlp_endpoint": "http://127.0.0.1:99999/v1"}, "tap.otlp_endpoint"),
        (JobsConfig, {"settle_s": True}, "slo.settle_s"),
        (JobsConfig, {"flags": {"dwell_s": True}}, "slo.flags.dwell_s"),
        (JobsConfig, {"metrics_port": 99999}, "slo.metrics_port"),
        (FleetConfig, {"speed": True}, "simulator.speed"),
        (FleetConfig, {"pods": [{"name": "p", "port": 99999}]}, "simulator.pods[0].port"),
        (FleetConfig, {"pods": [{"name": "p", "port": True}]}, "simulator.pods[0].port"),
        (
            FleetConfig,
            {"pods": [{"name": "p", "engine": {"max_num_seqs": True}}]},
            "simulator.pods[0].engine.max_num_seqs",
        ),
    ],
)
def test_sections_refuse_booleans_for_numbers_and_impossible_ports(
    model: type[BaseModel], raw: dict[str, Any], path: str
) -> None:
    assert _section_error(model, raw, path.split(".")[0]).startswith(f"{path}: ")


def test_port_zero_still_means_any_free_port_where_documented() -> None:
    assert TapConfig.model_validate({"listen": "127.0.0.1:0", "metrics_port": 0}).metrics_port == 0
    assert CollectConfig.model_validate({"metrics_port": 0}).metrics_port == 0


def test_scenario_events_and_fault_parameters_refuse_booleans_for_numbers() -> None:
    with pytest.raises(ConfigError, match="at_s: Input should be a valid number"):
        load_scenario({"events": [{"at_s": True, "pod": "p", "fault": "stall"}]})
    with pytest.raises(ConfigError, match="blocks_per_s"):
        validate_fault("kv_leak", {"blocks_per_s": True})


def test_slo_spec_paths_are_still_read_from_strings() -> None:
    assert JobsConfig.model_validate({"spec": "config/slo.yaml"}).spec == Path("config/slo.yaml")
