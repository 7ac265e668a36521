"""Fleet: what is wrong, where and since when, in pictures first — the alert state of every
SLO group over the range, request rate and p99 TTFT per pool, the degradation level of
every instance — then the tables behind them, one tab at a time (only the open tab is read
and sent): every SLO with budget and burn, instances by level, open findings, and what
changed in the last hour."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pandas as pd
import streamlit as st

from dashboards.charts import alert_strip, frame, line_chart
from dashboards.context import PageContext, fmt_count, fmt_pct, fmt_span, window_seconds
from dashboards.timelines import STRIP_ROWS, alert_detail
from dashboards.views.common import (
    findings_table,
    instances_in_scope,
    level_strip_section,
    no_data,
    page,
)
from pipeline.units import HOUR_MS
from slo.queries import MAX_RANGE_MS

__all__ = ["EVERY_GROUP_KEY", "PAGE", "TABLES_KEY", "TABLE_TABS", "slo_rows"]

#: Session key of the alert strip's "every group" switch (off: :data:`STRIP_ROWS` rows).
EVERY_GROUP_KEY = "fleet_every_group"
#: Session key of the detail tables' open tab (the tabs are :data:`TABLE_TABS`, below).
TABLES_KEY = "fleet_tables"

_LEVELS = {
    0: "L0 normal",
    1: "L1 no speculative decoding",
    2: "L2 long prompts refused",
    3: "L3 economy mode",
}


def slo_rows(status: pd.DataFrame) -> pd.DataFrame:
    """The SLO table: one row per SLO × group, numbers formatted with units; the columns an
    on-call reads first (SLO, group, budget left, alert) lead, then the burn rates."""
    rows = []
    for row in status.itertuples():
        burns = json.loads(row.burn_rates_json or "{}")
        group = json.loads(row.group_json or "{}")
        rows.append(
            {
                "SLO": row.slo_id,
                "group": _group_label(group),
                "budget left": fmt_pct(row.budget_remaining, 1),
                "alert": "FIRING" if row.alerting else "ok",
                **{f"burn {w}": f"{burns[w]:,.2f}×" for w in sorted(burns, key=window_seconds)},
                "objective": fmt_pct(row.objective, 3),
                "SLI": fmt_pct(row.sli, 3),
                "events": fmt_count(row.events),
                "bad": fmt_count(row.bad),
            }
        )
    return pd.DataFrame(rows)


def _group_label(group: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(group.items())) or "all"


def _slo_status(ctx: PageContext) -> pd.DataFrame | None:
    """``slo_status`` narrowed to the SLO, pool and instance filters (``None``: not read)."""
    status = ctx.table("slo_status")
    if status is None:
        return None
    df = status.to_pandas()
    if ctx.filters.slo:
        df = df[df["slo_id"] == ctx.filters.slo]
    if ctx.filters.pool or ctx.filters.instance:
        groups = df["group_json"].map(lambda g: json.loads(g or "{}"))
        keep = groups.map(
            lambda g: all(
                g.get(k) in (None, v)
                for k, v in (("pool", ctx.filters.pool), ("instance", ctx.filters.instance))
                if v
            )
        )
        df = df[keep]
    return df


def _summary(ctx: PageContext, status: pd.DataFrame | None) -> None:
    """One row of numbers: traffic in the view's last hour, SLOs alerting, budget left."""
    f = ctx.filters
    table = ctx.table(
        "outcome_counts",
        start_ms=f.end_ms - HOUR_MS,
        end_ms=f.end_ms,
        bucket_ms=HOUR_MS,
        pool=f.pool,
        instance=f.instance,
    )
    cols = st.columns(5)
    if table is not None:
        rows = table.to_pylist()
        total = sum(row["requests"] for row in rows)
        failed = sum(row["requests"] for row in rows if row["outcome"] != "ok")
        cols[0].metric("client requests (last hour)", fmt_count(total))
        cols[1].metric("not ok (last hour)", fmt_count(failed))
    if status is not None and not status.empty:
        cols[2].metric(
            "SLO groups alerting", f"{int(status['alerting'].sum()):,} of {len(status):,}"
        )
        cols[3].metric("lowest budget left", fmt_pct(status["budget_remaining"].min(), 1))
        cols[4].metric(
            "last evaluation",
            f"{pd.Timestamp(int(status['ts_ms'].max()), unit='ms', tz='UTC'):%H:%M} UTC",
        )


