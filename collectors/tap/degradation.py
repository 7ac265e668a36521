"""Degradation flags that act: what the tap does to a request at L1–L3 (DESIGN §3, seeds).

The SLO jobs publish level *transitions* of pools and instances to the Kafka ``flags``
topic. :class:`FlagFollower` follows that topic on a thread of its own (off the event
loop) and replaces a small immutable :class:`FlagSnapshot` whenever something changes; the
hot path only reads that reference and does two dict lookups (:meth:`Degrader.enforce`).

Actions (the tap enforces them for its instances and its pool, at the worst level of
those scopes):

* **L1**: the request goes upstream with ``x-llmslo-degradation: L1`` (routers and engines
  that can turn off speculative decoding read it); any level ≥ 1 forwards its own
  ``L<n>``, and a client's own header of that name is never forwarded;
* **L2**: ``429`` with ``Retry-After`` for prompts over ``l2_max_prompt_tokens`` and for
  ``max_tokens`` over ``l2_max_tokens``; everything else passes (with the header);
* **L3**: attempts go to ``fallback_upstream`` (the small-model replica, its model name in
  ``fallback_model``) and the response carries ``x-llmslo-degraded: economy`` (the front
  end's banner); without a fallback, L2.

**Prompt size without a tokenizer.** The estimate is the request body's length in bytes
divided by ``bytes_per_token`` (4), which costs nothing per request (the body is already
in memory, nothing is parsed). For English prose and code BPE tokenizers (Llama 3, GPT-4
class) average 3–5 characters per token, so the estimate is within −25 %/+35 % of the real
count plus the JSON envelope (a few hundred bytes: negligible at 16K tokens). CJK text
sent as UTF-8 (3 bytes a character, ~1–1.5 characters a token) is *under*-estimated by up
to 2×; sent with ``\\uXXXX`` escapes (Python's ``json.dumps`` default) it is over-estimated
by ~1.5×. The threshold is a load-shedding policy, not a context limit, so that bound is
acceptable; set ``bytes_per_token`` lower for a CJK-heavy fleet.

**Fail open.** The follower records when it last *heard from the broker* (a poll and an
offsets probe that succeeded, with or without messages: the topic only carries changes, so
silence is normal). When that is older than ``staleness_s`` (or it never heard), every
request passes untouched, counted as ``fail_open``: a tap that cannot know the level must
not keep shedding load on a level that may be long gone.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pipeline.errors import LlmsloError

__all__ = [
    "DEGRADATION_HEADER",
    "ECONOMY_HEADER",
    "DegradationConfig",
    "Degrader",
    "Enforcement",
    "FlagFollower",
    "FlagSnapshot",
    "FlagSource",
    "FlagSourceError",
    "estimate_prompt_tokens",
    "with_model",
]

log = logging.getLogger(__name__)

#: Forwarded upstream at L1 and above (value ``L1``…``L3``).
DEGRADATION_HEADER = "x-llmslo-degradation"
#: Added to the client's response when an L3 request was served by the fallback upstream.
ECONOMY_HEADER = ("x-llmslo-degraded", "economy")


class DegradationConfig(BaseModel):
    """The ``tap.degradation`` section: follow the flags and act on them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    follow_flags: bool = Field(
        False, description="follow the Kafka flags topic and enforce L1–L3 (needs tap.kafka)"
    )
    staleness_s: float = Field(
        60.0,
        gt=0,
        description="without contact with the flags topic this long, fail open (no action)",
    )
    l2_max_prompt_tokens: int = Field(
        16_384, ge=1, description="L2: longer prompts (estimated) get 429 + Retry-After"
    )
    l2_max_tokens: int = Field(
        4096, ge=1, description="L2: requests asking for more max_tokens get 429 + Retry-After"
    )
    bytes_per_token: float = Field(
        4.0, gt=0, description="prompt tokens are estimated as body bytes / this"
    )
    retry_after_s: int = Field(30, ge=1, description="Retry-After of an L2 rejection, seconds")
    fallback_upstream: str | None = Field(
        None, description="L3: the small-model replica's base URL (none: L3 acts as L2)"
    )
    fallback_model: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="L3: the model name the fallback serves; the request's `model` is "
        "rewritten to it (engines answer 404 to a name they do not serve); none: unchanged",
    )

    @field_validator("fallback_upstream")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"fallback_upstream {value!r} must start with http:// or https://")
        return None if value is None else value.rstrip("/")


def with_model(body: bytes, model: str) -> bytes:
    """``body`` (a JSON object) with its ``model`` replaced; unchanged if it is not JSON."""
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body
    if not isinstance(parsed, dict):
        return body
    parsed["model"] = model
    return json.dumps(parsed, separators=(",", ":"), ensure_ascii=False).encode()


def estimate_prompt_tokens(body_bytes: int, bytes_per_token: float) -> int:
    """Prompt tokens estimated from the body's size (see the module docstring for the bound)."""
    return math.ceil(body_bytes / bytes_per_token)


