"""A tap that follows the flags stays small: reading the SLO jobs' heartbeats and transitions
loads no pyarrow (the jobs publish the flags topic as JSON, the tap reads it in plain Python).

The import closure of ``llmslo tap`` at start is held by ``tests/llmslo/test_footprint.py``;
this is the running tap after flag messages arrived, which is how every demo tap runs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from collectors.tap.flagsource import read_json_rows
from pipeline.bus import Bus
from pipeline.errors import DecodeError
from pipeline.publisher import Publisher
from pipeline.schema import FLAG_TRANSITIONS, JOBS_HEARTBEATS
from slo.flags import FlagBoard, FlagPolicy, transition_rows
from slo.sinks import BusTransitionSink, JobsHeartbeat

ROOT = Path(__file__).resolve().parents[3]
POOL = "llama-3-8b"
#: Not in a tap, ever: the store, the API, the SLO maths, the dashboards, Arrow.
NOT_IN_A_TAP = (
    *("duckdb", "fastapi", "starlette", "uvicorn", "scipy", "pandas", "streamlit"),
    *("pyarrow", "numpy", "slo", "api", "alerts", "dashboards", "checks", "simulator"),
    *("pipeline.store", "pipeline.ingest"),
)
LONG_PROMPT = "word " * 14_000  # 70 KB: ~17.5K tokens estimated, over L2's 16K default


def _held(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == f or m.startswith(f + ".") for f in NOT_IN_A_TAP))


def _publish_l2_and_a_heartbeat(bus: Bus) -> None:
    """What the SLO jobs publish: the pool's way into L2, and the cycle's heartbeat."""
    board = FlagBoard(FlagPolicy())
    change = board.observe(int(time.time() * 1000), "pool", POOL, POOL, 0.03)
    assert change is not None and change.to_level == 2
    sink = BusTransitionSink(Publisher(bus.producer, component="test-flags"), 10.0)
    sink.write([change])
    now_ms = int(time.time() * 1000)
    sink.beat(JobsHeartbeat(now_ms, now_ms, "test-jobs", 5.0))
    sink.close()


def _post_long_prompt(url: str) -> int:
    body = {"model": POOL, "messages": [{"role": "user", "content": LONG_PROMPT}], "stream": True}
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_a_tap_following_the_flags_acts_on_them_without_importing_arrow(
    bus: Bus, tmp_path: Path
) -> None:
    _publish_l2_and_a_heartbeat(bus)
    config = tmp_path / "tap.yaml"
    config.write_text(json.dumps({"bus": {"topic_prefix": bus.prefix}, "tap": {"pool": POOL}}))
    log = tmp_path / "imports.txt"
    with log.open("w") as err:
        tap = subprocess.Popen(
            [
                *(sys.executable, "-X", "importtime", "-m", "llmslo", "tap"),
                *("--config", str(config), "--listen", "127.0.0.1:0"),
                *("--upstream", "http://127.0.0.1:9", "--follow-flags"),
                *("--bootstrap-servers", bus.bootstrap_servers),
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=os.environ | {"PYTHONPATH": str(ROOT)},
            cwd=ROOT,
        )
        try:
            assert tap.stdout is not None
            banner = json.loads(tap.stdout.readline())
            url = banner["url"]
            statuses = []
            deadline = time.monotonic() + 60
            # The follower reads the topic in the background: 502 (nothing listens upstream)
            # until it has, then L2 sheds the long prompt with a 429 before any upstream.
            while time.monotonic() < deadline and 429 not in statuses:
                statuses.append(_post_long_prompt(url))
                time.sleep(0.2)
        finally:
            tap.send_signal(signal.SIGTERM)
            assert tap.wait(timeout=60) == 0
    assert statuses[-1] == 429, statuses
    imported = set(re.findall(r"^import time:.*\|\s*([\w.]+)$", log.read_text(), re.M))
    assert "collectors.tap.flagsource" in imported
    assert _held(imported) == []


def test_json_flag_rows_are_checked_on_what_the_follower_reads() -> None:
    board = FlagBoard(FlagPolicy())
    change = board.observe(1_700_000_000_000, "instance", "10.0.0.7:8000", POOL, 0.03)
    assert change is not None
    rows = transition_rows([change])
    assert read_json_rows(FLAG_TRANSITIONS, json.dumps(rows).encode()) == rows
    beat = JobsHeartbeat(1_700_000_000_000, 1_700_000_000_000, "jobs-1", 5.0).row()
    assert read_json_rows(JOBS_HEARTBEATS, json.dumps(beat).encode()) == [beat]
    broken = [
        (FLAG_TRANSITIONS, rows[0] | {"to_level": 7}, "invalid_value"),  # level in [-1, 3]
        (FLAG_TRANSITIONS, rows[0] | {"scope": "galaxy"}, "invalid_value"),
        (FLAG_TRANSITIONS, rows[0] | {"kv_free_ratio": 2.5}, "invalid_value"),  # not read
        (FLAG_TRANSITIONS, rows[0] | {"to_level": "2"}, "schema_mismatch"),
        (FLAG_TRANSITIONS, rows[0] | {"to_level": True}, "schema_mismatch"),
        (FLAG_TRANSITIONS, rows[0] | {"scope_id": None}, "missing_required"),
        (JOBS_HEARTBEATS, beat | {"ts_ms": -1}, "invalid_value"),
        (JOBS_HEARTBEATS, beat | {"interval_s": "5"}, "schema_mismatch"),
    ]
    for schema, row, reason in broken:
        with pytest.raises(DecodeError) as raised:
            read_json_rows(schema, json.dumps(row).encode())
        assert raised.value.reason == reason, row
    for payload in (b"", b"[1, 2]", b'{"interval_s": Infinity}', b"\xff", b"[" * 100_000):
        with pytest.raises(DecodeError) as raised:
            read_json_rows(JOBS_HEARTBEATS, payload)
        assert raised.value.reason == "not_json", payload
