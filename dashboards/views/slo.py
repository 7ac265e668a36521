"""SLO: budget burn-down, multi-window burn rates with the page/ticket thresholds, and the
bad events behind them (which outcome, which instances)."""

from __future__ import annotations

import json

import altair as alt
import pandas as pd
import streamlit as st

from dashboards.charts import frame, line_chart
from dashboards.context import PageContext, fmt_count, fmt_pct, notice, window_seconds
from dashboards.filters import shown
from dashboards.views.common import no_data, page, page_incidents
from pipeline.units import DAY_MS

__all__ = ["BAD_INSTANCES", "PAGE"]

#: Most instances the bad-events chart draws (those with the most bad requests): a fleet's
#: 256 bars in 200 px are neither readable nor cheap for the browser.
BAD_INSTANCES = 10


def _choose_slo(ctx: PageContext, status: pd.DataFrame) -> str | None:
    ids = sorted(status["slo_id"].unique())
    if not ids:
        return None
    wanted = ctx.filters.slo if ctx.filters.slo in ids else ids[0]
    if ctx.filters.slo and ctx.filters.slo not in ids:
        notice(
            st.warning,
            "The link's SLO is not in the data; showing the first one.",
            [f"slo={shown(ctx.filters.slo)}"],
        )
    chosen = st.selectbox("SLO", ids, index=ids.index(wanted), key="slo_choice")
    if chosen != ctx.filters.slo:
        st.query_params["slo"] = chosen
    return str(chosen)


def _group(ctx: PageContext) -> dict[str, str] | None:
    group = {k: v for k, v in (("pool", ctx.filters.pool), ("instance", ctx.filters.instance)) if v}
    return group or None


def _in_group(ctx: PageContext, rows: pd.DataFrame) -> pd.DataFrame:
    """The SLO's status rows of the pool/instance filter (all rows when it matches none:
    an SLO not grouped by instance still applies to every instance)."""
    wanted = _group(ctx) or {}
    groups = rows["group_json"].map(lambda g: json.loads(g or "{}"))
    keep = groups.map(lambda g: all(g.get(k, v) == v for k, v in wanted.items()))
    return rows[keep] if keep.any() else rows


def _burn_rates(rows: pd.DataFrame) -> None:
    """Burn rate per window of each group at the last evaluation, against the pair factors."""
    records, thresholds = [], {}
    for row in rows.itertuples():
        status = json.loads(row.status_json)
        group = ", ".join(f"{k}={v}" for k, v in sorted(status.get("group", {}).items())) or "all"
        for window, burn in status.get("burn_rates", {}).items():
            records.append({"window": window, "burn rate": burn, "group": group})
        thresholds.update(dict(_pair_thresholds(status)))
    if not records:
        return
    df = pd.DataFrame(records)
    bars = alt.Chart(df).mark_bar().encode(
        x=alt.X("window:N", sort=sorted(set(df["window"]), key=window_seconds), title="window"),
        xOffset="group:N",
        y=alt.Y("burn rate:Q", title="burn rate (× budget)"), color="group:N",
        tooltip=["group:N", "window:N", alt.Tooltip("burn rate:Q", format=",.2f")],
    )  # fmt: skip
    rules_df = pd.DataFrame([{"threshold": k, "value": v} for k, v in thresholds.items()])
    rules = (
        alt.Chart(rules_df)
        .mark_rule(strokeDash=[6, 4], color="#b22222")
        .encode(y="value:Q", tooltip=["threshold:N", "value:Q"])
    )
    st.altair_chart(alt.layer(bars, rules).properties(height=240), width="stretch")
    st.caption(
        "Dashed lines: the page and ticket thresholds of each window pair (burn-rate factor)."
    )


def _pair_thresholds(status: dict[str, object]) -> list[tuple[str, float]]:
    """(label, factor) of each alert window pair: the burn rate at which it fires."""
    pairs = status.get("pairs")
    return [
        (f"{p['id']} ×{p['factor']:g}", float(p["factor"]))
        for p in (pairs if isinstance(pairs, list) else [])
    ]


