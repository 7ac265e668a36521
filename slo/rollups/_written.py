"""What a writer told a rollup it wrote (``note_written``), shared by both rollups.

Per raw table, the earliest event time (ms) of the rows written since the last update;
:data:`NO_CHANGE` when nothing was; ``None`` when anything may have changed (a full
settle-window recompute).
"""

from __future__ import annotations

__all__ = ["NO_CHANGE", "earliest"]

#: Nothing written since: a change time later than any event.
NO_CHANGE = 2**62


def earliest(known: int | None, new: int | None) -> int | None:
    """The earlier of two change times; ``None`` (anything changed) wins."""
    return None if known is None or new is None else min(known, new)
