"""The load generator: open-loop arrivals against OpenAI-compatible endpoints.

Arrivals come from a trace or Poisson (:mod:`simulator.traces`), scaled in time
(``time_scale`` > 1 replays faster). Client behaviours: concurrency limit, cancel after N s
(the connection is really closed), deadlines, retries before the first token with
exponential backoff and full jitter, and hot-instance router skew. The report holds
client-side TTFT/TPOT/ITL (DESIGN §3 definitions), outcomes and arrival lateness. Chunks
are timestamped when their network read completes, so chunks that arrive in one read
(sped-up fleets, a lagging client) show ITL gaps of 0, as a real client would see them.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from simulator.traces import TraceRequest

__all__ = ["LoadConfig", "LoadReport", "RequestResult", "run_load", "run_load_sync"]

_RETRYABLE = {429, 500, 502, 503, 504}


class LoadConfig(BaseModel):
    """Client behaviour; times in seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    targets: list[str] = Field(min_length=1, description="base URLs, e.g. http://127.0.0.1:8000")
    model: str = "llama-3-8b"
    chat: bool = True
    stream: bool = True
    include_usage: bool = True
    time_scale: float = Field(
        default=1.0, gt=0, description="replay speed-up: offsets divided by it"
    )
    concurrency: int = Field(default=256, ge=1, description="max requests in flight")
    cancel_after_s: float | None = Field(default=None, gt=0)
    deadline_s: float | None = Field(default=None, gt=0)
    max_attempts: int = Field(default=1, ge=1, le=20)
    backoff_base_s: float = Field(default=0.05, ge=0)
    backoff_max_s: float = Field(default=2.0, ge=0)
    hot_share: float = Field(
        default=0.0, ge=0, le=1, description="extra share routed to targets[0]"
    )
    max_output_tokens: int | None = Field(default=None, ge=1)
    max_prompt_tokens: int | None = Field(default=None, ge=1)
    request_timeout_s: float = Field(default=300.0, gt=0)
    seed: int = 0
    slo_ttft_ms: float | None = Field(
        default=None,
        gt=0,
        le=600_000,
        description="every request's own TTFT target, sent as x-llm-d-slo-ttft-ms (ms)",
    )
    slo_tpot_ms: float | None = Field(
        default=None,
        gt=0,
        le=600_000,
        description="every request's own TPOT target, sent as x-llm-d-slo-tpot-ms (ms)",
    )
    conversation_turns: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="prompts open with a conversation's own prefix: a new conversation every "
        "N requests, its N turns two conversations apart (what a prefix-locality router "
        "keys on); None: every prompt shares one prefix",
    )


@dataclass
class RequestResult:
    """What the client saw for one logical request (all attempts)."""

    target: str
    scheduled_s: float
    sent_s: float
    attempts: int = 0
    outcome: str = "ok"
    status: int | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    completion_tokens: int = 0
    itl_s: list[float] = field(default_factory=list)


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


@dataclass
class LoadReport:
    """Aggregate of a run: outcomes, throughput and client-side latency percentiles."""

    results: list[RequestResult]
    wall_s: float
    outcome_counts: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        ok = [r for r in self.results if r.outcome == "ok"]
        ttft = [r.ttft_s for r in self.results if r.ttft_s is not None]
        tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
        itl = [g for r in self.results for g in r.itl_s]
        late = [r.sent_s - r.scheduled_s for r in self.results]
        tokens = sum(r.completion_tokens for r in self.results)
        attempts = sum(r.attempts for r in self.results)
        return {
            "requests": len(self.results),
            "outcomes": dict(Counter(r.outcome for r in self.results)),
            "attempts": attempts,
            "retried_fraction": (attempts - len(self.results)) / attempts if attempts else 0.0,
            "wall_s": round(self.wall_s, 3),
            "req_per_s": len(self.results) / self.wall_s if self.wall_s else 0.0,
            "tokens": tokens,
            "tokens_per_s": tokens / self.wall_s if self.wall_s else 0.0,
            "ttft_s": {"p50": _pct(ttft, 50), "p90": _pct(ttft, 90), "p99": _pct(ttft, 99)},
            "tpot_s": {"p50": _pct(tpot, 50), "p90": _pct(tpot, 90), "p99": _pct(tpot, 99)},
            "itl_s": {"p50": _pct(itl, 50), "p90": _pct(itl, 90), "p99": _pct(itl, 99)},
            "arrival_lateness_s": {
                "p50": _pct(late, 50),
                "p99": _pct(late, 99),
                "max": max(late, default=None),
            },
        }


