"""The metric names and bucket bounds the rules read exist in each dialect's real-format
exposition (the simulator's engines speak vLLM current/legacy, SGLang and Triton TRT-LLM)."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from alerts import SIGNATURES, Signature
from alerts.signatures import signature_recordings
from alerts.sources import ENGINE_HISTOGRAMS
from simulator import EngineConfig, Fleet, FleetConfig, NodeConfig, PodConfig

DIALECTS = ["vllm", "vllm-legacy", "sglang", "trtllm"]
#: Metric names in PromQL: engine prefixes, or DCGM/tap/process names we rely on.
_NAME = re.compile(r"\b((?:vllm|sglang):[A-Za-z0-9_:]+|nv_[A-Za-z0-9_]+|trtllm_[A-Za-z0-9_]+)")


@pytest.fixture(scope="module")
def exposed() -> Iterator[dict[str, dict[str, set[str]]]]:
    """dialect → sample name → the ``le`` values seen (empty set for non-buckets)."""
    pods = [
        PodConfig(name=f"pod-{i}", dialect=d, model="m", node="node-0", gpus=[i],
                  engine=EngineConfig.model_validate({}))
        for i, d in enumerate(DIALECTS)
    ]  # fmt: skip
    config = FleetConfig(nodes=[NodeConfig(name="node-0", gpus=4)], pods=pods, speed=50, seed=1)
    with Fleet(config) as fleet:
        out: dict[str, dict[str, set[str]]] = {}
        for i, dialect in enumerate(DIALECTS):
            base = f"http://127.0.0.1:{fleet.pod(f'pod-{i}').port}"
            body = json.dumps({"model": "m", "prompt": "a" * 40, "max_tokens": 4}).encode()
            for _ in range(3):
                request = urllib.request.Request(
                    base + "/v1/completions", body, {"Content-Type": "application/json"}
                )
                urllib.request.urlopen(request, timeout=30).read()
            text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
            names: dict[str, set[str]] = {}
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    les = names.setdefault(sample.name, set())
                    if "le" in sample.labels:
                        les.add(sample.labels["le"])
            out[dialect] = names
        yield out


def _names(expr: str) -> set[str]:
    return set(_NAME.findall(expr))


_PER_DIALECT = [
    (sig, dialect)
    for sig in SIGNATURES
    for dialect in DIALECTS
    if sig.labels.get("dialect") == dialect
    or (
        (dialect, sig.labels.get("dialect")) == ("vllm-legacy", "vllm")
        and sig.alert == "LlmEngineStalled"
    )
]


@pytest.mark.parametrize(
    ("sig", "dialect"), _PER_DIALECT, ids=[f"{s.key} on {d}" for s, d in _PER_DIALECT]
)
def test_each_dialects_signature_reads_names_its_engine_exposes(
    sig: Signature, dialect: str, exposed: dict[str, dict[str, set[str]]]
) -> None:
    names = _names(sig.expr)
    assert names
    assert names <= set(exposed[dialect]), names - set(exposed[dialect])


@pytest.mark.parametrize("dialect", DIALECTS)
def test_kv_and_running_recordings_cover_every_dialect(
    dialect: str, exposed: dict[str, dict[str, set[str]]]
) -> None:
    for rule in signature_recordings():
        assert _names(rule["expr"]) & set(exposed[dialect]), (rule["record"], dialect)


@pytest.mark.parametrize("dialect", ["vllm", "vllm-legacy", "sglang"])
def test_engine_histograms_and_their_default_bounds_are_exposed(
    dialect: str, exposed: dict[str, dict[str, set[str]]]
) -> None:
    for metric, (histogram, bounds) in ENGINE_HISTOGRAMS[dialect].items():
        seen = exposed[dialect].get(f"{histogram}_bucket")
        assert seen, f"{dialect} {metric}: {histogram}_bucket not exposed"
        assert {float(le) for le in seen if le != "+Inf"} == set(bounds), (dialect, metric)
