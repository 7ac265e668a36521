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
    "Filters",
    "bucket_for",
    "bucket_label",
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
#: Bucket widths a chart may use; the narrowest giving at most ``_MAX_BUCKETS`` points wins.
#: Sub-minute widths only for data spans of at most ``_SUB_MINUTE_SPAN_MS`` (a demo, a
#: drill): they read raw records, where the rollups serve minutes and hours.
_SUB_MINUTE_MS = (5 * SECOND_MS, 10 * SECOND_MS, 15 * SECOND_MS, 30 * SECOND_MS)
_SUB_MINUTE_SPAN_MS = 30 * MINUTE_MS
_BUCKETS_MS = (
    MINUTE_MS,
    5 * MINUTE_MS,
    15 * MINUTE_MS,
    HOUR_MS,
    3 * HOUR_MS,
    6 * HOUR_MS,
    DAY_MS,
)
_MAX_BUCKETS = 240
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
    """One view's range ``[start_ms, end_ms)`` (epoch ms) and optional pool/instance/SLO.

    ``data_start_ms``/``data_end_ms`` are the data's first and last times (``None``: not
    known). Where the data covers less of the range, the charts' grid (:meth:`grid`) spans
    only what it covers and buckets follow that span: 2 minutes of demo data in a 24-hour
    view are drawn in 5-second buckets, not as one 15-minute dot.
    """

    start_ms: int
    end_ms: int
    range_name: str | None = DEFAULT_RANGE
    pool: str | None = None
    instance: str | None = None
    slo: str | None = None
    data_start_ms: int | None = None
    data_end_ms: int | None = None

    def _covered(self) -> tuple[int, int]:
        """The part of the range the data covers; the whole range when that is unknown or
        empty (an empty view must not ask for 5-second buckets over 30 days)."""
        if self.data_start_ms is None or self.data_end_ms is None:
            return self.start_ms, self.end_ms
        start = max(self.start_ms, self.data_start_ms)
        end = min(self.end_ms, self.data_end_ms + 1)
        return (start, end) if start < end else (self.start_ms, self.end_ms)

    @property
    def span_ms(self) -> int:
        """What the buckets divide: the data's span in the range when shorter than it."""
        start, end = self._covered()
        return end - start

    @property
    def bucket_ms(self) -> int:
        """Chart bucket width for the data's span in this range (≤ 240 buckets)."""
        return bucket_for(self.span_ms)

    @property
    def minute_bucket_ms(self) -> int:
        """:attr:`bucket_ms`, at least a minute: the SLO rollups' grain (``slo_minute``)."""
        return max(MINUTE_MS, self.bucket_ms)

    def grid(self, *, minutes: bool = False) -> dict[str, int]:
        """``start_ms``, ``end_ms`` and ``bucket_ms`` of a chart's query: the covered span
        (its start on a bucket boundary) in :attr:`bucket_ms`, or :attr:`minute_bucket_ms`
        with ``minutes`` (reads of the SLO rollups)."""
        bucket = self.minute_bucket_ms if minutes else self.bucket_ms
        start, end = self._covered()
        if (start, end) != (self.start_ms, self.end_ms):
            start = max(self.start_ms, start // bucket * bucket)
        return {"start_ms": start, "end_ms": end, "bucket_ms": bucket}

    def request_scope(self) -> dict[str, int | str | None]:
        """The range, bucket, pool and instance as keyword parameters of the request queries
        (``latency_percentiles``, ``outcome_counts``, ``ghost_counts``)."""
        return {
            **self.grid(),
            "pool": self.pool,
            "instance": self.instance,
        }


def bucket_for(span_ms: int) -> int:
    """The narrowest bucket width (ms) that splits ``span_ms`` into at most 240 buckets:
    5 to 30 seconds for a span of at most 30 minutes, whole minutes above."""
    widths = (*_SUB_MINUTE_MS, *_BUCKETS_MS) if span_ms <= _SUB_MINUTE_SPAN_MS else _BUCKETS_MS
    for bucket_ms in widths:
        if span_ms <= bucket_ms * _MAX_BUCKETS:
            return bucket_ms
    return _BUCKETS_MS[-1]


def bucket_label(bucket_ms: int) -> str:
    """A bucket width as a person says it: ``5 s``, ``15 min``, ``3 h``, ``1 d``."""
    for unit_ms, unit in ((DAY_MS, "d"), (HOUR_MS, "h"), (MINUTE_MS, "min")):
        if bucket_ms >= unit_ms and bucket_ms % unit_ms == 0:
            return f"{bucket_ms // unit_ms:,} {unit}"
    return f"{bucket_ms / SECOND_MS:g} s"


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
    data_start_ms: int | None = None,
) -> tuple[Filters, list[str]]:
    """Filters from URL parameters (``from``, ``to``, ``range``, ``pool``, ``instance``,
    ``slo``) and the problems found in them (each ignored, in words for the page).
    ``data_start_ms`` and ``data_end_ms`` are kept for :meth:`Filters.grid`."""
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
