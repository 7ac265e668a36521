"""The request contract (seeds, sequence S4): deadlines, retry policy and retry budget.

Retries happen only before the first token and only while the deadline, the attempt limit
and the retry budget all allow; the proxy enforces "before the first token" by holding the
response back until then (see :mod:`collectors.tap.proxy`).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["RetryBudget", "Upstream", "UpstreamPool", "parse_deadline_s"]


def parse_deadline_s(
    headers: Mapping[str, str],
    *,
    now_wall_s: float,
    deadline_header: str,
    timeout_header: str,
    default_timeout_s: float | None,
) -> tuple[float | None, str | None]:
    """The request's absolute deadline in Unix seconds, and a problem found (or ``None``).

    ``deadline_header`` holds an absolute Unix time in seconds or milliseconds (values
    above 10¹¹ are milliseconds); ``timeout_header`` a relative timeout in milliseconds.
    The earlier of the two wins; without either, ``default_timeout_s`` applies. Malformed
    values are ignored and reported as the second element (``bad_deadline_header``).
    """
    candidates: list[float] = []
    problem = None
    raw = headers.get(deadline_header)
    if raw is not None:
        value = _number(raw)
        if value is None:
            problem = "bad_deadline_header"
        else:
            candidates.append(value / 1000.0 if value > 1e11 else value)
    raw = headers.get(timeout_header)
    if raw is not None:
        value = _number(raw)
        if value is None:
            problem = "bad_deadline_header"
        else:
            candidates.append(now_wall_s + value / 1000.0)
    if not candidates and default_timeout_s is not None:
        candidates.append(now_wall_s + default_timeout_s)
    return (min(candidates) if candidates else None), problem


def _number(raw: str) -> float | None:
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    if value != value or value in (float("inf"), float("-inf")) or abs(value) > 1e15:
        return None
    return value


class RetryBudget:
    """Token bucket limiting retries to a fraction of traffic (Finagle-style).

    Every request deposits ``ratio`` tokens; every retry withdraws one; the bucket also
    refills at ``min_per_s`` tokens per second so a quiet tap can still retry. Capacity is
    bounded so a long quiet period cannot bank an unbounded retry storm. Times are seconds
    on the caller's monotonic clock.
    """

    def __init__(self, ratio: float, min_per_s: float, *, capacity: float = 100.0) -> None:
        self.ratio = ratio
        self.min_per_s = min_per_s
        self.capacity = capacity
        self._tokens = min(capacity, max(min_per_s, 1.0))
        self._last_s: float | None = None

    def _refill(self, now_s: float) -> None:
        if self._last_s is not None and now_s > self._last_s:
            self._tokens = min(
                self.capacity, self._tokens + (now_s - self._last_s) * self.min_per_s
            )
        self._last_s = now_s

    def deposit(self, now_s: float) -> None:
        """A new client request arrived."""
        self._refill(now_s)
        self._tokens = min(self.capacity, self._tokens + self.ratio)

    def try_withdraw(self, now_s: float) -> bool:
        """Take one retry from the budget; ``False`` when the budget is exhausted."""
        self._refill(now_s)
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


def _address(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


@dataclass(frozen=True)
class Upstream:
    """One engine endpoint: its base URL and its ``instance`` name (the configured name,
    else ``host:port``, as :func:`collectors.config.instance_name` has it)."""

    url: str
    instance: str

    @classmethod
    def from_url(cls, url: str, instance: str | None = None) -> Upstream:
        return cls(url.rstrip("/"), instance or _address(url))

    @property
    def address(self) -> str:
        """``host:port`` of the URL (the records' ``address`` column)."""
        return _address(self.url)


class UpstreamPool:
    """Round-robin over the configured upstreams; a retry prefers one not tried yet.

    ``instance`` names the only upstream (a sidecar tap); without it each goes by host:port.
    """

    def __init__(self, urls: list[str], instance: str | None = None) -> None:
        self.upstreams = [Upstream.from_url(url, instance) for url in urls]
        self._cycle = itertools.cycle(range(len(self.upstreams)))

    def pick(self, tried: set[str] | frozenset[str] = frozenset()) -> Upstream:
        """The next upstream in turn, skipping instances in ``tried`` while others remain."""
        for _ in range(len(self.upstreams)):
            candidate = self.upstreams[next(self._cycle)]
            if candidate.instance not in tried:
                return candidate
        return self.upstreams[next(self._cycle)]
