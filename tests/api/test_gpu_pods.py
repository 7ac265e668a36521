"""``detectors.gpu_pods`` (dcgm-exporter's ``pod`` label → engine instance, for fleets whose
engines are not named by their pod) reaches the read API: ``/api/v1/gpus`` names each GPU by
the engine it serves, as the detectors do, and filters on that engine and its pool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from pipeline.store import Store
from slo import queries
from tests.api.test_api_command import api_process
from tests.slo.factories import T0_MS, engine_sample, gpu_sample, insert

#: The engine is scraped by host:port (what the drill names it); dcgm labels its GPU by pod.
ENGINE, POD, POOL = "10.0.0.5:8000", "vllm-chat-7f9c4-x2k", "chat"
GPU_PODS = {POD: ENGINE}
SERIES: dict[str, Any] = {
    "signals": ["gpu_util"],
    "start_ms": T0_MS,
    "end_ms": T0_MS + 600_000,
    "bucket_ms": 600_000,
}


def insert_renamed(store: Store) -> None:
    """Ten minutes of one engine and its GPU, named differently by the two exporters."""
    minutes = [T0_MS + m * 60_000 for m in range(10)]
    insert(
        store,
        engine=[engine_sample(ts, "running", 4, instance=ENGINE, pool=POOL) for ts in minutes],
        gpu=[gpu_sample(ts, "gpu_util", 80, pod=POD) for ts in minutes],
    )


@pytest.fixture
def renamed(store: Store) -> Store:
    insert_renamed(store)
    return store


def _engines(rows: list[dict[str, Any]]) -> set[tuple[Any, Any]]:
    return {(row["instance"], row["pool"]) for row in rows}


def test_gpu_series_names_the_gpu_by_the_engine_gpu_pods_maps_its_pod_to(renamed: Store) -> None:
    mapped = queries.gpu_series(renamed.con.cursor(), gpu_pods=GPU_PODS, **SERIES)
    assert _engines(mapped.to_pylist()) == {(ENGINE, POOL)}
    for narrowed in (
        queries.gpu_series(renamed.con.cursor(), gpu_pods=GPU_PODS, instances=[ENGINE], **SERIES),
        queries.gpu_series(renamed.con.cursor(), gpu_pods=GPU_PODS, pool=POOL, **SERIES),
    ):
        assert _engines(narrowed.to_pylist()) == {(ENGINE, POOL)}
    # without the mapping the pod label is all there is (no engine of that name: no pool)
    plain = queries.gpu_series(renamed.con.cursor(), **SERIES)
    assert _engines(plain.to_pylist()) == {(POD, None)}


def test_the_gpu_route_applies_the_mapping_it_was_built_with(renamed: Store) -> None:
    app = create_app(renamed.con.cursor, token="t", gpu_pods=GPU_PODS)
    params = {**SERIES, "signals": "gpu_util", "instances": ENGINE}
    with TestClient(app) as client:
        answer = client.get("/api/v1/gpus", params=params)
        assert answer.status_code == 200, answer.text
        assert _engines(answer.json()["data"]) == {(ENGINE, POOL)}
        # the mapping is the server's configuration, never a query parameter
        refused = client.get("/api/v1/gpus", params={**params, "gpu_pods": f"{POD}:x"})
        assert refused.status_code == 400 and refused.json()["parameter"] == "gpu_pods"


def test_llmslo_api_takes_gpu_pods_from_the_slo_section_of_its_config(
    renamed: Store, tmp_path: Path
) -> None:
    renamed.close()
    config = tmp_path / "llmslo.yaml"
    config.write_text(
        f"store: {{path: '{renamed.path}'}}\nslo:\n  detectors:\n    gpu_pods: {{{POD}: '{ENGINE}'}}\n",
        encoding="utf-8",
    )
    with api_process("-c", str(config), "--read-only") as url:
        answer = httpx.get(f"{url}/api/v1/gpus", params={**SERIES, "signals": "gpu_util"})
    assert answer.status_code == 200, answer.text
    assert _engines(answer.json()["data"]) == {(ENGINE, POOL)}
