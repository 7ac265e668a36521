"""The SLO engine: specs, SLIs, error budgets, burn rates, failure signals and L0–L3 flags.

Owns the SLO spec format (:mod:`slo.spec`, read by :mod:`slo.spec.loader`) and its validated model (:mod:`slo.spec.model`), the
alert-window catalogs (:mod:`slo.windows`, data in ``slo/windows/*.yaml``), the per-minute
rollup tables in DuckDB (:mod:`slo.rollups.counts`), the evaluator (:mod:`slo.evaluate`; its sums
kept across cycles in :mod:`slo.window_sums`), the
failure-signature detectors (:mod:`slo.signals.detectors`, findings in :mod:`slo.signals.findings`), the degradation-flag state machine
(:mod:`slo.flags`), the ``llmslo jobs`` runner (:mod:`slo.jobs`) and the read API of all
these tables for dashboards, the HTTP API and the alert pusher (:mod:`slo.queries`). Data flows one way:
spec → model → evaluators → writers (DuckDB tables, Kafka ``flags``, ``/metrics``).
See ``slo/README.md`` for the tables and how to add a signal or a window catalog.
"""

from __future__ import annotations

from slo.budget import WindowCounts, budget_remaining, burn_rate, error_ratio, pair_alerting
from slo.evaluate import PairState, SloStatus, evaluate
from slo.rollups.counts import Rollup
from slo.spec import SloDocument, parse_spec
from slo.spec.loader import load_spec
from slo.spec.model import Slo, SloModel, build_model
from slo.spec.openslo import openslo_to_spec
from slo.windows import AlertPair, WindowCatalog, load_catalog

__all__ = [
    "AlertPair",
    "PairState",
    "Rollup",
    "Slo",
    "SloDocument",
    "SloModel",
    "SloStatus",
    "WindowCatalog",
    "WindowCounts",
    "budget_remaining",
    "build_model",
    "burn_rate",
    "error_ratio",
    "evaluate",
    "load_catalog",
    "load_spec",
    "openslo_to_spec",
    "pair_alerting",
    "parse_spec",
]
