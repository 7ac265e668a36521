"""Degradation flags for gateways: one shared watcher per process, ``ETag`` and long-poll.

:class:`FlagWatcher` reads the computed flags (``slo.queries.current_flags``) and the
overrides in force once per ``tick_s`` on its own thread, whatever the number of clients,
and wakes every waiting long-poll when the effective flags change. ``GET /api/v1/flags``
answers from that snapshot with a strong ``ETag`` (a hash of the answer); ``If-None-Match``
with the current tag is a 304, and with ``?wait=S`` (≤ 60 s) the request is held until the
flags differ from that tag or the wait ends (then 304). Overrides (token required) are set
and cleared here too and published to the ``flags`` topic so taps follow them.
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
from api.reads import ARROW_STREAM, parse_query, table_response
from pipeline.errors import QueryError
from slo.flags import FlagTransition
from slo.queries import current_flags
from slo.sinks import TransitionSink

__all__ = ["FlagSnapshot", "FlagWatcher", "add_flag_routes", "etag_of"]

log = logging.getLogger(__name__)

#: Longest a long-poll may wait, seconds.
MAX_WAIT_S = 60.0


def etag_of(table: pa.Table) -> str:
    """A strong ETag: the quoted SHA-256 (first 32 hex digits) of the rows as sorted JSON."""
    text = json.dumps(table.to_pylist(), sort_keys=True, default=str)
    return '"' + hashlib.sha256(text.encode()).hexdigest()[:32] + '"'


@dataclass(frozen=True)
class FlagView:
    """One answer of ``/api/v1/flags`` (all scopes, or pools or instances only), rendered
    once per change so that a poll costs no store read and no serialisation."""

    table: pa.Table
    etag: str
    json_body: bytes
    arrow_body: bytes

    @classmethod
    def of(cls, table: pa.Table) -> FlagView:
        rows = table.to_pylist()
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        body = json.dumps({"data": rows, "count": len(rows)}, default=str).encode()
        return cls(table, etag_of(table), body, sink.getvalue().to_pybytes())


@dataclass(frozen=True)
class FlagSnapshot:
    """The effective flags at one tick; ``version`` grows by one per change."""

    table: pa.Table
    etag: str
    version: int
    overrides: tuple[FlagOverride, ...]
    views: dict[str | None, FlagView]

    @classmethod
    def of(cls, table: pa.Table, version: int, overrides: tuple[FlagOverride, ...]) -> FlagSnapshot:
        views = {scope: FlagView.of(_view(table, scope)) for scope in (None, "pool", "instance")}
        return cls(table, views[None].etag, version, overrides, views)


class FlagWatcher:
    """Polls the store once per ``tick_s`` (on a daemon thread started on first use) and
    wakes waiting requests on change. ``reads`` counts the store reads (for tests and
    ``/metrics``-style checks: it does not grow with the number of clients)."""

    def __init__(
        self,
        connection_provider: Callable[[], duckdb.DuckDBPyConnection],
        clock: Callable[[], float],
        *,
        tick_s: float = 1.0,
        sink: TransitionSink | None = None,
    ) -> None:
        self.connection_provider = connection_provider
        self.clock = clock
        self.tick_s = tick_s
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

        Raises ``duckdb.Error`` when the store cannot be read.
        """
        with self._refresh_lock:
            now_ms = int(self.clock() * 1000)
            with closing(self.connection_provider()) as con:
                computed = current_flags(con)
                overrides = OverrideStore(con).active(now_ms)
            self.reads += 1
            table = apply_overrides(computed, overrides)
            etag = etag_of(table)
            previous = self._snapshot
            if previous is not None and previous.etag == etag:
                return previous
            version = (previous.version + 1) if previous else 1
            snapshot = FlagSnapshot.of(table, version, tuple(overrides))
            if previous is not None:
                self._publish_ended(previous, snapshot, now_ms)
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
                self._failing = False
            except Exception as exc:  # keep serving the last snapshot; log once per outage
                if not self._failing:
                    log.error("flag watcher cannot refresh the flags: %s", exc, exc_info=True)
                self._failing = True

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
        """Current level per pool and instance (manual overrides applied), with a strong
        ``ETag``. ``If-None-Match`` + ``wait=S`` (0 < S ≤ 60) holds the request until the
        flags change (200) or S seconds pass (304). ``at_ms`` reads the past (no wait)."""
        arguments = parse_query(request, kinds)
        scope, wait = arguments.get("scope"), arguments.get("wait")
        if scope is not None and scope not in ("pool", "instance"):
            raise QueryError("scope", f"must be one of pool, instance, got {str(scope)[:40]!r}")
        if wait is not None and not (isinstance(wait, float) and 0 < wait <= MAX_WAIT_S):
            raise QueryError("wait", f"must be in (0, {MAX_WAIT_S:.0f}] seconds, got {wait!r}")
        if "at_ms" in arguments:
            if wait is not None:
                raise QueryError("wait", "cannot wait on a past time (at_ms)")
            table = await asyncio.to_thread(_past_flags, watcher, arguments["at_ms"])
            response = table_response(request, _view(table, scope))
            response.headers["Cache-Control"] = "no-cache"
            return response
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


def _past_flags(watcher: FlagWatcher, at_ms: int) -> pa.Table:
    """The flags at ``at_ms`` with the overrides in force then (``current_flags`` checks it)."""
    with closing(watcher.connection_provider()) as con:
        computed = current_flags(con, at_ms=at_ms)
        return apply_overrides(computed, OverrideStore(con).active(at_ms))


def _answer(request: Request, view: FlagView) -> Response:
    headers = {"Cache-Control": "no-cache", "ETag": view.etag}
    if _matches(request.headers.get("if-none-match"), view.etag):
        return Response(status_code=304, headers=headers)
    if ARROW_STREAM in request.headers.get("accept", ""):
        return Response(view.arrow_body, media_type=ARROW_STREAM, headers=headers)
    return Response(view.json_body, media_type="application/json", headers=headers)
