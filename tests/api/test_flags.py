"""Flags for gateways: a strong ETag, 304 on If-None-Match, a long-poll that returns as
soon as the flags change, one store read per tick whatever the number of pollers, and
manual overrides (token required) that expire by themselves."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import httpx
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.reads import ARROW_STREAM
from api.service import ApiConfig
from pipeline.store import Store
from slo.flags import FlagTransition
from slo.queries import FLAGS_SCHEMA
from slo.sinks import ListTransitionSink, StoreTransitionSink
from tests.api.conftest import NOW_S, TOKEN, auth, serving
from tests.slo.factories import insert, request

POD = "10.0.0.7:8000"
FAST = ApiConfig(flags_tick_s=0.05)


def transition(
    ts_ms: int, scope_id: str, before: int, after: int, scope: str = "instance"
) -> FlagTransition:
    return FlagTransition(
        ts_ms, scope, scope_id, "llama", before, after, 0.04, "kv_free_below_l2", {"kv": 0.96}
    )


class Clock:
    """A settable clock (seconds)."""

    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def flagged(store: Store) -> Store:
    StoreTransitionSink(store.con).write(
        [transition(1_000, POD, 0, 2), transition(2_000, "llama", 0, 1, scope="pool")]
    )
    return store


def test_flags_carry_a_strong_etag_and_if_none_match_gets_304(flagged: Store) -> None:
    with TestClient(create_app(flagged.con.cursor, token=TOKEN)) as client:
        first = client.get("/api/v1/flags")
        assert first.status_code == 200
        etag = first.headers["etag"]
        assert etag.startswith('"') and not etag.startswith("W/")
        assert {(r["scope_id"], r["to_level"]) for r in first.json()["data"]} == {
            (POD, 2),
            ("llama", 1),
        }
        again = client.get("/api/v1/flags", headers={"If-None-Match": etag})
        assert again.status_code == 304 and again.content == b""
        assert again.headers["etag"] == etag
        other = client.get("/api/v1/flags", headers={"If-None-Match": '"stale"'})
        assert other.status_code == 200
        pools = client.get("/api/v1/flags", params={"scope": "pool"})
        assert [r["scope_id"] for r in pools.json()["data"]] == ["llama"]
        assert pools.headers["etag"] != etag
        arrow = client.get("/api/v1/flags", headers={"Accept": ARROW_STREAM})
        table = pa.ipc.open_stream(arrow.content).read_all()
        assert table.schema == FLAGS_SCHEMA and table.num_rows == 2
        assert arrow.headers["etag"] == etag
        past = client.get("/api/v1/flags", params={"at_ms": 1_500})
        assert [r["to_level"] for r in past.json()["data"]] == [2]


def test_a_change_gets_a_new_etag_within_a_tick(flagged: Store) -> None:
    with TestClient(create_app(flagged.con.cursor, FAST, token=TOKEN)) as client:
        etag = client.get("/api/v1/flags").headers["etag"]
        StoreTransitionSink(flagged.con).write([transition(3_000, POD, 2, 3)])
        time.sleep(0.5)
        after = client.get("/api/v1/flags", headers={"If-None-Match": etag})
        assert after.status_code == 200 and after.headers["etag"] != etag
        assert {r["scope_id"]: r["to_level"] for r in after.json()["data"]}[POD] == 3


def test_a_long_poll_returns_as_soon_as_the_flags_change(flagged: Store) -> None:
    with serving(create_app(flagged.con.cursor, FAST, token=TOKEN)) as url:
        etag = httpx.get(f"{url}/api/v1/flags").headers["etag"]
        timer = threading.Timer(
            0.5,
            lambda: StoreTransitionSink(flagged.con.cursor()).write([transition(3_000, POD, 2, 3)]),
        )
        started = time.monotonic()
        timer.start()
        answer = httpx.get(
            f"{url}/api/v1/flags", params={"wait": 20}, headers={"If-None-Match": etag}, timeout=30
        )
        elapsed = time.monotonic() - started
        timer.join()
    assert answer.status_code == 200
    assert {r["scope_id"]: r["to_level"] for r in answer.json()["data"]}[POD] == 3
    assert 0.4 < elapsed < 5, elapsed


def test_a_long_poll_without_change_ends_in_304_at_the_timeout(flagged: Store) -> None:
    with serving(create_app(flagged.con.cursor, FAST, token=TOKEN)) as url:
        etag = httpx.get(f"{url}/api/v1/flags").headers["etag"]
        started = time.monotonic()
        answer = httpx.get(
            f"{url}/api/v1/flags",
            params={"wait": "0.8"},
            headers={"If-None-Match": etag},
            timeout=10,
        )
        elapsed = time.monotonic() - started
    assert answer.status_code == 304 and answer.headers["etag"] == etag
    assert 0.7 < elapsed < 4, elapsed


def test_200_concurrent_pollers_share_one_watcher(flagged: Store) -> None:
    app = create_app(flagged.con.cursor, ApiConfig(flags_tick_s=0.2), token=TOKEN)
    watcher = app.state.flag_watcher

    async def poll_all(url: str, etag: str) -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=250)
        async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
            return await asyncio.gather(
                *(
                    client.get(
                        "/api/v1/flags", params={"wait": 15}, headers={"If-None-Match": etag}
                    )
                    for _ in range(200)
                )
            )

    with serving(app) as url:
        etag = httpx.get(f"{url}/api/v1/flags").headers["etag"]
        reads_before = watcher.reads
        timer = threading.Timer(
            2.0,
            lambda: StoreTransitionSink(flagged.con.cursor()).write([transition(3_000, POD, 2, 0)]),
        )
        timer.start()
        started = time.monotonic()
        answers = asyncio.run(poll_all(url, etag))
        elapsed = time.monotonic() - started
        timer.join()
    assert [a.status_code for a in answers] == [200] * 200
    assert len({a.headers["etag"] for a in answers}) == 1
    assert all({r["scope_id"]: r["to_level"] for r in a.json()["data"]}[POD] == 0 for a in answers)
    reads = watcher.reads - reads_before
    # One read per tick (0.2 s) plus slack, never one per poller.
    assert reads <= elapsed / 0.2 + 5, (reads, elapsed)
    assert reads < 200


@pytest.mark.parametrize(
    "params",
    [{"wait": "0"}, {"wait": "61"}, {"wait": "soon"}, {"wait": "nan"}, {"wait": "5", "at_ms": "10"},
     {"scope": "cluster"}, {"at_ms": "-1"}, {"limit": "5"}],
    ids=["zero wait", "over a minute", "not a number", "NaN", "waiting on the past",
         "unknown scope", "negative time", "unknown parameter"],
)  # fmt: skip
def test_bad_flag_parameters_are_400_naming_them(flagged: Store, params: dict[str, str]) -> None:
    with TestClient(create_app(flagged.con.cursor, token=TOKEN)) as client:
        answer = client.get("/api/v1/flags", params=params)
    assert answer.status_code == 400, answer.text
    assert answer.json()["parameter"] in params


# --- overrides -----------------------------------------------------------------------------

OVERRIDE = {
    "scope": "instance",
    "scope_id": POD,
    "level": 3,
    "expires_in_s": 600,
    "reason": "drain for maintenance",
}


def _overrides(store: Store) -> int:
    return len(store.con.execute("SELECT * FROM flag_overrides").fetchall())


def test_an_override_applies_publishes_and_vanishes_at_its_expiry(flagged: Store) -> None:
    clock, sink = Clock(NOW_S), ListTransitionSink()
    app = create_app(flagged.con.cursor, FAST, token=TOKEN, clock=clock, flag_sink=sink)
    with TestClient(app) as client:
        etag = client.get("/api/v1/flags").headers["etag"]
        made = client.post("/api/v1/flags/overrides", json=OVERRIDE, headers=auth())
        assert made.status_code == 201, made.text
        assert made.json()["published"] is True
        override_id = made.json()["override"]["override_id"]
        flags = client.get("/api/v1/flags")
        assert flags.headers["etag"] != etag
        row = {r["scope_id"]: r for r in flags.json()["data"]}[POD]
        assert (row["from_level"], row["to_level"], row["reason"]) == (2, 3, "manual_override")
        assert json.loads(row["evidence_json"])["override_id"] == override_id
        (started,) = sink.transitions
        assert (started.scope_id, started.from_level, started.to_level) == (POD, 2, 3)
        assert client.get("/api/v1/flags/overrides").json()["count"] == 1
        clock.now_s += 601
        time.sleep(0.5)  # the watcher's next tick sees it expired
        row = {r["scope_id"]: r for r in client.get("/api/v1/flags").json()["data"]}[POD]
        assert row["to_level"] == 2 and row["reason"] == "kv_free_below_l2"
        assert client.get("/api/v1/flags/overrides").json()["count"] == 0
        ended = sink.transitions[-1]
        assert (ended.reason, ended.from_level, ended.to_level) == ("manual_override_ended", 3, 2)


def test_an_override_of_an_unflagged_scope_and_its_clearing(flagged: Store) -> None:
    insert(flagged, requests=[request(1_000, pool="mistral")])  # known, never flagged
    sink = ListTransitionSink()
    app = create_app(flagged.con.cursor, token=TOKEN, clock=lambda: NOW_S, flag_sink=sink)
    with TestClient(app) as client:
        body = {**OVERRIDE, "scope": "pool", "scope_id": "mistral", "level": 1}
        override_id = client.post("/api/v1/flags/overrides", json=body, headers=auth()).json()[
            "override"
        ]["override_id"]
        assert {r["scope_id"]: r["to_level"] for r in client.get("/api/v1/flags").json()["data"]}[
            "mistral"
        ] == 1
        assert client.delete(f"/api/v1/flags/overrides/{override_id}").status_code == 401
        cleared = client.delete(f"/api/v1/flags/overrides/{override_id}", headers=auth())
        assert cleared.status_code == 200
        assert "mistral" not in {r["scope_id"] for r in client.get("/api/v1/flags").json()["data"]}
        assert (
            client.delete(f"/api/v1/flags/overrides/{override_id}", headers=auth()).status_code
            == 404
        )
        assert [t.reason for t in sink.transitions] == ["manual_override", "manual_override_ended"]


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"Authorization": "Bearer wrong"}, 403), ({"Authorization": TOKEN}, 401)],
    ids=["no token", "wrong token", "token without Bearer"],
)
def test_an_override_without_the_token_changes_nothing(
    flagged: Store, headers: dict[str, str], status: int
) -> None:
    sink = ListTransitionSink()
    with TestClient(create_app(flagged.con.cursor, token=TOKEN, flag_sink=sink)) as client:
        etag = client.get("/api/v1/flags").headers["etag"]
        answer = client.post("/api/v1/flags/overrides", json=OVERRIDE, headers=headers)
        assert answer.status_code == status
        assert client.get("/api/v1/flags", headers={"If-None-Match": etag}).status_code == 304
    assert _overrides(flagged) == 0 and sink.transitions == []


def test_no_configured_token_refuses_overrides(
    flagged: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLMSLO_API_TOKEN", raising=False)
    with TestClient(create_app(flagged.con.cursor)) as client:
        answer = client.post("/api/v1/flags/overrides", json=OVERRIDE, headers=auth())
    assert answer.status_code == 403 and "LLMSLO_API_TOKEN" in answer.json()["error"]
    assert _overrides(flagged) == 0


@pytest.mark.parametrize(
    "body",
    [{**OVERRIDE, "level": 4}, {**OVERRIDE, "level": "3"}, {**OVERRIDE, "expires_in_s": 0},
     {**OVERRIDE, "expires_in_s": 10**9}, {**OVERRIDE, "scope": "cluster"},
     {**OVERRIDE, "scope_id": ""}, {**OVERRIDE, "scope_id": "x" * 300},
     {**OVERRIDE, "extra": "1"}, {k: v for k, v in OVERRIDE.items() if k != "reason"}, [OVERRIDE]],
    ids=["level 4", "level as text", "no duration", "a 30-year override", "unknown scope",
         "empty scope id", "a 300-character id", "an unknown field", "no reason", "a list"],
)  # fmt: skip
def test_malformed_overrides_are_400_and_store_nothing(flagged: Store, body: Any) -> None:
    with TestClient(create_app(flagged.con.cursor, token=TOKEN)) as client:
        answer = client.post("/api/v1/flags/overrides", json=body, headers=auth())
        broken = client.post(
            "/api/v1/flags/overrides",
            content=b'{"scope": "pool",',
            headers={**auth(), "Content-Type": "application/json"},
        )
    assert answer.status_code == 400, answer.text
    assert broken.status_code == 400
    assert _overrides(flagged) == 0


def test_the_jobs_resume_from_their_own_level_not_an_override(flagged: Store) -> None:
    """A restart of ``llmslo run`` while an override is in force: the published override
    transitions are in ``flag_transitions`` but the jobs' hysteresis resumes from its own."""
    from slo.sinks import load_flag_states

    sink = ListTransitionSink()
    app = create_app(flagged.con.cursor, token=TOKEN, clock=lambda: NOW_S, flag_sink=sink)
    with TestClient(app) as client:
        assert (
            client.post("/api/v1/flags/overrides", json=OVERRIDE, headers=auth()).status_code == 201
        )
    StoreTransitionSink(flagged.con).write(sink.transitions)  # as the ingester stores them
    assert {r["reason"] for r in client.get("/api/v1/flags").json()["data"]} >= {"manual_override"}
    assert load_flag_states(flagged.con)[("instance", POD)].level == 2
