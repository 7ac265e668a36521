"""The API's bounds, over a real uvicorn server on loopback: the token before the body,
body caps per route, a canary never judged against itself, and reads that cannot starve
health checks or verdicts (own lanes, shedding with Retry-After, header timeouts)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from api.app import create_app
from api.capacity import ApiLimits
from api.service import ApiConfig
from llmslo.api_server import ApiServer
from tests.api.conftest import (
    BASELINE,
    CANARY,
    NOW_S,
    TOKEN,
    argo_params,
    auth,
    flagger_payload,
)
from tests.api.conftest import verdict_rows as stored_verdicts

GIB = 1 << 30


@pytest.fixture
def loaded(fill: Any) -> None:
    fill(200)


def served(make_app: Callable[..., FastAPI], **limits: Any) -> ApiServer:
    """The app and its server within ``limits`` (as ``llmslo run`` builds them)."""
    config = ApiConfig(port=0, limits=ApiLimits(**limits))
    return ApiServer(make_app(config), config).start()


@pytest.fixture
def server(make_app: Any, loaded: None) -> Iterator[ApiServer]:
    running = served(make_app)
    yield running
    running.stop()


def exchange(server: ApiServer, head: str, chunks: Iterator[bytes] | None = None) -> bytes:
    """Send ``head`` then body chunks until the server answers; the answer's first bytes."""
    body_chunks = chunks if chunks is not None else iter(())
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(head.encode())
        sock.setblocking(False)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                answer = sock.recv(65_536)
                if answer:
                    return answer
            except BlockingIOError:
                pass
            chunk = next(body_chunks, None)
            try:
                if chunk is not None:
                    sock.sendall(chunk)
                else:
                    time.sleep(0.01)
            except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                time.sleep(0.01)
    return b""


def post_head(path: str, length: int | None, token: str | None = None) -> str:
    size = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    authorization = f"Authorization: Bearer {token}\r\n" if token else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"{authorization}{size}\r\n\r\n"
    )


@pytest.mark.parametrize(
    ("path", "token", "status"),
    [
        ("/api/v1/silences", None, b"401"),
        ("/api/v1/verdict", None, b"401"),
        ("/api/v1/flags/overrides", None, b"401"),
        ("/api/v1/silences", "wrong", b"403"),
    ],
    ids=["silences without token", "verdict without token", "override without token",
         "silences with a wrong token"],
)  # fmt: skip
def test_a_body_is_refused_for_its_token_before_a_byte_of_it_is_sent(
    server: ApiServer, path: str, token: str | None, status: bytes
) -> None:
    """A 1 GiB body is announced and none of it sent: the refusal comes anyway."""
    answer = exchange(server, post_head(path, GIB, token))
    assert answer.split(b"\r\n")[0].split(b" ")[1] == status, answer[:200]
    assert b"connection: close" in answer.lower()


def test_a_body_larger_than_its_route_allows_is_413_by_length_or_by_count(
    server: ApiServer, store: Any
) -> None:
    by_length = exchange(server, post_head("/api/v1/verdict", GIB, TOKEN))
    assert by_length.startswith(b"HTTP/1.1 413"), by_length[:200]
    sent = 0

    def chunks() -> Iterator[bytes]:  # chunked encoding, at most 64 MiB
        nonlocal sent
        for _ in range(1024):
            sent += 65_536
            yield b"10000\r\n" + b" " * 65_536 + b"\r\n"

    by_count = exchange(server, post_head("/api/v1/verdict", None, TOKEN), chunks())
    assert by_count.startswith(b"HTTP/1.1 413"), by_count[:200]
    assert sent < 8 << 20  # refused after a few chunks, not after reading them all
    assert stored_verdicts(store) == 0


def test_a_flagger_payload_is_capped_at_a_few_kilobytes(client: TestClient, loaded: None) -> None:
    payload = {**flagger_payload(), "padding": "x" * 20_000}  # unknown fields are ignored
    answer = client.post("/api/v1/flagger/rollout", json=payload)
    assert answer.status_code == 413, answer.text
    assert client.post("/api/v1/flagger/rollout", json=flagger_payload()).status_code == 200


