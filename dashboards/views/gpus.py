"""GPUs: utilisation, frame buffer, temperature and power, and XID events, per GPU, each
named by the engine instance it serves (the instance and pool filters narrow to its GPUs)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards.charts import frame
from dashboards.context import PageContext
from dashboards.views.common import no_data, page, page_incidents, titled_chart

__all__ = ["PAGE"]

_SIGNALS = ("gpu_util", "fb_used_mib", "fb_free_mib", "temperature_c", "power_w", "xid")


def _series(df: pd.DataFrame, signal: str, column: str = "value") -> pd.DataFrame:
    one = df[df["signal"] == signal]
    return one[["time", "gpu_name", column]].rename(columns={column: "value", "gpu_name": "gpu"})


def _named(df: pd.DataFrame) -> pd.DataFrame:
    """Each GPU named by the engine it serves, then its node and index: ``pod-1 · node-0/GPU 1``."""
    named = df.copy()
    engine = named["instance"].fillna("unallocated").astype(str)
    node = named["hostname"].fillna(named["exporter"]).astype(str)
    named["gpu_name"] = engine + " · " + node + "/GPU " + named["gpu"].astype(str)
    return named


def _inventory(df: pd.DataFrame) -> None:
    """Which GPU serves which engine, and where its exporter answers (host:port)."""
    columns = ["instance", "pool", "hostname", "gpu", "uuid", "exporter", "address"]
    gpus = df[columns].drop_duplicates().sort_values(["instance", "hostname", "gpu"])
    with st.expander(f"{len(gpus)} GPU(s): engine, node, index, UUID and exporter"):
        st.dataframe(gpus.rename(columns={"instance": "engine"}), hide_index=True, width="stretch")


def _body(ctx: PageContext) -> None:
    f = ctx.filters
    table = ctx.table(
        "gpu_series",
        signals=list(_SIGNALS),
        **f.series_scope(),
        instances=[f.instance] if f.instance else None,
        pool=f.pool,
    )
    if table is None:
        return
    if table.num_rows == 0:
        narrowed = " of this engine" if f.instance else " of this pool" if f.pool else ""
        no_data(
            f"no GPU samples{narrowed} in this range (dcgm-exporter scrapes write "
            "`gpu_samples`; GPUs join an engine through their `pod` label)."
        )
        return
    df = _named(frame(table))
    incidents = page_incidents(ctx)
    left, right = st.columns(2)
    with left:
        titled_chart(
            "Utilisation",
            _series(df, "gpu_util"),
            y_title="GPU util (%)",
            color="gpu",
            y_format=",.0f",
            incidents=incidents,
        )
        titled_chart(
            "Temperature",
            _series(df, "temperature_c", "value_max"),
            y_title="°C (max)",
            color="gpu",
            y_format=",.0f",
            thresholds=[(85.0, "85 °C throttling zone")],
        )
    with right:
        fb = _series(df, "fb_used_mib")
        fb["value"] = fb["value"] / 1024
        titled_chart("Frame buffer used", fb, y_title="GiB used", color="gpu", y_format=",.1f")
        titled_chart("Power", _series(df, "power_w"), y_title="W", color="gpu", y_format=",.0f")
    _inventory(df)
    st.subheader("XID events")
    xid = df[(df["signal"] == "xid") & (df["value_max"] > 0)]
    if xid.empty:
        st.caption("No XID error reported in this range.")
    else:
        st.dataframe(
            xid[["time", "instance", "hostname", "gpu", "uuid", "address", "value_max"]].rename(
                columns={"instance": "engine", "value_max": "last XID code"}
            ),
            hide_index=True,
            width="stretch",
        )


PAGE = page("GPUs", _body)
