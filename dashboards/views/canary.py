"""Canary: which canary failed and when, in a picture first (each verdict as the window it
judged, coloured by its verdict), then the verdict history and per-metric results."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboards.charts import verdict_strip
from dashboards.context import PageContext
from dashboards.views.common import no_data, page

__all__ = ["PAGE"]


def _metric_rows(document: dict[str, Any] | None) -> pd.DataFrame:
    metrics = document.get("metrics") if document else None
    return pd.DataFrame(metrics if isinstance(metrics, list) else [])


def _verdict_strip(df: pd.DataFrame) -> None:
    """Each verdict as the window it judged, a row per service · canary."""
    st.subheader("Verdicts over time")
    spans = pd.DataFrame(
        {
            "canary": df["service"].astype(str) + " · " + df["canary"].astype(str),
            "start": pd.to_datetime(df["window_start_ts_ms"], unit="ms", utc=True),
            "end": pd.to_datetime(df["window_end_ts_ms"], unit="ms", utc=True),
            "verdict": df["verdict"],
            "reason": df["reason"].fillna(""),
        }
    )
    st.altair_chart(verdict_strip(spans), width="stretch")


def _body(ctx: PageContext) -> None:
    table = ctx.table("verdicts")
    if table is None:
        return
    df = table.to_pandas()
    if df.empty or "verdict" not in df:
        no_data(
            "no canary verdict has been computed (Argo Rollouts / Flagger call `/api/v1/verdict`)."
        )
        return
    df["time"] = pd.to_datetime(df["evaluated_ts_ms"], unit="ms", utc=True)
    counts = df["verdict"].value_counts()
    cols = st.columns(3)
    for col, name in zip(cols, ("pass", "fail", "inconclusive"), strict=True):
        col.metric(name, f"{int(counts.get(name, 0)):,}")
    _verdict_strip(df)
    st.dataframe(
        df[
            [
                "time",
                "service",
                "canary",
                "baseline",
                "verdict",
                "score",
                "reason",
                "canary_requests",
                "baseline_requests",
            ]
        ],
        hide_index=True,
        width="stretch",
    )
    choice = st.selectbox(
        "Per-metric results of",
        df["verdict_id"],
        format_func=lambda v: f"{v} ({df.loc[df['verdict_id'] == v, 'verdict'].iloc[0]})",
    )
    metrics = _metric_rows(ctx.verdict_document(str(choice)))
    if metrics.empty:
        st.caption("This verdict has no per-metric results.")
    else:
        st.dataframe(metrics, hide_index=True, width="stretch")


PAGE = page("Canary", _body)
