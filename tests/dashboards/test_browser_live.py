"""A real browser in front of a live pipeline: headless Debian Chromium loads the app that
`llmslo dashboard --api` serves against a running `llmslo run`, while it ingests.

The fleet is the simulator's (two vLLM pods on one node and its dcgm-exporter, in this
process), with a real `llmslo tap` per pod, `llmslo collect` discovering everything through
file_sd (pods by name, so DCGM's ``pod`` label names the engine each GPU serves), and
Poisson load through the taps (`llmslo load`); `llmslo run` ingests from the session's
embedded broker and serves its API. Every page is visited once data flows; the Fleet page is
loaded again at the end and must count more requests than on the first load. The
history-file browser test (``test_browser.py``) keeps covering the pages' faults (incidents,
a stall, flag transitions, a canary verdict), which a healthy live run does not have.

Screenshots are kept under ``var/screenshots/dashboards/live/``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from dashboards.filters import deep_link
from dashboards.views import PAGES
from pipeline.broker import EmbeddedBroker, free_port
from pipeline.bus import Bus, BusConfig
from simulator import Fleet, FleetConfig, NodeConfig, PodConfig
from tests.dashboards.browser import HeadlessChromium, blank
from tests.dashboards.test_browser import ROOT, SHOTS, chromium, start_dashboard  # noqa: F401
from tests.processes import line_matching

pytestmark = pytest.mark.slow

LIVE_SHOTS = SHOTS / "live"
PODS = ("pod-0", "pod-1")
#: Pages that must show data from the live run, and the charts each must draw then.
LIVE_CHARTS = {"slo": 1, "latency": 1, "engines": 1, "gpus": 1, "requests": 1}
#: Fleet's traffic metric, as Streamlit renders a metric: label, newline, value.
_REQUESTS = re.compile(r"client requests \(last hour\)\s+([\d,]+)")


def _llmslo(
    children: list[subprocess.Popen[str]], args: list[str], log: Path
) -> subprocess.Popen[str]:
    """``llmslo ARGS`` as a child process (stdout piped, stderr to ``log``), kept in ``children``."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "llmslo", *args],
        stdout=subprocess.PIPE if args[0] == "run" else log.open("w"),
        stderr=log.open("a"),
        text=True,
        env=env,
        cwd=ROOT,
    )
    children.append(process)
    return process


def _stop(children: list[subprocess.Popen[str]]) -> None:
    """SIGTERM to every child at once, then wait for each (kill after 30 s)."""
    for process in children:
        if process.poll() is None:
            process.terminate()
    for process in children:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _until(check: Callable[[], Any], what: str, run: subprocess.Popen[str], log: Path) -> Any:
    """``check()`` once it is truthy (HTTP errors count as not yet), within 90 s."""
    deadline = time.monotonic() + 90
    while True:
        try:
            result = check()
        except httpx.HTTPError:
            result = None
        if result:
            return result
        assert run.poll() is None, f"llmslo run exited: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{what} not seen within 90 s"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    config = FleetConfig(
        nodes=[NodeConfig(name="node-0", gpus=2)],
        pods=[
            PodConfig(name=name, dialect="vllm", model="llama-3-8b", node="node-0", gpus=[i])
            for i, name in enumerate(PODS)
        ],
        speed=5.0,
        seed=5,
    )
    with Fleet(config) as running:
        yield running


@pytest.fixture(scope="module")
def live_bus(broker: EmbeddedBroker) -> Iterator[Bus]:
    """The session's broker under a topic prefix of this module (one run for every page)."""
    config = BusConfig(
        bootstrap_servers=broker.bootstrap_servers,
        topic_prefix=f"t{uuid.uuid4().hex[:10]}.",
        partitions=2,
    )
    with Bus(config) as connected:
        connected.ensure_topics()
        yield connected


def _configs(workdir: Path, bus: Bus, fleet: Fleet) -> tuple[Path, dict[str, Path]]:
    """The pipeline's config (run and collect) and one per tap (naming its pod)."""
    targets = workdir / "targets.json"
    targets.write_text(json.dumps(fleet.file_sd()), encoding="utf-8")
    base = {
        "bus": {
            "bootstrap_servers": bus.bootstrap_servers,
            "topic_prefix": bus.prefix,
            "partitions": bus.config.partitions,
        },
        "store": {"path": str(workdir / "live.duckdb")},
        "ingest": {"group_id": f"live-{bus.prefix}", "batch_max_ms": 200},
        "slo": {"interval_s": 2},
        "api": {"port": 0},
        "collect": {"file_sd": [str(targets)]},
    }
    config = workdir / "llmslo.yaml"
    config.write_text(yaml.safe_dump(base), encoding="utf-8")
    taps = {}
    for pod in PODS:
        taps[pod] = workdir / f"tap-{pod}.yaml"
        taps[pod].write_text(yaml.safe_dump({**base, "tap": {"instance": pod}}), encoding="utf-8")
    return config, taps


