"""Trace readers (real formats, hostile input), replay timing, retries, cancel, report."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import ConfigError
from simulator.load import LoadConfig, run_load_sync
from simulator.traces import (
    TraceRequest,
    load_trace,
    poisson_arrivals,
    read_azure_csv,
    read_mooncake_jsonl,
)
from tests.simulator.conftest import scrape, value, wait_for

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
AZURE = TRACES / "azure2023_AzureLLMInferenceTrace_code.csv"
MOONCAKE = TRACES / "mooncake_fast25_conversation_trace.rows1-7851.jsonl"


def test_azure_csv_with_crlf_and_seven_fractional_digits(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(
        b"TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
        b"2023-11-16 18:17:03.9799600,4808,10\r\n"
        b"2023-11-16 18:17:04.0000001,3180,8"
    )  # no newline after the last row
    rows = read_azure_csv(path)
    assert [(r.prompt_tokens, r.output_tokens) for r in rows] == [(4808, 10), (3180, 8)]
    assert rows[0].offset_s == 0.0
    assert rows[1].offset_s == pytest.approx(0.0200401, abs=1e-6)


@pytest.mark.skipif(not AZURE.exists(), reason="shared traces not present")
def test_real_azure_trace_reads_whole_file():
    rows = load_trace(AZURE)
    assert len(rows) == 8819
    assert rows[-1].offset_s == pytest.approx(3436, abs=2)
    assert all(b.offset_s >= a.offset_s for a, b in itertools.pairwise(rows))


@pytest.mark.skipif(not MOONCAKE.exists(), reason="shared traces not present")
def test_real_mooncake_trace_reads():
    rows = load_trace(MOONCAKE)
    assert len(rows) == 7851
    assert rows[0] == TraceRequest(0.0, 6758, 500)


@pytest.mark.parametrize(
    ("name", "content", "where"),
    [
        ("bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,x,3\n", ":2:"),
        ("bad.csv", "nope\n", ":1:"),
        ("bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,2\n", ":2:"),
        (
            "bad.jsonl",
            '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1}\n',
            ":2:",
        ),
        ("bad.jsonl", "not json\n", ":1:"),
        ("bad.txt", "", "unknown trace format"),
    ],
)
def test_malformed_traces_name_file_and_line(tmp_path, name, content, where):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ConfigError, match=where):
        load_trace(path)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=60), max_size=5))
def test_fuzzed_mooncake_lines_raise_config_error_or_parse(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("fz") / "t.jsonl"
    path.write_text("\n".join(lines))
    try:
        rows = read_mooncake_jsonl(path)
    except ConfigError:
        return
    assert all(r.prompt_tokens >= 1 and r.output_tokens >= 1 for r in rows)


def test_poisson_rate_is_about_right():
    rows = list(poisson_arrivals(50, 100, seed=3))
    assert 4500 < len(rows) < 5500


def test_replay_honours_arrival_times(make_fleet, tmp_path):
    """Tolerance: each request is sent within 100 ms of its scaled trace offset (p99 < 50 ms)."""
    fleet = make_fleet(["vllm", "sglang"], speed=20)
    path = tmp_path / "t.jsonl"
    offsets_ms = [0, 250, 260, 700, 1500, 1510, 2300, 3000]
    path.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": 64, "output_length": 4}) + "\n"
            for t in offsets_ms
        )
    )
    config = LoadConfig(targets=[p.url for p in fleet.pods], time_scale=2.0)
    report = run_load_sync(config, load_trace(path))
    sent = sorted(r.sent_s for r in report.results)
    expected = [t / 1000 / 2.0 for t in offsets_ms]
    assert all(abs(s - e) < 0.1 for s, e in zip(sent, expected, strict=True))
    summary = report.summary()
    assert summary["outcomes"] == {"ok": len(offsets_ms)}
    assert summary["tokens"] == 4 * len(offsets_ms)


def test_cancelled_client_closes_its_connection_and_engine_aborts(make_fleet):
    fleet = make_fleet(["vllm"], speed=1.0)
    pod = fleet.pods[0]
    config = LoadConfig(targets=[pod.url], cancel_after_s=0.3)
    report = run_load_sync(config, [TraceRequest(0.0, 64, 5000), TraceRequest(0.05, 64, 5000)])
    assert report.summary()["outcomes"] == {"client_cancelled": 2}
    assert all(r.ttft_s is not None for r in report.results)
    assert wait_for(
        lambda: value(scrape(pod.url), "vllm:request_success_total", finished_reason="abort") == 2
    )
    assert value(scrape(pod.url), "vllm:num_requests_running") == 0


def test_retries_with_backoff_until_the_pod_recovers(make_fleet):
    fleet = make_fleet(["vllm"])
    pod = fleet.pods[0]
    fleet.set_fault("pod-0", "not_ready")
    import threading

    threading.Timer(0.4, lambda: fleet.clear_fault("pod-0", "not_ready")).start()
    config = LoadConfig(targets=[pod.url], max_attempts=10, backoff_base_s=0.05, backoff_max_s=0.3)
    report = run_load_sync(config, [TraceRequest(0.0, 16, 3)])
    result = report.results[0]
    assert result.outcome == "ok" and result.attempts > 1
    assert report.summary()["retried_fraction"] > 0


def test_deadline_exceeded_and_interrupted_stream_outcomes(make_fleet):
    fleet = make_fleet(["vllm", "vllm"], speed=1.0)
    fleet.set_fault("pod-1", "failure_after_first_token", after_tokens=2)
    slow = run_load_sync(
        LoadConfig(targets=[fleet.pods[0].url], deadline_s=0.3), [TraceRequest(0, 16, 5000)]
    )
    assert slow.results[0].outcome == "deadline_exceeded"
    cut = run_load_sync(LoadConfig(targets=[fleet.pods[1].url]), [TraceRequest(0, 16, 50)])
    assert cut.results[0].outcome == "interrupted_after_first_token"


def test_abort_cuts_the_streams_in_flight_and_stop_waits_for_them(make_fleet):
    import threading
    import time

    fleet = make_fleet(["vllm"], speed=1.0)
    config = LoadConfig(targets=[fleet.pods[0].url])
    long = [TraceRequest(0.0, 16, 5000)]  # ~4 minutes of decode
    ended = {}

    def run(name: str, stop: threading.Event | None, abort: threading.Event | None) -> None:
        run_load_sync(config, long, stop=stop, abort=abort)
        ended[name] = time.monotonic()

    stop, abort = threading.Event(), threading.Event()
    # daemon: the waiting one ends when the fleet stops its pod after the test
    waiting = threading.Thread(target=run, args=("stop", stop, None), daemon=True)
    cut = threading.Thread(target=run, args=("abort", None, abort), daemon=True)
    waiting.start()
    cut.start()
    time.sleep(1.0)
    stop.set()
    abort.set()
    asked = time.monotonic()
    cut.join(timeout=10)
    assert "abort" in ended and ended["abort"] - asked < 2  # cut at once
    waiting.join(timeout=2)
    assert "stop" not in ended  # still waiting for its stream
    assert value(scrape(fleet.pods[0].url), "vllm:num_requests_running") >= 1


def test_hot_share_skews_routing(make_fleet):
    fleet = make_fleet(["vllm", "vllm", "vllm", "vllm"], speed=50)
    config = LoadConfig(targets=[p.url for p in fleet.pods], hot_share=0.7, chat=False)
    report = run_load_sync(config, [TraceRequest(i * 0.002, 8, 2) for i in range(200)])
    hot = sum(r.target == fleet.pods[0].url for r in report.results)
    assert hot > 200 * 0.7


def test_load_config_rejects_nonsense():
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        LoadConfig(targets=[], time_scale=1)
    with pytest.raises(ValidationError):
        LoadConfig(targets=["http://x"], time_scale=0)


@settings(max_examples=80, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.text(max_size=30), st.text(max_size=6), st.text(max_size=6)), max_size=4
    ),
    crlf=st.booleans(),
)
def test_fuzzed_azure_csv_raises_config_error_or_parses(tmp_path_factory, rows, crlf):
    eol = "\r\n" if crlf else "\n"
    path = tmp_path_factory.mktemp("az") / "t.csv"
    path.write_text(
        eol.join(["TIMESTAMP,ContextTokens,GeneratedTokens", *(",".join(r) for r in rows)])
    )
    try:
        parsed = read_azure_csv(path)
    except ConfigError:
        return
    assert all(r.prompt_tokens >= 1 and r.output_tokens >= 1 for r in parsed)