class _Client:
    def __init__(self, config: LoadConfig, session: aiohttp.ClientSession, t0: float) -> None:
        self.config = config
        self.session = session
        self.t0 = t0
        self.rng = random.Random(config.seed)
        self.semaphore = asyncio.Semaphore(config.concurrency)
        self._rr = 0
        self._bodies = 0  # bodies rendered, numbering conversation turns
        self.headers = {"Content-Type": "application/json"}
        for header, target_ms in (
            ("x-llm-d-slo-ttft-ms", config.slo_ttft_ms),
            ("x-llm-d-slo-tpot-ms", config.slo_tpot_ms),
        ):
            if target_ms is not None:
                self.headers[header] = f"{target_ms:g}"

    def pick_target(self) -> str:
        targets = self.config.targets
        if self.config.hot_share and self.rng.random() < self.config.hot_share:
            return targets[0]
        self._rr = (self._rr + 1) % len(targets)
        return targets[self._rr]

    def body(self, req: TraceRequest) -> bytes:
        cfg = self.config
        prompt_tokens = min(req.prompt_tokens, cfg.max_prompt_tokens or req.prompt_tokens)
        output = min(req.output_tokens, cfg.max_output_tokens or req.output_tokens)
        text = "abcd" * prompt_tokens  # 4 characters per simulated token
        turns = cfg.conversation_turns
        if turns is not None:
            n, self._bodies = self._bodies, self._bodies + 1
            text = f"conversation {max(n // turns - 2 * (n % turns), 0)} {text}"
        payload: dict[str, Any] = {
            "model": cfg.model,
            "max_tokens": output,
            "ignore_eos": True,
            "stream": cfg.stream,
        }
        if cfg.chat:
            payload["messages"] = [{"role": "user", "content": text}]
        else:
            payload["prompt"] = text
        if cfg.stream and cfg.include_usage:
            payload["stream_options"] = {"include_usage": True}
        return json.dumps(payload).encode()

    async def one(self, req: TraceRequest) -> RequestResult:
        scheduled = self.t0 + req.offset_s / self.config.time_scale
        delay = scheduled - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        async with self.semaphore:
            result = RequestResult(
                self.pick_target(), scheduled - self.t0, time.monotonic() - self.t0
            )
            await self._attempts(req, result)
            return result

    async def _attempts(self, req: TraceRequest, result: RequestResult) -> None:
        cfg = self.config
        start = time.monotonic()
        deadline = start + cfg.deadline_s if cfg.deadline_s else None
        body = self.body(req)
        for attempt in range(1, cfg.max_attempts + 1):
            result.attempts = attempt
            retry = await self._attempt(body, result, start, deadline)
            if not retry or attempt == cfg.max_attempts:
                return
            backoff = min(cfg.backoff_max_s, cfg.backoff_base_s * 2 ** (attempt - 1))
            pause = self.rng.uniform(0, backoff)  # full jitter
            if deadline is not None and time.monotonic() + pause >= deadline:
                result.outcome = "deadline_exceeded"
                return
            await asyncio.sleep(pause)
            if attempt < cfg.max_attempts and len(cfg.targets) > 1:
                result.target = self.pick_target()

    async def _attempt(
        self, body: bytes, result: RequestResult, start: float, deadline: float | None
    ) -> bool:
        """One HTTP attempt; returns True when it failed before the first token (retryable)."""
        cfg = self.config
        limit = cfg.request_timeout_s
        cancel_at = start + cfg.cancel_after_s if cfg.cancel_after_s else None
        stop_at = min(x for x in (cancel_at, deadline, start + limit) if x is not None)
        route = "/v1/chat/completions" if cfg.chat else "/v1/completions"
        try:
            return await asyncio.wait_for(
                self._exchange(result.target + route, body, result, start),
                max(0.0, stop_at - time.monotonic()),
            )
        except TimeoutError:
            now = time.monotonic()
            if (
                cancel_at is not None
                and now >= cancel_at - 1e-3
                and (deadline is None or cancel_at <= deadline)
            ):
                result.outcome = "client_cancelled"
            elif deadline is not None and now >= deadline - 1e-3:
                result.outcome = "deadline_exceeded"
            else:
                result.outcome = "upstream_timeout"
            result.e2e_s = now - start
            return False
        except (aiohttp.ClientError, ConnectionError) as exc:
            result.e2e_s = time.monotonic() - start
            if result.ttft_s is not None:
                result.outcome = "interrupted_after_first_token"
                return False
            result.outcome = "error_before_first_token"
            result.status = getattr(exc, "status", None)
            return True

    async def _exchange(self, url: str, body: bytes, result: RequestResult, start: float) -> bool:
        async with self.session.post(url, data=body, headers=self.headers) as resp:
            result.status = resp.status
            if resp.status != 200:
                await resp.read()
                result.outcome = (
                    "rejected" if resp.status in (429, 503) else "error_before_first_token"
                )
                result.e2e_s = time.monotonic() - start
                return resp.status in _RETRYABLE
            if not self.config.stream:
                data = await resp.json()
                now = time.monotonic()
                result.completion_tokens = int(data.get("usage", {}).get("completion_tokens", 0))
                result.ttft_s = result.e2e_s = now - start
                result.outcome = "ok"
                return False
            return await self._read_stream(resp, result, start)

    async def _read_stream(
        self, resp: aiohttp.ClientResponse, result: RequestResult, start: float
    ) -> bool:
        """Read SSE events as they arrive (whole network reads, split on blank lines)."""
        state = _StreamState()
        pending = b""
        async for data in resp.content.iter_any():
            now = time.monotonic()
            events = (pending + data).split(b"\n\n")
            pending = events.pop()
            for event in events:
                if state.feed(event, now, start, result):
                    break
            if state.done:
                break
        result.e2e_s = time.monotonic() - start
        n = state.usage_tokens if state.usage_tokens is not None else state.chunks
        result.completion_tokens = int(n)
        if state.first is not None and state.last is not None and n > 1:
            result.tpot_s = (state.last - state.first) / (n - 1)
        if not state.done:
            result.outcome = (
                "interrupted_after_first_token"
                if state.first is not None
                else "error_before_first_token"
            )
            return state.first is None
        result.outcome = "ok"
        return False


