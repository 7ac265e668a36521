"""Each fault produces its documented observable signal, switched at run time."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import ConfigError
from simulator import FAULTS, Fleet, FleetConfig, PodConfig
from tests.simulator.conftest import (
    completion,
    engine_scrapes,
    get,
    open_stream,
    post,
    scrape,
    value,
    wait_for,
)


def _running(url: str) -> float:
    return value(scrape(url), "vllm:num_requests_running")


def _quiet_post(url: str, body: dict) -> None:
    with contextlib.suppress(OSError):  # the fleet may close under us at teardown
        post(url, body)


def _background(
    url: str, n: int, max_tokens: int, prompt_chars: int = 40
) -> list[threading.Thread]:
    body = completion(max_tokens, prompt_chars=prompt_chars)
    threads = [
        threading.Thread(target=_quiet_post, args=(url + "/v1/completions", body), daemon=True)
        for _ in range(n)
    ]
    for t in threads:
        t.start()
    return threads


def _dcgm(fleet, field: str, gpu: str = "0") -> float:
    return value(scrape(fleet.dcgm[0].url), field, gpu=gpu)


def test_stall_running_without_tokens_and_gpu_idle(make_fleet):
    fleet = make_fleet(["vllm"], speed=1.0)
    pod = fleet.pods[0]
    _background(pod.url, 3, 5000)
    assert wait_for(lambda: _running(pod.url) == 3)
    _dcgm(fleet, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")  # start a measurement window
    time.sleep(0.3)
    assert _dcgm(fleet, "DCGM_FI_PROF_GR_ENGINE_ACTIVE") > 0.3
    fleet.set_fault("pod-0", "stall")
    time.sleep(0.2)
    before = value(scrape(pod.url), "vllm:generation_tokens_total")
    _dcgm(fleet, "DCGM_FI_DEV_GPU_UTIL")
    time.sleep(0.5)
    after = scrape(pod.url)
    assert value(after, "vllm:num_requests_running") == 3
    assert value(after, "vllm:generation_tokens_total") == before
    assert _dcgm(fleet, "DCGM_FI_DEV_GPU_UTIL") == 0
    assert _dcgm(fleet, "DCGM_FI_PROF_GR_ENGINE_ACTIVE") == 0
    fleet.clear_fault("pod-0", "stall")
    assert wait_for(lambda: value(scrape(pod.url), "vllm:generation_tokens_total") > before)


def test_a_wedged_engine_takes_requests_runs_none_and_answers_health(make_fleet):
    """vllm#53868's wedge: running 0, waiting grows, no token, KV freed, /health still 200;
    cleared, the queued requests are scheduled and tokens flow again."""
    fleet = make_fleet(["vllm"], speed=1.0)
    pod = fleet.pods[0]
    _background(pod.url, 2, 5000)
    assert wait_for(lambda: _running(pod.url) == 2)
    fleet.set_fault("pod-0", "wedge")
    _background(pod.url, 3, 5000)
    assert wait_for(lambda: value(scrape(pod.url), "vllm:num_requests_waiting") == 5)
    before = value(scrape(pod.url), "vllm:generation_tokens_total")
    time.sleep(0.4)
    wedged = scrape(pod.url)
    assert value(wedged, "vllm:num_requests_running") == 0
    assert value(wedged, "vllm:num_requests_waiting") == 5
    assert value(wedged, "vllm:kv_cache_usage_perc") == 0
    assert value(wedged, "vllm:generation_tokens_total") == before
    assert get(pod.url + "/health")[0] == 200
    fleet.clear_fault("pod-0", "wedge")
    assert wait_for(lambda: value(scrape(pod.url), "vllm:generation_tokens_total") > before)
    assert wait_for(lambda: _running(pod.url) == 5)


def test_sglang_gauges_freeze_during_stall(make_fleet):
    fleet = make_fleet(["sglang"], speed=1.0)
    pod = fleet.pods[0]
    _background(pod.url, 2, 5000)
    assert wait_for(lambda: value(scrape(pod.url), "sglang:num_running_reqs") == 2)
    fleet.set_fault("pod-0", "stall")
    time.sleep(0.1)
    frozen = value(scrape(pod.url), "sglang:gen_throughput")
    decode = value(scrape(pod.url), "sglang:realtime_tokens_total", mode="decode")
    time.sleep(0.3)
    s = scrape(pod.url)
    assert value(s, "sglang:gen_throughput") == frozen
    assert value(s, "sglang:realtime_tokens_total", mode="decode") == decode


def test_client_disconnect_aborts_the_request(make_fleet):
    fleet = make_fleet(["vllm"], speed=1.0)
    pod = fleet.pods[0]
    sock = open_stream(pod.port, completion(5000, stream=True))
    assert wait_for(lambda: _running(pod.url) == 1)
    sock.close()
    assert wait_for(lambda: _running(pod.url) == 0)
    assert value(scrape(pod.url), "vllm:request_success_total", finished_reason="abort") == 1


def test_a_hung_engine_cannot_abort_until_it_recovers(make_fleet):
    fleet = make_fleet(["vllm"], speed=1.0)
    pod = fleet.pods[0]
    sock = open_stream(pod.port, completion(5000, stream=True))
    assert wait_for(lambda: _running(pod.url) == 1)
    fleet.set_fault("pod-0", "stall")
    sock.close()  # the client gives up on the silent stream
    time.sleep(0.5)
    hung = scrape(pod.url)
    assert value(hung, "vllm:num_requests_running") == 1  # still holding its batch slot and KV
    assert value(hung, "vllm:request_success_total", finished_reason="abort") == 0
    fleet.clear_fault("pod-0", "stall")
    assert wait_for(lambda: _running(pod.url) == 0)
    assert value(scrape(pod.url), "vllm:request_success_total", finished_reason="abort") == 1


def test_ghost_keeps_generating_after_disconnect(make_fleet):
    fleet = make_fleet(["vllm"], speed=1.0)
    pod = fleet.pods[0]
    fleet.set_fault("pod-0", "ghost")
    sock = open_stream(pod.port, completion(5000, stream=True))
    assert wait_for(lambda: _running(pod.url) == 1)
    sock.close()
    before = value(scrape(pod.url), "vllm:generation_tokens_total")
    time.sleep(0.5)
    s = scrape(pod.url)
    assert value(s, "vllm:num_requests_running") == 1
    assert value(s, "vllm:generation_tokens_total") > before
    assert value(s, "vllm:request_success_total", finished_reason="abort") == 0


def test_kv_leak_crosses_l1_l2_l3_thresholds(make_fleet):
    fleet = make_fleet(["vllm"], speed=1.0, num_gpu_blocks=1000)
    pod = fleet.pods[0]
    fleet.set_fault("pod-0", "kv_leak", blocks_per_s=2000)
    seen: list[float] = []

    def usage_at_l3() -> bool:
        seen.append(value(scrape(pod.url), "vllm:kv_cache_usage_perc"))
        return seen[-1] >= 0.99

    assert wait_for(usage_at_l3, timeout=10, interval=0.02)
    assert seen[0] < 0.9 and seen[-1] >= 0.99
    assert seen == sorted(seen), "a leak only grows"


def test_fragmentation_stalls_admission_with_room_left(make_fleet):
    fleet = make_fleet(["vllm"], speed=1.0)
    pod = fleet.pods[0]
    fleet.set_fault("pod-0", "fragmentation", largest_free_run=1)
    _background(pod.url, 4, 20, prompt_chars=400)  # 100 tokens need 7 contiguous blocks
    assert wait_for(lambda: value(scrape(pod.url), "vllm:num_requests_waiting") == 4)
    s = scrape(pod.url)
    assert value(s, "vllm:kv_cache_usage_perc") < 0.1
    fleet.clear_fault("pod-0", "fragmentation")
    assert wait_for(lambda: value(scrape(pod.url), "vllm:request_success_total") == 4)


def test_fragmentation_under_load_keeps_a_running_batch_while_the_queue_grows():
    """Prompts that fit no free run wait (the admission signature: waiting grows with KV
    room, preemptions), and the prompts that fit one are admitted past them: the batch never
    empties and tokens keep flowing, so the data says fragmentation, not a stall."""
    scrapes = engine_scrapes("fragmentation", rate_per_s=3.0, seconds=90.0, fault_from_s=20.0)
    settled = [s for s in scrapes if s.t_s >= 26.0]  # the batch of before has turned over
    running = [s.running for s in settled]
    waiting = [s.waiting for s in settled]
    assert min(running) > 0, running
    assert all(b.tokens > a.tokens for a, b in pairwise(settled)), "tokens stood still"
    assert waiting == sorted(waiting) and waiting[-1] - waiting[0] >= 20, waiting
    assert max(s.kv_usage for s in settled) < 0.5, "KV keeps room"
    assert settled[-1].preemptions > settled[0].preemptions


def test_preemption_cascade(make_fleet):
    fleet = make_fleet(["vllm"], speed=5.0, num_gpu_blocks=400)
    pod = fleet.pods[0]
    fleet.set_fault("pod-0", "preemption_cascade", reserve_fraction=0.85, preempt_probability=0.5)
    _background(pod.url, 12, 200)
    assert wait_for(lambda: value(scrape(pod.url), "vllm:num_preemptions_total") >= 5)
    s = scrape(pod.url)
    assert value(s, "vllm:kv_cache_usage_perc") > 0.85


def test_slow_decode_and_slow_prefill_stretch_latency(make_fleet):
    fleet = make_fleet(["vllm"], speed=2.0)
    pod = fleet.pods[0]

    def itl_and_ttft() -> tuple[float, float]:
        s = scrape(pod.url)
        return (
            value(s, "vllm:inter_token_latency_seconds_sum"),
            value(s, "vllm:time_to_first_token_seconds_sum"),
        )

    def one_request() -> tuple[float, float]:
        itl_before, ttft_before = itl_and_ttft()
        post(pod.url + "/v1/completions", completion(6))
        itl_after, ttft_after = itl_and_ttft()
        return itl_after - itl_before, ttft_after - ttft_before

    # The healthy figure is the least of three requests: a busy test machine only ever
    # adds delay, so the minimum is the engine's own time.
    healthy = [one_request() for _ in range(3)]
    itl_healthy, ttft_healthy = min(i for i, _ in healthy), min(t for _, t in healthy)
    fleet.set_fault("pod-0", "slow_decode", factor=6)
    fleet.set_fault("pod-0", "slow_prefill", factor=6)
    itl_slow, ttft_slow = one_request()
    assert itl_slow > 3 * itl_healthy
    assert ttft_slow > 3 * ttft_healthy


def test_itl_jitter_widens_the_tail(make_fleet):
    fleet = make_fleet(["vllm"], speed=1.0)
    pod = fleet.pods[0]
    fleet.set_fault("pod-0", "itl_jitter", mean_ms=200)
    post(pod.url + "/v1/completions", completion(8))
    s = scrape(pod.url)
    slow = value(s, "vllm:inter_token_latency_seconds_count") - value(
        s, "vllm:inter_token_latency_seconds_bucket", le="0.1"
    )
    assert slow >= 2


def test_nan_burst_errors_and_corrupted_counter(make_fleet):
    fleet = make_fleet(["vllm"])
    pod = fleet.pods[0]
    fleet.set_fault("pod-0", "nan_burst", fraction=1.0)
    status, body = post(pod.url + "/v1/completions", completion(5, stream=True))
    assert (
        status == 200 and b'"finish_reason": "error"' in body and body.endswith(b"data: [DONE]\n\n")
    )
    s = scrape(pod.url)
    assert value(s, "vllm:request_success_total", finished_reason="error") == 1
    assert value(s, "vllm:corrupted_requests_total") == 1


@pytest.mark.parametrize("fault", ["not_ready", "model_load_failure"])
def test_not_ready_and_model_load_failure_answer_503(make_fleet, fault):
    fleet = make_fleet(["vllm"])
    pod = fleet.pods[0]
    assert get(pod.url + "/health")[0] == 200
    fleet.set_fault("pod-0", fault)
    assert get(pod.url + "/health")[0] == 503
    assert post(pod.url + "/v1/completions", completion(3))[0] == 503
    fleet.clear_fault("pod-0", fault)
    assert get(pod.url + "/health")[0] == 200


def test_model_load_failure_lists_no_model_while_not_ready_still_does(make_fleet):
    fleet = make_fleet(["vllm", "vllm"])
    fleet.set_fault("pod-0", "model_load_failure")
    fleet.set_fault("pod-1", "not_ready")
    failed, not_ready = (json.loads(get(p.url + "/v1/models")[1])["data"] for p in fleet.pods)
    assert failed == [] and [m["id"] for m in not_ready] == ["llama-3-8b"]


def _decode_by_rank(url: str) -> dict[str, float]:
    rows = scrape(url)["sglang:realtime_tokens_total"]
    return {lab["dp_rank"]: v for lab, v, _ in rows if lab.get("mode") == "decode"}


def test_hot_rank_skews_one_dp_ranks_tokens_and_queue(make_fleet):
    fleet = make_fleet(["sglang"], speed=5.0, dp_size=4)
    pod = fleet.pods[0]
    _background(pod.url, 8, 3000)
    assert wait_for(lambda: sum(_decode_by_rank(pod.url).values()) > 400)
    even = _decode_by_rank(pod.url)
    assert sorted(even) == ["0", "1", "2", "3"]
    assert max(even.values()) <= 1.2 * min(even.values()) + 4  # healthy: even split
    fleet.set_fault("pod-0", "hot_rank", ranks=[2], factor=4.0)
    even = _decode_by_rank(pod.url)  # the ranks' split follows the fault from this scrape on
    time.sleep(1.0)
    after = _decode_by_rank(pod.url)
    delta = {rank: after[rank] - even[rank] for rank in after}
    others = [delta[r] for r in ("0", "1", "3")]
    assert delta["2"] >= 3 * max(others) > 0
    running = {lab["dp_rank"]: v for lab, v, _ in scrape(pod.url)["sglang:num_running_reqs"]}
    assert running["2"] > max(running[r] for r in ("0", "1", "3"))


def test_crash_closes_the_port_and_restart_resets_counters(make_fleet):
    fleet = make_fleet(["vllm"])
    pod = fleet.pods[0]
    post(pod.url + "/v1/completions", completion(3))
    start = value(scrape(pod.url), "process_start_time_seconds")
    status, _ = post(pod.url + "/admin/faults", {"fault": "crash"})
    assert status == 200

    def refused() -> bool:
        try:
            socket.create_connection(("127.0.0.1", pod.port), timeout=1).close()
            return False
        except OSError:
            return True

    assert wait_for(refused)
    fleet.clear_fault("pod-0", "crash")
    s = scrape(pod.url)
    assert value(s, "vllm:request_success_total") == 0
    assert value(s, "process_start_time_seconds") >= start


def test_prefill_failure_is_an_error_before_the_first_token(make_fleet):
    fleet = make_fleet(["vllm"])
    pod = fleet.pods[0]
    fleet.set_fault("pod-0", "prefill_failure")
    status, body = post(pod.url + "/v1/completions", completion(5, stream=True))
    assert status == 500 and "error" in json.loads(body)
    assert value(scrape(pod.url), "vllm:request_success_total", finished_reason="error") == 1


def test_failure_after_first_token_cuts_the_stream(make_fleet):
    fleet = make_fleet(["vllm"])
    pod = fleet.pods[0]
    fleet.set_fault("pod-0", "failure_after_first_token", after_tokens=3)
    sock = open_stream(pod.port, completion(50, stream=True))
    data = b""
    sock.settimeout(10)
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    assert data.count(b'"text": " ') >= 1
    assert b"[DONE]" not in data


def test_xid_appears_on_the_pods_gpus_only(make_fleet):
    fleet = make_fleet(["vllm", "vllm"])
    fleet.set_fault("pod-1", "xid", code=79)
    s = scrape(fleet.dcgm[0].url)
    rows = {lab["gpu"]: (lab, v) for lab, v, _ in s["DCGM_FI_DEV_XID_ERRORS"]}
    assert rows["1"][1] == 79 and rows["1"][0]["err_code"] == "79"
    assert rows["1"][0]["err_msg"] == "GPU has fallen off the bus"
    assert rows["0"][1] == 0
    fleet.set_fault("pod-0", "xid", code=48)  # the code decides the message
    labels = {lab["gpu"]: lab for lab, _, _ in scrape(fleet.dcgm[0].url)["DCGM_FI_DEV_XID_ERRORS"]}
    assert (labels["0"]["err_code"], labels["0"]["err_msg"]) == ("48", "Double Bit ECC Error")


def test_admin_endpoint_lists_sets_and_clears(make_fleet):
    fleet = make_fleet(["vllm"])
    pod = fleet.pods[0]
    assert (
        post(pod.url + "/admin/faults", {"fault": "slow_decode", "params": {"factor": 2}})[0] == 200
    )
    assert json.loads(get(pod.url + "/admin/faults")[1])["active"] == {
        "slow_decode": {"factor": 2.0}
    }
    import urllib.request

    req = urllib.request.Request(pod.url + "/admin/faults/slow_decode", method="DELETE")
    assert urllib.request.urlopen(req).status == 200
    assert json.loads(get(pod.url + "/admin/faults")[1])["active"] == {}


def test_unknown_fault_and_bad_params_are_refused(make_fleet):
    fleet = make_fleet(["vllm"])
    pod = fleet.pods[0]
    assert post(pod.url + "/admin/faults", {"fault": "meteor"})[0] == 404
    assert (
        post(pod.url + "/admin/faults", {"fault": "slow_decode", "params": {"factor": -1}})[0]
        == 400
    )
    with pytest.raises(ConfigError, match=r"params\.factor"):
        fleet.set_fault("pod-0", "slow_decode", factor="x")
    assert fleet.active_faults("pod-0") == {}


@pytest.fixture(scope="module")
def admin_fleet():
    with Fleet(FleetConfig(pods=[PodConfig(name="pod-0")], speed=20)) as fleet:
        yield fleet


_BODIES = st.one_of(
    st.binary(max_size=200),
    st.dictionaries(
        st.sampled_from(["fault", "params", "x"]),
        st.one_of(
            st.text(max_size=20),
            st.sampled_from(sorted(FAULTS)),
            st.integers(),
            st.none(),
            st.dictionaries(st.text(max_size=10), st.integers(), max_size=3),
        ),
        max_size=3,
    ).map(lambda d: json.dumps(d).encode()),
)


@settings(max_examples=60, deadline=None)
@given(body=_BODIES)
def test_hostile_admin_bodies_never_cause_a_500(admin_fleet, body):
    pod = admin_fleet.pods[0]
    req = urllib.request.Request(
        pod.url + "/admin/faults", body, {"Content-Type": "application/json"}
    )
    try:
        status = urllib.request.urlopen(req, timeout=10).status
    except urllib.error.HTTPError as exc:
        status = exc.code
    assert status in (200, 400, 404)
    for name in list(pod.faults.snapshot()):
        if name == "crash":
            assert wait_for(lambda: not pod.listening)
        admin_fleet.clear_fault("pod-0", name)
    assert get(pod.url + "/health")[0] == 200


def test_every_catalogued_fault_is_tested_here():
    source = Path(__file__).read_text()
    missing = [name for name in FAULTS if f'"{name}"' not in source]
    assert not missing
