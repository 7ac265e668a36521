"""Flags that go stale: every answer of ``/api/v1/flags`` says when its state was computed
(``as_of``, the SLO jobs' newest heartbeat) and whether it is ``stale``; past the bound
without a heartbeat, over a finished run's file, or when the store cannot be read, gateways
are told so (and the ETag changes, so a long-poll wakes up) instead of a level for ever."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import duckdb
import httpx
from fastapi.testclient import TestClient

from api.app import create_app
from api.service import ApiConfig
from pipeline.store import Store
from slo.flags import FlagTransition
from slo.sinks import JobsHeartbeat, StoreTransitionSink
from tests.api.conftest import TOKEN, serving

POD = "10.0.0.7:8000"
STALENESS = ApiConfig(flags_tick_s=0.05, flags_staleness_s=3.0)


class Clock:
    """A settable wall clock (Unix seconds)."""

    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def flag_l2(store: Store, ts_ms: int) -> None:
    StoreTransitionSink(store.con).write(
        [FlagTransition(ts_ms, "pool", "llama", "llama", 0, 2, 0.03, "kv_free_below_l2", {})]
    )


def beat(store: Store, ts_ms: int, interval_s: float = 0.5) -> None:
    StoreTransitionSink(store.con.cursor()).beat(JobsHeartbeat(ts_ms, ts_ms, "jobs-1", interval_s))


def wait_for(client: TestClient, stale: bool, within_s: float = 5.0) -> httpx.Response:
    deadline = time.monotonic() + within_s
    while True:
        answer = client.get("/api/v1/flags")
        if answer.json()["stale"] is stale:
            return answer
        assert time.monotonic() < deadline, f"flags never became stale={stale}"
        time.sleep(0.05)


def test_flags_go_stale_past_the_bound_and_fresh_when_heartbeats_resume(store: Store) -> None:
    clock = Clock(1_700_000_000.0)
    flag_l2(store, 1_699_999_000_000)
    beat(store, 1_700_000_000_000)
    with TestClient(create_app(store.con.cursor, STALENESS, token=TOKEN, clock=clock)) as client:
        fresh = client.get("/api/v1/flags")
        body = fresh.json()
        assert body["data"][0]["to_level"] == 2
        assert (body["as_of"], body["stale"], body["stale_reason"]) == (
            "2023-11-14T22:13:20.000Z",
            False,
            None,
        )
        assert body["staleness_s"] == 3.0
        assert fresh.headers["x-llmslo-flags-stale"] == "false"
        assert fresh.headers["x-llmslo-flags-as-of"] == "2023-11-14T22:13:20.000Z"
        clock.now_s += 3.5  # the jobs stay silent past the bound
        stale = wait_for(client, stale=True)
        assert stale.json()["stale_reason"] == "heartbeat_old"
        assert stale.json()["as_of"] == body["as_of"]  # the levels are the old ones, said so
        assert stale.json()["data"] == body["data"]
        assert stale.headers["etag"] != fresh.headers["etag"]
        again = client.get("/api/v1/flags", headers={"If-None-Match": fresh.headers["etag"]})
        assert again.status_code == 200 and again.json()["stale"] is True
        not_modified = client.get("/api/v1/flags", headers={"If-None-Match": stale.headers["etag"]})
        assert not_modified.status_code == 304
        assert not_modified.headers["x-llmslo-flags-stale"] == "true"
        beat(store, int(clock.now_s * 1000))  # the jobs are back
        resumed = wait_for(client, stale=False)
        assert resumed.json()["as_of"] == "2023-11-14T22:13:23.500Z"


def test_a_long_poll_wakes_up_when_the_flags_go_stale(store: Store) -> None:
    now_s = time.time()
    flag_l2(store, int(now_s * 1000) - 60_000)
    beat(store, int(now_s * 1000))
    beat_mono = time.monotonic() - (time.time() - now_s)
    with serving(create_app(store.con.cursor, STALENESS, token=TOKEN)) as url:
        first = httpx.get(f"{url}/api/v1/flags")
        assert first.json()["stale"] is False
        answer = httpx.get(
            f"{url}/api/v1/flags",
            params={"wait": 20},
            headers={"If-None-Match": first.headers["etag"]},
            timeout=30,
        )
        since_beat_s = time.monotonic() - beat_mono
    assert answer.status_code == 200 and answer.json()["stale"] is True
    assert 3.0 <= since_beat_s < 6.0, since_beat_s  # at the 3 s bound, within a few ticks


def test_a_finished_runs_file_answers_stale(tmp_path: Path) -> None:
    """A demo ended an hour ago at L2: its file is served read-only, and says so."""
    ended_ms = int(time.time() * 1000) - 3_600_000
    with Store(tmp_path / "demo.duckdb") as store:
        flag_l2(store, ended_ms - 30_000)
        for i in range(5):
            beat(store, ended_ms - 2_000 * (4 - i), interval_s=5.0)
    path = tmp_path / "demo.duckdb"
    app = create_app(lambda: duckdb.connect(str(path), read_only=True), token=TOKEN, read_only=True)
    with TestClient(app) as client:
        answer = client.get("/api/v1/flags").json()
        past = client.get("/api/v1/flags", params={"at_ms": ended_ms}).json()
    assert answer["data"][0]["to_level"] == 2
    assert (answer["stale"], answer["stale_reason"]) == (True, "heartbeat_old")
    assert answer["staleness_s"] == 60.0  # the default: 4 cycles of 15 s, above 3 × 5 s
    assert past["stale"] is False and past["as_of"] == answer["as_of"]  # fresh back then


def test_a_store_without_heartbeats_is_stale(store: Store) -> None:
    flag_l2(store, 1_000)
    with TestClient(create_app(store.con.cursor, token=TOKEN)) as client:
        answer = client.get("/api/v1/flags")
    body = answer.json()
    assert (body["as_of"], body["stale"], body["stale_reason"]) == (None, True, "no_heartbeat")
    assert "x-llmslo-flags-as-of" not in answer.headers


def test_an_unreadable_store_serves_the_last_levels_as_stale(tmp_path: Path) -> None:
    path = tmp_path / "live.duckdb"
    with Store(path) as store:
        flag_l2(store, int(time.time() * 1000) - 10_000)
        beat(store, int(time.time() * 1000) + 3_600_000, interval_s=15.0)  # fresh for an hour
    app = create_app(
        lambda: duckdb.connect(str(path), read_only=True),
        ApiConfig(flags_tick_s=0.05),
        token=TOKEN,
        read_only=True,
    )
    with TestClient(app) as client:
        fresh = client.get("/api/v1/flags")
        assert fresh.json()["stale"] is False
        shutil.move(path, tmp_path / "gone.duckdb")  # the volume went away
        stale = wait_for(client, stale=True)
        assert stale.json()["stale_reason"] == "store_unreadable"
        assert stale.json()["data"] == fresh.json()["data"]
        shutil.move(tmp_path / "gone.duckdb", path)
        assert wait_for(client, stale=False).json()["stale_reason"] is None
