"""The HTTP API: read routes over :mod:`slo.queries` (JSON or Arrow IPC) for the
dashboards, degradation flags for gateways (ETag, long-poll, token-guarded overrides), the
Alertmanager silence pass-through, and canary verdicts: the Kayenta-style judge, cohort
sample loading, the ``verdicts`` table and the routes that Argo Rollouts (``web``
provider) and Flagger (webhooks) call unchanged. :func:`create_app` builds it all.

Data flows one way: request parameters → validated :class:`~api.cohorts.Cohort` /
:class:`~api.cohorts.TimeRange` → :func:`~api.cohorts.load_samples` (DuckDB, parameterised
SQL) → :func:`~api.judge.judge` (pure) → :class:`~api.verdicts.VerdictStore` and the HTTP
answer. See ``docs/canary.md`` for ready Argo and Flagger manifests.
"""

from __future__ import annotations

from api.app import create_app
from api.cohorts import Cohort, CohortSamples, SampleOptions, TimeRange, load_samples
from api.errors import QueryError, UnknownCohortError
from api.flags import FlagWatcher
from api.judge import JudgeConfig, MetricConfig, SloGateInput, Verdict, judge
from api.reads import READ_ROUTES
from api.service import ApiConfig
from api.tables import API_TABLES

__all__ = [
    "API_TABLES",
    "READ_ROUTES",
    "ApiConfig",
    "Cohort",
    "CohortSamples",
    "FlagWatcher",
    "JudgeConfig",
    "MetricConfig",
    "QueryError",
    "SampleOptions",
    "SloGateInput",
    "TimeRange",
    "UnknownCohortError",
    "Verdict",
    "create_app",
    "judge",
    "load_samples",
]
