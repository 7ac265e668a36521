"""Per-request measurement of an OpenAI-compatible response, exactly per DESIGN §3.

:class:`StreamMeter` is pure logic: it is told what arrived and when (seconds on a
monotonic clock the caller owns) and never reads a clock itself, so tests drive it with
plain numbers. It keeps token *counts and timings* only — never content text.

Definitions (t₀ = request received by the tap):

* ``ttfb_s``: first data event of any kind (the role-only chat chunk included) − t₀;
* ``ttft_s``: first chunk carrying non-empty ``content``, ``reasoning_content`` /
  ``reasoning``, a ``tool_calls`` delta, or completion ``text`` − t₀;
* ``tpot_s``: (t_last_token_chunk − t_first_token_chunk) / (N − 1), N =
  ``usage.completion_tokens``; when the engine sent no usage (engines and older versions
  that ignore ``stream_options.include_usage``), N = the tokens counted from the
  token-bearing chunks (one per chunk unless the chunk says otherwise: logprobs or
  continuous usage), and ``tokens_source`` says which (``usage`` | ``chunks``); ``None``
  when N ≤ 1;
* ITL gaps: every gap between consecutive token-bearing chunks, with the tokens each
  chunk carried (from continuous usage stats or logprobs when present, else 1); kept in
  memory as 8-byte floats for the exact :class:`ItlSummary` a record carries instead of
  the whole list (a 25,000-token stream: ~200 KB while it runs, freed when it ends);
* ``e2e_s`` is set by the proxy when the last byte has been written to the client;
* ``gap_error_s``: the largest read-delay bound (``late_s``) of the token-bearing chunks,
  so every gap is within ± it of the gap at the socket (:mod:`collectors.tap.loopwatch`
  says where the bound comes from); ``None`` when no bound was given;
* ``itl_gap_errors_s``: each gap's own bound, the larger of its two chunks' read delays
  (a chunk read late lengthens the gap before it and shortens the one after it), so
  :meth:`Measurements.itl_summary` can summarise only the gaps the tap can vouch for.
"""

from __future__ import annotations

import json
import math
from array import array
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ITL_HISTOGRAM_BOUNDS_S",
    "ChunkInfo",
    "ItlSummary",
    "Measurements",
    "StreamMeter",
    "measure_json_response",
    "parse_json_body",
]

#: Upper bounds (inclusive, seconds) of the ITL histogram's log buckets: 0.25 ms × √2ᵏ,
#: k = 0…30, so 0.25 ms … 8.2 s at ±19 % resolution; one more bucket counts larger gaps.
ITL_HISTOGRAM_BOUNDS_S = tuple(0.00025 * 2 ** (k / 2) for k in range(31))

#: DESIGN §4: a request's ITL jitter is defined for requests with at least this many chunks.
JITTER_MIN_TOKEN_CHUNKS = 10


@dataclass(frozen=True)
class ItlSummary:
    """Exact statistics of one response's ITL gaps (seconds; ``None`` without gaps).

    Percentiles are nearest-rank (a gap that occurred). ``jitter_s`` = p99 − p50, only for
    responses with at least :data:`JITTER_MIN_TOKEN_CHUNKS` token-bearing chunks.
    ``histogram`` counts gaps per :data:`ITL_HISTOGRAM_BOUNDS_S` bucket, plus one overflow.
    """

    count: int
    mean_s: float | None
    p50_s: float | None
    p90_s: float | None
    p99_s: float | None
    max_s: float | None
    jitter_s: float | None
    histogram: tuple[int, ...]

    @classmethod
    def of(cls, gaps_s: array[float] | list[float]) -> ItlSummary:
        """The summary of ``gaps_s`` (sorts a copy: O(n log n), once per response)."""
        ordered = sorted(gaps_s)
        n = len(ordered)
        histogram = [0] * (len(ITL_HISTOGRAM_BOUNDS_S) + 1)
        for gap in ordered:
            histogram[bisect_left(ITL_HISTOGRAM_BOUNDS_S, gap)] += 1
        if not n:
            return cls(0, None, None, None, None, None, None, tuple(histogram))

        def rank(q: float) -> float:
            return ordered[max(math.ceil(q * n) - 1, 0)]

        p50, p99 = rank(0.5), rank(0.99)
        jitter = p99 - p50 if n + 1 >= JITTER_MIN_TOKEN_CHUNKS else None
        return cls(
            n, math.fsum(ordered) / n, p50, rank(0.9), p99, ordered[-1], jitter, tuple(histogram)
        )


