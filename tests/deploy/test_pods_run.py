"""The manifests are not fiction: the rendered containers run, as written, on loopback.

From ``kubectl kustomize deploy/overlays/vllm`` the test takes the tap and collector
sidecars of the engine Deployment and the ``llmslo run`` container of the StatefulSet:
their ``args``, their ``env`` with the downward-API values of two simulated pods (a stable
and a canary ``pod-template-hash``) and the ConfigMaps' files, and expands ``$(VAR)`` as
the kubelet does. Only what a cluster provides differs: the Kafka bootstrap (the session's
embedded broker, a topic prefix of its own), the file paths of the mounted volumes, and
the listening ports (free loopback ports in place of the manifest's, mapped one to one, so
the tap still reaches the engine through the ``llmslo.io/engine-port`` annotation). Then
load through the taps must give request records, findings (the canary fails half its
prefills) and a verdict for the AnalysisTemplate's request, sent as Argo's web provider
sends it, that its ``failureCondition`` reads as a failure.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from pipeline.broker import free_port
from pipeline.bus import Bus
from simulator import Fleet, FleetConfig, NodeConfig, PodConfig
from tests.deploy.conftest import render

TOKEN = "deploy-e2e-token"
HASHES = {"stable": "5d9f7c6b4", "canary": "7f8c9d2a1"}
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _by(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"].startswith(name))


def _container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def _field(pod: dict[str, Any], path: str) -> str:
    """A downward-API ``fieldPath`` of ``pod`` (missing labels read as "", as in a pod)."""
    found = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if found:
        return str(pod["metadata"][found[1]].get(found[2], ""))
    return {
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": pod["metadata"]["namespace"],
        "spec.nodeName": pod["spec"]["nodeName"],
    }[path]


def _command(
    container: dict[str, Any],
    pod: dict[str, Any],
    configmaps: dict[str, dict[str, str]],
    secrets: dict[str, dict[str, str]],
) -> tuple[list[str], dict[str, str]]:
    """``args`` and ``env`` of ``container`` as the kubelet would start it in ``pod``."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        source = var.get("valueFrom")
        if source is None:
            env[var["name"]] = var["value"]
        elif "fieldRef" in source:
            env[var["name"]] = _field(pod, source["fieldRef"]["fieldPath"])
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            env[var["name"]] = configmaps[ref["name"]][ref["key"]]
        else:
            ref = source["secretKeyRef"]
            env[var["name"]] = secrets[ref["name"]][ref["key"]]
    args = [_VAR.sub(lambda m: env.get(m[1], m[0]), arg) for arg in container["args"]]
    return args, env


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    pods = [
        PodConfig(
            name=f"llama-3-8b-{HASHES[side]}-x{i}", model="llama-3-8b", node="gpu-node-0", gpus=[i]
        )
        for i, side in enumerate(("stable", "canary"))
    ]
    config = FleetConfig(
        nodes=[NodeConfig(name="gpu-node-0", gpus=2)], pods=pods, speed=5.0, seed=7
    )
    with Fleet(config) as running:
        yield running


def _healthy(base_url: str) -> bool:
    return httpx.get(f"{base_url}/health", timeout=2).status_code == 200


