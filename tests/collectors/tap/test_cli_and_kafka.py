"""`llmslo tap` as a process, its config section, and records on the real Kafka bus."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from kafka import TopicPartition

from collectors.tap import KafkaSink, TapConfig, TapProxy
from llmslo.cli import main
from llmslo.sections import load_config
from pipeline.bus import Bus
from pipeline.codec import decode_message
from pipeline.schema import ENGINE_SAMPLES, REQUEST_RECORDS
from tests.collectors.tap.fakes import (
    CHAT,
    ScriptedUpstream,
    post,
    stream_script,
    tap_sample_signals,
)

ROOT = Path(__file__).resolve().parents[3]


def test_example_config_is_valid() -> None:
    config = load_config(ROOT / "config" / "tap.example.yaml")
    assert config.section("tap", TapConfig).upstreams == ["http://127.0.0.1:8000"]


def test_bad_tap_section_names_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("tap:\n  max_attempts: 0\n  upstreams: [ftp://x]\n  bogus: 1\n")
    assert main(["config", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "tap.max_attempts" in err and "tap.upstreams" in err and "tap.bogus" in err


def test_tap_command_without_upstream_fails_clearly(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tap", "--no-kafka"]) == 2
    assert "tap.upstreams" in capsys.readouterr().err


def test_following_flags_needs_kafka(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["tap", "--no-kafka", "--follow-flags", "--upstream", "http://127.0.0.1:9"])
    assert code == 2
    assert "tap.degradation.follow_flags" in capsys.readouterr().err


def test_degradation_section_names_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("tap:\n  degradation: {fallback_upstream: '10.0.0.9:8000', staleness_s: 0}\n")
    assert main(["config", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "tap.degradation.fallback_upstream" in err and "tap.degradation.staleness_s" in err


def test_tap_process_proxies_and_writes_records_to_stdout() -> None:
    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: stream_script(3))
        upstream = await up.start()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "from llmslo.cli import console_main; console_main()",
            "tap",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            upstream,
            "--no-kafka",
            "--records-out",
            "-",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=ROOT,
        )
        assert proc.stdout is not None and proc.stderr is not None
        try:
            banner = json.loads(await asyncio.wait_for(proc.stderr.readline(), 30))
            assert banner["tap"] == "listening" and banner["upstreams"] == [upstream]
            status, body, _ = await post(banner["url"], CHAT)
            assert status == 200 and body.endswith(b"[DONE]\n\n")
            record = json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))
            assert record["outcome"] == "ok" and record["completion_tokens"] == 3
        finally:
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 30) == 0
            await up.stop()

    asyncio.run(scenario())


def consume_all(bus: Bus, topic: str, want: int, timeout_s: float = 30.0) -> list:
    consumer = bus.consumer(None)
    partitions = [TopicPartition(bus.prefix + topic, p) for p in range(bus.config.partitions)]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    rows: list = []
    deadline = time.monotonic() + timeout_s
    while len(rows) < want and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=200).values():
            for message in records:
                decoded = decode_message(message.value, message.headers)
                rows += decoded.table.to_pylist()
    consumer.close()
    return rows


def test_records_and_gauges_reach_the_bus(bus: Bus) -> None:
    sink = KafkaSink(bus.producer(), flush_interval_s=0.1)

    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: stream_script(4))
        config = TapConfig(listen="127.0.0.1:0", upstreams=[await up.start()], tap_id="t1")
        proxy = TapProxy(config, sink)
        port = await proxy.start()
        for i in range(3):
            await post(f"http://127.0.0.1:{port}", CHAT, headers={"x-request-id": f"r{i}"})
        await proxy.stop()
        await up.stop()

    asyncio.run(scenario())
    sink.close()
    rows = consume_all(bus, REQUEST_RECORDS.topic, 3)
    assert sorted(r["request_id"] for r in rows) == ["r0", "r1", "r2"]
    assert {r["outcome"] for r in rows} == {"ok"} and {r["tap_id"] for r in rows} == {"t1"}
    assert all(r["chunk_tokens"] == [1, 1, 1, 1] and len(r["itl_gaps_s"]) == 3 for r in rows)
    samples = consume_all(bus, ENGINE_SAMPLES.topic, 2)
    assert {(s["signal"], s["dialect"]) for s in samples} == {
        (signal, "tap") for signal in tap_sample_signals()
    }


def test_tap_process_publishes_to_kafka_by_default(broker, tmp_path: Path) -> None:
    prefix = f"cli{int(time.time() * 1000) % 10**9}."
    config = tmp_path / "llmslo.yaml"
    config.write_text(
        f"bus:\n  bootstrap_servers: {broker.bootstrap_servers}\n  topic_prefix: '{prefix}'\n"
        "  partitions: 2\ntap:\n  flush_interval_s: 0.1\n  gauge_interval_s: 0.2\n"
    )

    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: stream_script(2))
        upstream = await up.start()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "from llmslo.cli import console_main; console_main()",
            "tap",
            "-c",
            str(config),
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            upstream,
            "--metrics-port",
            "0",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=ROOT,
        )
        assert proc.stdout is not None
        try:
            banner = json.loads(await asyncio.wait_for(proc.stdout.readline(), 60))
            assert banner["kafka"] is True and banner["metrics_port"] > 0
            for i in range(2):
                await post(banner["url"], CHAT, headers={"x-request-id": f"k{i}"})
            await asyncio.sleep(0.5)
        finally:
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 60) == 0
            await up.stop()

    asyncio.run(scenario())
    from pipeline.config import BusConfig

    with Bus(
        BusConfig(bootstrap_servers=broker.bootstrap_servers, topic_prefix=prefix, partitions=2)
    ) as bus:
        rows = consume_all(bus, REQUEST_RECORDS.topic, 2)
        samples = consume_all(bus, ENGINE_SAMPLES.topic, 2)
    assert sorted(r["request_id"] for r in rows) == ["k0", "k1"]
    assert {s["signal"] for s in samples} == tap_sample_signals()


def test_tap_records_land_in_the_duckdb_requests_table(store) -> None:
    """Rows go through the same encode → decode → commit path the ingester uses."""
    from collectors.tap import ListSink
    from collectors.tap.sinks import rows_to_table
    from pipeline.codec import encode_arrow, headers_for

    sink = ListSink()

    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: stream_script(5, gap_s=0.002))
        config = TapConfig(
            listen="127.0.0.1:0", upstreams=[await up.start()], kafka=False, tenants=["acme"]
        )
        proxy = TapProxy(config, sink)
        port = await proxy.start()
        await post(f"http://127.0.0.1:{port}", CHAT, headers={"x-tenant-id": "acme"})
        await proxy.stop()
        await up.stop()

    asyncio.run(scenario())
    for schema, rows in ((REQUEST_RECORDS, sink.requests), (ENGINE_SAMPLES, sink.samples)):
        payload = encode_arrow(schema, rows_to_table(schema, rows))
        decoded = decode_message(payload, headers_for(schema))
        store.commit_batch({schema.table: [decoded.table]}, group_id="g", offsets={}, now_ts_ms=0)
    got = store.con.execute(
        "SELECT outcome, tenant, completion_tokens, len(itl_gaps_s), chunk_tokens FROM requests"
    ).fetchall()
    assert got == [("ok", "acme", 5, 4, [1, 1, 1, 1, 1])]
    assert store.count("requests") == 1
