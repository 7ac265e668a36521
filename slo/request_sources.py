"""Who measured a request record, and the one SQL condition that reads each kind.

The ``requests`` table (:mod:`pipeline.schema`) holds the records of two sources, told
apart by its ``source`` column:

* ``tap`` — a stream tap's record (``source`` null): a user's request as the tap on the
  SSE path saw it. Everything that speaks of user traffic (SLIs, rollups, detectors,
  cohorts, the dashboards' request series) reads these only.
* ``probe`` — the synthetic prober's (``source = 'probe'``, ``llmslo probe``): a few
  requests a minute through an entry point, no user's, read only when asked for.

Every read of ``requests`` picks its records with :func:`source_filter`, so adding a
kind of record is a change here only: its ``source`` value in :data:`SOURCE_VALUES` (and
the literal of :data:`RequestSource`); the taps' reads leave it out from then on.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["REQUEST_SOURCES", "SOURCE_VALUES", "RequestSource", "source_filter"]

#: A kind of request record (the ``source`` parameter of the request reads).
RequestSource = Literal["tap", "probe"]
#: Every kind, the default (the taps', user traffic) first.
REQUEST_SOURCES: tuple[RequestSource, ...] = get_args(RequestSource)
#: The ``source`` column's value of each kind's records; ``None`` is null (the taps').
SOURCE_VALUES: dict[RequestSource, str | None] = {"tap": None, "probe": "probe"}


def source_filter(source: RequestSource = "tap", table: str | None = None) -> str:
    """SQL condition that keeps the ``requests`` rows of ``source``.

    ``table``: the alias of ``requests`` in the query (``retry`` for ``retry.source``),
    none for a bare ``source``. The taps' rows are all those of no other kind (a record
    written before ``source`` existed, or by a producer that never sets it, is a tap's).
    Raises ``KeyError`` for a ``source`` not in :data:`SOURCE_VALUES`.
    """
    column = f"{table}.source" if table else "source"
    value = SOURCE_VALUES[source]
    if value is not None:
        return f"{column} = '{value}'"
    others = [other for other in SOURCE_VALUES.values() if other is not None]
    return " AND ".join(f"{column} IS DISTINCT FROM '{other}'" for other in others) or "true"
