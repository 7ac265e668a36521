"""The tap's failed attempts per instance, for the failure detectors (one read per cycle).

Two kinds of failure, as the tap classifies them (``pipeline.schema.OUTCOMES``):

- **before the first token** — outcome ``error_before_first_token`` *with an upstream
  answer* (``upstream_status`` set: a 5xx, or a 200 stream that ended or errored before any
  token). Attempts the engine never answered (connection refused, timeouts) belong to
  target-down and crash; 503/429 are ``rejected`` and belong to readiness.
- **after the first token** — outcome ``interrupted_after_first_token`` (upstream EOF or an
  error event mid-stream). A client that hangs up is ``client_cancelled``, never this.

Retries are attributed to the instance whose attempt failed: attempt *n* of a request is
caused by attempt *n − 1* of the same ``original_request_id``, wherever that one ran.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb
import numpy as np

from slo.request_sources import source_filter

__all__ = [
    "AFTER_FIRST_TOKEN",
    "BEFORE_FIRST_TOKEN",
    "FailureKind",
    "FailureStats",
    "load_failures",
    "load_finished_cancels",
]

BEFORE_FIRST_TOKEN = "error_before_first_token"
AFTER_FIRST_TOKEN = "interrupted_after_first_token"
#: How far before the window a retried attempt's predecessor is looked for (ms).
_RETRY_REACH_MS = 120_000
_SAMPLE_IDS = 5
#: An attempt whose answer shows the pod itself failing (``slo.signals._serving``): a 5xx (503 of a
#: worker not ready too), an error before the first token that is no 4xx (a stream that
#: ended or errored first, a reset, a refused connection), a stream cut after it, a
#: ``finish_reason=error``, a connect timeout. Not a 429 (a full queue, or the tap's own L2
#: refusal, never sent upstream), a deadline, a first-token or read timeout (what an
#: overloaded or slow pod produces) nor a 4xx (the request's fault): neither served nor
#: failed, like a client cancel.
_POD_FAILED = f"""
    outcome = '{AFTER_FIRST_TOKEN}'
    OR (outcome = 'ok' AND finish_reason = 'error')
    OR (outcome = '{BEFORE_FIRST_TOKEN}' AND coalesce(upstream_status, 0) NOT BETWEEN 400 AND 499)
    OR (outcome = 'rejected' AND upstream_status >= 500)
    OR (outcome = 'upstream_timeout' AND error_kind = 'connect_timeout')
"""


@dataclass(frozen=True)
class FailureKind:
    """Failed attempts of one kind on one instance over the lookback."""

    count: int
    statuses: dict[str, int]  # upstream HTTP status (or "none") → attempts
    error_kinds: dict[str, int]  # the tap's error_kind → attempts
    sample_request_ids: list[str]  # the latest few, newest first
    tokens_median: float  # tokens the client got before the failure
    tokens_max: float


@dataclass
class FailureStats:
    """One instance's attempts, failures and the retries its failures caused."""

    attempts: int = 0
    first_token_attempts: int = 0  # attempts that delivered at least one token
    client_cancelled: int = 0
    retries: int = 0  # attempts here that were a retry (attempt > 1), whatever caused them
    retries_caused: int = 0  # later attempts of requests whose previous attempt failed here
    kinds: dict[str, FailureKind] = field(default_factory=dict)  # outcome → its failures
    served: int = 0  # attempts answered ok without finish_reason=error (slo.signals._serving)
    pod_failed: int = 0  # attempts whose answer shows the pod itself failing (slo.signals._serving)

    def failed(self, outcome: str) -> int:
        kind = self.kinds.get(outcome)
        return kind.count if kind else 0


def load_failures(
    con: duckdb.DuckDBPyConnection, start_ms: int, now_ms: int
) -> dict[str, FailureStats]:
    """Per instance, the tap's attempts between ``start_ms`` and ``now_ms`` (received time)."""
    stats: dict[str, FailureStats] = {}
    for instance, attempts, served, pod_failed, first, cancelled, retries in con.execute(
        f"""
        SELECT instance, count(*),
               count(*) FILTER (WHERE outcome = 'ok' AND finish_reason IS DISTINCT FROM 'error'),
               count(*) FILTER (WHERE {_POD_FAILED}),
               count(*) FILTER (WHERE ttft_s IS NOT NULL OR coalesce(token_chunks, 0) > 0),
               count(*) FILTER (WHERE outcome = 'client_cancelled'),
               count(*) FILTER (WHERE attempt > 1)
        FROM requests WHERE received_ts_ms >= ? AND received_ts_ms <= ? AND {source_filter()}
        GROUP BY instance
        """,
        [start_ms, now_ms],
    ).fetchall():
        stats[instance] = FailureStats(
            attempts, first, cancelled, retries, served=served, pod_failed=pod_failed
        )
    for row in con.execute(
        f"""
        SELECT instance, outcome, count(*),
               histogram(coalesce(CAST(upstream_status AS VARCHAR), 'none')),
               histogram(coalesce(error_kind, 'none')),
               max_by(request_id, received_ts_ms, {_SAMPLE_IDS}),
               median(coalesce(completion_tokens, token_chunks, 0)),
               max(coalesce(completion_tokens, token_chunks, 0))
        FROM requests
        WHERE received_ts_ms >= ? AND received_ts_ms <= ? AND {source_filter()}
          AND (outcome = '{AFTER_FIRST_TOKEN}'
               OR (outcome = '{BEFORE_FIRST_TOKEN}' AND upstream_status IS NOT NULL))
        GROUP BY instance, outcome
        """,
        [start_ms, now_ms],
    ).fetchall():
        instance, outcome, count, statuses, kinds, ids, median, top = row
        stats.setdefault(instance, FailureStats()).kinds[outcome] = FailureKind(
            count, dict(statuses), dict(kinds), list(ids), float(median or 0), float(top or 0)
        )
    for instance, caused in con.execute(
        f"""
        SELECT earlier.instance, count(*)
        FROM requests AS retry JOIN requests AS earlier
          ON earlier.original_request_id = retry.original_request_id
         AND earlier.attempt = retry.attempt - 1
        WHERE retry.received_ts_ms >= ? AND retry.received_ts_ms <= ? AND retry.attempt > 1
          AND earlier.received_ts_ms >= ? AND earlier.received_ts_ms <= ?
          AND {source_filter(table="retry")}
        GROUP BY earlier.instance
        """,
        [start_ms, now_ms, start_ms - _RETRY_REACH_MS, now_ms],
    ).fetchall():
        stats.setdefault(instance, FailureStats()).retries_caused = int(caused)
    return stats


def load_finished_cancels(
    con: duckdb.DuckDBPyConnection, start_ms: int, now_ms: int
) -> dict[str, np.ndarray]:
    """Per instance, when (ms) clients hung up on a stream the engine had already finished
    (``client_cancelled`` with a ``finish_reason``: a client that closes right after the last
    token without reading ``[DONE]``). The tap counts these as disconnects; the engine has
    nothing left to abort, so the ghost detector takes them out of the disconnect count."""
    rows = con.execute(
        f"""
        SELECT instance, list(disconnect_ts_ms ORDER BY disconnect_ts_ms)
        FROM requests
        WHERE disconnect_ts_ms >= ? AND disconnect_ts_ms <= ?
          AND outcome = 'client_cancelled' AND finish_reason IS NOT NULL
          AND {source_filter()}
        GROUP BY instance
        """,
        [start_ms, now_ms],
    ).fetchall()
    return {instance: np.array(ts, np.int64) for instance, ts in rows}