def _until(
    check: Callable[[], Any],
    what: str,
    processes: list[subprocess.Popen[str]],
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
        for process in processes:
            assert process.poll() is None, f"{process.args!r} exited {process.returncode}"
        assert time.monotonic() < deadline, f"{what} not seen within {timeout_s:.0f} s"
        time.sleep(0.5)


@pytest.mark.slow
def test_the_rendered_pods_run_and_the_pipeline_judges_the_canary(
    bus: Bus, fleet: Fleet, tmp_path: Path
) -> None:
    objects = render("overlays/vllm")
    engine = _by(objects, "Deployment", "llama-3-8b")
    statefulset = _by(objects, "StatefulSet", "llmslo")
    analysis = yaml.safe_load(
        (Path(__file__).parents[2] / "deploy/canary/argo/analysistemplate.yaml").read_text()
    )
    configmaps = {
        o["metadata"]["name"]: dict(o["data"]) for o in objects if o["kind"] == "ConfigMap"
    }
    secrets = {o["metadata"]["name"]: {"token": TOKEN} for o in objects if o["kind"] == "Secret"}
    for data in configmaps.values():
        if "bootstrap_servers" in data:
            data["bootstrap_servers"] = bus.bootstrap_servers
    ports = {8190: free_port(), 9465: free_port(), 8100: 0, 9466: 0, 9467: 0}

    def config_file(
        name: str, key: str, section_ports: dict[str, tuple[str, int]], copy: str = ""
    ) -> Path:
        """The mounted ConfigMap file with the test's topic prefix, state dir and ports."""
        document = yaml.safe_load(configmaps[name][key])
        document["bus"] = {"topic_prefix": bus.prefix, "partitions": bus.config.partitions}
        for section, (field, manifest_port) in section_ports.items():
            assert document[section][field] == manifest_port, (section, field)
            document[section][field] = free_port()
        if "store" in document:
            document["store"]["path"] = str(tmp_path / "llmslo.duckdb")
            document["ingest"] |= {"group_id": f"deploy-{bus.prefix}", "batch_max_ms": 200}
            document["slo"] = {"interval_s": 1}
        path = tmp_path / f"{name}{copy}-{key}"
        path.write_text(yaml.safe_dump(document))
        return path

    sidecar_ports = {"tap": ("metrics_port", 9466), "collect": ("metrics_port", 9467)}
    api_port = ports[8190]
    llmslo_yaml_name = next(n for n in configmaps if n.startswith("llmslo-config"))
    run_config = config_file(llmslo_yaml_name, "llmslo.yaml", {"api": ("port", 8190)})
    api_port = yaml.safe_load(run_config.read_text())["api"]["port"]

    processes: list[subprocess.Popen[str]] = []
    with ExitStack() as stack:
        mounts: dict[str, str] = {}

        def start(args: list[str], env: dict[str, str], log: str) -> None:
            args = [
                str(sidecar)
                if a == "/etc/llmslo/sidecar.yaml"
                else str(run_config)
                if a == "/etc/llmslo/llmslo.yaml"
                else a
                for a in args
            ]
            handle = (tmp_path / log).open("w")
            process = subprocess.Popen(
                [sys.executable, "-m", "llmslo", *args],
                env={**os.environ, **env},
                stdout=handle,
                stderr=subprocess.STDOUT,
                text=True,
            )
            processes.append(process)

            def stop() -> None:
                process.terminate()
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()

            stack.callback(stop)

        run_args, run_env = _command(_container(statefulset, "llmslo"), {}, configmaps, secrets)
        assert run_args[run_args.index("--metrics-port") + 1] == "9465"
        run_args[run_args.index("--metrics-port") + 1] = str(ports[9465])
        start(run_args, run_env, "run.log")
        taps = []
        for simulated in fleet.pods:
            template = engine["spec"]["template"]
            revision = simulated.name.split("-")[-2]
            pod = {
                "metadata": {
                    "name": simulated.name,
                    "namespace": "inference",
                    "labels": {**template["metadata"]["labels"], "pod-template-hash": revision},
                    # The engine listens where the simulator put it; the annotation says so.
                    "annotations": {
                        **template["metadata"]["annotations"],
                        "llmslo.io/engine-port": str(simulated.port),
                    },
                },
                "spec": {"nodeName": "gpu-node-0"},
            }
            # Each pod mounts the ConfigMap: its own copy here, its own metrics ports.
            sidecar = config_file("llmslo-sidecar", "sidecar.yaml", sidecar_ports, revision)
            mounts["/etc/llmslo/sidecar.yaml"] = str(sidecar)
            tap_args, tap_env = _command(_container(engine, "llmslo-tap"), pod, configmaps, secrets)
            host, port = tap_args.index("--host") + 1, tap_args.index("--port") + 1
            assert (tap_args[host], tap_args[port]) == ("0.0.0.0", "8100")
            tap_port = free_port()
            tap_args[host], tap_args[port] = "127.0.0.1", str(tap_port)
            assert f"http://127.0.0.1:{simulated.port}" in tap_args
            start(tap_args, tap_env, f"tap-{revision}.log")
            taps.append(f"http://127.0.0.1:{tap_port}")
            collect_args, collect_env = _command(
                _container(engine, "llmslo-collector"), pod, configmaps, secrets
            )
            assert f"instance={simulated.name}" in collect_args
            start([*collect_args, "--interval", "1"], collect_env, f"collect-{revision}.log")
        fleet.set_fault(fleet.pods[1].name, "prefill_failure", fraction=0.5)
        api = f"http://127.0.0.1:{api_port}"
        for tap in taps:
            _until(partial(_healthy, tap), "tap health", processes)
        start(
            ["load", "--targets", ",".join(taps), "--rate", "16", "--duration", "45"],
            {},
            "load.log",
        )

        with httpx.Client(base_url=api, timeout=10) as client:
            meta = _until(lambda: client.get("/api/v1/meta").json(), "the API", processes)
            assert meta is not None
            now_ms = int(time.time() * 1000)
            window = {"start_ms": now_ms - 600_000, "end_ms": now_ms + 600_000}
            canary = fleet.pods[1].name

            def canary_findings() -> list[tuple[str, str, str]]:
                rows = client.get("/api/v1/findings", params=window).json()["data"]
                return [
                    (f["signal"], f["scope_id"], f["pool"]) for f in rows if f["scope_id"] == canary
                ]

            # Named by the pod name and the pool label, as the sidecars stamp them.
            findings = _until(canary_findings, "the canary's findings", processes, timeout_s=100)
            assert ("prefill_failure", canary, "llama-3-8b") in findings, findings
            # The AnalysisTemplate's request, its arguments filled in as Argo fills them.
            web = analysis["spec"]["metrics"][0]["provider"]["web"]
            values = {
                "namespace": "inference",
                "service": "llama-3-8b",
                "canary-hash": HASHES["canary"],
                "stable-hash": HASHES["stable"],
                "window": "10m",
                "min-requests": "40",
                "api-token": TOKEN,
            }
            fill = lambda text: re.sub(r"\{\{args\.([a-z-]+)\}\}", lambda m: values[m[1]], text)  # noqa: E731
            body = {key: fill(value) for key, value in web["jsonBody"].items()}
            headers = {h["key"]: fill(h["value"]) for h in web["headers"]}
            path = web["url"].split(":8190", 1)[1]

            def verdict() -> Any:
                answer = client.request(web["method"], path, json=body, headers=headers)
                assert answer.status_code == 200, answer.text
                summary = answer.json()["summary"]  # jsonPath {$.summary}
                return summary if summary["verdict"] != "inconclusive" else None

            summary = _until(verdict, "a conclusive verdict", processes, timeout_s=90)
            assert analysis["spec"]["metrics"][0]["failureCondition"] == 'result.verdict == "fail"'
            assert summary["verdict"] == "fail", summary
