"""Computing, storing and rendering verdicts: the part of the API under the HTTP layer.

:class:`VerdictService` takes raw parameters, validates them (:mod:`api.params`), loads
both cohorts (:mod:`api.cohorts`), judges (:mod:`api.judge`), stores the verdict with its
evidence (:mod:`api.verdicts`) and returns the verdict document of
reference/canary-and-peers.md §2.3. An idempotency key (Flagger's checksum with the
parameters and a recompute bucket) returns the stored verdict instead of a new one.
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

import duckdb
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator

from api.capacity import ApiLimits
from api.cohorts import Cohort, SampleOptions, TimeRange, load_samples, shared_requests
from api.judge import JudgeConfig, SloGateInput, Verdict, judge
from api.params import ParsedRequest, parse_duration_ms, parse_params
from api.verdicts import HISTORY_SCHEMA, StoredVerdict, VerdictStore
from pipeline.errors import QueryError

__all__ = ["ApiConfig", "SloStateProvider", "VerdictService", "build_document"]

#: Gives the canary's SLO state (burn rates, budget left) for the SLO gate, or None.
SloStateProvider = Callable[[Cohort, TimeRange], SloGateInput | None]


class ApiConfig(BaseModel):
    """The API's settings. Binds to loopback unless told otherwise."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(8190, ge=0, le=65_535)
    #: Environment variable holding the bearer token; without it verdicts are refused (403).
    token_env: str = "LLMSLO_API_TOKEN"
    default_window: str = "10m"
    #: A Flagger retry with the same checksum within this many seconds gets the stored verdict.
    recompute_s: int = Field(15, ge=1, le=3_600)
    history_max_limit: int = Field(1_000, ge=1, le=100_000)
    #: Alertmanager base URL for the silence pass-through (``POST /api/v1/silences``).
    alertmanager_url: str | None = Field(None, pattern=r"^https?://[^\s]+$", max_length=2_048)
    #: How often the one flags watcher per process reads the store, seconds.
    flags_tick_s: float = Field(1.0, ge=0.05, le=60.0)
    #: Flags whose newest jobs heartbeat is older than this are answered ``stale`` (60 s:
    #: four cycles of the default 15 s interval; never under three of the jobs' intervals).
    flags_staleness_s: float = Field(60.0, gt=0, le=86_400.0)
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    samples: SampleOptions = Field(default_factory=SampleOptions)
    limits: ApiLimits = Field(default_factory=ApiLimits)

    @field_validator("default_window")
    @classmethod
    def _window(cls, value: str) -> str:
        parse_duration_ms(value)
        return value


def _iso(ts_ms: int) -> str:
    return datetime.fromtimestamp(ts_ms / 1000, UTC).isoformat().replace("+00:00", "Z")


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _refuse_shared(con: duckdb.DuckDBPyConnection, request: ParsedRequest) -> None:
    """Raise ``QueryError`` naming the overlap when a request of the range is in both."""
    count, instance = shared_requests(con, request.canary, request.baseline, request.time_range)
    if count:
        raise QueryError(
            None,
            f"canary and baseline select the same requests: {count} request(s) in the window "
            f"fall in both cohorts (canary {request.canary.describe()}, baseline "
            f"{request.baseline.describe()}; e.g. instance {instance})",
        )


def build_document(
    verdict: Verdict,
    request: ParsedRequest,
    config: JudgeConfig,
    verdict_id: str,
    evaluated_ts_ms: int,
) -> dict[str, Any]:
    """The verdict document (JSON-ready); ``summary`` stays small for Argo's jsonPath."""
    window = request.time_range
    return {
        "apiVersion": "slo-verdict/v1",
        "kind": "Verdict",
        "id": verdict_id,
        "summary": {
            "verdict": verdict.verdict,
            "pass": verdict.verdict == "pass",
            "fail": verdict.verdict == "fail",
            "score": verdict.score,
            "canaryRequests": verdict.canary_requests,
            "baselineRequests": verdict.baseline_requests,
            "reason": verdict.reason[:300],
        },
        "subject": {
            "namespace": request.params.namespace,
            "service": request.params.service,
            "canary": request.canary.describe(),
            "baseline": request.baseline.describe(),
        },
        "window": {
            "start": _iso(window.start_ms),
            "end": _iso(window.end_ms),
            "seconds": (window.end_ms - window.start_ms) / 1000,
        },
        "evaluatedAt": _iso(evaluated_ts_ms),
        "judge": {
            "name": "mannwhitney-v1",
            "thresholds": {"pass": config.pass_score, "marginal": config.marginal_score},
            "confLevel": config.confidence,
        },
        "metrics": [{k: _clean(v) for k, v in asdict(m).items()} for m in verdict.metrics],
        "sloGate": asdict(verdict.slo_gate),
    }


