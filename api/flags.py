"""Degradation flags for gateways: one shared watcher per process, ``ETag`` and long-poll.

:class:`FlagWatcher` reads the computed flags (``slo.queries.current_flags``), the
overrides in force and the SLO jobs' newest heartbeat (``jobs_heartbeats``) once per
``tick_s`` on its own thread, whatever the number of clients, and wakes every waiting
long-poll when the answer changes. Every answer says how old it is: ``as_of`` (the
heartbeat of the cycle that computed it, wall clock) and ``stale``, true when that
heartbeat is older than the bound (:class:`Freshness`), when there is none, or when the
store cannot be read (the last levels are then served, marked stale, never as fresh).
``GET /api/v1/flags`` answers from that snapshot with a strong ``ETag`` (a hash of the
whole answer, so it changes with ``as_of`` and ``stale`` too); ``If-None-Match`` with the
current tag is a 304, and with ``?wait=S`` (≤ 60 s) the request is held until the answer
differs from that tag or the wait ends (then 304). Overrides (token required) are set and
cleared here too and published to the ``flags`` topic so taps follow them. The contract
for gateway authors is ``docs/gateways.md``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
from fastapi import FastAPI, Request
from fastapi.responses import Response

from api.overrides import (
    OVERRIDE_ENDED,
    OVERRIDE_REASON,
    FlagOverride,
    OverrideStore,
    apply_overrides,
)
from api.reads import ARROW_STREAM, parse_query
from pipeline.errors import QueryError
from pipeline.schema import heartbeat_bound_s
from slo.flags import FlagTransition
from slo.queries import FLAGS_SCHEMA, current_flags, last_heartbeat
from slo.sinks import TransitionSink

__all__ = [
    "FlagSnapshot",
    "FlagWatcher",
    "Freshness",
    "add_flag_routes",
    "etag_of",
]

log = logging.getLogger(__name__)

#: Longest a long-poll may wait, seconds.
MAX_WAIT_S = 60.0
#: Response headers that carry the freshness on every answer (a 304 and Arrow too).
AS_OF_HEADER = "X-Llmslo-Flags-As-Of"
STALE_HEADER = "X-Llmslo-Flags-Stale"


def _iso(ts_ms: int) -> str:
    return datetime.fromtimestamp(ts_ms / 1000, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


@dataclass(frozen=True)
class Freshness:
    """How old an answer is: ``as_of_ms`` is the newest jobs heartbeat (wall clock, Unix
    epoch ms; None: none was ever stored), ``stale`` whether it is older than
    ``staleness_s`` (the effective bound), and ``reason`` why (``no_heartbeat``,
    ``heartbeat_old``, ``store_unreadable``; None when fresh)."""

    as_of_ms: int | None
    stale: bool
    reason: str | None
    staleness_s: float

    @classmethod
    def judge(
        cls, beat: tuple[int, float | None] | None, now_ms: int, staleness_s: float
    ) -> Freshness:
        """From the newest heartbeat ``(ts_ms, interval_s)`` (or None) at ``now_ms``."""
        if beat is None:
            return cls(None, True, "no_heartbeat", staleness_s)
        ts_ms, interval_s = beat
        bound_s = heartbeat_bound_s(staleness_s, interval_s)
        stale = now_ms - ts_ms > bound_s * 1000
        return cls(ts_ms, stale, "heartbeat_old" if stale else None, bound_s)

    def unreadable(self) -> Freshness:
        """The same ``as_of``, stale because the store cannot be read now."""
        return Freshness(self.as_of_ms, True, "store_unreadable", self.staleness_s)

    def fields(self) -> dict[str, Any]:
        """The answer's freshness fields (JSON)."""
        return {
            "as_of": None if self.as_of_ms is None else _iso(self.as_of_ms),
            "stale": self.stale,
            "stale_reason": self.reason,
            "staleness_s": self.staleness_s,
        }

    def headers(self) -> dict[str, str]:
        """``X-Llmslo-Flags-As-Of`` (ISO 8601, absent without heartbeat) and ``-Stale``."""
        headers = {STALE_HEADER: "true" if self.stale else "false"}
        if self.as_of_ms is not None:
            headers[AS_OF_HEADER] = _iso(self.as_of_ms)
        return headers


