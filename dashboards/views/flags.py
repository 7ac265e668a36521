"""Flags & findings: every instance's degradation level over the range in a picture first
(the Fleet page's strip), then the L0–L3 transitions of every scope with their evidence, and
the findings of the range."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards.charts import frame, step_chart
from dashboards.context import PageContext
from dashboards.views.common import findings_table, level_strip_section, no_data, page

__all__ = ["PAGE"]


def _timeline(ctx: PageContext) -> None:
    f = ctx.filters
    st.subheader("Level transitions")
    table = ctx.table(
        "flag_timeline", start_ms=f.start_ms, end_ms=f.end_ms, scope_id=f.instance, limit=10_000
    )
    if table is None:
        return
    df = frame(table, "ts_ms")
    if f.pool:
        df = df[df["pool"] == f.pool]
    if df.empty:
        no_data("no degradation-level transition in this range (every scope stayed at its level).")
        return
    df["scope_id"] = df["scope"] + " " + df["scope_id"].map(ctx.instance_label)
    # Each scope's line holds its last level to the end of the range.
    # and starts the range at the level it came from.
    ordered = df.sort_values("ts_ms")
    tail = ordered.groupby("scope_id", as_index=False).last()
    tail["time"] = pd.Timestamp(f.end_ms, unit="ms", tz="UTC")
    head = ordered.groupby("scope_id", as_index=False).first()
    head["to_level"], head["reason"] = head["from_level"], "before the range"
    head["time"] = pd.Timestamp(f.start_ms, unit="ms", tz="UTC")
    lines = pd.concat([head, df, tail])[["time", "scope_id", "to_level", "reason"]]
    st.altair_chart(
        step_chart(lines, y="to_level", y_title="level (L0–L3)", color="scope_id"),
        width="stretch",
    )
    shown = df.sort_values("ts_ms", ascending=False)
    shown["transition"] = (
        "L" + shown["from_level"].astype(str) + " → L" + shown["to_level"].astype(str)
    )
    st.dataframe(
        shown[["time", "scope_id", "transition", "reason", "evidence_json"]],
        hide_index=True,
        width="stretch",
    )


def _findings(ctx: PageContext) -> None:
    f = ctx.filters
    st.subheader("Findings")
    table = ctx.table(
        "findings", start_ms=f.start_ms, end_ms=f.end_ms, scope_id=f.instance, limit=10_000
    )
    if table is None:
        return
    df = frame(table, "ts_ms")
    if f.pool:
        df = df[df["pool"] == f.pool]
    if df.empty:
        st.caption("No finding started or ended in this range.")
        return
    columns = ["time", "state", "signal", "severity", "scope", "scope_id", "pool", "basis"]
    findings_table(df, [*columns, "evidence_json"])


def _body(ctx: PageContext) -> None:
    level_strip_section(ctx)
    _timeline(ctx)
    _findings(ctx)


PAGE = page("Flags & findings", _body)
