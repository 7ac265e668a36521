"""Latency: TTFT / TPOT / ITL / E2E percentile bands per pool or instance, their
distribution across instances, and goodput."""

from __future__ import annotations

import altair as alt
import streamlit as st

from dashboards.charts import band_chart, frame, line_chart
from dashboards.context import PageContext, fmt_seconds
from dashboards.views.common import no_data, page, page_incidents

__all__ = ["PAGE"]

_METRICS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}
#: DESIGN §4 defaults, drawn where they apply.
_TARGETS_S = {"ttft": (2.0, "TTFT p99 target 2 s"), "tpot": (0.08, "TPOT p99 target 80 ms")}


def _percentiles(ctx: PageContext, metric: str, by: str) -> None:
    f = ctx.filters
    table = ctx.table(
        "latency_percentiles",
        metric=metric,
        by=by,
        **f.request_scope(),
    )
    if table is None:
        return
    if table.num_rows == 0:
        no_data(
            f"no tap request record with a {_METRICS[metric]} in this range (the stream tap writes `requests`)."
        )
        return
    df = frame(table)
    key = "instance" if by == "instance" else "pool"
    target = _TARGETS_S.get(metric)
    cols = st.columns(4)
    cols[0].metric(
        f"{_METRICS[metric]} p50 (median bucket)", fmt_seconds(float(df["p50_s"].median()))
    )
    cols[1].metric(f"{_METRICS[metric]} p99 (worst bucket)", fmt_seconds(float(df["p99_s"].max())))
    cols[2].metric("max", fmt_seconds(float(df["max_s"].max())))
    cols[3].metric("samples", f"{int(df['samples'].sum()):,}")
    st.altair_chart(
        band_chart(
            df,
            low="p50_s",
            high="p99_s",
            mid="p90_s",
            color=key,
            y_title=f"{_METRICS[metric]} (s): p50–p99 band, p90 line",
            y_format=",.2f",
            thresholds=[target] if target else (),
            incidents=page_incidents(ctx),
        ),
        width="stretch",
    )
    st.caption(
        "Distribution across "
        + ("instances" if by == "instance" else "pools")
        + ": p99 of each bucket"
    )
    st.altair_chart(
        alt.Chart(df)
        .mark_boxplot(extent="min-max")
        .encode(
            x=alt.X("p99_s:Q", title=f"{_METRICS[metric]} p99 per bucket (s)"),
            y=alt.Y(f"{key}:N", title=None),
            color=alt.Color(f"{key}:N", legend=None),
        )
        .properties(height=max(70, 34 * df[key].nunique())),
        width="stretch",
    )


def _goodput(ctx: PageContext) -> None:
    f = ctx.filters
    st.subheader("Goodput")
    outcomes = ctx.table(
        "outcome_counts",
        **f.request_scope(),
    )
    if outcomes is None or outcomes.num_rows == 0:
        no_data("no tap request records in this range.")
        return
    df = frame(outcomes)
    ok = df[df["outcome"] == "ok"].groupby(["time", "pool"], as_index=False)["requests"].sum()
    ok["ok requests/s"] = ok["requests"] / (f.bucket_ms / 1000)
    st.altair_chart(
        line_chart(ok, "ok requests/s", y_title="completed ok requests/s", color="pool"),
        width="stretch",
    )
    st.caption(
        "Requests that ended ok per second; the goodput SLO (all latency targets met) is on the SLO page."
    )


def _body(ctx: PageContext) -> None:
    left, right = st.columns([3, 1])
    metric = left.radio(
        "Metric",
        list(_METRICS),
        format_func=_METRICS.__getitem__,
        horizontal=True,
        key="latency_metric",
    )
    by = right.radio(
        "Per",
        ["pool", "instance"],
        horizontal=True,
        key="latency_by",
        index=1 if ctx.filters.instance else 0,
    )
    _percentiles(ctx, str(metric), str(by))
    _goodput(ctx)


PAGE = page("Latency", _body)
