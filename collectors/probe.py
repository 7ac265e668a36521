"""Synthetic prober for streaming LLM endpoints (blackbox_exporter for OpenAI SSE).

:class:`Prober` sends one small streaming chat request to the entry point (a gateway URL,
not a pod) every ``interval_s`` and turns each into a ``REQUEST_RECORDS`` row with
``source = "probe"``: TTFT (first chunk with content), TPOT, end-to-end time, the outcome
(DESIGN §3 names) and, when it failed, ``error_kind``:

* ``connect_refused`` / ``connect_timeout`` / ``connect_error`` — nothing answered (gateway down);
* ``http_<status>`` — the gateway or router answered with an error status (503 from a
  router with no eligible endpoint, 429 from a full queue: outcome ``rejected``);
* ``read_timeout`` — no byte within ``timeout_s`` (outcome ``upstream_timeout``);
* ``stream_cut`` — the stream ended without ``[DONE]`` (before or after the first token).

Failures are data, never exceptions: a probe always yields one record. Records go to the
``sink(schema, table)`` callable, e.g. :meth:`pipeline.publisher.PublishBuffer.put` in
front of the one bounded publisher. Time comes from the injected ``wall_s``/``monotonic_s``
clocks, so the record maths is tested without waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pyarrow as pa
from pydantic import BaseModel, Field

from collectors.collector import client_error_text
from collectors.tap.sse import SseFramer
from pipeline.config import STRICT
from pipeline.schema import REQUEST_RECORDS, RecordSchema

__all__ = ["PROBE_SOURCE", "ProbeConfig", "ProbeSection", "Prober"]

log = logging.getLogger(__name__)

#: ``requests.source`` of every probe record (NULL = measured by a tap).
PROBE_SOURCE = "probe"
ROUTE = "/v1/chat/completions"


class ProbeConfig(BaseModel):
    """What to probe and how often (seconds)."""

    model_config = STRICT

    url: str = Field(min_length=1, description="entry point base URL, e.g. http://gateway:8080")
    model: str = "llama-3-8b"
    interval_s: float = Field(default=10.0, gt=0, le=3600)
    timeout_s: float = Field(default=30.0, gt=0, le=600, description="whole request deadline")
    max_tokens: int = Field(default=8, ge=1, le=256, description="tokens asked per probe")
    prompt: str = Field(default="Say hello.", min_length=1, max_length=1024)
    pool: str | None = Field(default=None, description="pool label (default: the model)")
    tenant: str | None = Field(default="probe", description="tenant label of probe records")
    instance: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="the entry point's name in records (default: the URL's host:port); name "
        "it like the gateway's scrape target so probe and router findings share a scope",
    )


class ProbeSection(BaseModel):
    """The ``probe:`` config section: entry points ``llmslo run`` probes (none by default)."""

    model_config = STRICT

    targets: list[ProbeConfig] = Field(default_factory=list, max_length=64)


class _Measure:
    """Times (monotonic seconds from the send) and counts of one probe's stream."""

    def __init__(self) -> None:
        self.ttfb_s: float | None = None
        self.first_s: float | None = None
        self.last_s: float | None = None
        self.chunks = 0
        self.usage_tokens: int | None = None
        self.done = False
        self.finish_reason: str | None = None

    def event(self, data: bytes, at_s: float) -> None:
        if self.ttfb_s is None:
            self.ttfb_s = at_s
        if data.strip() == b"[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            return
        if not isinstance(chunk, dict):
            return
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {} if isinstance(choice, dict) else {}
            if isinstance(delta, dict) and delta.get("content"):
                self.chunks += 1
                self.first_s = at_s if self.first_s is None else self.first_s
                self.last_s = at_s
            if isinstance(choice, dict) and choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])

    @property
    def tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else self.chunks


