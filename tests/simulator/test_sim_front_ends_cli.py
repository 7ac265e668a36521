"""``llmslo sim`` starts the front ends beside the pods and prints where they are."""

from __future__ import annotations

import json

import pytest

from app.cli import main
from pipeline.errors import ConfigError
from simulator.config import load_fleet_config


def test_sim_prints_the_gateway_autoscaler_and_pd_pair_with_their_file_sd_targets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["sim", "--pods", "4", "--gateway", "prefix_locality", "--prefix-cache", "64"]
    argv += ["--autoscaler", "--pd", "pod-2,pod-3", "--seconds", "0.5"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    fronts = out["front_ends"]
    assert fronts["gateway"]["policy"] == "prefix_locality"
    assert fronts["gateway"]["pods"] == ["pod-0", "pod-1"]
    assert (fronts["pd"]["prefill"], fronts["pd"]["decode"]) == ("pod-2", "pod-3")
    assert all(fronts[f]["url"].startswith("http://127.0.0.1:") for f in fronts)
    named = {g["labels"].get("instance"): g for g in out["file_sd"]}
    for front in ("gateway", "autoscaler", "pd"):
        assert named[front]["targets"] == [fronts[front]["url"].removeprefix("http://")]
        assert named[front]["labels"]["pool"] == "llama-3-8b"


def test_front_ends_naming_unknown_pods_fail_with_the_field(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["sim", "--pods", "2", "--pd", "pod-0,pod-9", "--seconds", "0.5"]) == 2
    assert "front_ends: unknown pods ['pod-9']" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="two pods"):
        load_fleet_config(
            {"pods": [{"name": "a"}], "front_ends": {"pd": {"prefill": "a", "decode": "a"}}}
        )