def _healthy(tap: str) -> bool:
    return httpx.get(f"{tap}/health").status_code == 200


def _flowing(api: httpx.Client) -> bool:
    """Requests of both pods, engine samples, the pods' GPUs and an SLO evaluation are in."""
    meta = api.get("/api/v1/meta").json()
    if not set(PODS) <= {i["instance"] for i in meta["instances"]} or not meta["data_end_ms"]:
        return False
    end_ms = int(time.time() * 1000) + 60_000
    window = {"start_ms": end_ms - 3_600_000, "end_ms": end_ms, "bucket_ms": 60_000}
    served = api.get("/api/v1/outcomes", params={"by": "instance", **window}).json()["data"]
    gpus = api.get("/api/v1/gpus", params={"signals": "gpu_util", **window}).json()["data"]
    slos = api.get("/api/v1/slos").json()["count"]
    return (
        set(PODS) <= {row["instance"] for row in served}
        and set(PODS) <= {row["instance"] for row in gpus}
        and slos > 0
    )


@pytest.fixture(scope="module")
def live(
    live_bus: Bus, fleet: Fleet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """(dashboard URL, API URL) of `llmslo dashboard --api` on a running `llmslo run`."""
    workdir = tmp_path_factory.mktemp("live")
    config, tap_configs = _configs(workdir, live_bus, fleet)
    children: list[subprocess.Popen[str]] = []
    try:
        # Everything starts at once (Python start-up is most of the wait on a busy host).
        taps = []
        for pod in fleet.pods:
            port = free_port()
            args = ["tap", "-c", str(tap_configs[pod.name]), "--listen", f"127.0.0.1:{port}"]
            _llmslo(children, [*args, "--upstream", pod.url], workdir / f"tap-{pod.name}.log")
            taps.append(f"http://127.0.0.1:{port}")
        collect = ["collect", "-c", str(config), "--interval", "1"]
        _llmslo(children, collect, workdir / "collect.log")
        run_log = workdir / "run.log"
        run = _llmslo(children, ["run", "-c", str(config)], run_log)
        assert run.stdout is not None
        found, lines = line_matching(run.stdout, r"serving the API on (http://\S+) ")
        assert found, f"{lines!r} {run_log.read_text()[-2000:]}"
        api_url = found[1]
        dashboard, url = start_dashboard("--api", api_url)
        children.append(dashboard)
        for tap in taps:
            _until(partial(_healthy, tap), tap, run, run_log)
        load = ["load", "--targets", ",".join(taps), "--rate", "4", "--duration", "300"]
        _llmslo(children, load, workdir / "load.log")
        with httpx.Client(base_url=api_url, timeout=10, trust_env=False) as api:
            _until(lambda: _flowing(api), "data from the pods, their GPUs and an SLO", run, run_log)
        yield url, api_url
    finally:
        _stop(children)


def _requests_shown(text: str) -> int:
    found = _REQUESTS.search(text)
    assert found, f"no request count on the Fleet page: {text[:1500]}"
    return int(found[1].replace(",", ""))


def test_every_page_renders_the_live_run_and_the_fleet_page_follows_it(
    chromium: HeadlessChromium,  # noqa: F811
    live: tuple[str, str],
) -> None:
    url, _ = live
    chromium.open(deep_link(url, "fleet"), timeout_s=90)
    first = chromium.state()
    requests_before = _requests_shown(first["text"])
    first_load_s = time.monotonic()
    assert requests_before > 0
    for path in PAGES:
        chromium.open(deep_link(url, path), timeout_s=90)
        state = chromium.state()
        png = chromium.screenshot(LIVE_SHOTS / f"{path}.png")
        assert state["title"] == PAGES[path][0]
        assert state["exceptions"] == [] and state["errors"] == [], (path, state)
        assert "Page not found" not in state["text"] and not blank(png), path
        if path in LIVE_CHARTS:
            assert "No data yet" not in state["text"], (path, state["text"][:2000])
            assert state["drawn"] >= LIVE_CHARTS[path], (path, state)
        assert "live, refreshing every" in state["text"], path  # the pages know it is live
    # The dashboards cache answers for 20 s: past that, a new load asks the API again.
    time.sleep(max(0.0, 21 - (time.monotonic() - first_load_s)))
    chromium.open(deep_link(url, "fleet"), timeout_s=90)
    again = chromium.state()
    chromium.screenshot(LIVE_SHOTS / "fleet-again.png")
    assert again["exceptions"] == []
    assert _requests_shown(again["text"]) > requests_before
