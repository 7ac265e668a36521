"""Durations in milliseconds, the unit of every ``*_ms`` timestamp and span in llmslo.

Written once here so a bucket, a window or a retention is never a literal to re-type.
"""

from __future__ import annotations

__all__ = ["DAY_MS", "HOUR_MS", "MINUTE_MS", "SECOND_MS", "ceil_to", "floor_to"]

SECOND_MS = 1_000
MINUTE_MS = 60 * SECOND_MS
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS


def floor_to(ts_ms: int, step_ms: int) -> int:
    """The start of the ``step_ms`` bucket holding ``ts_ms`` (epoch-aligned): 61_000, 60_000 → 60_000."""
    return ts_ms // step_ms * step_ms


def ceil_to(ts_ms: int, step_ms: int) -> int:
    """The first multiple of ``step_ms`` at or after ``ts_ms``: 61_000, 60_000 → 120_000."""
    return -(-ts_ms // step_ms) * step_ms
