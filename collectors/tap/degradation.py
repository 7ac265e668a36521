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

**Fail open.** A level is acted on only while two things are recent: the follower's last
*contact with the broker* (a poll and an offsets probe that succeeded, with or without
messages: the topic only carries changes, so silence is normal), and the SLO jobs' last
*heartbeat* on the topic (``jobs_heartbeat``, one per cycle that computed the flags). When
either is older than ``staleness_s`` (the heartbeat's bound is never under three jobs
intervals, ``pipeline.schema.heartbeat_bound_s``), or there never was one, every request
passes untouched, counted as ``fail_open``: a tap that cannot know the level, or whose
levels nobody maintains any more, must not keep shedding load on a level that may be long
gone (as Alertmanager lets an alert expire when its sender stops re-sending it). The
heartbeat's age is its wall-clock ``ts_ms`` against the tap's wall clock, taken once when
it arrives and carried on the monotonic clock from then on (heartbeats replayed from the
topic's start are as old as they say; clock skew between hosts adds to the age).
``llmslo_tap_flags_stale`` (1 while failing open, ``reason`` says why) and
``llmslo_tap_flags_stale_transitions_total`` count it, and each change is logged once;
levels apply again with the next heartbeat.
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

from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import BaseModel, ConfigDict, Field, field_validator

from pipeline.errors import LlmsloError
from pipeline.schema import heartbeat_bound_s

__all__ = [
    "DEGRADATION_HEADER",
    "ECONOMY_HEADER",
    "DegradationConfig",
    "Degrader",
    "Enforcement",
    "FlagFollower",
    "FlagPoll",
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
        description="without contact with the flags topic, or without a heartbeat of the SLO "
        "jobs on it, this long, fail open (no action); never under three jobs intervals",
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
    """Levels by ``(scope, scope_id)``, when the source was last heard and when the newest
    jobs heartbeat was sent (both monotonic s), and the jobs' interval it announced."""

    levels: Mapping[tuple[str, str], int] = field(default_factory=dict)
    heard_s: float | None = None
    beat_s: float | None = None
    interval_s: float | None = None

    def stale_reason(self, now_s: float, staleness_s: float) -> str | None:
        """Why the levels cannot be trusted at ``now_s`` (``no_contact``, ``no_heartbeat``,
        ``heartbeat_old``), or None."""
        if self.heard_s is None or now_s - self.heard_s > staleness_s:
            return "no_contact"
        if self.beat_s is None:
            return "no_heartbeat"
        if now_s - self.beat_s > heartbeat_bound_s(staleness_s, self.interval_s):
            return "heartbeat_old"
        return None

    def level(
        self, pool: str | None, instances: Iterable[str], now_s: float, staleness_s: float
    ) -> int | None:
        """The worst level of ``pool`` and ``instances``; ``None`` when stale (fail open)."""
        if self.stale_reason(now_s, staleness_s) is not None:
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


@dataclass(frozen=True)
class FlagPoll:
    """What one poll of the flags topic brought: transition rows (``scope``, ``scope_id``,
    ``to_level``, ``ts_ms``) and jobs heartbeat rows (``ts_ms`` wall clock, ``interval_s``)."""

    transitions: list[Mapping[str, Any]] = field(default_factory=list)
    heartbeats: list[Mapping[str, Any]] = field(default_factory=list)


class FlagSource(Protocol):
    """Where transitions and the jobs' heartbeats come from."""

    def poll(self, timeout_s: float) -> FlagPoll:
        """What arrived (maybe nothing); raises :class:`FlagSourceError` on an outage."""
        ...

    def close(self) -> None: ...


class _StaleMetrics:
    """``llmslo_tap_flags_stale{reason}`` and its transitions, on the tap's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.stale = Gauge(
            "llmslo_tap_flags_stale",
            "1 while the tap fails open because its flags are stale, by reason (no_contact: "
            "broker unreachable; no_heartbeat / heartbeat_old: the SLO jobs are silent)",
            ["reason"],
            registry=registry,
        )
        self.transitions = Counter(
            "llmslo_tap_flags_stale_transitions",
            "Times the tap's flags went stale (it failed open), by reason",
            ["reason"],
            registry=registry,
        )
        self.heartbeat_age = Gauge(
            "llmslo_tap_flags_heartbeat_age_seconds",
            "Age of the newest SLO jobs heartbeat the tap has seen (NaN: none yet)",
            registry=registry,
        )
        self.reasons = ("no_contact", "no_heartbeat", "heartbeat_old")
        for reason in self.reasons:
            self.stale.labels(reason).set(0)
        self.heartbeat_age.set(math.nan)


class FlagFollower:
    """Follows a :class:`FlagSource` on a daemon thread; :attr:`snapshot` is always current.

    ``clock`` is monotonic seconds, the same clock the :class:`Degrader` reads (the
    default is the tap's own, :func:`time.perf_counter`); ``wall_clock`` (Unix seconds)
    dates the heartbeats. ``staleness_s`` is the tap's bound (``tap.degradation``): after
    each poll the follower judges staleness, logs each change once and, with a
    ``registry``, exports it.
    """

    def __init__(
        self,
        source: FlagSource,
        *,
        clock: Callable[[], float] = time.perf_counter,
        wall_clock: Callable[[], float] = time.time,
        poll_s: float = 0.5,
        staleness_s: float = 60.0,
        registry: CollectorRegistry | None = None,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self.source = source
        self.snapshot = FlagSnapshot()
        self.staleness_s = staleness_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._poll_s = poll_s
        self._on_error = on_error
        self._metrics = _StaleMetrics(registry) if registry is not None else None
        self._latest: dict[tuple[str, str], tuple[int, int]] = {}  # key → (ts_ms, level)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llmslo-flag-follower", daemon=True)
        self._failing = False
        self._stale: str | None = None

    def start(self) -> FlagFollower:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.source.close()

    def current(self) -> FlagSnapshot:
        return self.snapshot

    def apply(self, poll: FlagPoll, heard_s: float, wall_s: float | None = None) -> None:
        """Fold a poll in (latest ``ts_ms`` wins per scope, the newest heartbeat counts) and
        publish a snapshot; ``wall_s`` is the wall clock at ``heard_s`` (default: now)."""
        latest = self._latest
        changed = False
        for row in poll.transitions:
            key = (str(row["scope"]), str(row["scope_id"]))
            ts_ms, level = int(row["ts_ms"]), int(row["to_level"])
            if key not in latest or ts_ms >= latest[key][0]:
                changed = changed or latest.get(key, (0, -1))[1] != level
                latest[key] = (ts_ms, level)
        levels = (
            {key: level for key, (_, level) in latest.items()} if changed else self.snapshot.levels
        )
        beat_s, interval_s = self.snapshot.beat_s, self.snapshot.interval_s
        if poll.heartbeats:
            wall = self._wall_clock() if wall_s is None else wall_s
            newest = max(poll.heartbeats, key=lambda row: int(row["ts_ms"]))
            # Its age now, on the monotonic clock from here on: never younger than "now".
            sent_s = heard_s - max(0.0, wall - int(newest["ts_ms"]) / 1000)
            if beat_s is None or sent_s > beat_s:
                interval = newest.get("interval_s")
                beat_s, interval_s = sent_s, None if interval is None else float(interval)
        self.snapshot = FlagSnapshot(levels, heard_s, beat_s, interval_s)  # atomic swap

    def judge(self, now_s: float) -> str | None:
        """Judge staleness at ``now_s``: log a change once, export it; returns the reason."""
        snapshot = self.snapshot
        reason = snapshot.stale_reason(now_s, self.staleness_s)
        if reason != self._stale:
            if reason is None:
                log.info("flags fresh again: enforcing levels (jobs heartbeat received)")
            else:
                log.warning(
                    "flags stale (%s): failing open, no level enforced until the SLO jobs' "
                    "heartbeat is back within %.0f s",
                    reason,
                    self.staleness_s,
                )
            if self._metrics is not None:
                for known in self._metrics.reasons:
                    self._metrics.stale.labels(known).set(1 if known == reason else 0)
                if reason is not None:
                    self._metrics.transitions.labels(reason).inc()
            self._stale = reason
        if self._metrics is not None and snapshot.beat_s is not None:
            self._metrics.heartbeat_age.set(now_s - snapshot.beat_s)
        return reason

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                poll = self.source.poll(self._poll_s)
            except FlagSourceError as exc:
                if not self._failing:
                    log.warning("flags topic unreachable, levels age from now: %s", exc)
                    self._failing = True
                if self._on_error is not None:
                    self._on_error()
                self.judge(self._clock())
                self._stop.wait(self._poll_s)
                continue
            if self._failing:
                log.info("flags topic reachable again")
                self._failing = False
            try:
                self.apply(poll, self._clock())
            except (KeyError, TypeError, ValueError):
                # A row the schema let through but that makes no level: skip the batch,
                # keep following (a dead thread would silently fail open forever).
                log.exception("flag transitions skipped")
            self.judge(self._clock())
