"""Helpers every page uses: the sidebar filters, "no data yet", incidents, live refresh."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
import streamlit as st

from dashboards.charts import frame, incidents_frame, level_strip, line_chart
from dashboards.context import REFRESH_S, PageContext, fmt_span, page_context
from dashboards.filters import RANGES
from dashboards.timelines import level_spans
from slo.queries import FINDINGS_SCHEMA
from slo.signals.catalog import RUNBOOK_BASE_URL, runbook_url

__all__ = [
    "RUNBOOK_ENV",
    "findings_table",
    "instances_in_scope",
    "level_strip_section",
    "no_data",
    "page",
    "page_incidents",
    "parse_json_column",
    "titled_chart",
]

_ALL = "all"
#: Environment variable with the base URL of the runbooks the finding rows link to.
RUNBOOK_ENV = "LLMSLO_RUNBOOK_BASE_URL"


def findings_table(df: pd.DataFrame, columns: Sequence[str]) -> None:
    """Finding rows with a ``runbook`` link per row (``{base}/{signal}.md``, the base from
    ``LLMSLO_RUNBOOK_BASE_URL``, the alerts' default otherwise)."""
    base = os.environ.get(RUNBOOK_ENV) or RUNBOOK_BASE_URL
    shown = df[list(columns)].copy()
    shown["runbook"] = [runbook_url(base, signal) for signal in df["signal"]]
    st.dataframe(
        shown,
        hide_index=True,
        width="stretch",
        column_config={"runbook": st.column_config.LinkColumn("runbook", display_text="runbook")},
    )


def _set_param(name: str, key: str) -> None:
    value = st.session_state[key]
    if value in (None, _ALL, ""):
        st.query_params.pop(name, None)
    else:
        st.query_params[name] = value
    if name == "range":
        st.query_params.pop("from", None)
        st.query_params.pop("to", None)
    if name == "pool":
        st.query_params.pop("instance", None)


def _sidebar(ctx: PageContext) -> None:
    f, meta = ctx.filters, ctx.meta
    with st.sidebar:
        ranges = list(RANGES) if f.range_name else ["link", *RANGES]
        st.selectbox(
            "Time range",
            ranges,
            index=ranges.index(f.range_name or "link"),
            key="filter_range",
            on_change=_set_param,
            args=("range", "filter_range"),
            help="ending at the newest data; 'link' is the range the URL gave",
        )
        pools = [_ALL, *meta.pools] + ([f.pool] if f.pool and f.pool not in meta.pools else [])
        st.selectbox(
            "Pool", pools, index=pools.index(f.pool or _ALL), key="filter_pool",
            on_change=_set_param, args=("pool", "filter_pool"),
        )  # fmt: skip
        names = [i["instance"] for i in instances_in_scope(ctx)]
        if f.instance and f.instance not in names:
            names.append(f.instance)
        options = [_ALL, *[str(n) for n in names]]
        st.selectbox(
            "Instance", options, index=options.index(f.instance or _ALL), key="filter_instance",
            on_change=_set_param, args=("instance", "filter_instance"),
            format_func=lambda name: name if name == _ALL else ctx.instance_label(name),
        )  # fmt: skip
        st.caption(
            f"{pd.Timestamp(f.start_ms, unit='ms', tz='UTC'):%Y-%m-%d %H:%M} → "
            f"{pd.Timestamp(f.end_ms, unit='ms', tz='UTC'):%Y-%m-%d %H:%M} UTC · "
            + _buckets_caption(ctx)
            + (f" · live, refreshing every {REFRESH_S} s" if ctx.live else "")
        )


def _buckets_caption(ctx: PageContext) -> str:
    """``24h selected · data covers 2.5 min · buckets of 5 s (1 min from rollups)``: the
    span the data covers only where it is shorter than the range (by more than the newest,
    partly filled minute), the rollup width only where it differs."""
    f = ctx.filters
    selected_ms = f.end_ms - f.start_ms
    start_ms, end_ms = f.covered
    words = [f"{f.range_name or fmt_span(selected_ms)} selected"]
    if selected_ms - (end_ms - start_ms) > 60_000:
        words.append(f"data covers {fmt_span(end_ms - start_ms)}")
    buckets = f"buckets of {fmt_span(f.bucket_ms)}"
    if f.rollup_bucket_ms != f.bucket_ms:
        buckets += f" ({fmt_span(f.rollup_bucket_ms)} for SLO budgets, from per-minute rollups)"
    return " · ".join([*words, buckets])


def page(title: str, body: Callable[[PageContext], None]) -> Callable[[], None]:
    """A Streamlit page: title, sidebar filters, then ``body`` (re-run every 30 s while live)."""

    def run() -> None:
        st.title(title)
        ctx = page_context()
        if ctx is None:
            return
        _sidebar(ctx)
        if ctx.meta.data_end_ms is None:
            no_data(
                "The database has no engine samples and no request records. Start the "
                "pipeline (`llmslo run`) or generate history (`llmslo sim history`)."
            )
            return
        if ctx.live:

            @st.fragment(run_every=REFRESH_S)
            def live() -> None:
                fresh = page_context()
                body(fresh or ctx)

            live()
        else:
            body(ctx)

    run.__name__ = f"page_{title.lower().replace(' ', '_').replace('&', 'and')}"
    return run


def no_data(what: str) -> None:
    """The clear "no data yet" message, saying what is missing."""
    st.info(f"No data yet — {what}", icon=":material/hourglass_empty:")


def instances_in_scope(ctx: PageContext) -> list[dict[str, str | None]]:
    """Known instances, narrowed to the pool filter."""
    pool = ctx.filters.pool
    return [i for i in ctx.meta.instances if pool is None or i.get("pool") == pool]


def page_incidents(ctx: PageContext) -> pd.DataFrame:
    """Page-severity findings over the range as shaded intervals (empty when none)."""
    f = ctx.filters
    found = ctx.table("findings", start_ms=f.start_ms, end_ms=f.end_ms, limit=10_000)
    if found is None:
        found = FINDINGS_SCHEMA.empty_table()
    return incidents_frame(frame(found, "ts_ms"), f.end_ms)


def parse_json_column(values: pd.Series) -> pd.Series:
    """A JSON text column as dicts (unparseable text becomes ``{}``)."""

    def parse(text: object) -> dict[str, object]:
        try:
            value = json.loads(str(text))
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    return values.map(parse)


def titled_chart(title: str, df: pd.DataFrame, **chart: Any) -> None:
    """A subheader and, full width, :func:`~dashboards.charts.line_chart` of ``df["value"]``
    (``chart`` are its keyword options: ``y_title``, ``color``, ``y_format``, …)."""
    st.subheader(title)
    st.altair_chart(line_chart(df, "value", **chart), width="stretch")


def level_strip_section(ctx: PageContext) -> None:
    """Every instance's degradation level over the range (L0 when its flag never moved)."""
    st.subheader("Degradation level per instance")
    f = ctx.filters
    moves = ctx.table(
        "flag_timeline", start_ms=f.start_ms, end_ms=f.end_ms, scope="instance", limit=10_000
    )
    before = ctx.table("current_flags", scope="instance", at_ms=f.start_ms - 1)
    if moves is None or before is None:
        return
    names = [str(i["instance"]) for i in instances_in_scope(ctx)]
    rows = [r for r in moves.to_pylist() if _in_scope(ctx, r)]
    levels = {
        str(r["scope_id"]): int(r["to_level"]) for r in before.to_pylist() if _in_scope(ctx, r)
    }
    if f.instance:
        names = [n for n in names if n == f.instance]
    df = level_spans(rows, before=levels, instances=names, start_ms=f.start_ms, end_ms=f.end_ms)
    if df.empty:
        no_data("no instance has been observed and no degradation flag has been set.")
        return
    df["instance"] = df["instance"].map(ctx.instance_label)
    df["start"] = pd.to_datetime(df["start_ms"], unit="ms", utc=True)
    df["end"] = pd.to_datetime(df["end_ms"], unit="ms", utc=True)
    st.altair_chart(level_strip(df), width="stretch")


def _in_scope(ctx: PageContext, row: dict[str, object]) -> bool:
    f = ctx.filters
    return (f.pool is None or row["pool"] == f.pool) and (
        f.instance is None or row["scope_id"] == f.instance
    )
