"""The Fleet page's pictures: the burn-rate strip, request rate and p99 TTFT per pool, and
the degradation level of every instance over time.

Each reads one existing question (``slo_burn_series``, ``outcome_counts``,
``latency_percentiles``, ``flag_timeline`` / ``current_flags``) at the page's buckets; none
scans raw rows where the rollups answer. Times are clipped to the span the data covers in
the range, so 2 minutes of demo data in a 24-hour view fill the chart instead of a sliver.
"""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from dashboards.charts import BELOW_PAIRS, frame, level_chart, line_chart, strip_chart
from dashboards.context import PageContext
from dashboards.filters import bucket_label
from dashboards.views.common import instances_in_scope, page_incidents

__all__ = ["burn_cells", "level_intervals", "pictures"]

#: Most instances the level chart draws (the worst first); the rest are counted.
MAX_LEVEL_ROWS = 40


def _span(ctx: PageContext) -> tuple[int, int]:
    """The part of the range the data covers (the whole range when not known)."""
    grid = ctx.filters.grid()
    return grid["start_ms"], grid["end_ms"]


def _group(ctx: PageContext) -> dict[str, str] | None:
    group = {k: v for k, v in (("pool", ctx.filters.pool), ("instance", ctx.filters.instance)) if v}
    return group or None


def _pairs(status: pd.DataFrame) -> list[tuple[str, float, str]]:
    """(label, factor, severity) of every SLO's window pairs, highest factor first."""
    seen: dict[str, tuple[str, float, str]] = {}
    for text in status["status_json"]:
        pairs = json.loads(text or "{}").get("pairs")
        for pair in pairs if isinstance(pairs, list) else []:
            label = f"{pair['id']} ×{pair['factor']:g}"
            seen[label] = (label, float(pair["factor"]), str(pair.get("severity", "")))
    return sorted(seen.values(), key=lambda p: -p[1])


def burn_cells(burn: pd.DataFrame, status: pd.DataFrame, bucket_ms: int) -> pd.DataFrame:
    """One strip cell per SLO × bucket: ``pair`` is the highest window pair (of that SLO)
    whose factor the bucket's burn rate reaches, else :data:`BELOW_PAIRS`."""
    factors: dict[str, list[tuple[str, float]]] = {}
    for slo_id, text in zip(status["slo_id"], status["status_json"], strict=True):
        if slo_id in factors:
            continue
        pairs = json.loads(text or "{}").get("pairs")
        factors[slo_id] = sorted(
            ((f"{p['id']} ×{p['factor']:g}", float(p["factor"])) for p in pairs or []),
            key=lambda p: -p[1],
        )

    def highest(row: pd.Series) -> str:
        for label, factor in factors.get(row["slo_id"], []):
            if row["burn_rate"] >= factor:
                return label
        return BELOW_PAIRS

    cells = burn.copy()
    cells["pair"] = cells.apply(highest, axis=1) if not cells.empty else []
    cells["end"] = cells["time"] + pd.Timedelta(milliseconds=bucket_ms)
    return cells


def _strip(ctx: PageContext) -> None:
    f = ctx.filters
    st.subheader("SLO burn rate")
    status = ctx.table("slo_status")
    burn = ctx.table(
        "slo_burn_series",
        **f.grid(minutes=True),
        group=_group(ctx),
    )
    if status is None or burn is None:
        return
    sdf = status.to_pandas()
    bdf = frame(burn)
    if f.slo:
        bdf = bdf[bdf["slo_id"] == f.slo]
    if bdf.empty:
        st.caption("No SLO events in this range: the SLO jobs roll up `slo_minute`/`slo_hour`.")
        return
    pairs = _pairs(sdf)
    st.altair_chart(
        strip_chart(burn_cells(bdf, sdf, f.minute_bucket_ms), [(p[0], p[2]) for p in pairs]),
        width="stretch",
    )
    st.caption(
        f"Each cell: one SLO's burn rate over a {bucket_label(f.minute_bucket_ms)} bucket, "
        "coloured by the highest alert window pair whose burn-rate factor it reaches "
        "(reds page, oranges ticket). The Alert column below is the last evaluation's."
    )


