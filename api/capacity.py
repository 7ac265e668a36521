"""The API's capacity: separate worker lanes per kind of route, and the server's bounds.

Every blocking handler runs on the worker threads of one :class:`Lane`, never on AnyIO's
shared default pool, so the kinds of route cannot starve each other:

* ``health``: ``/readyz`` (``/healthz`` touches no thread at all);
* ``verdicts``: Argo and Flagger verdicts, queued and never shed (they are authenticated,
  and a 503 would count against the rollout);
* ``changes``: flag overrides (authenticated);
* ``reads``: the dashboards' read routes and the verdict history. When its threads are
  busy and ``read_queue`` more reads wait, the next read is shed at once with 503 and
  ``Retry-After``, so an overload of reads is refused before anything else slows.

:class:`ApiLimits` (the ``api.limits`` config section) sizes the lanes and bounds the
server: connections (``limit_concurrency``: beyond it uvicorn answers 503), the time a
client may take to send its request head and its body, and how long an idle keep-alive
connection is held.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.to_thread
from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel, ConfigDict, Field

from api.errors import OverloadedError

__all__ = ["ApiLimits", "Lane", "Lanes"]

T = TypeVar("T")


class ApiLimits(BaseModel):
    """Capacity and timeouts of the API server (``api.limits``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Open connections (idle keep-alive ones included) beyond which uvicorn answers 503.
    max_connections: int = Field(1_024, ge=16, le=100_000)
    #: A client must send its whole request head within this many seconds of connecting
    #: (or of its first byte on a kept-alive connection), else the connection is closed.
    header_timeout_s: float = Field(10.0, gt=0, le=300)
    #: A request body must arrive within this many seconds of its head (else 408).
    body_timeout_s: float = Field(10.0, gt=0, le=300)
    #: An idle keep-alive connection is closed after this many seconds.
    keep_alive_s: int = Field(5, ge=1, le=300)
    #: Largest request head (request line and headers), bytes.
    max_header_bytes: int = Field(16_384, ge=1_024, le=1_048_576)
    read_threads: int = Field(8, ge=1, le=256)
    #: Reads that may wait for a read thread; one more is shed with 503.
    read_queue: int = Field(32, ge=0, le=10_000)
    verdict_threads: int = Field(4, ge=1, le=64)
    change_threads: int = Field(2, ge=1, le=64)
    health_threads: int = Field(2, ge=1, le=16)
    #: ``Retry-After`` of a shed read, seconds.
    retry_after_s: int = Field(1, ge=1, le=3_600)


class Lane:
    """Blocking work on at most ``threads`` worker threads of its own.

    With ``queue`` set, a call that finds ``threads + queue`` calls already running or
    waiting raises :class:`~api.errors.OverloadedError` at once (and counts it).
    """

    def __init__(
        self,
        name: str,
        threads: int,
        queue: int | None,
        retry_after_s: int,
        shed: Counter,
    ) -> None:
        self.name = name
        self.limiter = anyio.CapacityLimiter(threads)
        self.max_pending = None if queue is None else threads + queue
        self.pending = 0
        self.retry_after_s = retry_after_s
        self._shed = shed.labels(lane=name)

    async def run(self, work: Callable[[], T]) -> T:
        """``work()`` on one of this lane's threads; raises ``OverloadedError`` when full."""
        if self.max_pending is not None and self.pending >= self.max_pending:
            self._shed.inc()
            raise OverloadedError(
                f"too many {self.name} in progress; retry later", self.retry_after_s
            )
        self.pending += 1
        try:
            return await anyio.to_thread.run_sync(work, limiter=self.limiter)
        finally:
            self.pending -= 1


class Lanes:
    """The app's lanes, sized by ``limits``; their shed counter is
    ``llmslo_api_shed_total{lane}`` in ``registry``."""

    def __init__(self, limits: ApiLimits, registry: CollectorRegistry) -> None:
        shed = Counter(
            "llmslo_api_shed",
            "Requests refused with 503 because their lane was full",
            ["lane"],
            registry=registry,
        )
        retry = limits.retry_after_s
        self.health = Lane("health", limits.health_threads, None, retry, shed)
        self.verdicts = Lane("verdicts", limits.verdict_threads, None, retry, shed)
        self.changes = Lane("changes", limits.change_threads, None, retry, shed)
        self.reads = Lane("reads", limits.read_threads, limits.read_queue, retry, shed)