def _alert_strip(ctx: PageContext, status: pd.DataFrame | None) -> None:
    """Each SLO group's worst alert over the range, recomputed per bucket from the rollups
    for every group in one read (:func:`slo.queries.slo_alert_spans`), which folds the
    groups past :data:`~dashboards.timelines.STRIP_ROWS` into a row per SLO."""
    st.subheader("SLO alerts over time")
    if status is None:
        return
    if status.empty:
        no_data(
            "no SLO has been evaluated: the SLO jobs (`llmslo run` or `llmslo jobs`) write `slo_status_current`."
        )
        return
    every = bool(st.session_state.get(EVERY_GROUP_KEY, False))
    spans = ctx.table("slo_alert_spans", **_strip_scope(ctx, every=every))
    if spans is None:
        return
    if spans.num_rows:
        _draw_alert_strip(ctx, spans.to_pandas(), every=every)
    else:
        no_data("no SLO group with events in its rollups (`slo_minute`, `slo_hour`).")
    # An empty label value (records without that label): the jobs' status and the rollup
    # keys do not say the same thing then, so such groups are listed only.
    unlabelled = [
        f"{row.slo_id} · {_group_label(group)}"
        for row in status.itertuples()
        if not all((group := json.loads(row.group_json or "{}")).values())
    ]
    if unlabelled:
        st.caption("Not drawn (a group label without a value):")
        st.text("\n".join(unlabelled))


