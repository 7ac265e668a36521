"""Error-budget maths on counts: pure functions, no I/O.

Everything is count-based (Σbad / Σtotal over a window, never an average of ratios) and an
empty window is *no evidence*, not NaN: its error ratio is ``None``, its burn rate 0 and it
leaves the whole budget.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WindowCounts", "budget_remaining", "burn_rate", "error_ratio", "pair_alerting"]


@dataclass(frozen=True)
class WindowCounts:
    """Good/total event counts over one window. ``+`` merges disjoint windows (associative)."""

    total: int = 0
    bad: int = 0

    def __add__(self, other: WindowCounts) -> WindowCounts:
        return WindowCounts(self.total + other.total, self.bad + other.bad)

    @property
    def good(self) -> int:
        return self.total - self.bad


def error_ratio(counts: WindowCounts) -> float | None:
    """Σbad / Σtotal, or ``None`` for a window without events."""
    return counts.bad / counts.total if counts.total > 0 else None


def burn_rate(counts: WindowCounts, objective: float) -> float:
    """How many times faster than allowed the budget burns: error ratio / (1 − objective).

    1.0 spends exactly the period's budget over the period; 0.0 for an empty window.
    """
    ratio = error_ratio(counts)
    return 0.0 if ratio is None else ratio / (1.0 - objective)


def budget_remaining(counts: WindowCounts, objective: float) -> float:
    """Share of the period's error budget left: 1 − bad / (total × (1 − objective)).

    1.0 when nothing was spent (or nothing happened); negative once overspent.
    """
    return 1.0 - burn_rate(counts, objective)


def pair_alerting(
    short: WindowCounts, long: WindowCounts, objective: float, factor: float, min_events: int = 0
) -> bool:
    """Workbook multi-window rule: both windows burn faster than ``factor``.

    The low-traffic guard (``min_events``) requires the long window to hold that many events.
    """
    if long.total < min_events:
        return False
    return burn_rate(short, objective) > factor and burn_rate(long, objective) > factor
