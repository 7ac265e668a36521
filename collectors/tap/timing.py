"""Whether one attempt's chunk times are the engine's, or partly the tap's own lateness.

Every upstream read has an arrival time: the kernel's receive stamp of its newest byte when
the connection is stamped (:mod:`collectors.tap.stamped`), else the moment the loop ran
the read. A token chunk's time is its read's arrival. That is exact (to the kernel's µs)
for a read that carried one token-bearing chunk, however late the loop was. It is not for

* **a burst**: several token-bearing chunks in one read. TCP merged the segments, the
  stamp is the newest one's, and the earlier chunks arrived at some unknown time since the
  previous read. If the read came less than ``bound_s`` after that stamp and no stall over
  ``bound_s`` overlaps the time since the previous read, the loop would have read an
  earlier chunk on its own within ``bound_s``: the error of each gap is at most ``bound_s``
  (an engine that really sent them together). Otherwise the attempt is uncertain;
* **an unstamped connection** (TLS, no ``SO_TIMESTAMPNS``): any recorded stall over
  ``bound_s`` between the first and the last token chunk makes it uncertain; without one,
  a gap's error is at most ``bound_s`` plus the loop monitor's interval (a stall shorter
  than that can slip between two samples).

:class:`TimingGuard` is told about each read (pure logic, no clock); :meth:`uncertain`
takes a ``stall_within(start_s, end_s)`` lookup (:meth:`LoopMonitor.stall_within`).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["TimingGuard"]

#: Burst reads remembered per attempt for the stall check; beyond, it is uncertain.
_BURSTS_KEPT = 64


class TimingGuard:
    """Per attempt: the reads that carried token chunks, and whether their times hold."""

    __slots__ = (
        "_arrival_s",
        "_bursts",
        "_chunks_before",
        "_first_token_s",
        "_last_read_s",
        "_last_token_s",
        "_previous_read_s",
        "_read_s",
        "bound_s",
        "max_lag_s",
        "reason",
        "stamped",
    )

    def __init__(self, bound_s: float, *, stamped: bool) -> None:
        self.bound_s = bound_s
        self.stamped = stamped
        self.max_lag_s = 0.0
        #: Why the attempt is uncertain (``burst`` or ``stall``); ``None`` while it is not.
        self.reason: str | None = None
        self._arrival_s: float | None = None
        self._read_s = 0.0  # when the current read was made (arrival + lag)
        self._previous_read_s: float | None = None
        self._last_read_s: float | None = None
        self._chunks_before = 0
        self._first_token_s: float | None = None
        self._last_token_s: float | None = None
        self._bursts: list[tuple[float, float]] = []

    def on_read(self, arrival_s: float, lag_s: float, token_chunks: int, before: int) -> None:
        """Bytes of the read that arrived at ``arrival_s`` (``lag_s`` before it was made)
        were measured: the attempt had ``before`` token chunks before them and
        ``token_chunks`` after. One read may be measured in several calls."""
        if arrival_s != self._arrival_s:  # a new read
            self._arrival_s = arrival_s
            self._previous_read_s = self._last_read_s
            self._read_s = self._last_read_s = arrival_s + lag_s
            self._chunks_before = before
            if lag_s > self.max_lag_s:
                self.max_lag_s = lag_s
        if token_chunks == before:
            return
        if self._first_token_s is None:
            self._first_token_s = arrival_s
        self._last_token_s = arrival_s
        if token_chunks - self._chunks_before < 2 or self.reason is not None:
            return
        # A burst: its earlier chunks came at some time since the previous read.
        if self._read_s - arrival_s > self.bound_s:
            self.reason = "burst"
            return
        since = self._previous_read_s
        if since is not None and self._read_s - since > self.bound_s:
            if self._bursts and self._bursts[-1][1] == self._read_s:
                return
            if len(self._bursts) >= _BURSTS_KEPT:
                self.reason = "burst"
                return
            self._bursts.append((since, self._read_s))

    def uncertain(self, stall_within: Callable[[float, float], float]) -> bool:
        """Decide (once the attempt ended) from the stalls the loop monitor recorded."""
        if self.reason is None:
            if self.stamped:
                if any(stall_within(a, b) > self.bound_s for a, b in self._bursts):
                    self.reason = "burst"
            elif (
                self._first_token_s is not None
                and self._last_token_s is not None
                and stall_within(self._first_token_s, self._last_token_s) > self.bound_s
            ):
                self.reason = "stall"
        return self.reason is not None