def test_a_slow_body_is_408(make_app: Any, loaded: None) -> None:
    server = served(make_app, body_timeout_s=0.5)
    try:
        answer = exchange(
            server, post_head("/api/v1/verdict", 100, TOKEN), iter([b"{"] + [b""] * 10_000)
        )
    finally:
        server.stop()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]


# --- a canary is not judged against itself ------------------------------------------------


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"baseline_instances": f"{CANARY},10.9.9.9:8000"}, CANARY),
        ({"baseline_instances": f"{BASELINE},{CANARY}"}, CANARY),
        ({"canary_instances": "", "canary_selector": "pool=llama-3-8b"}, "fall in both"),
        ({"baseline_instances": "", "baseline_selector": "pool=llama-3-8b"}, "fall in both"),
    ],
    ids=["a baseline holding the canary and a stranger", "a baseline holding the canary",
         "a canary selector covering the baseline", "a baseline selector covering the canary"],
)  # fmt: skip
def test_overlapping_cohorts_are_400_naming_the_overlap_for_argo_and_flagger(
    client: TestClient, loaded: None, store: Any, params: dict[str, str], named: str
) -> None:
    for answer in (
        client.get("/api/v1/verdict", params=argo_params(**params), headers=auth()),
        client.post("/api/v1/verdict", json=argo_params(**params), headers=auth()),
        client.post("/api/v1/flagger/rollout", json=flagger_payload(**params)),
    ):
        assert answer.status_code == 400, answer.text
        assert "same requests" in answer.json()["error"]
        assert named in answer.json()["error"]
    assert stored_verdicts(store) == 0


def test_disjoint_selectors_are_judged(make_app: Any, fill: Any) -> None:
    fill(200, canary={"revision": "r2"})
    with TestClient(make_app()) as client:
        params = argo_params(canary_instances="", canary_selector="revision=r2")
        answer = client.get("/api/v1/verdict", params=params, headers=auth())
    assert answer.status_code == 200, answer.text
    assert answer.json()["summary"]["canaryRequests"] == 200


def test_a_pass_for_an_inconclusive_verdict_warns_and_is_counted(
    make_app: Any, loaded: None
) -> None:
    registry = CollectorRegistry()
    with TestClient(make_app(registry=registry)) as client:
        # An hour before the first record: both cohorts exist but sent nothing.
        early = flagger_payload(on_inconclusive="pass", at="2000-01-01T00:00:00Z")
        answer = client.post("/api/v1/flagger/rollout", json=early)
    assert answer.status_code == 200, answer.text
    assert answer.json()["verdict"] == "inconclusive"
    assert "without a verdict" in answer.json()["warning"]
    assert "0 canary" in answer.json()["warning"]
    assert registry.get_sample_value("llmslo_api_unjudged_passes_total", {"gate": "rollout"}) == 1


# --- overrides -----------------------------------------------------------------------------

OVERRIDE = {
    "scope": "instance",
    "scope_id": CANARY,
    "level": 2,
    "expires_in_s": 60,
    "reason": "drain",
}


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({**OVERRIDE, "level": "high"}, 401, "token"),
        ({**OVERRIDE, "scope_id": "10.6.6.6:8000"}, 400, "10.6.6.6:8000"),
        ({**OVERRIDE, "scope": "pool", "scope_id": "no-such-pool"}, 400, "no-such-pool"),
        ({**OVERRIDE, "pool": "no-such-pool"}, 400, "no-such-pool"),
        ({**OVERRIDE, "reason": "ok\u202egnp.exe"}, 400, "U+202E"),
        ({**OVERRIDE, "reason": "a\x00b"}, 400, "U+0000"),
        ({**OVERRIDE, "scope_id": CANARY + "\u2066"}, 400, "U+2066"),
        ({**OVERRIDE, "reason": "line\nbreak"}, 400, "U+000A"),
    ],
    ids=["an invalid body without the token", "an unknown instance", "an unknown pool",
         "an unknown pool field", "a bidi override", "a NUL", "a bidi isolate in the id",
         "a control character"],
)  # fmt: skip
def test_overrides_are_refused_before_anything_is_stored(
    client: TestClient, loaded: None, store: Any, body: dict[str, Any], status: int, words: str
) -> None:
    headers = {} if status == 401 else auth()
    answer = client.post("/api/v1/flags/overrides", json=body, headers=headers)
    assert answer.status_code == status, answer.text
    assert words in answer.text
    assert store.con.execute("SELECT count(*) FROM flag_overrides").fetchone() == (0,)
    known = client.post("/api/v1/flags/overrides", json=OVERRIDE, headers=auth())
    assert known.status_code == 201, known.text