def _bad_events(ctx: PageContext) -> None:
    f = ctx.filters
    st.subheader("Bad events behind it")
    # Totals over the range: day buckets read the same requests as the page's buckets in a
    # fraction of the rows (256 instances × 240 buckets × outcomes were 200,000 rows).
    outcomes = ctx.table(
        "outcome_counts", by="instance", **{**f.request_scope(), "bucket_ms": DAY_MS}
    )
    if outcomes is None:
        return
    df = outcomes.to_pandas()
    bad = df[df["outcome"] != "ok"]
    if bad.empty:
        st.success("No request ended badly in this range.")
        return
    by_outcome = (
        bad.groupby("outcome", as_index=False)["requests"]
        .sum()
        .sort_values("requests", ascending=False)
    )
    per_instance = bad.groupby("instance")["requests"].sum().sort_values(ascending=False)
    worst = per_instance.head(BAD_INSTANCES)
    by_instance = bad[bad["instance"].isin(worst.index)]
    by_instance = by_instance.groupby(["instance", "outcome"], as_index=False)["requests"].sum()
    left, right = st.columns(2)
    left.altair_chart(
        alt.Chart(by_outcome)
        .mark_bar()
        .encode(
            x=alt.X("requests:Q", title="bad requests"),
            y=alt.Y("outcome:N", sort="-x"),
            tooltip=["outcome", alt.Tooltip("requests:Q", format=",")],
        )
        .properties(height=200),
        width="stretch",
    )
    right.altair_chart(
        alt.Chart(by_instance)
        .mark_bar()
        .encode(
            x=alt.X("requests:Q", title="bad requests"),
            y=alt.Y("instance:N", sort="-x"),
            color="outcome:N",
            tooltip=["instance", "outcome", alt.Tooltip("requests:Q", format=",")],
        )
        .properties(height=200),
        width="stretch",
    )
    rest = per_instance.iloc[BAD_INSTANCES:]
    if not rest.empty:
        right.caption(
            f"The {len(worst):,} instances with the most bad requests; {len(rest):,} more "
            f"instances had {fmt_count(rest.sum())} (pick one in the sidebar to see its own)."
        )


def _body(ctx: PageContext) -> None:
    f = ctx.filters
    status = ctx.table("slo_status")
    if status is None:
        return
    sdf = status.to_pandas()
    slo_id = _choose_slo(ctx, sdf)
    if slo_id is None:
        no_data(
            "no SLO has been evaluated yet (`slo_status_current` is empty): start the SLO jobs."
        )
        return
    rows = _in_group(ctx, sdf[sdf["slo_id"] == slo_id])
    first = rows.iloc[0]
    cols = st.columns(5)
    cols[0].metric("objective", fmt_pct(first["objective"], 3))
    cols[1].metric("SLI (period)", fmt_pct(rows["sli"].min(), 3))
    cols[2].metric("budget left", fmt_pct(rows["budget_remaining"].min(), 1))
    cols[3].metric("events", fmt_count(rows["events"].sum()))
    cols[4].metric("alert", "FIRING" if rows["alerting"].any() else "ok")
    budget = ctx.table(
        "budget_series",
        slo_id=slo_id,
        objective=float(first["objective"]),
        **f.series_scope(rollup=True),
        group=_group(ctx),
    )
    incidents = page_incidents(ctx)
    st.subheader("Error budget left, cumulative from the range start")
    if budget is None:
        return
    if budget.num_rows == 0:
        no_data(
            "no events of this SLO in this range (rollups `slo_minute`/`slo_hour` are empty here)."
        )
    else:
        df = frame(budget)
        st.altair_chart(
            line_chart(
                df,
                "budget_remaining",
                y_title="budget left",
                y_format=".0%",
                thresholds=[(0.0, "budget exhausted")],
                incidents=incidents,
            ),
            width="stretch",
        )
        st.subheader("Burn rate per bucket")
        st.altair_chart(
            line_chart(
                df,
                "burn_rate",
                y_title="burn rate (× budget)",
                thresholds=[(v, k) for k, v in _pair_thresholds(json.loads(first["status_json"]))],
                incidents=incidents,
            ),
            width="stretch",
        )
    st.subheader("Burn rate per window (last evaluation)")
    _burn_rates(rows)
    _bad_events(ctx)


PAGE = page("SLO", _body)
