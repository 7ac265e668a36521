"""Canary: verdicts over time (which canary failed, when), then the verdict history with
per-metric results."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from dashboards.charts import time_tip, time_x
from dashboards.context import PageContext
from dashboards.views.common import no_data, page

__all__ = ["PAGE"]

_VERDICT_COLOURS = {"fail": "#d62728", "inconclusive": "#ff7f0e", "pass": "#2ca02c"}


def _timeline(df: pd.DataFrame) -> alt.Chart:
    """One point per verdict: when (UTC), which canary, coloured by the verdict."""
    return (
        alt.Chart(df)
        .mark_point(filled=True, size=120)
        .encode(
            x=time_x(),
            y=alt.Y("canary:N", title=None, axis=alt.Axis(labelLimit=260)),
            color=alt.Color(
                "verdict:N",
                scale=alt.Scale(
                    domain=list(_VERDICT_COLOURS), range=list(_VERDICT_COLOURS.values())
                ),
            ),
            tooltip=[
                time_tip(),
                "service:N",
                "canary:N",
                "baseline:N",
                "verdict:N",
                alt.Tooltip("score:Q", format=",.1f"),
                "reason:N",
            ],
        )
        .properties(height=max(80, 30 * df["canary"].nunique()))
    )


def _metric_rows(document: dict[str, Any] | None) -> pd.DataFrame:
    metrics = document.get("metrics") if document else None
    return pd.DataFrame(metrics if isinstance(metrics, list) else [])


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
    st.altair_chart(_timeline(df), width="stretch")
    st.dataframe(
        df[
            [
                "time",
                "verdict",
                "canary",
                "reason",
                "service",
                "baseline",
                "score",
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
