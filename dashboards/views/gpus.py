"""GPUs: utilisation, frame buffer, temperature and power, and XID events, per node and GPU."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards.charts import frame
from dashboards.context import PageContext
from dashboards.views.common import no_data, page, page_incidents, titled_chart

__all__ = ["PAGE"]

_SIGNALS = ("gpu_util", "fb_used_mib", "fb_free_mib", "temperature_c", "power_w", "xid")


def _series(df: pd.DataFrame, signal: str, column: str = "value") -> pd.DataFrame:
    one = df[df["signal"] == signal].copy()
    one["gpu"] = (
        one["hostname"].fillna(one["instance"]).astype(str) + " / GPU " + one["gpu"].astype(str)
    )
    return one[["time", "gpu", column]].rename(columns={column: "value"})


def _body(ctx: PageContext) -> None:
    f = ctx.filters
    # gpu_series' ``instance`` is the dcgm-exporter's scrape target, not the engine's: the
    # engine filters cannot narrow it until the series carry the ``pod`` each GPU serves.
    table = ctx.table(
        "gpu_series",
        signals=list(_SIGNALS),
        start_ms=f.start_ms,
        end_ms=f.end_ms,
        bucket_ms=f.bucket_ms,
    )
    if f.instance or f.pool:
        st.caption("Showing every GPU: GPU series do not yet name the engine pod they serve.")
    if table is None:
        return
    if table.num_rows == 0:
        no_data("no GPU samples in this range (dcgm-exporter scrapes write `gpu_samples`).")
        return
    df = frame(table)
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
    st.subheader("XID events")
    xid = df[(df["signal"] == "xid") & (df["value_max"] > 0)]
    if xid.empty:
        st.caption("No XID error reported in this range.")
    else:
        st.dataframe(
            xid[["time", "instance", "hostname", "gpu", "uuid", "value_max"]].rename(
                columns={"value_max": "last XID code"}
            ),
            hide_index=True,
            width="stretch",
        )


PAGE = page("GPUs", _body)
