"""Validation of :mod:`slo.queries` parameters: kinds, bounds, and the time grid.

Private to ``slo``. Every check raises :class:`pipeline.errors.QueryError` naming the
parameter; nothing here builds SQL text from a value (values are bound as parameters).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from pipeline.errors import QueryError
from pipeline.units import DAY_MS, MINUTE_MS, SECOND_MS

__all__ = [
    "MAX_LIMIT",
    "MAX_POINTS",
    "MAX_RANGE_MS",
    "MAX_TEXT_CHARS",
    "MAX_VALUES",
    "Grid",
    "check_choice",
    "check_fraction",
    "check_grid",
    "check_limit",
    "check_range",
    "check_seconds",
    "check_text",
    "check_texts",
    "check_ts_ms",
]

#: Longest time range one query may cover (a 30-day SLO period with room to compare).
MAX_RANGE_MS = 90 * DAY_MS
#: Most time buckets one series may have (a 30-day range at 10-minute resolution).
MAX_POINTS = 5_000
#: Most rows a listing (findings, flag transitions) may return.
MAX_LIMIT = 10_000
#: Longest identifier (SLO id, instance, signal name) accepted.
MAX_TEXT_CHARS = 256
#: Most values a list parameter (instances, signals) may hold.
MAX_VALUES = 256
#: Timestamps are Unix epoch ms between 1970 and 2286 (below 10**13).
_MAX_TS_MS = 10**13

ChoiceT = TypeVar("ChoiceT", bound=str)


@dataclass(frozen=True)
class Grid:
    """A validated ``[start_ms, end_ms)`` range cut into buckets of ``bucket_ms``
    (bucket starts are multiples of ``bucket_ms`` since the epoch)."""

    start_ms: int
    end_ms: int
    bucket_ms: int


def _int(parameter: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise QueryError(parameter, f"must be an integer, got {type(value).__name__}")
    return value


def check_ts_ms(parameter: str, value: object) -> int:
    """A Unix epoch timestamp in ms, ``0 <= value < 10**13``."""
    ts_ms = _int(parameter, value)
    if not 0 <= ts_ms < _MAX_TS_MS:
        raise QueryError(
            parameter, f"must be a Unix epoch time in ms in [0, {_MAX_TS_MS}), got {ts_ms}"
        )
    return ts_ms


def check_range(start_ms: object, end_ms: object) -> tuple[int, int]:
    """``start_ms < end_ms``, at most :data:`MAX_RANGE_MS` apart."""
    start, end = check_ts_ms("start_ms", start_ms), check_ts_ms("end_ms", end_ms)
    if end <= start:
        raise QueryError("end_ms", f"must be after start_ms ({start}), got {end}")
    if end - start > MAX_RANGE_MS:
        raise QueryError(
            "end_ms",
            f"the range may span at most {MAX_RANGE_MS // DAY_MS} days, got {(end - start) / DAY_MS:.1f}",
        )
    return start, end


def check_grid(
    start_ms: object, end_ms: object, bucket_ms: object, *, unit_ms: int = SECOND_MS
) -> Grid:
    """A range and a bucket width: a whole number of ``unit_ms`` (seconds, or minutes for
    a series read from per-minute rollups), at most :data:`MAX_POINTS` buckets."""
    start, end = check_range(start_ms, end_ms)
    bucket = _int("bucket_ms", bucket_ms)
    if bucket < unit_ms or bucket % unit_ms:
        unit = {SECOND_MS: "seconds", MINUTE_MS: "minutes"}.get(unit_ms, f"{unit_ms} ms")
        raise QueryError(
            "bucket_ms", f"must be a whole number of {unit} (>= {unit_ms}), got {bucket}"
        )
    points = (end - 1) // bucket - start // bucket + 1
    if points > MAX_POINTS:
        wider = math.ceil((end - start) / MAX_POINTS / unit_ms) * unit_ms
        raise QueryError(
            "bucket_ms",
            f"{points} buckets exceed {MAX_POINTS}: use at least {wider} ms for this range",
        )
    return Grid(start, end, bucket)


def check_limit(limit: object) -> int:
    """``1 <= limit <= MAX_LIMIT``."""
    value = _int("limit", limit)
    if not 1 <= value <= MAX_LIMIT:
        raise QueryError("limit", f"must be in [1, {MAX_LIMIT}], got {value}")
    return value


def check_fraction(parameter: str, value: object, *, low: float, high: float) -> float:
    """A finite number strictly between ``low`` and ``high``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise QueryError(parameter, f"must be a number, got {type(value).__name__}")
    number = float(value)
    if not (math.isfinite(number) and low < number < high):
        raise QueryError(parameter, f"must be in ({low}, {high}), got {value!r}")
    return number


def check_seconds(parameter: str, value: object, *, high: float) -> float:
    """A finite duration in seconds, ``0 <= value <= high``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise QueryError(parameter, f"must be a number of seconds, got {type(value).__name__}")
    seconds = float(value)
    if not (math.isfinite(seconds) and 0.0 <= seconds <= high):
        raise QueryError(parameter, f"must be in [0, {high}] seconds, got {value!r}")
    return seconds


def check_text(parameter: str, value: object) -> str:
    """A non-empty string of at most :data:`MAX_TEXT_CHARS` characters, without NUL."""
    if not isinstance(value, str):
        raise QueryError(parameter, f"must be a string, got {type(value).__name__}")
    if not value or len(value) > MAX_TEXT_CHARS or "\x00" in value:
        raise QueryError(parameter, f"must be 1 to {MAX_TEXT_CHARS} characters without NUL")
    return value


def check_texts(parameter: str, values: object) -> list[str]:
    """A non-empty list (or tuple) of at most :data:`MAX_VALUES` :func:`check_text` strings."""
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise QueryError(parameter, f"must be a list of strings, got {type(values).__name__}")
    if not 1 <= len(values) <= MAX_VALUES:
        raise QueryError(parameter, f"must hold 1 to {MAX_VALUES} values, got {len(values)}")
    return [check_text(parameter, value) for value in values]


def check_choice(parameter: str, value: object, choices: Sequence[ChoiceT]) -> ChoiceT:
    """One of ``choices``."""
    for choice in choices:
        if value == choice and isinstance(value, str):
            return choice
    raise QueryError(parameter, f"must be one of {', '.join(choices)}, got {value!r}")
