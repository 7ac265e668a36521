"""The filters every page shares, read from and written to the URL query string.

Deep links (an alert's ``generatorURL``): ``{dashboard}/slo?slo=<id>&pool=<pool>&
instance=<instance>&from=<ms>&to=<ms>``, every parameter optional, on any page. Without
``from``/``to`` the range is the last ``range`` (``1h`` … ``30d``, default ``24h``) of the
data, ending at its newest row, so a history file opens on its own days and not on an
empty "now". Every parameter is parsed and bounded here, before a page shows anything:
times are epoch milliseconds from 1970 to 2100 spanning at most ``MAX_SPAN_MS``, names
(``pool``, ``instance``, ``slo``) at most ``MAX_NAME_CHARS`` printable characters. A
parameter that does not parse or is out of bounds is ignored and reported (never a
traceback); the report quotes it through :func:`shown`, which pages still escape, because
a URL is anyone's to write.

Charts cut the range into buckets that fit the data (:func:`bucket_for`): the width follows
the span the data actually covers inside the range (:attr:`Filters.covered`, from the
source's meta), so two minutes of a demo under a 24-hour range draw 5-second buckets, not
one 15-minute dot. Series read from per-minute rollups never go below a minute
(:data:`ROLLUP_BUCKET_MS`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlencode

from pipeline.units import DAY_MS, HOUR_MS, MINUTE_MS, SECOND_MS

__all__ = [
    "MAX_NAME_CHARS",
    "MAX_SPAN_MS",
    "MAX_TIME_MS",
    "RANGES",
    "ROLLUP_BUCKET_MS",
    "Filters",
    "bucket_for",
    "deep_link",
    "parse_filters",
    "shown",
    "to_query",
]

#: Range choices offered in the sidebar, longest last.
RANGES: Mapping[str, int] = {
    "1h": HOUR_MS,
    "6h": 6 * HOUR_MS,
    "24h": DAY_MS,
    "7d": 7 * DAY_MS,
    "30d": 30 * DAY_MS,
}
DEFAULT_RANGE = "24h"
#: Bucket widths a chart may use, each with the most buckets it may cut a span into; the
#: narrowest width within its limit wins. Sub-minute widths are read from raw records (the
#: rollups are per minute), so they serve short spans only: at most 60 buckets, 30 minutes.
_BUCKETS_MS: tuple[tuple[int, int], ...] = (
    (5 * SECOND_MS, 60),
    (15 * SECOND_MS, 60),
    (30 * SECOND_MS, 60),
    (MINUTE_MS, 240),
    (5 * MINUTE_MS, 240),
    (15 * MINUTE_MS, 240),
    (HOUR_MS, 240),
    (3 * HOUR_MS, 240),
    (6 * HOUR_MS, 240),
    (DAY_MS, 240),
)
#: The narrowest bucket of a series read from per-minute rollups (``budget_series``).
ROLLUP_BUCKET_MS = MINUTE_MS
#: The latest time a link may name: 2100-01-01 UTC (pandas' datetimes end in 2262).
MAX_TIME_MS = 4_102_444_800_000
#: The longest explicit range: a year and a day (the presets end at 30 days).
MAX_SPAN_MS = 366 * DAY_MS
#: The longest pool, instance or SLO name a link may carry.
MAX_NAME_CHARS = 200
#: Epoch milliseconds as digits only (``int()`` would also take ``1_000`` or `` 7 ``).
_EPOCH_MS = re.compile(r"[0-9]{1,13}")
#: How much of a refused value a report quotes.
_SHOWN_CHARS = 60


@dataclass(frozen=True)
class Filters:
    """One view's range ``[start_ms, end_ms)`` (epoch ms), optional pool/instance/SLO, and
    the first and last time of the data (epoch ms, from the source's meta; ``None`` when
    unknown or empty)."""

    start_ms: int
    end_ms: int
    range_name: str | None = DEFAULT_RANGE
    pool: str | None = None
    instance: str | None = None
    slo: str | None = None
    data_start_ms: int | None = None
    data_end_ms: int | None = None

    @property
    def covered(self) -> tuple[int, int]:
        """``[start, end)`` (epoch ms) of the range narrowed to the data's first and last
        time; the whole range when the data's extent is unknown or lies outside it."""
        start, end = self.start_ms, self.end_ms
        if self.data_start_ms is not None:
            start = max(start, self.data_start_ms)
        if self.data_end_ms is not None:
            end = min(end, self.data_end_ms + 1)
        return (start, end) if start < end else (self.start_ms, self.end_ms)

    @property
    def bucket_ms(self) -> int:
        """Bucket width (ms) of a series read from raw records: :func:`bucket_for` the
        span the data covers in the range."""
        start, end = self.covered
        return bucket_for(end - start)

    @property
    def rollup_bucket_ms(self) -> int:
        """Bucket width (ms) of a series read from per-minute rollups: never below a minute."""
        start, end = self.covered
        return bucket_for(end - start, least_ms=ROLLUP_BUCKET_MS)

    def series_scope(self, *, rollup: bool = False) -> dict[str, int]:
        """``start_ms``, ``end_ms`` (the covered span) and ``bucket_ms`` as keyword parameters
        of a series query; ``rollup`` for one read from per-minute rollups."""
        start, end = self.covered
        bucket = self.rollup_bucket_ms if rollup else self.bucket_ms
        if rollup:  # a rollup row is stamped with its minute's start: take the minute the
            # data starts in, not the minute after it (never before the range itself)
            start = max(start // bucket * bucket, self.start_ms)
        return {"start_ms": start, "end_ms": end, "bucket_ms": bucket}

    def request_scope(self) -> dict[str, int | str | None]:
        """:meth:`series_scope`, pool and instance as keyword parameters of the request
        queries (``latency_percentiles``, ``outcome_counts``, ``ghost_counts``)."""
        return {**self.series_scope(), "pool": self.pool, "instance": self.instance}


def bucket_for(span_ms: int, *, least_ms: int = 0) -> int:
    """The narrowest bucket width (ms), at least ``least_ms``, that cuts ``span_ms`` into at
    most its limit of buckets: 60 for the sub-minute widths (5, 15, 30 s), 240 for the
    others (1, 5, 15 min; 1, 3, 6 h; 1 d, the widest, whatever the span)."""
    for bucket_ms, most in _BUCKETS_MS:
        if bucket_ms >= least_ms and span_ms <= bucket_ms * most:
            return bucket_ms
    return _BUCKETS_MS[-1][0]


def shown(raw: str) -> str:
    """``raw`` quoted for a report: at most 60 characters, control and format characters
    (newlines, bidi overrides) as escapes."""
    cut = raw if len(raw) <= _SHOWN_CHARS else raw[:_SHOWN_CHARS] + "…"
    return repr(cut)


def _time_param(query: Mapping[str, str], name: str, problems: list[str]) -> int | None:
    raw = query.get(name)
    if raw in (None, ""):
        return None
    text = str(raw)
    if not _EPOCH_MS.fullmatch(text):
        problems.append(
            f"{name}={shown(text)} is not epoch milliseconds; showing the default range"
        )
        return None
    value = int(text)
    if value > MAX_TIME_MS:
        problems.append(
            f"{name}={shown(text)} is after 2100-01-01 (epoch ms); showing the default range"
        )
        return None
    return value


def _name_param(query: Mapping[str, str], name: str, problems: list[str]) -> str | None:
    value = query.get(name)
    if value in (None, ""):
        return None
    text = str(value)
    if len(text) > MAX_NAME_CHARS:
        problems.append(f"{name}={shown(text)} is longer than {MAX_NAME_CHARS} characters; ignored")
        return None
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in text):
        problems.append(f"{name}={shown(text)} has control characters; ignored")
        return None
    return text