def etag_of(body: bytes) -> str:
    """A strong ETag: the quoted SHA-256 (first 32 hex digits) of the JSON answer."""
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


@dataclass(frozen=True)
class FlagView:
    """One answer of ``/api/v1/flags`` (all scopes, or pools or instances only), rendered
    once per change so that a poll costs no store read and no serialisation."""

    table: pa.Table
    freshness: Freshness
    etag: str
    json_body: bytes
    arrow_body: bytes

    @classmethod
    def of(cls, table: pa.Table, freshness: Freshness) -> FlagView:
        rows = table.to_pylist()
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        answer = {"data": rows, "count": len(rows), **freshness.fields()}
        body = json.dumps(answer, sort_keys=True, default=str).encode()
        return cls(table, freshness, etag_of(body), body, sink.getvalue().to_pybytes())


@dataclass(frozen=True)
class FlagSnapshot:
    """The effective flags at one tick; ``version`` grows by one per change."""

    table: pa.Table
    etag: str
    version: int
    overrides: tuple[FlagOverride, ...]
    views: dict[str | None, FlagView]
    freshness: Freshness

    @classmethod
    def of(
        cls,
        table: pa.Table,
        version: int,
        overrides: tuple[FlagOverride, ...],
        freshness: Freshness,
    ) -> FlagSnapshot:
        views = {
            scope: FlagView.of(_view(table, scope), freshness)
            for scope in (None, "pool", "instance")
        }
        return cls(table, views[None].etag, version, overrides, views, freshness)