# --- reads never starve health checks and verdicts ------------------------------------------


async def _crowd(url: str, readers: int) -> dict[str, Any]:
    """``readers`` concurrent reads, then ``/healthz`` and a verdict while they are served."""
    done: list[tuple[str, float]] = []
    limits = httpx.Limits(max_connections=readers + 10)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def read() -> httpx.Response:
            answer = await client.get("/api/v1/meta")
            done.append(("read", time.monotonic()))
            return answer

        warm = await client.get("/api/v1/verdict", params=argo_params(), headers=auth())
        assert warm.status_code == 200, warm.text  # the judge's imports are loaded
        tasks = [asyncio.create_task(read()) for _ in range(readers)]
        await asyncio.sleep(1.0)  # the readers are in
        health = await client.get("/healthz")
        health_ts = time.monotonic()
        verdict = await client.get("/api/v1/verdict", params=argo_params(), headers=auth())
        verdict_ts = time.monotonic()
        reads = await asyncio.gather(*tasks)
    after = [ts for kind, ts in done if kind == "read"]
    return {
        "health": health,
        "verdict": verdict,
        "reads": reads,
        "reads_after_health": sum(ts > health_ts for ts in after),
        "reads_after_verdict": sum(ts > verdict_ts for ts in after),
    }


class SlowStore:
    """The test store behind a disk that takes ``delay_s`` to open each cursor."""

    def __init__(self, store: Any, delay_s: float) -> None:
        self.store, self.delay_s = store, delay_s

    def __call__(self) -> Any:
        time.sleep(self.delay_s)
        return self.store.con.cursor()


def test_health_and_verdicts_answer_while_200_readers_crowd_the_reads(
    store: Any, loaded: None
) -> None:
    def make_app(config: ApiConfig) -> FastAPI:
        return create_app(SlowStore(store, 0.3), config, token=TOKEN, clock=lambda: NOW_S)

    server = served(make_app, read_threads=2, read_queue=18)
    try:
        crowd = asyncio.run(_crowd(server.url, 200))
    finally:
        server.stop()
    assert crowd["health"].status_code == 200
    assert crowd["verdict"].status_code == 200, crowd["verdict"].text
    assert crowd["verdict"].json()["summary"]["canaryRequests"] == 200
    statuses = [r.status_code for r in crowd["reads"]]
    shed = [r for r in crowd["reads"] if r.status_code == 503]
    assert set(statuses) == {200, 503}
    assert statuses.count(200) >= 20  # threads + queue, and those freed meanwhile
    assert all(r.headers["retry-after"] == "1" for r in shed)
    # Neither waited behind the admitted reads: most were answered after them.
    assert crowd["reads_after_health"] >= 2
    assert crowd["reads_after_verdict"] >= 2


def test_half_sent_heads_and_silent_sockets_are_closed_within_the_header_timeout(
    make_app: Any, loaded: None
) -> None:
    server = served(make_app, header_timeout_s=1.0)
    sockets = [socket.create_connection((server.host, server.port)) for _ in range(500)]
    try:
        for i, sock in enumerate(sockets):
            if i % 10:  # every tenth stays silent
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        start = time.monotonic()
        for sock in sockets:
            sock.settimeout(max(0.1, start + 5 - time.monotonic()))
            assert sock.recv(1024) == b""  # closed by the server, not timed out here
        assert httpx.get(f"{server.url}/healthz").status_code == 200
    finally:
        for sock in sockets:
            sock.close()
        server.stop()


def test_a_request_head_larger_than_the_limit_is_431(make_app: Any, loaded: None) -> None:
    server = served(make_app, max_header_bytes=4_096)
    try:
        answer = httpx.get(f"{server.url}/healthz", headers={"X-Big": "x" * 8_000})
        small = httpx.get(f"{server.url}/healthz", headers={"X-Ok": "x" * 1_000})
    finally:
        server.stop()
    assert answer.status_code == 431
    assert small.status_code == 200
