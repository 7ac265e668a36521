"""Fleet: pictures first, then the tables behind them.

Above the fold the page answers what is wrong, where and since when: a burn-rate strip (SLO ×
time, each cell coloured by the highest alert window pair its burn rate reaches), request
rate and p99 TTFT per pool over the range, and the degradation level of every instance that
left L0. The tables follow (SLOs with their alert and budget first, instances by level,
open findings, what changed); a wide table scrolls inside its own frame.
"""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from dashboards.context import PageContext, fmt_count, fmt_pct, window_seconds
from dashboards.views.common import findings_table, instances_in_scope, no_data, page
from dashboards.views.fleet.pictures import pictures
from pipeline.units import HOUR_MS

__all__ = ["PAGE", "slo_rows"]

_LEVELS = {
    0: "L0 normal",
    1: "L1 no speculative decoding",
    2: "L2 long prompts refused",
    3: "L3 economy mode",
}


def slo_rows(status: pd.DataFrame) -> pd.DataFrame:
    """The SLO table: one row per SLO × group, numbers formatted with units; what an SRE
    reads first (SLO, group, alert, budget left) leads, the burn per window follows."""
    rows = []
    for row in status.itertuples():
        burns = json.loads(row.burn_rates_json or "{}")
        group = json.loads(row.group_json or "{}")
        rows.append(
            {
                "SLO": row.slo_id,
                "group": ", ".join(f"{k}={v}" for k, v in sorted(group.items())) or "all",
                "alert": "FIRING" if row.alerting else "ok",
                "budget left": fmt_pct(row.budget_remaining, 1),
                "SLI": fmt_pct(row.sli, 3),
                "objective": fmt_pct(row.objective, 3),
                **{f"burn {w}": f"{burns[w]:,.2f}×" for w in sorted(burns, key=window_seconds)},
                "events": fmt_count(row.events),
                "bad": fmt_count(row.bad),
            }
        )
    return pd.DataFrame(rows)


def _slos(ctx: PageContext) -> None:
    st.subheader("SLOs")
    status = ctx.table("slo_status")
    if status is None:
        return
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
    if df.empty:
        no_data(
            "no SLO has been evaluated: the SLO jobs (`llmslo run` or `llmslo jobs`) write `slo_status_current`."
        )
        return
    firing = int(df["alerting"].sum())
    cols = st.columns(4)
    cols[0].metric("SLO groups", f"{len(df):,}")
    cols[1].metric("alerting", f"{firing:,}")
    cols[2].metric("lowest budget left", fmt_pct(df["budget_remaining"].min(), 1))
    cols[3].metric(
        "last evaluation",
        f"{pd.Timestamp(int(df['ts_ms'].max()), unit='ms', tz='UTC'):%H:%M:%S} UTC",
    )
    table = slo_rows(df.sort_values(["alerting", "budget_remaining"], ascending=[False, True]))
    st.dataframe(table, hide_index=True, width="stretch")


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
    df["reason"] = df["reason"].fillna("no transition")
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


def _traffic(ctx: PageContext) -> None:
    """Client requests the taps saw in the view's last hour, and how many did not end ok:
    the first thing to check in an incident (is traffic flowing, is it failing)."""
    f = ctx.filters
    table = ctx.table(
        "outcome_counts",
        start_ms=f.end_ms - HOUR_MS,
        end_ms=f.end_ms,
        bucket_ms=HOUR_MS,
        pool=f.pool,
        instance=f.instance,
    )
    if table is None:
        return
    rows = table.to_pylist()
    total = sum(row["requests"] for row in rows)
    failed = sum(row["requests"] for row in rows if row["outcome"] != "ok")
    cols = st.columns(4)
    cols[0].metric("client requests (last hour)", fmt_count(total))
    cols[1].metric("not ok (last hour)", fmt_count(failed))


def _body(ctx: PageContext) -> None:
    _traffic(ctx)
    pictures(ctx)
    _slos(ctx)
    _levels(ctx)
    left, right = st.columns(2)
    with left:
        _findings(ctx)
    with right:
        _changes(ctx)


PAGE = page("Fleet", _body)