@dataclass(frozen=True)
class ChunkInfo:
    """What one data event was: ``usage_only`` chunks are candidates for stripping."""

    is_done: bool = False
    is_json: bool = True
    token_bearing: bool = False
    usage_only: bool = False
    error: bool = False


@dataclass
class Measurements:
    """Everything the tap learned about one response (timings in seconds since t₀)."""

    ttfb_s: float | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    #: ``usage`` (the engine's usage) or ``chunks`` (counted from token-bearing chunks).
    tokens_source: str | None = None
    finish_reason: str | None = None
    response_model: str | None = None
    itl_gaps_s: array[float] = field(default_factory=lambda: array("d"))
    #: Each gap's error bound (seconds), parallel to ``itl_gaps_s``; empty without bounds.
    itl_gap_errors_s: array[float] = field(default_factory=lambda: array("d"))
    chunk_tokens: list[int] = field(default_factory=list)
    saw_done: bool = False
    error_event: bool = False
    not_json_events: int = 0
    gap_error_s: float | None = None

    @property
    def token_chunks(self) -> int:
        return len(self.chunk_tokens)

    @property
    def tokens_seen(self) -> int:
        """Tokens counted from the chunks themselves (usage may be missing)."""
        return sum(self.chunk_tokens)

    def itl_stats(self) -> tuple[float | None, float | None, float | None]:
        """(mean, p99 nearest-rank, max) of the ITL gaps; ``None`` when there are none."""
        summary = self.itl_summary()
        return summary.mean_s, summary.p99_s, summary.max_s

    def itl_summary(self) -> ItlSummary:
        """Exact statistics and the log-bucket histogram of every ITL gap as read."""
        return ItlSummary.of(self.itl_gaps_s)

    def vouched_itl(self, max_error_s: float) -> tuple[ItlSummary, float | None, bool | None]:
        """The ITL summary of the gaps whose own bound is within ``max_error_s``, that
        summary's bound (the largest kept), and whether it is *uncertain*: dropping the
        other gaps left too few for a jitter (:data:`JITTER_MIN_TOKEN_CHUNKS` chunks), in
        which case the summary and bound are of every gap as read. Without gaps or bounds:
        every gap, :attr:`gap_error_s` and ``None``."""
        gaps, errors = self.itl_gaps_s, self.itl_gap_errors_s
        if not gaps or len(errors) != len(gaps):
            return ItlSummary.of(gaps), self.gap_error_s, None
        kept = [
            (gap, error) for gap, error in zip(gaps, errors, strict=True) if error <= max_error_s
        ]
        if len(kept) < len(gaps) and len(kept) + 1 < JITTER_MIN_TOKEN_CHUNKS:
            return ItlSummary.of(gaps), self.gap_error_s, True
        return ItlSummary.of([g for g, _ in kept]), max(e for _, e in kept), False


_decode = json.JSONDecoder().decode
_NOT_JSON = ChunkInfo(is_json=False)
_DONE = ChunkInfo(is_done=True)
_TOKEN = ChunkInfo(token_bearing=True)
_PLAIN = ChunkInfo()


