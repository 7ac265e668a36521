"""One attempt of one client request against one upstream: forward, measure, classify.

The response is held back (bounded by ``hold_max_bytes``) until the first token, so a
failure before it can be retried invisibly; from the first token on, bytes flow through as
they arrive and a failure terminates the client's stream (never a transparent replay).
Every exit path leaves :attr:`Exchange.outcome` set to one of ``pipeline.schema.OUTCOMES``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from multidict import CIMultiDict

from collectors.tap.config import TapConfig
from collectors.tap.contract import Upstream
from collectors.tap.downstream import ClientGone, Downstream
from collectors.tap.measure import Measurements, StreamMeter, measure_json_response
from collectors.tap.sse import SseEvent, SseFramer
from collectors.tap.targets import NO_TARGETS, OwnTargets
from collectors.tap.upstream import (
    ConnectFailed,
    ConnectTimeout,
    ReadTimeout,
    UpstreamClient,
    UpstreamReset,
    UpstreamResponse,
)

__all__ = ["Exchange", "RequestContext"]

log = logging.getLogger(__name__)

#: Upstream bytes are added to the byte counter in batches of about this many (and at the
#: end of each attempt), not once per read.
_BYTES_REPORT_EVERY = 64 * 1024

_CUT_ERRORS = (UpstreamReset, ConnectionError)


@dataclass
class RequestContext:
    """What the tap knows about a client request before the first attempt (no text kept)."""

    route: str
    method: str
    path_qs: str
    headers: CIMultiDict[str]
    body: bytes
    streamed: bool
    strip_usage: bool
    model: str | None
    tenant: str | None
    original_id: str
    t0_s: float
    received_wall_s: float
    deadline_wall_s: float | None
    problems: list[str] = field(default_factory=list)
    #: Stamped on every record of the request (tap config or header; see ``header_label``).
    revision: str | None = None
    cohort: str | None = None
    max_tokens: int | None = None
    #: Degradation flags (collectors.tap.degradation): the level acted on and the action.
    degradation_level: int | None = None
    enforced_action: str | None = None
    #: The request's own latency targets (``x-llm-d-slo-*`` headers; see collectors.tap.targets).
    own_targets: OwnTargets = NO_TARGETS


def _is_event_stream(headers: CIMultiDict[str]) -> bool:
    """False only for an answer that says it is something else (no Content-Type: trusted)."""
    content_type = headers.get("Content-Type")
    return content_type is None or content_type.lower().lstrip().startswith("text/event-stream")


class Exchange:
    """One attempt; :meth:`run` then (for the final attempt) :meth:`deliver`."""

    def __init__(
        self,
        ctx: RequestContext,
        upstream: Upstream,
        attempt: int,
        config: TapConfig,
        client: UpstreamClient,
        clock: Callable[[], float],
        hooks: Any,
    ) -> None:
        self.ctx, self.upstream, self.attempt = ctx, upstream, attempt
        self.request_id = ctx.original_id if attempt == 1 else f"{ctx.original_id}.{attempt}"
        self._config, self._client, self._clock, self._hooks = config, client, clock, hooks
        #: now_s → the most a chunk read then can have waited for the loop (LoopWatch)
        self._late: Callable[[float], float | None] = hooks.late_s
        self.meter = StreamMeter(ctx.t0_s)
        self.framer = SseFramer(config.max_event_bytes)
        self.outcome: str | None = None
        self.error_kind: str | None = None
        self.retryable = False
        self.cut = False  # the upstream stream broke; the client's stream must be cut too
        self.upstream_status: int | None = None
        self.upstream_headers: CIMultiDict[str] = CIMultiDict()
        self.held: list[bytes] = []
        self.held_bytes = 0
        self._bytes_in = 0  # read from upstream, reported to the hooks once per attempt
        self.end_s: float | None = None
        self.disconnect_wall_s: float | None = None
        self.upstream_closed_wall_s: float | None = None
        self.tokens_after_disconnect: int | None = None
        self.measurements: Measurements | None = None
        self.draining = False
        self.emitted = False
        #: The client was handed the end of the answer ([DONE], or the chunk with the
        #: finish reason): if it hangs up now, it had the whole answer (see client_gone).
        self.answered = False
        self.http_status: int | None = None  # status the client got (final attempt only)
        self._resp: UpstreamResponse | None = None
        self._open = False
        #: Until the first token (streamed SSE only): what the engine sends meanwhile,
        #: comments and role-only chunks included, does not extend it.
        self._first_token_scope: asyncio.Timeout | None = None

    # ------------------------------------------------------------------ running
    async def run(self, down: Downstream) -> None:
        """Forward the request and the response; never raises except CancelledError."""
        within_s = self._config.first_token_timeout_s if self.ctx.streamed else None
        try:
            async with asyncio.timeout(within_s) as self._first_token_scope:
                await self._send()
                assert self._resp is not None
                streaming = self.ctx.streamed and _is_event_stream(self.upstream_headers)
                if self.upstream_status != 200 or not streaming:
                    self._first_token_arrived()  # no first token to wait for
                if self.upstream_status != 200:
                    await self._error_status()
                elif self.ctx.streamed and not streaming:
                    await self._not_event_stream(down)
                elif self.ctx.streamed:
                    await self._stream(down)
                else:
                    await self._json_body(down)
        except ClientGone as exc:
            self.client_gone(exc.reason)
        except ConnectTimeout:
            self._fail("upstream_timeout", "connect_timeout")
        except ReadTimeout:
            self._fail("upstream_timeout", "upstream_read_timeout", cut=self._resp is not None)
        except TimeoutError:  # the first-token scope's own (a deadline's is a CancelledError)
            self._fail("upstream_timeout", "first_token_timeout", cut=True)
            self.held, self.held_bytes = [], 0  # keep-alives only: the client gets a 504
        except ConnectFailed:
            self._fail("error_before_first_token", "connect_failed")
        except _CUT_ERRORS as exc:
            self._fail("error_before_first_token", "upstream_reset", cut=True)
            log.debug(
                "upstream %s reset request %s: %s", self.upstream.instance, self.request_id, exc
            )
        except asyncio.CancelledError:
            if down.gone:
                self.client_gone("client_disconnected")
            raise
        finally:
            self._report_bytes_in()
            if not self.draining:
                self.close_upstream()

    def _report_bytes_in(self) -> None:
        # Batched (a counter update takes a lock): every _BYTES_REPORT_EVERY and at the end.
        if self._bytes_in:
            self._hooks.bytes_in(self._bytes_in)
            self._bytes_in = 0

    async def _send(self) -> None:
        headers = CIMultiDict(self.ctx.headers)
        headers[self._config.request_id_header] = self.request_id
        if self.ctx.deadline_wall_s is not None:
            remaining_ms = max(int((self.ctx.deadline_wall_s - self._hooks.wall_s()) * 1000), 1)
            headers[self._config.timeout_header] = str(remaining_ms)
            headers[self._config.deadline_header] = str(int(self.ctx.deadline_wall_s * 1000))
        self._hooks.opened(self)
        self._open = True
        self._resp = await self._client.request(
            self.upstream.url,
            self.ctx.method,
            self.ctx.path_qs,
            list(headers.items()),
            self.ctx.body,
        )
        self.upstream_status = self._resp.status
        self.upstream_headers = CIMultiDict(self._resp.headers)

    async def _error_status(self) -> None:
        """A non-200 answer: keep a bounded copy of its body for the client, classify it."""
        assert self._resp is not None and self.upstream_status is not None
        self.meter.m.ttfb_s = self._clock() - self.ctx.t0_s
        while self.held_bytes < self._config.hold_max_bytes:
            chunk = await self._resp.readany()
            if not chunk:
                break
            self.held.append(chunk)
            self.held_bytes += len(chunk)
        status = self.upstream_status
        outcome = "rejected" if status in (429, 503) else "error_before_first_token"
        self._fail(outcome, f"http_{status}", retryable=status in self._config.retry_on_status)

    async def _not_event_stream(self, down: Downstream) -> None:
        """A 200 to a streamed request that is no SSE stream (a login page from a proxy in
        between, say): held back like an error answer so another upstream may be tried; on
        the last attempt (or once over ``hold_max_bytes``) it reaches the client whole and
        properly ended, never as an open stream."""
        assert self._resp is not None
        self.meter.m.ttfb_s = self._clock() - self.ctx.t0_s
        while chunk := await self._resp.readany():
            self._bytes_in += len(chunk)
            await self._forward(down, chunk)
            if self.held_bytes > self._config.hold_max_bytes:
                await self._commit(down)
        self._fail("error_before_first_token", "not_event_stream", retryable=not down.committed)

    async def _stream(self, down: Downstream) -> None:
        assert self._resp is not None
        forward = self._forwarder(down)
        while await self._resp.pipe(forward):
            await down.wait_writable()
        events = self.framer.close()
        if (
            events
            and events[-1].data is None
            and not events[-1].oversized
            and events[-1].raw.strip()
        ):
            self._hooks.dropped("unterminated_event")
        await self._forward(down, self._measure(events, self._clock()))
        self._classify_end()
        if self.outcome == "ok" or not self.retryable:
            await self._commit(down)

    def _forwarder(self, down: Downstream) -> Callable[[bytes], bool]:
        """The callback :meth:`UpstreamResponse.pipe` hands each engine chunk to, from the
        connection's data callback: it frames and measures the chunk, holds it back until
        the first token (or ``hold_max_bytes``), then writes it to the client at once. The
        first token thus leaves in the same callback that read it, like every later chunk:
        no task hand-off, which would wait behind every other stream's chunks read in the
        same loop iteration. Returns whether the client is behind (reading then pauses)."""
        arrival = self._arrival
        hold_max = self._config.hold_max_bytes
        meter = self.meter
        waiting = self._first_token_scope  # the first-token timeout, until the first token

        def forward(chunk: bytes) -> bool:
            nonlocal waiting
            out = self._frame(chunk, *arrival())
            if waiting is not None and meter.first_token_seen:
                waiting.reschedule(None)
                waiting = None
            if not down.committed:
                self.held.append(out)
                self.held_bytes += len(out)
                if meter.first_token_seen or self.held_bytes > hold_max:
                    self._commit_nowait(down)
                return down.behind
            down.write_nowait(out)
            if not self.answered:
                self._note_answered()
            return down.behind

        return forward

    def _first_token_arrived(self) -> None:
        if self._first_token_scope is not None:
            self._first_token_scope.reschedule(None)

    def _arrival(self) -> tuple[float, float | None]:
        """When the bytes just read reached the tap and how much earlier they may have:
        the kernel's receive stamp where the connection has one, else now and the loop's
        read-delay bound (seconds)."""
        response = self._resp
        stamp = response.stamp if response is not None else None
        if stamp is not None:
            return stamp
        now_s = self._clock()
        return now_s, self._late(now_s)

    def _frame(self, chunk: bytes, now_s: float, late_s: float | None) -> bytes:
        """Frame ``chunk`` into events, measure them, and return the bytes to forward."""
        self._bytes_in += len(chunk)
        if self._bytes_in >= _BYTES_REPORT_EVERY:
            self._report_bytes_in()
        before = self.framer.oversized_events
        out = self._measure(self.framer.feed(chunk), now_s, late_s)
        if self.framer.oversized_events != before:
            self._hooks.dropped("oversized_event")
        return out

    def _measure(self, events: list[SseEvent], now_s: float, late_s: float | None = None) -> bytes:
        """Measure ``events``; return their bytes minus the usage chunk the tap asked for."""
        parts = []
        strip = self.ctx.strip_usage
        meter = self.meter
        if events and late_s is None:
            late_s = self._late(now_s)
        for event in events:
            if event.data is not None:
                info = meter.on_data(event.data, now_s, late_s)
                if strip and info.usage_only:
                    continue
            parts.append(event.raw)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _note_answered(self) -> None:
        """Call after a successful write: did it carry the end of the answer?"""
        m = self.meter.m
        self.answered = m.saw_done or m.finish_reason is not None

    async def _forward(self, down: Downstream, data: bytes) -> None:
        if down.committed:
            await down.write(data)
            self._note_answered()
        else:
            self.held.append(data)
            self.held_bytes += len(data)

    async def _commit(self, down: Downstream) -> None:
        self._commit_nowait(down)
        await down.wait_writable()

    def _commit_nowait(self, down: Downstream) -> None:
        """Send the status, the headers and what was held back (once); check ``down.behind``."""
        if down.committed:
            return
        down.commit(self.upstream_status or 200, self.upstream_headers)
        held, self.held, self.held_bytes = self.held, [], 0
        down.write_nowait(b"".join(held))
        self._note_answered()

    def _classify_end(self) -> None:
        m = self.meter.m
        first = self.meter.first_token_seen
        if m.not_json_events:
            self._hooks.dropped("not_json", m.not_json_events)
        if m.error_event:
            if first:
                self._fail("interrupted_after_first_token", "upstream_error_event")
            else:
                self._fail("error_before_first_token", "upstream_error_event", retryable=True)
        elif not m.saw_done and m.finish_reason is None:
            if first:
                self._fail("interrupted_after_first_token", "upstream_eof", cut=True)
            else:
                self._fail("error_before_first_token", "upstream_eof", retryable=True, cut=True)
        else:
            self.outcome = "ok"

    async def _json_body(self, down: Downstream) -> None:
        assert self._resp is not None
        limit = self._config.max_json_response_bytes
        kept = bytearray()
        overflow = False
        while True:
            chunk = await self._resp.readany()
            if not chunk:
                break
            self._bytes_in += len(chunk)
            if self.meter.m.ttfb_s is None:
                self.meter.m.ttfb_s = self._clock() - self.ctx.t0_s
            if len(kept) + len(chunk) <= limit:
                kept += chunk
            else:
                overflow = True
            await self._forward(down, chunk)
            await self._commit(down)
        ttfb = self.meter.m.ttfb_s
        self.meter.m = measure_json_response(b"" if overflow else bytes(kept), self.ctx.t0_s)
        self.meter.m.ttfb_s = ttfb
        if overflow:
            self._hooks.dropped("json_response_too_large")
        self.outcome = "ok"
        await self._commit(down)

    # ------------------------------------------------------------------ outcomes
    def _fail(
        self, outcome: str, kind: str, *, retryable: bool | None = None, cut: bool = False
    ) -> None:
        first = self.meter.first_token_seen
        if outcome in ("error_before_first_token", "upstream_timeout") and first:
            outcome = "interrupted_after_first_token"
        self.outcome, self.error_kind, self.cut = outcome, kind, cut
        self.retryable = (not first) if retryable is None else (retryable and not first)

    def client_gone(self, reason: str) -> None:
        """The client disconnected (or stopped reading): record it, close or drain upstream.

        A client that leaves once it was handed the end of the answer (clients stop reading
        at ``data: [DONE]`` and close without waiting for HTTP's terminating chunk) got the
        whole answer: that attempt stays ``ok`` and is no disconnect.
        """
        if self.answered and self.outcome in (None, "ok"):
            self.outcome, self.retryable = "ok", False
            if self.end_s is None:
                self.end_s = self._clock()
            self.close_upstream()
            return
        if self.disconnect_wall_s is None:
            self.disconnect_wall_s = self._hooks.wall_s()
            self._hooks.disconnected(self)
        self.outcome, self.error_kind, self.retryable = "client_cancelled", reason, False
        if self._config.drain_max_s > 0 and self._resp is not None and self._open:
            self.draining = True
            self._hooks.spawn(self._drain())
        else:
            self.close_upstream()

    def deadline_passed(self) -> None:
        if self.outcome != "client_cancelled":
            self.outcome, self.error_kind, self.retryable = "deadline_exceeded", "deadline", False
        self.close_upstream()

    def close_upstream(self) -> None:
        """Close (or, after a clean end, release) the upstream connection, once."""
        if not self._open:
            return
        self._open = False
        if self._resp is not None:
            if self.outcome == "ok" and self._resp.at_eof():
                self._resp.release()
            else:
                self._resp.close()
        self.upstream_closed_wall_s = self._hooks.wall_s()
        self._hooks.closed(self)

    async def _drain(self) -> None:
        """Evidence (c): keep reading upstream for a bounded time, count tokens generated."""
        assert self._resp is not None
        counter = StreamMeter(self.ctx.t0_s)
        budget = self._config.drain_max_bytes
        try:
            async with asyncio.timeout(self._config.drain_max_s):
                while budget > 0:
                    chunk = await self._resp.readany()
                    if not chunk:
                        break
                    budget -= len(chunk)
                    now = self._clock()
                    for event in self.framer.feed(chunk):
                        if event.data is not None:
                            counter.on_data(event.data, now)
        except (TimeoutError, *_CUT_ERRORS):
            pass
        finally:
            self.tokens_after_disconnect = counter.m.tokens_seen
            self.draining = False
            self.close_upstream()
            self._hooks.drained(self)

    # ------------------------------------------------------------------ delivery
    async def deliver(self, down: Downstream) -> None:
        """Final attempt only: finish the client's response according to the outcome."""
        try:
            await self._deliver(down)
        except ClientGone as exc:
            self.client_gone(exc.reason)
        self.end_s = self._clock()

    async def _deliver(self, down: Downstream) -> None:
        if self.outcome == "client_cancelled":
            return
        if self.outcome == "deadline_exceeded":
            if down.committed:
                down.abort()
            else:
                await down.send_error(504, "deadline_exceeded", "the request deadline passed")
            return
        if not down.committed and self.upstream_status is not None and (self.held or not self.cut):
            await self._commit(down)
        if down.committed:
            if self.cut:
                down.abort()
            else:
                await down.end()
            return
        status = 504 if self.outcome == "upstream_timeout" else 502
        await down.send_error(
            status, self.outcome or "error", f"upstream failed: {self.error_kind}"
        )

    def finish(self) -> Measurements:
        """The measurements of this attempt (e2e only when the client got a response)."""
        if self.measurements is None:
            self.measurements = self.meter.finish(self.end_s)
        return self.measurements
