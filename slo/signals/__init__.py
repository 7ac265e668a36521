"""Failure signals: the detectors, one module per family, and what they return.

Each family module (:mod:`slo.signals.engine`, ``health``, ``traffic``, ``latency``,
``failure``, ``edge``, ``infra``) holds its detectors; each detector reads one shared
:class:`Snapshot` (:mod:`slo.signals.snapshot`) and returns :class:`Finding` values
(:mod:`slo.signals.findings`). :mod:`slo.signals.detectors` lists them (``DETECTORS``) and runs
them all (:func:`detect_all`). See ``slo/README.md`` for how to add a signal.
"""

from __future__ import annotations

from slo.signals.detectors import (
    DETECTORS,
    DetectorConfig,
    Finding,
    detect_all,
    gini,
    pool_findings,
)
from slo.signals.snapshot import (
    BUCKET_SIGNALS,
    GATEWAY_SIGNALS,
    RANK_SIGNALS,
    Autoscalers,
    AutoscalerSeries,
    ProbeSeries,
    RequestStats,
    Series,
    Snapshot,
    TargetHealthSeries,
    load_snapshot,
)

__all__ = [
    "BUCKET_SIGNALS",
    "DETECTORS",
    "GATEWAY_SIGNALS",
    "RANK_SIGNALS",
    "AutoscalerSeries",
    "Autoscalers",
    "DetectorConfig",
    "Finding",
    "ProbeSeries",
    "RequestStats",
    "Series",
    "Snapshot",
    "TargetHealthSeries",
    "detect_all",
    "gini",
    "load_snapshot",
    "pool_findings",
]
