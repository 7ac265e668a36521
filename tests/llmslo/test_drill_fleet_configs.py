"""The simulated fleets the drill plans: one builder for plain and front-end fleets, so
every pod runs the drill's prefill chunk and each fleet's pods and front ends agree."""

from __future__ import annotations

import pytest

from llmslo.drill.fronts import FRONT_END_FLEETS, drill_fleet_config, front_end_config
from simulator import GatewayConfig


def test_a_plain_fleet_has_its_pods_named_after_it_one_gpu_each() -> None:
    gateway = GatewayConfig.model_validate({"health_interval_s": 1.0})
    config = drill_fleet_config(
        "fleet3", 3, 11, 256, pod_prefix="fleet3-", front_ends={"gateway": gateway}
    )
    assert [(p.name, p.node, p.gpus) for p in config.pods] == [
        ("fleet3-p0", "fleet3-node", [0]),
        ("fleet3-p1", "fleet3-node", [1]),
        ("fleet3-p2", "fleet3-node", [2]),
    ]
    assert [(n.name, n.gpus) for n in config.nodes] == [("fleet3-node", 3)]
    assert {p.engine.prefill_chunk_tokens for p in config.pods} == {256}
    assert (config.seed, config.gateway, config.pd) == (11, gateway, None)


@pytest.mark.parametrize("kind", FRONT_END_FLEETS, ids=list(FRONT_END_FLEETS))
def test_a_front_end_fleet_has_the_pods_its_front_ends_name(kind: str) -> None:
    fleet = FRONT_END_FLEETS[kind]
    config = front_end_config("fleet9", fleet, 5, 256)
    names = [p.name for p in config.pods]
    assert names == [f"p{i}" for i in range(fleet.pods)]
    if config.pd is not None:
        assert {config.pd.prefill, config.pd.decode} <= set(names)
    assert (config.gateway is not None) == ("gateway" in fleet.front_ends)
    for pod in config.pods:
        assert pod.engine.prefill_chunk_tokens == 256
        for setting, value in (fleet.engine or {}).items():
            assert getattr(pod.engine, setting) == value