def _strip_scope(ctx: PageContext, *, every: bool) -> dict[str, Any]:
    """The span the data covers in the view's range, in whole minutes (its last
    ``MAX_RANGE_MS`` at most), with the SLO, pool and instance filters and the strip's row
    limit (none with ``every``)."""
    scope = ctx.filters.series_scope(rollup=True)
    bucket_ms = scope["bucket_ms"]
    earliest = -(-(scope["end_ms"] - MAX_RANGE_MS) // bucket_ms) * bucket_ms
    f = ctx.filters
    return {
        **scope,
        "start_ms": max(scope["start_ms"], earliest),
        "slo_id": f.slo,
        "pool": f.pool,
        "instance": f.instance,
        "most_rows": None if every else STRIP_ROWS,
    }


def _draw_alert_strip(ctx: PageContext, rows: pd.DataFrame, *, every: bool) -> None:
    """The spans (folded past :data:`~dashboards.timelines.STRIP_ROWS` groups unless
    ``every``) as a strip: tooltips written once per span, from its last bucket's burns;
    under it, how many groups share a row and the switch that draws each on its own."""
    own = rows["folded"] == 0
    df = pd.DataFrame(
        {
            "slo": [
                f"{slo_id} · {_group_label(json.loads(group))}"
                if not folded
                else f"{slo_id} · {folded:,} other group{'s' if folded > 1 else ''}"
                for slo_id, group, folded in zip(
                    rows["slo_id"], rows["group_json"], rows["folded"], strict=True
                )
            ],
            "start": pd.to_datetime(rows["start_ms"], unit="ms", utc=True),
            "end": pd.to_datetime(rows["end_ms"], unit="ms", utc=True),
            "state": rows["state"],
            "detail": [
                alert_detail(burns) if not folded else f"the worst of {folded:,} groups"
                for burns, folded in zip(rows["burns"], rows["folded"], strict=True)
            ],
        }
    )
    st.altair_chart(alert_strip(df), width="stretch")
    st.caption(
        "Each cell: the worst alert window pair over its burn-rate factor at the end of the "
        f"bucket ({fmt_span(ctx.filters.rollup_bucket_ms)}), recomputed from the SLO rollups "
        "(windows counted in whole buckets; the low-traffic guard is not applied)."
        f"{_folded_caption(rows)} The SLOs table below has the jobs' own last evaluation."
    )
    if every or not own.all():
        st.toggle(
            "Draw every SLO group on its own row",
            key=EVERY_GROUP_KEY,
            help=f"off: the {STRIP_ROWS} groups alerting at the range's end, then longest in "
            "page, then ticket, each on a row, the others one row per SLO",
        )


def _folded_caption(rows: pd.DataFrame) -> str:
    """What the strip's folded rows hide (empty when no row is folded): ``6 of 257 SLO
    groups have a row each: …; 251 more share one row per SLO (ttft: 251) …``."""
    folded = rows[rows["folded"] > 0].groupby("slo_id", sort=True)["folded"].first()
    if folded.empty:
        return ""
    own = rows.loc[rows["folded"] == 0, ["slo_id", "group_json"]].drop_duplicates()
    hidden = int(folded.sum())
    per_slo = ", ".join(f"{slo_id}: {count:,}" for slo_id, count in folded.items())
    return (
        f" {len(own):,} of {len(own) + hidden:,} SLO groups have a row each: those alerting "
        "at the range's end, then those longest in page, then in ticket. "
        f"{hidden:,} more share one row per SLO ({per_slo}) showing their worst state: "
        "switch on every group below, or pick an SLO, pool or instance in the sidebar, to "
        "see each one."
    )


def _pool_charts(ctx: PageContext) -> None:
    """Request rate and p99 TTFT per pool over the range, side by side."""
    f = ctx.filters
    left, right = st.columns(2)
    with left:
        st.subheader("Client requests/s by pool")
        outcomes = ctx.table("outcome_counts", by="pool", **f.request_scope())
        if outcomes is not None and outcomes.num_rows:
            df = frame(outcomes)
            df = df.groupby(["time", "bucket_ts_ms", "pool"], as_index=False)["requests"].sum()
            df["requests/s"] = df["requests"] / _covered_s(ctx, df["bucket_ts_ms"])
            st.altair_chart(
                line_chart(df, "requests/s", y_title="client requests/s", color="pool"),
                width="stretch",
            )
        elif outcomes is not None:
            no_data("no request records in this range (the taps write `requests`).")
    with right:
        st.subheader("p99 TTFT by pool")
        latency = ctx.table("latency_percentiles", metric="ttft", by="pool", **f.request_scope())
        if latency is not None and latency.num_rows:
            st.altair_chart(
                line_chart(frame(latency), "p99_s", y_title="p99 TTFT (s)", color="pool"),
                width="stretch",
            )
        elif latency is not None:
            no_data("no request with a first token in this range.")


def _covered_s(ctx: PageContext, bucket_ts_ms: pd.Series) -> pd.Series:
    """Seconds of each bucket that data can cover: the last bucket ends at the newest data,
    so a rate there is not read as a sudden drop."""
    f = ctx.filters
    last_ms = min(f.end_ms, (ctx.meta.data_end_ms or f.end_ms) + 1)
    ends = (bucket_ts_ms + f.bucket_ms).clip(upper=last_ms)
    return ((ends - bucket_ts_ms).clip(lower=1_000)) / 1000


def _slo_table(status: pd.DataFrame | None) -> None:
    st.subheader("SLOs")
    if status is None:
        return
    if status.empty:
        st.caption("No SLO group in this view.")
        return
    rows = slo_rows(status)
    st.dataframe(
        rows,
        hide_index=True,
        width="stretch",
        column_config={
            "SLO": st.column_config.TextColumn(pinned=True),
            "group": st.column_config.TextColumn(pinned=True),
        },
    )


def _levels(ctx: PageContext) -> None:
    """Every known instance by its current level: an instance whose flag never moved is at
    L0, so it counts as "L0 normal" (since ``—``) rather than not at all."""
    st.subheader("Instances by degradation level")
    flags = ctx.table("current_flags", scope="instance")
    if flags is None:
        return
    df = flags.to_pandas()
    if ctx.filters.pool:
        df = df[df["pool"] == ctx.filters.pool]
    flagged = set(df["scope_id"])
    never_moved = pd.DataFrame(
        [
            {"scope_id": i["instance"], "pool": i.get("pool"), "to_level": 0}
            for i in instances_in_scope(ctx)
            if i["instance"] not in flagged
        ]
    ).reindex(columns=df.columns)
    if df.empty:
        df = never_moved
    elif not never_moved.empty:
        df = pd.concat([df, never_moved], ignore_index=True)
    if df.empty:
        no_data("no instance has been observed and no degradation flag has been set.")
        return
    df["level"] = df["to_level"].map(lambda lvl: _LEVELS.get(int(lvl), f"L{lvl}"))
    df["since"] = pd.to_datetime(df["ts_ms"], unit="ms", utc=True)
    df["instance"] = df["scope_id"].map(ctx.instance_label)
    df["reason"] = df["reason"].astype(object).fillna("no transition")
    counts = df.groupby("level").size()
    cols = st.columns(len(_LEVELS))
    for col, name in zip(cols, _LEVELS.values(), strict=True):
        col.metric(name, f"{int(counts.get(name, 0)):,}")
    st.dataframe(
        df.sort_values(["to_level", "scope_id"], ascending=[False, True])[
            ["instance", "pool", "level", "since", "reason"]
        ],
        hide_index=True,
        width="stretch",
    )


def _findings(ctx: PageContext) -> None:
    st.subheader("Active findings")
    found = ctx.table("open_findings", at_ms=ctx.filters.end_ms - 1)
    if found is None:
        return
    df = found.to_pandas()
    if ctx.filters.pool:
        df = df[df["pool"] == ctx.filters.pool]
    if df.empty:
        st.success("No finding is firing.")
        return
    df["since"] = pd.to_datetime(df["ts_ms"], unit="ms", utc=True)
    findings_table(
        df, ["signal", "severity", "scope", "scope_id", "pool", "basis", "since", "evidence_json"]
    )


def _changes(ctx: PageContext) -> None:
    st.subheader("What changed in the last hour")
    end = ctx.filters.end_ms
    found = ctx.table("findings", start_ms=end - HOUR_MS, end_ms=end)
    flags = ctx.table("flag_timeline", start_ms=end - HOUR_MS, end_ms=end)
    rows = []
    for row in found.to_pylist() if found is not None else []:
        rows.append(
            {
                "time": row["ts_ms"],
                "what": f"{row['signal']} {row['state']}",
                "scope": row["scope_id"],
                "detail": row["basis"],
            }
        )
    for row in flags.to_pylist() if flags is not None else []:
        rows.append(
            {
                "time": row["ts_ms"],
                "what": f"L{row['from_level']} → L{row['to_level']}",
                "scope": row["scope_id"],
                "detail": row["reason"],
            }
        )
    if not rows:
        st.caption("Nothing changed: no finding started or ended and no flag moved.")
        return
    df = pd.DataFrame(rows).sort_values("time", ascending=False)
    df["time"] = pd.to_datetime(df["time"], unit="ms", utc=True)
    st.dataframe(df, hide_index=True, width="stretch")


#: The detail tables, one tab each, in order (the first is open on a new load): the tab's
#: label and what draws its table from the page's context and the SLO status.
_TABLES: tuple[tuple[str, Callable[[PageContext, pd.DataFrame | None], None]], ...] = (
    ("SLOs", lambda ctx, status: _slo_table(status)),
    ("Instances by level", lambda ctx, status: _levels(ctx)),
    ("Active findings", lambda ctx, status: _findings(ctx)),
    ("Changed in the last hour", lambda ctx, status: _changes(ctx)),
)
TABLE_TABS = tuple(label for label, _ in _TABLES)


def _tables(ctx: PageContext, status: pd.DataFrame | None) -> None:
    """The detail tables, one tab each: only the open tab's table is read and sent (a
    switch of tab runs the page again), so a load draws one table, not four."""
    tabs = st.tabs(TABLE_TABS, key=TABLES_KEY, on_change="rerun")
    for tab, (_, draw) in zip(tabs, _TABLES, strict=True):
        with tab:
            if tab.open is not False:
                draw(ctx, status)


def _body(ctx: PageContext) -> None:
    status = _slo_status(ctx)
    _summary(ctx, status)
    _alert_strip(ctx, status)
    _pool_charts(ctx)
    level_strip_section(ctx)
    _tables(ctx, status)


PAGE = page("Fleet", _body)