@dataclass(frozen=True)
class FlagSnapshot:
    """Levels by ``(scope, scope_id)`` and when the source was last heard (monotonic s)."""

    levels: Mapping[tuple[str, str], int] = field(default_factory=dict)
    heard_s: float | None = None

    def level(
        self, pool: str | None, instances: Iterable[str], now_s: float, staleness_s: float
    ) -> int | None:
        """The worst level of ``pool`` and ``instances``; ``None`` when stale (fail open)."""
        if self.heard_s is None or now_s - self.heard_s > staleness_s:
            return None
        levels = self.levels
        if not levels:
            return 0
        worst = levels.get(("pool", pool), 0) if pool is not None else 0
        for instance in instances:
            worst = max(worst, levels.get(("instance", instance), 0))
        return worst


@dataclass(frozen=True)
class Enforcement:
    """What the tap does to one request: ``action`` is recorded as ``enforced_action``."""

    level: int | None
    action: str | None
    reject: bool = False
    fallback: bool = False


_PASS = Enforcement(0, None)
_FAIL_OPEN = Enforcement(None, "fail_open")


class Degrader:
    """Decides a request's :class:`Enforcement` from the follower's current snapshot."""

    def __init__(
        self,
        config: DegradationConfig,
        snapshot: Callable[[], FlagSnapshot],
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self._snapshot = snapshot
        self._clock = clock

    def enforce(
        self, pool: str | None, instances: Iterable[str], body_bytes: int, max_tokens: int | None
    ) -> Enforcement:
        """The action for a request of ``body_bytes`` asking for ``max_tokens`` (or None)."""
        cfg = self.config
        level = self._snapshot().level(pool, instances, self._clock(), cfg.staleness_s)
        if level is None:
            return _FAIL_OPEN
        if level == 0:
            return _PASS
        if level >= 3 and cfg.fallback_upstream is not None:
            return Enforcement(level, "fallback_upstream", fallback=True)
        if level >= 2:
            if estimate_prompt_tokens(body_bytes, cfg.bytes_per_token) > cfg.l2_max_prompt_tokens:
                return Enforcement(level, "rejected_long_prompt", reject=True)
            if max_tokens is not None and max_tokens > cfg.l2_max_tokens:
                return Enforcement(level, "rejected_max_tokens", reject=True)
        return Enforcement(level, "degradation_header")


class FlagSourceError(LlmsloError):
    """The flags source cannot be reached now (the follower retries; staleness grows)."""


class FlagSource(Protocol):
    """Where transitions come from: rows with ``scope``, ``scope_id``, ``to_level``, ``ts_ms``."""

    def poll(self, timeout_s: float) -> list[Mapping[str, Any]]:
        """New transition rows (maybe none); raises :class:`FlagSourceError` on an outage."""
        ...

    def close(self) -> None: ...


class FlagFollower:
    """Follows a :class:`FlagSource` on a daemon thread; :attr:`snapshot` is always current.

    ``clock`` is monotonic seconds, the same clock the :class:`Degrader` reads (the
    default is the tap's own, :func:`time.perf_counter`).
    """

    def __init__(
        self,
        source: FlagSource,
        *,
        clock: Callable[[], float] = time.perf_counter,
        poll_s: float = 0.5,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self.source = source
        self.snapshot = FlagSnapshot()
        self._clock = clock
        self._poll_s = poll_s
        self._on_error = on_error
        self._latest: dict[tuple[str, str], tuple[int, int]] = {}  # key → (ts_ms, level)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llmslo-flag-follower", daemon=True)
        self._failing = False

    def start(self) -> FlagFollower:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.source.close()

    def current(self) -> FlagSnapshot:
        return self.snapshot

    def apply(self, rows: Iterable[Mapping[str, Any]], heard_s: float) -> None:
        """Fold transition rows in (latest ``ts_ms`` wins per scope) and publish a snapshot."""
        latest = self._latest
        changed = False
        for row in rows:
            key = (str(row["scope"]), str(row["scope_id"]))
            ts_ms, level = int(row["ts_ms"]), int(row["to_level"])
            if key not in latest or ts_ms >= latest[key][0]:
                changed = changed or latest.get(key, (0, -1))[1] != level
                latest[key] = (ts_ms, level)
        levels = (
            {key: level for key, (_, level) in latest.items()} if changed else self.snapshot.levels
        )
        self.snapshot = FlagSnapshot(levels, heard_s)  # one reference swap: atomic

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                rows = self.source.poll(self._poll_s)
            except FlagSourceError as exc:
                if not self._failing:
                    log.warning("flags topic unreachable, levels age from now: %s", exc)
                    self._failing = True
                if self._on_error is not None:
                    self._on_error()
                self._stop.wait(self._poll_s)
                continue
            if self._failing:
                log.info("flags topic reachable again")
                self._failing = False
            try:
                self.apply(rows, self._clock())
            except (KeyError, TypeError, ValueError):
                # A row the schema let through but that makes no level: skip the batch,
                # keep following (a dead thread would silently fail open forever).
                log.exception("flag transitions skipped")
