"""The Streamlit dashboards SREs browse: Fleet, SLO, Latency, Engines, GPUs, Requests,
Flags & findings and Canary pages over the SLO and raw tables.

Owns the data sources the pages read (:class:`DuckDBSource` for a file nobody writes,
:class:`ApiSource` for a running ``llmslo run``), the URL filters (deep links) and the
Altair charts. Floor 3: imports ``slo`` and ``pipeline``, reaches ``api`` over HTTP only.
``llmslo dashboard`` (in ``llmslo/``) runs :data:`APP_SCRIPT` with ``streamlit run``.
"""

from __future__ import annotations

from pathlib import Path

from dashboards.filters import Filters, parse_filters, to_query
from dashboards.sources import (
    SOURCE_ENV,
    ApiSource,
    DataSource,
    DuckDBSource,
    Meta,
    SourceError,
)

__all__ = [
    "APP_SCRIPT",
    "SOURCE_ENV",
    "ApiSource",
    "DataSource",
    "DuckDBSource",
    "Filters",
    "Meta",
    "SourceError",
    "parse_filters",
    "to_query",
]

#: The Streamlit script to run (``streamlit run APP_SCRIPT``).
APP_SCRIPT = Path(__file__).with_name("app.py")
