"""Engines: running/waiting, KV usage with the L1–L3 lines, preemptions, token throughput,
and stall / fragmentation markers."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards.charts import frame
from dashboards.context import PageContext
from dashboards.views.common import findings_table, no_data, page, page_incidents, titled_chart
from slo.signals.catalog import SIGNALS

__all__ = ["PAGE"]

_SIGNALS = ("running", "waiting", "kv_usage", "preemptions", "generation_tokens", "prompt_tokens")
#: KV usage above which each degradation level starts (DESIGN §3: free < 10 %, 5 %, 1 %).
_KV_LEVELS = [
    (0.90, "L1: KV free < 10 %"),
    (0.95, "L2: KV free < 5 %"),
    (0.99, "L3: KV free < 1 %"),
]
#: The findings this page marks: the signals whose catalog page is this one.
_MARKERS = tuple(name for name, row in SIGNALS.items() if row.page == "engines")


def _series(df: pd.DataFrame, signal: str) -> pd.DataFrame:
    one = df[df["signal"] == signal]
    return one.groupby(["time", "instance"], as_index=False)["value"].mean()


def _markers(ctx: PageContext) -> None:
    f = ctx.filters
    found = ctx.table("findings", start_ms=f.start_ms, end_ms=f.end_ms, limit=10_000)
    if found is None:
        return
    df = found.to_pandas()
    df = df[df["signal"].isin(_MARKERS)]
    st.subheader("Engine findings")
    if df.empty:
        st.caption(f"No {', '.join(_MARKERS).replace('_', ' ')} finding in this range.")
        return
    df["time"] = pd.to_datetime(df["ts_ms"], unit="ms", utc=True)
    findings_table(
        df, ["time", "state", "signal", "scope_id", "severity", "basis", "evidence_json"]
    )


def _body(ctx: PageContext) -> None:
    f = ctx.filters
    instances = [f.instance] if f.instance else None
    table = ctx.table(
        "engine_series",
        signals=list(_SIGNALS),
        **f.series_scope(),
        instances=instances,
        pool=f.pool,
    )
    if table is None:
        return
    if table.num_rows == 0:
        no_data("no engine samples in this range (the scrape collectors write `engine_samples`).")
        _markers(ctx)
        return
    df = frame(table)
    incidents = page_incidents(ctx)
    left, right = st.columns(2)
    with left:
        titled_chart(
            "Running requests",
            _series(df, "running"),
            y_title="running",
            color="instance",
            y_format=",.1f",
            incidents=incidents,
        )
    with right:
        titled_chart(
            "Waiting requests",
            _series(df, "waiting"),
            y_title="waiting",
            color="instance",
            y_format=",.1f",
            incidents=incidents,
        )
    titled_chart(
        "KV cache usage",
        _series(df, "kv_usage"),
        y_title="KV usage",
        color="instance",
        y_format=".0%",
        thresholds=_KV_LEVELS,
        incidents=incidents,
    )
    left, right = st.columns(2)
    with left:
        titled_chart(
            "Preemptions",
            _series(df, "preemptions"),
            y_title="preemptions/s",
            color="instance",
            y_format=",.3f",
            incidents=incidents,
        )
    with right:
        titled_chart(
            "Token throughput",
            _series(df, "generation_tokens"),
            y_title="generated tokens/s",
            color="instance",
            y_format=",.0f",
            incidents=incidents,
        )
    _markers(ctx)


PAGE = page("Engines", _body)
