"""The HTTP API and canary verdicts (issue 13): the Kayenta-style judge, cohort sample
loading, the ``verdicts`` table and the FastAPI app that Argo Rollouts (``web`` provider)
and Flagger (webhooks) call unchanged.

Data flows one way: request parameters → validated :class:`~api.cohorts.Cohort` /
:class:`~api.cohorts.TimeRange` → :func:`~api.cohorts.load_samples` (DuckDB, parameterised
SQL) → :func:`~api.judge.judge` (pure) → :class:`~api.verdicts.VerdictStore` and the HTTP
answer. See ``docs/canary.md`` for ready Argo and Flagger manifests.
"""

from __future__ import annotations

from api.app import create_app
from api.cohorts import Cohort, CohortSamples, SampleOptions, TimeRange, load_samples
from api.errors import QueryError, UnknownCohortError
from api.judge import JudgeConfig, MetricConfig, SloGateInput, Verdict, judge
from api.service import ApiConfig

__all__ = [
    "ApiConfig",
    "Cohort",
    "CohortSamples",
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