class StreamMeter:
    """Accumulates :class:`Measurements` from SSE data events of one streamed response."""

    def __init__(self, t0_s: float) -> None:
        self.t0_s = t0_s
        self.m = Measurements()
        self._first_token_s: float | None = None
        self._last_token_s: float | None = None
        self._last_late_s: float | None = None  # the last token chunk's read-delay bound
        self._tokens_counted = 0  # tokens attributed to chunks so far

    @property
    def first_token_seen(self) -> bool:
        return self._first_token_s is not None

    def on_data(self, data: bytes, now_s: float, late_s: float | None = None) -> ChunkInfo:
        """One data event arrived at ``now_s``; returns what kind of chunk it was.

        ``late_s`` bounds how long it may have waited for the reader (seconds) before
        ``now_s``; ``None`` when unknown."""
        m = self.m
        if m.ttfb_s is None:
            m.ttfb_s = now_s - self.t0_s
        if data == b"[DONE]":
            m.saw_done = True
            return _DONE
        try:
            obj = _decode(data.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            m.not_json_events += 1
            return _NOT_JSON
        if type(obj) is not dict:
            m.not_json_events += 1
            return _NOT_JSON
        return self._on_object(obj, now_s, late_s)

    def _on_object(self, obj: dict[str, Any], now_s: float, late_s: float | None) -> ChunkInfo:
        m = self.m
        choices = obj.get("choices")
        if "error" in obj and not choices:
            m.error_event = True
            return ChunkInfo(error=True)
        if m.response_model is None:
            model = obj.get("model")
            if isinstance(model, str):
                m.response_model = model[:200]
        tokens = 0
        if type(choices) is list:
            for choice in choices:
                if type(choice) is dict:
                    tokens += self._choice(choice)
        usage = obj.get("usage")
        continuous = self._usage(usage) if usage is not None else None
        if tokens:
            if continuous is not None and continuous > self._tokens_counted:
                tokens = continuous - self._tokens_counted  # cumulative usage is exact
            self._tokens_counted += tokens
            self._token_chunk(now_s, tokens, late_s)
            if late_s is not None and (m.gap_error_s is None or late_s > m.gap_error_s):
                m.gap_error_s = late_s
            return _TOKEN
        if isinstance(usage, dict) and not choices:
            return ChunkInfo(usage_only=True)
        return _PLAIN

    def _choice(self, choice: dict[str, Any]) -> int:
        reason = choice.get("finish_reason")
        if reason is not None and isinstance(reason, str):
            self.m.finish_reason = reason[:64]
        delta = choice.get("delta")
        if type(delta) is dict:
            bearing = bool(
                delta.get("content")
                or delta.get("reasoning_content")
                or delta.get("reasoning")
                or delta.get("tool_calls")
            )
        else:
            bearing = bool(choice.get("text"))
        if not bearing:
            return 0
        logprobs = choice.get("logprobs")
        if logprobs is not None and type(logprobs) is dict:
            content = logprobs.get("content") or logprobs.get("tokens")
            if isinstance(content, list) and content:
                return len(content)
        return 1

    def _usage(self, usage: Any) -> int | None:
        if not isinstance(usage, dict):
            return None
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(prompt, int) and not isinstance(prompt, bool) and prompt >= 0:
            self.m.prompt_tokens = prompt
        if isinstance(completion, int) and not isinstance(completion, bool) and completion >= 0:
            self.m.completion_tokens = completion
            return completion
        return None

    def _token_chunk(self, now_s: float, tokens: int, late_s: float | None = None) -> None:
        m = self.m
        if self._first_token_s is None:
            self._first_token_s = now_s
            m.ttft_s = now_s - self.t0_s
        else:
            assert self._last_token_s is not None
            m.itl_gaps_s.append(now_s - self._last_token_s)
            if late_s is not None and self._last_late_s is not None:
                m.itl_gap_errors_s.append(max(late_s, self._last_late_s))
        self._last_token_s = now_s
        self._last_late_s = late_s
        m.chunk_tokens.append(min(tokens, 32767))

    def finish(self, end_s: float | None) -> Measurements:
        """Close the measurement: ``end_s`` is when the last byte reached the client."""
        m = self.m
        if end_s is not None:
            m.e2e_s = end_s - self.t0_s
        if m.completion_tokens is not None:
            m.tokens_source = "usage"
        elif m.chunk_tokens:
            # No usage from this engine: every token chunk was seen, so count them.
            m.completion_tokens = m.tokens_seen
            m.tokens_source = "chunks"
        n = m.completion_tokens
        first, last = self._first_token_s, self._last_token_s
        if n is not None and n > 1 and first is not None and last is not None:
            m.tpot_s = (last - first) / (n - 1)
        return m


def parse_json_body(body: bytes) -> dict[str, Any] | None:
    """The request or response body as a JSON object, or ``None`` if it is not one."""
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return obj if isinstance(obj, dict) else None


def measure_json_response(body: bytes, t0_s: float) -> Measurements:
    """Measurements from a complete non-streamed response body (usage, finish reason)."""
    meter = StreamMeter(t0_s)
    obj = parse_json_body(body)
    if obj is not None and "error" not in obj:
        meter._usage(obj.get("usage"))
        for choice in obj.get("choices") or ():
            if isinstance(choice, dict) and isinstance(choice.get("finish_reason"), str):
                meter.m.finish_reason = choice["finish_reason"][:64]
        model = obj.get("model")
        if isinstance(model, str):
            meter.m.response_model = model[:200]
    return meter.m
