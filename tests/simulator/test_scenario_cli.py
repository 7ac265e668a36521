"""Scenario timelines, fleet config validation and the ``llmslo sim`` / ``llmslo load`` CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmslo.cli import main
from pipeline.errors import ConfigError
from simulator import load_fleet_config
from simulator.scenario import ScenarioRunner, load_scenario
from tests.simulator.conftest import get, scrape, value, wait_for

ROOT = Path(__file__).resolve().parents[2]


def test_scenario_plays_set_and_clear_in_order(make_fleet):
    fleet = make_fleet(["vllm", "vllm"])
    scenario = load_scenario(
        {
            "events": [
                {"at_s": 0.3, "pod": "pod-0", "fault": "not_ready", "action": "clear"},
                {"at_s": 0.0, "pod": "pod-0", "fault": "not_ready"},
                {"at_s": 0.1, "pod": "pod-1", "fault": "slow_decode", "params": {"factor": 3}},
            ]
        },
        ["pod-0", "pod-1"],
    )
    runner = ScenarioRunner(fleet, scenario).start()
    assert wait_for(lambda: get(fleet.pods[0].url + "/health")[0] == 503, timeout=5)
    assert runner.wait(10)
    assert get(fleet.pods[0].url + "/health")[0] == 200
    assert fleet.active_faults("pod-1") == {"slow_decode": {"factor": 3.0}}
    assert [e.fault for _, e in runner.applied] == ["not_ready", "slow_decode", "not_ready"]


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ([{"at_s": 1, "pod": "pod-0", "fault": "meteor"}], "events[0].fault: unknown"),
        ([{"at_s": 1, "pod": "pod-9", "fault": "stall"}], "events[0].pod: unknown"),
        ([{"at_s": -1, "pod": "pod-0", "fault": "stall"}], "events.0.at_s"),
        (
            [{"at_s": 1, "pod": "pod-0", "fault": "slow_decode", "params": {"factor": 0}}],
            "params.factor",
        ),
    ],
)
def test_bad_scenarios_name_the_event(events, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_scenario({"events": events}, ["pod-0"])


def test_example_configs_are_valid():
    config = load_fleet_config(ROOT / "config" / "simulator.example.yaml")
    assert {p.dialect for p in config.pods} == {"vllm", "vllm-legacy", "sglang", "trtllm"}
    load_scenario(
        ROOT / "config" / "simulator.scenario.example.yaml", [p.name for p in config.pods]
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"pods": [{"name": "a", "dialect": "tgi"}]}, "pods.0.dialect"),
        ({"pods": [{"name": "a", "node": "n"}]}, "unknown node"),
        (
            {
                "nodes": [{"name": "n", "gpus": 1}],
                "pods": [{"name": "a", "node": "n", "gpus": [3]}],
            },
            "lacks",
        ),
        ({"pods": [{"name": "a", "engine": {"profile": "x"}}]}, "unknown profile"),
        ({"speed": 0}, "speed"),
    ],
)
def test_bad_fleet_configs_name_the_field(data, message):
    with pytest.raises(ConfigError, match=message):
        load_fleet_config(data)


def test_llmslo_sim_prints_urls_and_stops_on_sigterm():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from llmslo.cli import main; raise SystemExit(main())",
            "sim",
            "--pods",
            "2",
            "--dialects",
            "vllm,trtllm",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        info = json.loads(line)
        assert [p["dialect"] for p in info["pods"]] == ["vllm", "trtllm"]
        assert get(info["pods"][0]["url"] + "/health")[0] == 200
        assert get(info["dcgm"][0]["url"] + "/metrics")[0] == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_llmslo_load_reports_client_latencies(make_fleet, capsys):
    fleet = make_fleet(["vllm"], speed=20)
    assert (
        main(
            [
                "load",
                "--targets",
                fleet.pods[0].url,
                "--rate",
                "20",
                "--duration",
                "1",
                "--max-output-tokens",
                "5",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["requests"] > 5 and report["outcomes"] == {"ok": report["requests"]}
    assert report["ttft_s"]["p50"] > 0 and report["itl_s"]["p99"] > 0


def test_llmslo_load_needs_rate_or_trace(capsys):
    assert main(["load", "--targets", "http://127.0.0.1:9"]) == 2
    assert "--rate" in capsys.readouterr().err


def test_llmslo_sim_with_background_load_keeps_pods_busy():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from llmslo.cli import main; raise SystemExit(main())",
            "sim",
            "--pods",
            "2",
            "--speed",
            "10",
            "--load-rate",
            "20",
            "--load-output-tokens",
            "8",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    try:
        info = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        urls = [p["url"] for p in info["pods"]]

        def served(url: str) -> float:
            return value(scrape(url), "vllm:request_success_total")

        assert wait_for(lambda: all(served(u) >= 3 for u in urls), timeout=30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


_JSONISH = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-5, 70000),
        st.floats(allow_nan=True),
        st.text(max_size=12),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
_FLEETISH = st.fixed_dictionaries(
    {},
    optional={
        "speed": _JSONISH,
        "seed": _JSONISH,
        "nodes": st.lists(
            st.fixed_dictionaries({"name": st.text(max_size=5)}, optional={"gpus": _JSONISH}),
            max_size=2,
        ),
        "pods": st.lists(
            st.fixed_dictionaries(
                {"name": st.text(max_size=5)},
                optional={
                    "dialect": st.sampled_from(["vllm", "sglang", "x"]),
                    "node": _JSONISH,
                    "gpus": _JSONISH,
                    "engine": st.dictionaries(
                        st.sampled_from(["num_gpu_blocks", "block_size", "profile", "z"]),
                        _JSONISH,
                        max_size=2,
                    ),
                },
            ),
            max_size=3,
        ),
    },
)


@settings(max_examples=150, deadline=None)
@given(data=st.one_of(_FLEETISH, _JSONISH))
def test_fuzzed_fleet_configs_validate_or_raise_config_error(data):
    try:
        config = (
            load_fleet_config(data) if isinstance(data, dict) else load_fleet_config({"pods": data})
        )
    except ConfigError as exc:
        assert str(exc)
        return
    assert len({p.name for p in config.pods}) == len(config.pods)


@settings(max_examples=100, deadline=None)
@given(
    events=st.lists(
        st.dictionaries(
            st.sampled_from(["at_s", "pod", "fault", "action", "params"]), _JSONISH, max_size=5
        ),
        max_size=3,
    )
)
def test_fuzzed_scenarios_validate_or_raise_config_error(events):
    try:
        scenario = load_scenario({"events": events}, ["pod-0"])
    except ConfigError:
        return
    assert all(e.pod == "pod-0" for e in scenario.events)
