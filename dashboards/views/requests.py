"""Requests: outcomes, retries, ghosts per window with their evidence, disconnects; and,
apart from the users' requests, the entry points as the synthetic prober sees them."""

from __future__ import annotations

import altair as alt
import streamlit as st

from dashboards.charts import frame, line_chart, utc_time
from dashboards.context import PageContext, fmt_count, fmt_pct, fmt_seconds
from dashboards.views.common import no_data, page

__all__ = ["PAGE"]


def _outcomes(ctx: PageContext) -> None:
    f = ctx.filters
    table = ctx.table(
        "outcome_counts",
        **f.request_scope(),
    )
    if table is None:
        return
    if table.num_rows == 0:
        no_data("no tap request records in this range (the stream tap writes `requests`).")
        return
    df = frame(table)
    requests, attempts = int(df["requests"].sum()), int(df["attempts"].sum())
    bad = int(df.loc[df["outcome"] != "ok", "requests"].sum())
    cols = st.columns(4)
    cols[0].metric("client requests", fmt_count(requests))
    cols[1].metric("attempts", fmt_count(attempts))
    cols[2].metric(
        "retried attempts", fmt_pct((attempts - requests) / attempts if attempts else None)
    )
    cols[3].metric("not ok", fmt_pct(bad / requests if requests else None))
    per = df.groupby(["time", "outcome"], as_index=False)[["requests", "attempts"]].sum()
    st.subheader("Outcomes")
    # Bad outcomes are a percent of the traffic: stacked on their own so they stay visible.
    for title, rows in (
        ("ok requests / bucket", per[per["outcome"] == "ok"]),
        ("not ok / bucket", per[per["outcome"] != "ok"]),
    ):
        if rows.empty:
            continue
        rows, x, when = utc_time(rows)
        st.altair_chart(
            alt.Chart(rows)
            .mark_area(opacity=0.85, interpolate="step-after")
            .encode(
                x=x,
                y=alt.Y("requests:Q", title=title, stack=True),
                color=alt.Color("outcome:N", scale=alt.Scale(scheme="tableau10")),
                tooltip=[
                    when,
                    "outcome:N",
                    alt.Tooltip("requests:Q", format=","),
                    alt.Tooltip("attempts:Q", format=","),
                ],
            )
            .properties(height=180),
            width="stretch",
        )
    retries = df.groupby("time", as_index=False)[["requests", "attempts"]].sum()
    retries["retry share"] = (retries["attempts"] - retries["requests"]) / retries["attempts"]
    st.subheader("Retries")
    st.altair_chart(
        line_chart(retries, "retry share", y_title="retried attempts / attempts", y_format=".1%"),
        width="stretch",
    )


def _ghosts(ctx: PageContext) -> None:
    f = ctx.filters
    st.subheader("Disconnects and ghosts")
    table = ctx.table(
        "ghost_counts",
        **f.request_scope(),
    )
    if table is None:
        return
    if table.num_rows == 0:
        st.caption("No client disconnected in this range.")
        return
    df = frame(table)
    cols = st.columns(3)
    cols[0].metric("disconnects", fmt_count(df["disconnects"].sum()))
    cols[1].metric("ghosts (upstream kept > grace)", fmt_count(df["ghosts"].sum()))
    cols[2].metric("tokens after disconnect", fmt_count(df["tokens_after_disconnect"].sum()))
    long = df.melt(
        id_vars=["time", "instance"],
        value_vars=["disconnects", "ghosts"],
        var_name="kind",
        value_name="count",
    )
    long, x, when = utc_time(long)
    st.altair_chart(
        alt.Chart(long)
        .mark_bar()
        .encode(
            x=x,
            y=alt.Y("count:Q"),
            color="kind:N",
            xOffset="kind:N",
            tooltip=[
                "instance:N",
                "kind:N",
                "count:Q",
                when,
            ],
        )
        .properties(height=200),
        width="stretch",
    )
    evidence = ctx.table("findings", start_ms=f.start_ms, end_ms=f.end_ms, signal="ghost_requests")
    if evidence is not None and evidence.num_rows:
        st.caption("Engine-side evidence (running above the tap's in-flight):")
        st.dataframe(
            frame(evidence, "ts_ms")[["time", "state", "scope_id", "basis", "evidence_json"]],
            hide_index=True,
            width="stretch",
        )


def _probes(ctx: PageContext) -> None:
    """The prober's records (``source=probe``), counted nowhere else on the pages: whether
    the front door answers, per entry point. The instance filter names engines, not entry
    points, so only the pool filter applies."""
    f = ctx.filters
    st.subheader("Probes (entry points)")
    scope = {
        **f.series_scope(),
        "pool": f.pool,
        "by": "instance",
        "source": "probe",
    }
    outcomes = ctx.table("outcome_counts", **scope)
    if outcomes is None:
        return
    if outcomes.num_rows == 0:
        st.caption(
            "No probe records in this range (`llmslo probe`, or a `probe:` section of "
            "`llmslo run`, sends them through an entry point)."
        )
        return
    df = frame(outcomes).rename(columns={"instance": "entry point"})
    df["ok"] = df["attempts"].where(df["outcome"] == "ok", 0)
    per = df.groupby(["time", "entry point"], as_index=False)[["attempts", "ok"]].sum()
    per["ok share"] = per["ok"] / per["attempts"]
    ttft = ctx.table("latency_percentiles", metric="ttft", **scope)
    ttft_df = None
    if ttft is not None and ttft.num_rows:
        ttft_df = frame(ttft).rename(columns={"instance": "entry point"})
    rows = []
    for entry, group in per.groupby("entry point"):
        probes, ok = int(group["attempts"].sum()), int(group["ok"].sum())
        mine = None if ttft_df is None else ttft_df[ttft_df["entry point"] == entry]
        rows.append(
            {
                "entry point": entry,
                "probes": fmt_count(probes),
                "failed": fmt_count(probes - ok),
                "ok share": fmt_pct(ok / probes if probes else None),
                "TTFT p50 (median bucket)": fmt_seconds(
                    None if mine is None or mine.empty else float(mine["p50_s"].median())
                ),
                "TTFT p99 (worst bucket)": fmt_seconds(
                    None if mine is None or mine.empty else float(mine["p99_s"].max())
                ),
            }
        )
    st.dataframe(rows, hide_index=True, width="stretch")
    st.altair_chart(
        line_chart(
            per, "ok share", y_title="ok probes / probes", y_format=".0%", color="entry point"
        ),
        width="stretch",
    )


def _body(ctx: PageContext) -> None:
    _outcomes(ctx)
    _ghosts(ctx)
    _probes(ctx)


PAGE = page("Requests", _body)