class FlagWatcher:
    """Polls the store once per ``tick_s`` (on a daemon thread started on first use) and
    wakes waiting requests on change. ``reads`` counts the store reads (for tests and
    ``/metrics``-style checks: it does not grow with the number of clients).
    ``staleness_s``: an answer whose newest jobs heartbeat is older (by ``clock``, Unix
    seconds) is stale (never under three jobs intervals: ``pipeline.schema.heartbeat_bound_s``)."""

    def __init__(
        self,
        connection_provider: Callable[[], duckdb.DuckDBPyConnection],
        clock: Callable[[], float],
        *,
        tick_s: float = 1.0,
        staleness_s: float = 60.0,
        sink: TransitionSink | None = None,
    ) -> None:
        self.connection_provider = connection_provider
        self.clock = clock
        self.tick_s = tick_s
        self.staleness_s = staleness_s
        self.sink = sink
        self.reads = 0
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._snapshot: FlagSnapshot | None = None
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    @property
    def latest(self) -> FlagSnapshot | None:
        """The latest snapshot without touching the store (None before the first read)."""
        return self._snapshot

    def current(self) -> FlagSnapshot:
        """The latest snapshot (read now if there is none yet); starts the thread."""
        self._start()
        snapshot = self._snapshot
        return snapshot if snapshot is not None else self.refresh()

    def refresh(self) -> FlagSnapshot:
        """Read the store once; on a change publish a new snapshot and wake the waiters.

        When the store cannot be read, the last levels (none before the first read) are
        published as stale (``store_unreadable``); the outage is logged once.
        """
        with self._refresh_lock:
            now_ms = int(self.clock() * 1000)
            previous = self._snapshot
            try:
                with closing(self.connection_provider()) as con:
                    computed = current_flags(con)
                    overrides = tuple(OverrideStore(con).active(now_ms))
                    beat = last_heartbeat(con)
            except duckdb.Error as exc:
                if not self._failing:
                    log.error("flag watcher cannot read the store, flags now stale: %s", exc)
                self._failing = True
                if previous is None:
                    empty = Freshness(None, True, "store_unreadable", self.staleness_s)
                    return self._install(FLAGS_SCHEMA.empty_table(), (), empty, now_ms)
                freshness = previous.freshness.unreadable()
                return self._install(previous.table, previous.overrides, freshness, now_ms)
            if self._failing:
                log.info("flag watcher reads the store again")
                self._failing = False
            self.reads += 1
            freshness = Freshness.judge(beat, now_ms, self.staleness_s)
            return self._install(
                apply_overrides(computed, list(overrides)), overrides, freshness, now_ms
            )

    def _install(
        self,
        table: pa.Table,
        overrides: tuple[FlagOverride, ...],
        freshness: Freshness,
        now_ms: int,
    ) -> FlagSnapshot:
        """Publish the snapshot of ``table`` unless it answers the same as the current one."""
        previous = self._snapshot
        version = (previous.version + 1) if previous else 1
        snapshot = FlagSnapshot.of(table, version, overrides, freshness)
        if previous is not None and previous.etag == snapshot.etag:
            return previous
        if previous is not None:
            self._publish_ended(previous, snapshot, now_ms)
        if previous is None or previous.freshness.stale != freshness.stale:
            log.log(
                logging.WARNING if freshness.stale else logging.INFO,
                "flags %s (as of %s, %s)",
                "stale" if freshness.stale else "fresh",
                freshness.fields()["as_of"],
                freshness.reason or "heartbeat within the bound",
            )
        with self._lock:
            self._snapshot = snapshot
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            loop.call_soon_threadsafe(_resolve, future)
        return snapshot

    async def changed_since(self, version: int, timeout_s: float) -> FlagSnapshot:
        """The first snapshot newer than ``version``, or the current one after ``timeout_s``."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            snapshot = self._snapshot
            if snapshot is not None and snapshot.version > version:
                return snapshot
            self._waiters.append((loop, future))
        try:
            await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            with self._lock:
                if (loop, future) in self._waiters:
                    self._waiters.remove((loop, future))
        return self.current()

    def publish(self, transitions: list[FlagTransition]) -> bool:
        """Send transitions to the ``flags`` topic when a sink is configured."""
        if self.sink is None or not transitions:
            return False
        self.sink.write(transitions)
        return True

    def stop(self) -> None:
        """End the thread (within one tick)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=self.tick_s + 5)

    @property
    def running(self) -> bool:
        """The polling thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None and not self._stopping.is_set():
                self._thread = threading.Thread(target=self._run, name="api-flags", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while not self._stopping.wait(self.tick_s):
            try:
                self.refresh()
            except Exception:  # a bug, not an outage: keep the thread (answers age by tick)
                log.exception("flag watcher cannot refresh the flags")

    def _publish_ended(self, before: FlagSnapshot, after: FlagSnapshot, now_ms: int) -> None:
        """Overrides that expired since the last tick end with a transition back."""
        gone = {o.override_id for o in before.overrides} - {o.override_id for o in after.overrides}
        levels = {(r["scope"], r["scope_id"]): r for r in after.table.to_pylist()}
        ended = []
        for override in before.overrides:
            if override.override_id in gone:
                row = levels.get((override.scope, override.scope_id))
                ended.append(end_transition(override, row, now_ms))
        self.publish(ended)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def start_transition(override: FlagOverride, from_level: int) -> FlagTransition:
    """The transition an override publishes when set."""
    return FlagTransition(
        ts_ms=override.created_ts_ms,
        scope=override.scope,
        scope_id=override.scope_id,
        pool=override.pool,
        from_level=from_level,
        to_level=override.level,
        kv_free_ratio=None,
        reason=OVERRIDE_REASON,
        evidence={"override": override.as_json()},
    )


def end_transition(
    override: FlagOverride, row: dict[str, Any] | None, now_ms: int
) -> FlagTransition:
    """The transition back to the computed level when an override ends."""
    return FlagTransition(
        ts_ms=now_ms,
        scope=override.scope,
        scope_id=override.scope_id,
        pool=override.pool,
        from_level=override.level,
        to_level=0 if row is None else int(row["to_level"]),
        kv_free_ratio=None,
        reason=OVERRIDE_ENDED,
        evidence={"override": override.as_json()},
    )


def _matches(if_none_match: str | None, etag: str) -> bool:
    if not if_none_match:
        return False
    tags = {tag.strip() for tag in if_none_match.split(",")}
    return "*" in tags or etag in tags


def _view(table: pa.Table, scope: object) -> pa.Table:
    return table if scope is None else table.filter(pc.equal(table["scope"], scope))


def add_flag_routes(app: FastAPI, watcher: FlagWatcher) -> None:
    """``GET /api/v1/flags`` (ETag, ``If-None-Match``, ``?wait=``) on ``app``."""
    kinds = {"scope": "text", "at_ms": "int", "wait": "float"}

    @app.get("/api/v1/flags", tags=["flags"])
    async def flags(request: Request) -> Response:
        """Current level per pool and instance (manual overrides applied), with ``as_of``
        (the jobs heartbeat they were computed at) and ``stale``, and a strong ``ETag``.
        ``If-None-Match`` + ``wait=S`` (0 < S ≤ 60) holds the request until the answer
        changes (200) or S seconds pass (304). ``at_ms`` reads the past (no wait)."""
        arguments = parse_query(request, kinds)
        scope, wait = arguments.get("scope"), arguments.get("wait")
        if scope is not None and scope not in ("pool", "instance"):
            raise QueryError("scope", f"must be one of pool, instance, got {str(scope)[:40]!r}")
        if wait is not None and not (isinstance(wait, float) and 0 < wait <= MAX_WAIT_S):
            raise QueryError("wait", f"must be in (0, {MAX_WAIT_S:.0f}] seconds, got {wait!r}")
        if "at_ms" in arguments:
            if wait is not None:
                raise QueryError("wait", "cannot wait on a past time (at_ms)")
            table, freshness = await asyncio.to_thread(_past_flags, watcher, arguments["at_ms"])
            return _answer(request, FlagView.of(_view(table, scope), freshness))
        # Polls are served from the shared snapshot: no thread hop, no store read.
        snapshot = watcher.latest
        if snapshot is None or not watcher.running:
            snapshot = await asyncio.to_thread(watcher.current)
        view = snapshot.views[scope]
        given = request.headers.get("if-none-match")
        if wait is not None and _matches(given, view.etag):
            deadline = asyncio.get_running_loop().time() + wait
            while _matches(given, view.etag):
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                snapshot = await watcher.changed_since(snapshot.version, remaining)
                view = snapshot.views[scope]
        return _answer(request, view)


def _past_flags(watcher: FlagWatcher, at_ms: int) -> tuple[pa.Table, Freshness]:
    """The flags at ``at_ms`` with the overrides in force then (``current_flags`` checks it),
    and how fresh they were then."""
    with closing(watcher.connection_provider()) as con:
        computed = current_flags(con, at_ms=at_ms)
        table = apply_overrides(computed, OverrideStore(con).active(at_ms))
        freshness = Freshness.judge(last_heartbeat(con, at_ms), at_ms, watcher.staleness_s)
    return table, freshness


def _answer(request: Request, view: FlagView) -> Response:
    headers = {"Cache-Control": "no-cache", "ETag": view.etag, **view.freshness.headers()}
    if _matches(request.headers.get("if-none-match"), view.etag):
        return Response(status_code=304, headers=headers)
    if ARROW_STREAM in request.headers.get("accept", ""):
        return Response(view.arrow_body, media_type=ARROW_STREAM, headers=headers)
    return Response(view.json_body, media_type="application/json", headers=headers)