class Prober:
    """Probes ``config.url`` every ``interval_s`` until :meth:`stop`; see the module docstring."""

    def __init__(
        self,
        config: ProbeConfig,
        sink: Callable[[RecordSchema, pa.Table], object],
        *,
        wall_s: Callable[[], float] = time.time,
        monotonic_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.sink = sink
        self.wall_s, self.monotonic_s = wall_s, monotonic_s
        parts = urlsplit(config.url)
        self.instance = config.instance or parts.netloc or config.url
        self.probe_id = f"probe:{self.instance}"
        self._stop = asyncio.Event()
        #: Probes sent, those that ended ``ok``, failures by ``error_kind``, and the last
        #: failure in words (with the URL).
        self.probes = 0
        self.ok = 0
        self.failed: dict[str, int] = {}
        self.last_error: str | None = None

    def stop(self) -> None:
        """Ask :meth:`run` to return after the probe in hand (call from the loop's thread)."""
        self._stop.set()

    async def run(self, *, rounds: int | None = None) -> None:
        """Probe every ``interval_s`` (from the start of one probe to the next)."""
        timeout = aiohttp.ClientTimeout(total=self.config.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not self._stop.is_set() and (rounds is None or self.probes < rounds):
                started = self.monotonic_s()
                row = await self.probe_once(session)
                self.sink(
                    REQUEST_RECORDS,
                    pa.Table.from_pylist([row], schema=REQUEST_RECORDS.storage_arrow),
                )
                wait = max(0.0, self.config.interval_s - (self.monotonic_s() - started))
                with contextlib.suppress(TimeoutError):  # the interval elapsed: next probe
                    await asyncio.wait_for(self._stop.wait(), wait)

    def _body(self) -> bytes:
        return json.dumps(
            {
                "model": self.config.model,
                "messages": [{"role": "user", "content": self.config.prompt}],
                "max_tokens": self.config.max_tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ).encode()

    async def probe_once(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        """One probe; returns its ``REQUEST_RECORDS`` row (never raises for a failed probe)."""
        request_id = f"probe-{uuid.uuid4().hex[:16]}"
        received_ms = int(self.wall_s() * 1000)
        start = self.monotonic_s()
        measure = _Measure()
        status: int | None = None
        kind: str | None = None
        url = self.config.url.rstrip("/") + ROUTE
        why = ""
        try:
            headers = {"content-type": "application/json", "x-request-id": request_id}
            async with session.post(url, data=self._body(), headers=headers) as resp:
                status = resp.status
                if status != 200:
                    await resp.read()
                    kind, why = f"http_{status}", f"HTTP {status} from {url}"
                else:
                    framer = SseFramer()
                    async for piece in resp.content.iter_any():
                        now = self.monotonic_s() - start
                        for event in framer.feed(piece):
                            if event.data is not None:
                                measure.event(event.data, now)
                        if measure.done:
                            break
                    kind = None if measure.done else "stream_cut"
                    why = f"the stream from {url} ended without [DONE]"
        except aiohttp.ClientConnectorError as exc:
            refused = isinstance(exc.os_error, ConnectionRefusedError)
            kind = "connect_refused" if refused else "connect_error"
            why = client_error_text(exc, url)
        except (TimeoutError, aiohttp.ServerTimeoutError):
            kind = (
                "read_timeout"
                if status is not None or measure.ttfb_s is not None
                else "connect_timeout"
            )
            why = f"no complete answer from {url} within {self.config.timeout_s:g} s"
        except (aiohttp.ClientError, OSError) as exc:
            kind = "stream_cut" if status == 200 else "connect_error"
            why = (
                client_error_text(exc, url)
                if isinstance(exc, aiohttp.ClientError)
                else f"{url}: {exc}"
            )
        self._count(request_id, kind, why)
        return self._row(request_id, received_ms, self.monotonic_s() - start, status, kind, measure)

    def _count(self, request_id: str, kind: str | None, why: str) -> None:
        self.probes += 1
        if kind is None:
            self.ok += 1
            return
        self.failed[kind] = self.failed.get(kind, 0) + 1
        self.last_error = why
        log.info("probe %s failed (%s): %s", request_id, kind, why)

    def _row(
        self,
        request_id: str,
        received_ms: int,
        e2e_s: float,
        status: int | None,
        kind: str | None,
        m: _Measure,
    ) -> dict[str, Any]:
        tokens = m.tokens
        tpot = (
            (m.last_s - m.first_s) / (tokens - 1)
            if m.first_s is not None and m.last_s is not None and tokens > 1 and kind is None
            else None
        )
        return {
            "request_id": request_id,
            "original_request_id": request_id,
            "attempt": 1,
            "tap_id": self.probe_id,
            "instance": self.instance,
            "pool": self.config.pool or self.config.model,
            "model": self.config.model,
            "tenant": self.config.tenant,
            "route": ROUTE,
            "streamed": True,
            "received_ts_ms": received_ms,
            "deadline_ts_ms": received_ms + int(self.config.timeout_s * 1000),
            "http_status": status,
            "outcome": _outcome(status, kind, m),
            "error_kind": kind,
            "finish_reason": m.finish_reason,
            "ttfb_s": m.ttfb_s,
            "ttft_s": m.first_s,
            "tpot_s": tpot,
            "e2e_s": e2e_s,
            "completion_tokens": tokens if kind is None else None,
            "token_chunks": m.chunks,
            "upstream_status": status,
            "source": PROBE_SOURCE,
        }


def _outcome(status: int | None, kind: str | None, m: _Measure) -> str:
    if kind is None:
        return "ok"
    if status in (429, 503) and kind.startswith("http_"):
        return "rejected"
    if kind in ("read_timeout", "connect_timeout"):
        return "upstream_timeout" if m.first_s is None else "interrupted_after_first_token"
    return "interrupted_after_first_token" if m.first_s is not None else "error_before_first_token"
