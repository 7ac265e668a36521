"""What every page is handed: the source (cached), the URL filters and number formatting.

The source is named by the environment variable ``LLMSLO_DASHBOARD_SOURCE``: ``db:PATH``
(a DuckDB file nobody writes) or ``api:URL`` (a running ``llmslo run``); ``llmslo
dashboard`` sets it. Answers are cached with ``st.cache_data`` keyed by source, question,
range and filters, for ``CACHE_TTL_S`` seconds (so a live view refreshes and a page switch
does not re-query). A source or parameter error becomes a message on the page.

Streamlit renders the text of ``st.markdown``, ``st.caption``, ``st.info``/``st.warning``/
``st.error`` and metric labels as Markdown (links, images, ``:color[…]``, LaTeX), and
GitHub's autolinks turn any ``http://…``, ``www.…`` or ``a@b.c`` in it into a live link
whatever its escapes. So those carry only this package's own words; text from anywhere
else (a URL parameter, an exporter label, a client string, an error message quoting one)
is shown by :func:`notice` as plain text, or in a table or chart, which show text as it is.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import streamlit as st

from dashboards.filters import Filters, parse_filters
from dashboards.sources import (
    GPU_PODS_ENV,
    SOURCE_ENV,
    ApiSource,
    DataSource,
    DuckDBSource,
    Meta,
    SourceError,
)
from pipeline.errors import LlmsloError

__all__ = [
    "CACHE_TTL_S",
    "LIVE_WITHIN_MS",
    "SOURCE_ENV",
    "PageContext",
    "fmt_count",
    "fmt_pct",
    "fmt_seconds",
    "fmt_span",
    "notice",
    "open_source",
    "page_context",
    "window_seconds",
]

log = logging.getLogger(__name__)

CACHE_TTL_S = 20
#: Data newer than this (ms before now) means a pipeline is writing: pages auto-refresh.
LIVE_WITHIN_MS = 5 * 60_000
REFRESH_S = 30


@st.cache_resource(show_spinner=False)
def open_source(spec: str) -> DataSource:
    """The source named ``db:PATH`` or ``api:URL`` (one per server process); a file source
    joins GPUs to engines through ``LLMSLO_DASHBOARD_GPU_PODS`` (set by ``llmslo dashboard``)."""
    kind, _, where = spec.partition(":")
    if kind == "db" and where:
        return DuckDBSource(where, gpu_pods=_gpu_pods())
    if kind == "api" and where:
        return ApiSource(where)
    raise SourceError(f"{SOURCE_ENV}={spec!r}: expected db:PATH or api:URL")


def _gpu_pods() -> dict[str, str]:
    """``GPU_PODS_ENV`` as a mapping; a malformed value is refused naming the variable."""
    raw = os.environ.get(GPU_PODS_ENV, "")
    try:
        mapping = json.loads(raw) if raw else {}
    except json.JSONDecodeError as exc:
        raise SourceError(f"{GPU_PODS_ENV}: not JSON ({exc})") from exc
    if not isinstance(mapping, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()
    ):
        raise SourceError(f"{GPU_PODS_ENV}: expected a JSON object of pod → instance strings")
    return mapping


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def _cached_meta(spec: str) -> Meta:
    return open_source(spec).meta()


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=1024)
def _cached_table(spec: str, question: str, params_json: str) -> pa.Table:
    return open_source(spec).table(question, **json.loads(params_json))


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=256)
def _cached_verdict(spec: str, verdict_id: str) -> dict[str, Any] | None:
    return open_source(spec).verdict_document(verdict_id)


@dataclass
class PageContext:
    """One page run: the source, its meta, the filters, and whether data is arriving."""

    spec: str
    meta: Meta
    filters: Filters
    live: bool

    def table(self, question: str, **params: Any) -> pa.Table | None:
        """The cached answer, or ``None`` after showing why it could not be read."""
        clean = {k: v for k, v in params.items() if v is not None}
        try:
            return _cached_table(self.spec, question, json.dumps(clean, sort_keys=True))
        except LlmsloError as exc:
            log.warning("dashboard query %s %s failed: %s", question, clean, exc)
            notice(st.warning, f"Could not read {question.replace('_', ' ')}:", [str(exc)])
            return None

    def verdict_document(self, verdict_id: str) -> dict[str, Any] | None:
        """One stored verdict's document (cached), or ``None`` after showing why not."""
        try:
            return _cached_verdict(self.spec, verdict_id)
        except LlmsloError as exc:
            notice(st.warning, "Could not read the verdict:", [verdict_id, str(exc)])
            return None

    def instance_label(self, instance: str) -> str:
        """``instance`` with its host:port when targets carry an ``address``."""
        for row in self.meta.instances:
            if row.get("instance") == instance and row.get("address"):
                return f"{instance} ({row['address']})"
        return instance


def page_context() -> PageContext | None:
    """Open the source and read the filters; ``None`` after explaining what is missing."""
    spec = os.environ.get(SOURCE_ENV, "")
    if not spec:
        st.error(
            f"No data source: start with `llmslo dashboard --db FILE` or `--api URL` ({SOURCE_ENV})."
        )
        return None
    try:
        meta = _cached_meta(spec)
    except LlmsloError as exc:
        notice(st.error, "Cannot read the data source:", [str(exc)])
        return None
    now_ms = int(time.time() * 1000)
    query = {key: st.query_params.get(key, "") for key in st.query_params}
    filters, problems = parse_filters(
        query, meta.data_end_ms, now_ms, data_start_ms=meta.data_start_ms
    )
    if problems:
        notice(st.warning, "Some link parameters were not used:", problems)
    live = meta.data_end_ms is not None and now_ms - meta.data_end_ms < LIVE_WITHIN_MS
    return PageContext(spec=spec, meta=meta, filters=filters, live=live)


def notice(alert: Callable[[str], object], message: str, quoted: Sequence[str]) -> None:
    """``message`` (this package's own words) in an ``st.warning``/``st.error`` box, then
    the text it is about, one line each, as plain text (``st.text``: never Markdown)."""
    alert(message)
    st.text("\n".join(quoted))


_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def window_seconds(window: str) -> float:
    """A window name such as ``5m`` or ``30d`` in seconds (unknown forms sort last)."""
    try:
        return float(window[:-1]) * _UNIT_S[window[-1]]
    except (KeyError, ValueError, IndexError):
        return float("inf")


def fmt_pct(value: float | None, digits: int = 2) -> str:
    """A fraction as a percentage (``0.9953`` → ``99.53 %``); ``—`` when unknown."""
    if value is None or value != value:
        return "—"
    return f"{value * 100:.{digits}f} %"


def fmt_seconds(value: float | None) -> str:
    """Seconds in the unit a person reads: ``850 ms``, ``2.41 s``; ``—`` when unknown."""
    if value is None or value != value:
        return "—"
    if abs(value) < 1:
        return f"{value * 1000:,.0f} ms"
    return f"{value:,.2f} s"


def fmt_span(span_ms: int) -> str:
    """A span of time (ms) in the unit a person reads: ``5 s``, ``2.5 min``, ``23.5 h``, ``7 d``."""
    for unit_ms, unit in ((86_400_000, "d"), (3_600_000, "h"), (60_000, "min")):
        if span_ms >= unit_ms:
            return f"{round(span_ms / unit_ms, 1):g} {unit}"
    return f"{round(span_ms / 1000, 1):g} s"


def fmt_count(value: float | None) -> str:
    """A count with thousands separators; ``—`` when unknown."""
    if value is None or value != value:
        return "—"
    return f"{value:,.0f}"