def parse_filters(
    query: Mapping[str, str],
    data_end_ms: int | None,
    now_ms: int,
    *,
    data_start_ms: int | None = None,
) -> tuple[Filters, list[str]]:
    """Filters from URL parameters (``from``, ``to``, ``range``, ``pool``, ``instance``,
    ``slo``) and the problems found in them (each ignored, in words for the page);
    ``data_start_ms``/``data_end_ms`` are the data's first and last time (the meta's)."""
    problems: list[str] = []
    start, end = _time_param(query, "from", problems), _time_param(query, "to", problems)
    if problems:  # half a range is not what the link meant: show the default one
        start = end = None
    range_name = query.get("range") or None
    if range_name is not None and range_name not in RANGES:
        problems.append(f"range={shown(range_name)} is not one of {', '.join(RANGES)}; ignored")
        range_name = None
    if start is not None and end is not None and start >= end:
        problems.append("from must be before to; showing the default range")
        start = end = None
    if start is not None and end is not None and end - start > MAX_SPAN_MS:
        problems.append("from–to spans more than 366 days; showing the default range")
        start = end = None
    anchor = data_end_ms if data_end_ms is not None else now_ms
    # The newest minute is partly filled: end past it so it is included.
    default_end = (anchor // MINUTE_MS + 1) * MINUTE_MS
    if start is None or end is None:
        span = RANGES[range_name or DEFAULT_RANGE]
        if end is None:
            end = default_end if start is None else start + span
        if start is None:
            start = max(0, end - span)
        range_name = range_name or DEFAULT_RANGE
        if query.get("from") or query.get("to"):
            range_name = None
    else:
        range_name = None
    return (
        Filters(
            start_ms=start,
            end_ms=end,
            range_name=range_name,
            pool=_name_param(query, "pool", problems),
            instance=_name_param(query, "instance", problems),
            slo=_name_param(query, "slo", problems),
            data_start_ms=data_start_ms,
            data_end_ms=data_end_ms,
        ),
        problems,
    )


def to_query(filters: Filters) -> dict[str, str]:
    """The URL parameters that reproduce ``filters`` (explicit range when not a preset)."""
    query: dict[str, str] = {}
    if filters.range_name is None:
        query["from"], query["to"] = str(filters.start_ms), str(filters.end_ms)
    elif filters.range_name != DEFAULT_RANGE:
        query["range"] = filters.range_name
    for name in ("slo", "pool", "instance"):
        value = getattr(filters, name)
        if value:
            query[name] = value
    return query


#: Page paths of the deep-link contract.
PAGE_PATHS = ("fleet", "slo", "latency", "engines", "gpus", "requests", "flags", "canary")


def deep_link(dashboard_url: str, page: str, **params: str | int | None) -> str:
    """``{dashboard_url}/{page}?slo=…&pool=…&instance=…&from=…&to=…`` (``from_ms``/``to_ms``
    keywords give ``from``/``to``; ``None`` values are left out). Raises ``ValueError`` for
    a page that is not in :data:`PAGE_PATHS`."""
    if page not in PAGE_PATHS:
        raise ValueError(f"page {page!r}: expected one of {', '.join(PAGE_PATHS)}")
    names = {"from_ms": "from", "to_ms": "to"}
    query = {names.get(k, k): str(v) for k, v in params.items() if v is not None}
    return f"{dashboard_url.rstrip('/')}/{page}" + (f"?{urlencode(query)}" if query else "")
