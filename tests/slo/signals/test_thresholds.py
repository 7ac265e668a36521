"""Each detector family's thresholds live beside its detectors, and the ``detectors:`` section
users write stays one flat mapping of them all (:class:`slo.signals.config.DetectorConfig`)."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pydantic import BaseModel

import slo.signals
from llmslo.sections import parse_config
from pipeline.config import STRICT
from pipeline.errors import ConfigError
from slo.jobs import JobsConfig
from slo.signals import (
    _serving,
    detectors,
    edge,
    engine,
    failure,
    findings,
    health,
    infra,
    latency,
    traffic,
)
from slo.signals.config import DetectorConfig
from slo.signals.findings import CommonThresholds

SIGNALS_DIR = Path(slo.signals.__file__).parent

#: Module → the thresholds model its detectors read (``detectors`` runs the pool rule).
FAMILIES: dict[ModuleType, type[BaseModel]] = {
    engine: engine.EngineThresholds,
    health: health.HealthThresholds,
    traffic: traffic.TrafficThresholds,
    latency: latency.LatencyThresholds,
    failure: failure.FailureThresholds,
    edge: edge.EdgeThresholds,
    infra: infra.InfraThresholds,
    _serving: _serving.ServingThresholds,
    findings: CommonThresholds,
}
READERS = {**FAMILIES, detectors: CommonThresholds}


def _declared(model: type[BaseModel]) -> set[str]:
    """Fields the class itself declares (not those it inherits)."""
    return set(inspect.get_annotations(model))


def _threshold_models() -> list[type[BaseModel]]:
    """Every thresholds model that declares fields in a module of ``slo/signals``, found by
    import (compositions such as ``PoolThresholds`` and ``DetectorConfig`` declare none)."""
    found: list[type[BaseModel]] = []
    for path in sorted(SIGNALS_DIR.glob("*.py")):
        module = importlib.import_module(f"slo.signals.{path.stem}")
        for value in vars(module).values():
            if (
                inspect.isclass(value)
                and issubclass(value, CommonThresholds)
                and value.__module__ == module.__name__
                and _declared(value)
            ):
                found.append(value)
    return found


def test_the_composed_schema_is_the_union_of_the_family_models() -> None:
    union: dict[str, Any] = {}
    for model in FAMILIES.values():
        properties = model.model_json_schema()["properties"]
        for name in _declared(model):
            assert name not in union, f"{name} declared twice"
            union[name] = properties[name]
    assert DetectorConfig.model_json_schema()["properties"] == union
    assert DetectorConfig.model_config == STRICT


def test_every_threshold_has_one_home_in_a_family_module() -> None:
    models = _threshold_models()
    assert set(models) == set(FAMILIES.values())
    assert all(model in DetectorConfig.__mro__ for model in models)
    assert _declared(DetectorConfig) == set()
    homes: dict[str, list[str]] = {}
    for model in models:
        for name in _declared(model):
            homes.setdefault(name, []).append(f"{model.__module__}.{model.__name__}")
    assert set(homes) == set(DetectorConfig.model_fields)
    assert {name: where for name, where in homes.items() if len(where) > 1} == {}


def _cfg_reads(module: ModuleType) -> set[str]:
    """Names of ``cfg.<name>`` attribute reads in the module's source that are thresholds."""
    source = Path(str(module.__file__)).read_text(encoding="utf-8")
    return {
        node.attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "cfg"
        and node.attr in DetectorConfig.model_fields
    }


@pytest.mark.parametrize(("module", "model"), READERS.items(), ids=[m.__name__ for m in READERS])
def test_a_family_module_reads_only_its_own_and_the_shared_thresholds(
    module: ModuleType, model: type[BaseModel]
) -> None:
    reads = _cfg_reads(module)
    assert reads, f"{module.__name__} reads no threshold: the scan found nothing"
    assert reads - set(model.model_fields) == set()


DETECTORS_SECTION = {
    "lookback_s": 120,
    "gpu_pods": {"dcgm-pod-0": "engine-0"},
    "pool_min_serving": 3,
    "stall_for_s": 20,
    "down_for_s": 30,
    "hot_min_requests": 50,
    "slow_p_value": 0.01,
    "failure_share": 0.2,
    "entry_window_s": 30,
    "kv_index_drop": 0.5,
    "autoscalers": ["serving/llm-hpa"],
}


def test_the_detectors_section_stays_one_flat_mapping_of_every_family() -> None:
    config = parse_config({"slo": {"detectors": DETECTORS_SECTION}})
    detectors_cfg = config.section("slo", JobsConfig).detectors
    assert {k: getattr(detectors_cfg, k) for k in DETECTORS_SECTION} == DETECTORS_SECTION
    untouched = set(DetectorConfig.model_fields) - set(DETECTORS_SECTION)
    defaults = DetectorConfig()
    assert all(getattr(detectors_cfg, k) == getattr(defaults, k) for k in untouched)


@pytest.mark.parametrize(
    ("detectors_section", "error"),
    [
        ({"engine": {"stall_for_s": 20}}, "slo.detectors.engine: Extra inputs are not permitted"),
        ({"stall_for_s": "20"}, "slo.detectors.stall_for_s: Input should be a valid number"),
        ({"pool_min_serving": 1}, "slo.detectors.pool_min_serving: Input should be greater"),
        ({"autoscalers": ["llm-hpa"]}, "slo.detectors.autoscalers[0]: Value error, 'llm-hpa'"),
    ],
    ids=[
        "a family is no nested section",
        "a quoted number is refused",
        "a shared threshold keeps its bound",
        "an autoscaler keeps its namespace-slash-name rule",
    ],
)
def test_a_wrong_threshold_is_named_by_its_flat_path(
    detectors_section: dict[str, Any], error: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"slo": {"detectors": detectors_section}})
    assert error in str(info.value)