def _traffic_charts(ctx: PageContext) -> None:
    f = ctx.filters
    left, right = st.columns(2)
    outcomes = ctx.table("outcome_counts", **f.request_scope())
    ttft = ctx.table("latency_percentiles", metric="ttft", **f.request_scope())
    incidents = page_incidents(ctx)
    with left:
        st.subheader("Request rate per pool")
        if outcomes is not None and outcomes.num_rows:
            df = frame(outcomes).groupby(["time", "pool"], as_index=False)["requests"].sum()
            df["requests/s"] = df["requests"] / (f.bucket_ms / 1000)
            st.altair_chart(
                line_chart(
                    df, "requests/s", y_title="client requests/s", color="pool", incidents=incidents
                ),
                width="stretch",
            )
        elif outcomes is not None:
            st.caption("No tap request record in this range.")
    with right:
        st.subheader("p99 TTFT per pool")
        if ttft is not None and ttft.num_rows:
            st.altair_chart(
                line_chart(
                    frame(ttft), "p99_s", y_title="TTFT p99 (s)", color="pool", incidents=incidents
                ),
                width="stretch",
            )
        elif ttft is not None:
            st.caption("No tap request record with a TTFT in this range.")


def level_intervals(
    before: pd.DataFrame, moves: pd.DataFrame, start_ms: int, end_ms: int
) -> pd.DataFrame:
    """Per instance, the intervals of ``[start_ms, end_ms)`` it held each level: from the
    level it had at ``start_ms`` (``before``: its last transition until then) through every
    transition in ``moves``. Only instances above L0 at some point; ``rank`` orders the
    worst (highest level reached, then longest above L0) first."""
    rows = []
    held = {r.scope_id: int(r.to_level) for r in before.itertuples()}
    reasons = {r.scope_id: str(r.reason) for r in before.itertuples()}
    by_instance: dict[str, list[tuple[int, int, str]]] = {}
    for r in moves.sort_values("ts_ms").itertuples():
        by_instance.setdefault(r.scope_id, []).append(
            (int(r.ts_ms), int(r.to_level), str(r.reason))
        )
    for instance in sorted(set(held) | set(by_instance)):
        level, reason, since = (
            held.get(instance, 0),
            reasons.get(instance, "before the range"),
            start_ms,
        )
        for ts_ms, to_level, why in by_instance.get(instance, []):
            ts_ms = min(max(ts_ms, start_ms), end_ms)
            if ts_ms > since:
                rows.append((instance, since, ts_ms, level, reason))
            level, reason, since = to_level, why, ts_ms
        if since < end_ms:
            rows.append((instance, since, end_ms, level, reason))
    df = pd.DataFrame(rows, columns=["instance", "start_ms", "end_ms", "to_level", "reason"])
    worst = (
        df.assign(above=(df["end_ms"] - df["start_ms"]) * (df["to_level"] > 0))
        .groupby("instance")
        .agg(peak=("to_level", "max"), above=("above", "sum"))
    )
    worst = worst[worst["peak"] > 0].sort_values(["peak", "above"], ascending=False)
    df = df[df["instance"].isin(worst.index)].copy()
    df["rank"] = df["instance"].map({name: i for i, name in enumerate(worst.index)})
    df["level"] = "L" + df["to_level"].astype(str)
    df["time"] = pd.to_datetime(df["start_ms"], unit="ms", utc=True)
    df["end"] = pd.to_datetime(df["end_ms"], unit="ms", utc=True)
    return df


def _levels(ctx: PageContext) -> None:
    f = ctx.filters
    st.subheader("Degradation level per instance")
    start, end = _span(ctx)
    before = ctx.table("current_flags", scope="instance", at_ms=start)
    moves = ctx.table("flag_timeline", start_ms=start, end_ms=end, scope="instance", limit=10_000)
    if before is None or moves is None:
        return
    bdf, mdf = before.to_pandas(), moves.to_pandas()
    if f.pool:
        bdf, mdf = bdf[bdf["pool"] == f.pool], mdf[mdf["pool"] == f.pool]
    if f.instance:
        bdf, mdf = bdf[bdf["scope_id"] == f.instance], mdf[mdf["scope_id"] == f.instance]
    df = level_intervals(bdf, mdf, start, end)
    known = len(instances_in_scope(ctx)) if not f.instance else 1
    moved = int(df["instance"].nunique())
    if not moved:
        st.caption(f"All {known:,} instance(s) held L0 (normal) throughout the range.")
        return
    shown = df[df["rank"] < MAX_LEVEL_ROWS].copy()
    shown["instance"] = shown["instance"].map(ctx.instance_label)
    st.altair_chart(level_chart(shown), width="stretch")
    rest = max(0, known - moved)
    more = (
        f"; {moved - MAX_LEVEL_ROWS:,} more left L0 (see the table)"
        if moved > MAX_LEVEL_ROWS
        else ""
    )
    st.caption(
        f"{moved:,} instance(s) left L0 in the range, worst first{more}; "
        f"{rest:,} other(s) held L0 (normal) throughout."
    )


def pictures(ctx: PageContext) -> None:
    """The Fleet page's charts, in the order an on-call engineer reads them."""
    _strip(ctx)
    _traffic_charts(ctx)
    _levels(ctx)