class VerdictService:
    """Verdicts over connections from ``connection_provider`` (closed after each use)."""

    def __init__(
        self,
        connection_provider: Callable[[], duckdb.DuckDBPyConnection],
        config: ApiConfig,
        clock: Callable[[], float],
        slo_state_provider: SloStateProvider | None = None,
        *,
        store_verdicts: bool = True,
    ) -> None:
        self.store_verdicts = store_verdicts
        self.connection_provider = connection_provider
        self.config = config
        self.clock = clock
        self.slo_state_provider = slo_state_provider

    def evaluate(
        self,
        raw: Mapping[str, object],
        source: str,
        idempotency: Mapping[str, object] | None = None,
    ) -> tuple[dict[str, Any], str]:
        """Compute (or fetch, for a repeated idempotent call) and store one verdict.

        Returns the document and the verdict name (with ``"stored": false`` when the
        service does not store verdicts). Raises :class:`~pipeline.errors.QueryError`
        (bad parameters), :class:`~api.errors.UnknownCohortError`, or ``duckdb.Error``.
        """
        now_ms = int(self.clock() * 1000)
        request = parse_params(raw, now_ms, self.config.default_window)
        judge_config = self.config.judge
        if request.params.min_requests is not None:
            judge_config = judge_config.model_copy(
                update={"min_requests": request.params.min_requests}
            )
        key = self._key(idempotency, request) if idempotency else None
        con = self.connection_provider()
        try:
            store = VerdictStore(con)
            if (
                key is not None
                and self.store_verdicts
                and (stored := store.by_idempotency_key(key)) is not None
            ):
                return stored.document, stored.verdict
            if not request.disjoint:
                _refuse_shared(con, request)
            canary = load_samples(con, request.canary, request.time_range, self.config.samples)
            baseline = load_samples(con, request.baseline, request.time_range, self.config.samples)
            slo_state = (
                self.slo_state_provider(request.canary, request.time_range)
                if self.slo_state_provider
                else None
            )
            verdict = judge(canary, baseline, judge_config, slo_state)
            verdict_id = uuid.uuid4().hex
            document = build_document(verdict, request, judge_config, verdict_id, now_ms)
            if self.store_verdicts:
                store.insert(self._row(verdict, request, document, key, source, now_ms))
            else:  # a read-only store: computed, not kept, and the answer says so
                document["stored"] = False
            return document, verdict.verdict
        finally:
            con.close()

    def history(
        self, limit: int, service: str | None, verdict: str | None
    ) -> tuple[list[StoredVerdict], pa.Table]:
        """Stored verdicts, newest first: the documents and the rows as a table (none when
        the store has no ``verdicts`` table, e.g. a read-only file)."""
        con = self.connection_provider()
        try:
            store = VerdictStore(con)
            return store.history(limit, service, verdict), store.history_table(
                limit, service, verdict
            )
        except duckdb.CatalogException:
            return [], HISTORY_SCHEMA.empty_table()
        finally:
            con.close()

    def by_id(self, verdict_id: str) -> StoredVerdict | None:
        """One stored verdict, or None."""
        con = self.connection_provider()
        try:
            return VerdictStore(con).by_id(verdict_id)
        finally:
            con.close()

    def _key(self, material: Mapping[str, object], request: ParsedRequest) -> str:
        bucket = request.time_range.end_ms // (self.config.recompute_s * 1000)
        text = json.dumps({**material, "bucket": bucket}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    @staticmethod
    def _row(
        verdict: Verdict,
        request: ParsedRequest,
        document: dict[str, Any],
        key: str | None,
        source: str,
        now_ms: int,
    ) -> dict[str, Any]:
        return {
            "verdict_id": document["id"],
            "idempotency_key": key,
            "evaluated_ts_ms": now_ms,
            "source": source,
            "namespace": request.params.namespace,
            "service": request.params.service,
            "canary": request.canary.describe(),
            "baseline": request.baseline.describe(),
            "window_start_ts_ms": request.time_range.start_ms,
            "window_end_ts_ms": request.time_range.end_ms,
            "verdict": verdict.verdict,
            "score": verdict.score,
            "reason": verdict.reason,
            "canary_requests": verdict.canary_requests,
            "baseline_requests": verdict.baseline_requests,
            "document_json": json.dumps(document, sort_keys=True),
        }