class _StreamState:
    """Per-stream parse state; token-bearing = non-empty ``content`` or ``text`` (DESIGN §3)."""

    __slots__ = ("chunks", "done", "first", "last", "usage_tokens")

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None
        self.chunks = 0
        self.done = False
        self.usage_tokens: int | None = None

    def feed(self, event: bytes, now: float, start: float, result: RequestResult) -> bool:
        """Account one SSE event; returns True at ``[DONE]``."""
        if not event.startswith(b"data: "):
            return False
        if event.startswith(b"data: [DONE]"):
            self.done = True
            return True
        if b'"usage"' in event and b'"choices": []' in event:
            usage = json.loads(event[6:]).get("usage") or {}
            self.usage_tokens = usage.get("completion_tokens")
            return False
        if (b'"content": "' in event and b'"content": ""' not in event) or (
            b'"text": "' in event and b'"text": ""' not in event
        ):
            self.chunks += 1
            result.completion_tokens = self.chunks  # so far; usage replaces it at the end
            if self.first is None:
                self.first = now
                result.ttft_s = now - start
            elif self.last is not None:
                result.itl_s.append(now - self.last)
            self.last = now
        return False


async def run_load(
    config: LoadConfig,
    requests: Iterable[TraceRequest],
    *,
    stop: threading.Event | None = None,
    abort: threading.Event | None = None,
    keep_results: bool = True,
) -> LoadReport:
    """Replay ``requests`` (in arrival order) against ``config.targets``; returns the report.

    ``requests`` may be an endless iterator (background load); ``stop`` ends the arrivals
    and waits for the requests in flight; ``abort`` ends the arrivals and cancels the
    requests in flight (they are left out of the report). With ``keep_results=False`` only outcome counts
    are kept (long runs), and the report's ``results`` list is empty.
    """
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = time.monotonic() + 0.05
        client = _Client(config, session, t0)
        in_flight: set[asyncio.Task[RequestResult]] = set()
        results: list[RequestResult] = []
        outcomes: Counter[str] = Counter()

        def collect(task: asyncio.Task[RequestResult]) -> None:
            in_flight.discard(task)
            if not task.cancelled() and task.exception() is None:
                result = task.result()
                outcomes[result.outcome] += 1
                if keep_results:
                    results.append(result)

        if isinstance(requests, list):
            requests = sorted(requests, key=lambda r: r.offset_s)

        def ended() -> bool:
            return any(e is not None and e.is_set() for e in (stop, abort))

        for req in requests:
            if ended():
                break
            # open loop: spawn each request at its arrival time (few timers in flight)
            delay = t0 + req.offset_s / config.time_scale - time.monotonic() - 0.002
            while delay > 0 and not ended():
                await asyncio.sleep(min(delay, 0.5))
                delay = t0 + req.offset_s / config.time_scale - time.monotonic() - 0.002
            task = asyncio.create_task(client.one(req))
            in_flight.add(task)
            task.add_done_callback(collect)
        while in_flight:
            if abort is not None and abort.is_set():
                for task in in_flight:
                    task.cancel()
                await asyncio.gather(*in_flight, return_exceptions=True)
                break
            await asyncio.wait(set(in_flight), timeout=0.2)
        results.sort(key=lambda r: r.scheduled_s)
        report = LoadReport(results, time.monotonic() - t0)
        report.outcome_counts = dict(outcomes)
        return report


def run_load_sync(
    config: LoadConfig,
    requests: Iterable[TraceRequest],
    *,
    stop: threading.Event | None = None,
    abort: threading.Event | None = None,
    keep_results: bool = True,
) -> LoadReport:
    """:func:`run_load` on a fresh event loop (for CLIs, threads and tests)."""
    return asyncio.run(
        run_load(config, requests, stop=stop, abort=abort, keep_results=keep_results)
    )
