"""Histogram bucket bounds: a latency SLI from engine histograms needs its threshold to be one.

Bounds are matched by numeric value, never by string (vLLM writes ``le="2.0"``, Prometheus
3 writes ``le="2"``). The bounds seen in the data win; without data the documented defaults
of the dialect apply (reference/engine-metrics.md §1.1, §2.1). The table is data: add a
dialect by adding a row.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import duckdb

from pipeline.buckets import (
    SGLANG_E2E_S,
    SGLANG_ITL_S,
    SGLANG_TTFT_S,
    VLLM_ITL_S,
    VLLM_REQUEST_LATENCY_S,
    VLLM_TTFT_S,
)
from slo.spec import LatencySpec
from slo.spec.model import SloModel

__all__ = ["DEFAULT_BUCKETS", "check_bucket_bounds", "observed_bounds"]

_VLLM = {"ttft": VLLM_TTFT_S, "itl": VLLM_ITL_S, "tpot": VLLM_ITL_S, "e2e": VLLM_REQUEST_LATENCY_S}

#: Default bucket bounds (seconds) per dialect and canonical histogram signal.
DEFAULT_BUCKETS: Mapping[str, Mapping[str, tuple[float, ...]]] = {
    "vllm": _VLLM,
    "vllm-legacy": _VLLM,  # same families under the older names
    "sglang": {
        "ttft": SGLANG_TTFT_S,
        "itl": SGLANG_ITL_S,
        "tpot": SGLANG_ITL_S,
        "e2e": SGLANG_E2E_S,
    },
}


def observed_bounds(con: duckdb.DuckDBPyConnection) -> dict[str, set[float]]:
    """Finite ``le`` values present in ``engine_samples`` per histogram signal."""
    rows = con.execute(
        "SELECT signal, list(DISTINCT le) FROM engine_samples "
        "WHERE kind = 'bucket' AND signal IS NOT NULL AND isfinite(le) GROUP BY signal"
    ).fetchall()
    return {signal: {float(v) for v in values} for signal, values in rows}


def _has_bound(bounds: Iterable[float], threshold: float) -> bool:
    return any(math.isclose(bound, threshold, rel_tol=1e-9, abs_tol=1e-12) for bound in bounds)


def check_bucket_bounds(
    model: SloModel, observed: Mapping[str, set[float]] | None = None
) -> list[str]:
    """Problems with engine-histogram thresholds, one message per SLO (empty when fine)."""
    problems = []
    for index, slo in enumerate(model.slos):
        sli = slo.sli
        if not isinstance(sli, LatencySpec) or sli.source != "engine":
            continue
        where = f"slos[{index}].sli.threshold_s"
        seen = (observed or {}).get(sli.metric)
        if seen:
            bounds, origin = sorted(seen), "bucket bounds seen in engine_samples"
        elif sli.dialect is not None and sli.dialect in DEFAULT_BUCKETS:
            bounds, origin = (
                list(DEFAULT_BUCKETS[sli.dialect][sli.metric]),
                f"default {sli.dialect} buckets",
            )
        else:
            problems.append(
                f"{where}: no {sli.metric} bucket bounds known: set sli.dialect "
                f"({', '.join(DEFAULT_BUCKETS)}) or validate against a store with data"
            )
            continue
        if not _has_bound(bounds, sli.threshold_s):
            near = sorted(bounds, key=lambda b: abs(b - sli.threshold_s))[:2]
            problems.append(
                f"{where}: {sli.threshold_s:g} s is not a {sli.metric} bucket bound ({origin}); "
                f"nearest: {', '.join(f'{b:g}' for b in sorted(near))}"
            )
    return problems
