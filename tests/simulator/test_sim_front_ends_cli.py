"""``llmslo sim`` starts the front ends beside the pods and prints where they are."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Any

import pytest

from llmslo.cli import main
from pipeline.errors import ConfigError
from simulator.config import load_fleet_config
from tests.simulator.conftest import MODEL, post_quietly, scrape

FRONT_ENDS = ("gateway", "autoscaler", "pd")


def test_sim_prints_the_gateway_autoscaler_and_pd_pair_with_their_file_sd_targets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["sim", "--pods", "4", "--gateway", "prefix_locality", "--prefix-cache", "64"]
    argv += ["--autoscaler", "--pd", "pod-2,pod-3", "--seconds", "0.5"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    fronts = {front: out[front] for front in FRONT_ENDS}
    assert fronts["gateway"]["policy"] == "prefix_locality"
    assert fronts["gateway"]["pods"] == ["pod-0", "pod-1"]
    assert (fronts["pd"]["prefill"], fronts["pd"]["decode"]) == ("pod-2", "pod-3")
    assert all(fronts[f]["url"].startswith("http://127.0.0.1:") for f in fronts)
    named = {g["labels"].get("instance"): g for g in out["file_sd"]}
    for front in FRONT_ENDS:
        assert named[front]["targets"] == [fronts[front]["url"].removeprefix("http://")]
        assert named[front]["labels"]["pool"] == "llama-3-8b"


def _printed(capsys: pytest.CaptureFixture[str], timeout_s: float = 30) -> dict[str, Any]:
    """What a running ``llmslo sim`` printed at start-up, once it has."""
    text, deadline = "", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text += capsys.readouterr().out
        with contextlib.suppress(ValueError):
            return dict(json.loads(text))
        time.sleep(0.1)
    raise AssertionError(f"llmslo sim printed no JSON in {timeout_s} s: {text!r}")


def _gauge(url: str, name: str, **labels: str) -> float:
    """The one series of ``name`` whose labels include ``labels``."""
    (value,) = [v for s, v, _ in scrape(url)[name] if labels.items() <= s.items()]
    return value


def _scale_through_the_gateway(out: dict[str, Any]) -> dict[str, float]:
    """Ready replicas (the autoscaler's and the gateway's pool) at rest, then after load
    through the printed gateway URL has had time to make the autoscaler scale out."""
    gateway, autoscaler = out["gateway"], out["autoscaler"]
    ready = "kube_deployment_status_replicas_ready"
    # the gateway's deployment, not the unrelated one the exporter shows beside it
    seen = {"at_rest": _gauge(autoscaler["url"], ready, deployment="llm-pool")}
    for i in range(8):
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"scale {i}"}],
            "max_tokens": 200,
            "ignore_eos": True,
        }
        url = f"{gateway['url']}/v1/chat/completions"
        threading.Thread(target=post_quietly, args=(url, body), daemon=True).start()
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        seen["under_load"] = _gauge(autoscaler["url"], ready, deployment="llm-pool")
        # the gateway's own count of ready pods in its active set (health checks every 1 s)
        seen["gateway_ready_pods"] = _gauge(gateway["url"], "inference_pool_ready_pods")
        if seen["under_load"] == seen["gateway_ready_pods"] == 2:
            break
        time.sleep(0.2)
    return seen


def test_every_front_end_flag_at_once_starts_one_gateway_that_the_autoscaler_scales(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["sim", "--pods", "4", "--gateway", "prefix_locality", "--router-down-policy"]
    argv += ["reject", "--autoscaler", "--pd", "pod-2,pod-3", "--seconds", "12"]
    printed: dict[str, Any] = {}
    seen: dict[str, Any] = {}

    def check_while_running() -> None:  # llmslo sim itself runs in the main thread (signals)
        try:
            printed.update(_printed(capsys))
            seen.update(_scale_through_the_gateway(printed))
        except Exception as exc:  # re-raised by the test below
            seen["error"] = exc

    checker = threading.Thread(target=check_while_running)
    checker.start()
    assert main(argv) == 0
    checker.join(timeout=30)
    assert "error" not in seen, seen.get("error")
    gateway, autoscaler = printed["gateway"], printed["autoscaler"]
    assert (gateway["policy"], gateway["router_down_policy"]) == ("prefix_locality", "reject")
    assert gateway["pods"] == ["pod-0", "pod-1"]
    printed_urls = [v["url"] for v in printed.values() if isinstance(v, dict) and "url" in v]
    assert sorted(printed_urls) == sorted([gateway["url"], autoscaler["url"], printed["pd"]["url"]])
    assert [g for g in printed["file_sd"] if g["labels"].get("instance") == "gateway"] == [
        {
            "targets": [gateway["address"]],
            "labels": {"instance": "gateway", "pool": "llama-3-8b", "dialect": "epp"},
        }
    ]
    # one of the gateway's two pods ready at rest; its load made the autoscaler add the other
    assert (seen["at_rest"], seen["under_load"], seen["gateway_ready_pods"]) == (1, 2, 2)


def test_front_ends_naming_unknown_pods_fail_with_the_field(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["sim", "--pods", "2", "--pd", "pod-0,pod-9", "--seconds", "0.5"]) == 2
    assert "pd: unknown pods ['pod-9']" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="two pods"):
        load_fleet_config({"pods": [{"name": "a"}], "pd": {"prefill": "a", "decode": "a"}})


def test_the_old_front_ends_key_is_refused_naming_the_new_keys() -> None:
    with pytest.raises(ConfigError, match="front_ends: no longer a key; write its gateway:"):
        load_fleet_config({"pods": [{"name": "a"}], "front_ends": {"gateway": {}}})
