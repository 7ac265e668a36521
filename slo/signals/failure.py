"""Detectors of failed attempts at the tap: prefill failure (before the first token) and
interrupted streams (after it), per instance against the rest of its pool.

An instance is reported when its failure share of attempts is

- at least ``failure_share`` (an absolute bar: a whole pool failing is still reported, on
  every instance and then on the pool by :func:`slo.signals.detectors.pool_findings`), or
- at least ``failure_min_share``, ``failure_over_pool`` × the rest of the pool's share, and
  unlikely under it (one-sided binomial test, p < ``failure_p_value``; the pool's share
  gets a pseudo-count so a pool with no failure still gives a finite baseline). The rest of
  the pool is its *serving* instances other than this one (:mod:`slo.signals._serving`: a pod down,
  stalled, not ready or failing most of its requests is no baseline), and this rule needs
  at least ``pool_min_serving`` − 1 of them,

and holds at least ``failure_min_count`` failures. Severity: ``page`` from
``failure_page_share`` on (most requests see it), else ``ticket``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import Field
from scipy.stats import binomtest

from slo.signals._failures import AFTER_FIRST_TOKEN, BEFORE_FIRST_TOKEN, FailureStats
from slo.signals._serving import PoolThresholds, pool_baselines
from slo.signals.findings import Finding
from slo.signals.snapshot import Snapshot

__all__ = ["FailureThresholds", "detect_prefill_failure", "detect_stream_interrupted"]


class FailureThresholds(PoolThresholds):
    """Thresholds of prefill failure and interrupted streams; the pool baseline's
    (:class:`~slo.signals._serving.ServingThresholds`, ``failure_min_count`` among them) too.
    """

    failure_share: float = Field(
        default=0.1,
        gt=0,
        le=1,
        description="share of an instance's attempts failing that is"
        " reported whatever its pool does",
    )
    failure_over_pool: float = Field(
        default=3.0, gt=1, description="instance failure share / rest of the pool's that counts"
    )
    failure_min_share: float = Field(
        default=0.02, gt=0, le=1, description="least failure share judged against the pool"
    )
    failure_p_value: float = Field(
        default=1e-3, gt=0, lt=1, description="one-sided binomial p-value against the pool"
    )
    failure_page_share: float = Field(
        default=0.25, gt=0, le=1, description="failure share from which a finding pages"
    )


Denominator = Callable[[FailureStats], int]


def _judge(
    snap: Snapshot, cfg: FailureThresholds, outcome: str, denominator: Denominator
) -> list[tuple[str, dict[str, Any]]]:
    """(instance, evidence) of every instance whose ``outcome`` share stands out."""
    found = []
    for pool in pool_baselines(snap, cfg).values():
        instances = [*pool.serving, *pool.left_out]
        stats = {i: snap.failures[i] for i in instances if i in snap.failures}
        # the rest of the pool is its serving instances other than this one (slo.signals._serving)
        serving = [i for i in pool.serving if i in stats]
        serving_n = sum(denominator(stats[i]) for i in serving)
        serving_k = sum(stats[i].failed(outcome) for i in serving)
        for instance, s in sorted(stats.items()):
            n, k = denominator(s), s.failed(outcome)
            if k < cfg.failure_min_count or n == 0:
                continue
            share = k / n
            own = instance in serving
            peers = len(serving) - own
            rest_n, rest_k = serving_n - n * own, serving_k - k * own
            baseline = (rest_k + 1) / (rest_n + 2)  # Laplace: finite when the rest never fails
            p_value = float(binomtest(k, n, baseline, alternative="greater").pvalue)
            relative = (
                peers + 1 >= cfg.pool_min_serving
                and rest_n > 0
                and share >= cfg.failure_min_share
                and share >= cfg.failure_over_pool * (rest_k / rest_n)
                and p_value < cfg.failure_p_value
            )
            if share < cfg.failure_share and not relative:
                continue
            kind = s.kinds[outcome]
            found.append(
                (
                    instance,
                    {
                        "failed": k,
                        "attempts": n,
                        "share": share,
                        "pool_rest_share": rest_k / rest_n if rest_n else None,
                        "p_value": p_value,
                        "basis_share": "absolute" if share >= cfg.failure_share else "over_pool",
                        "upstream_statuses": kind.statuses,
                        "error_kinds": kind.error_kinds,
                        "sample_request_ids": kind.sample_request_ids,
                        "retries_caused": s.retries_caused,
                        "client_cancelled": s.client_cancelled,
                        "left_out": dict(pool.left_out),
                    },
                )
            )
    return found


def _severity(evidence: dict[str, Any], cfg: FailureThresholds) -> str:
    return "page" if evidence["share"] >= cfg.failure_page_share else "ticket"


def detect_prefill_failure(snap: Snapshot, cfg: FailureThresholds) -> list[Finding]:
    """Attempts the engine answered with an error before the first token (a 5xx, or a stream
    that ended or errored first), as a share of the instance's attempts."""
    return [
        Finding.on_instance(
            snap, "prefill_failure", instance, _severity(ev, cfg), "tap_outcomes", ev
        )
        for instance, ev in _judge(snap, cfg, BEFORE_FIRST_TOKEN, lambda s: s.attempts)
    ]


def detect_stream_interrupted(snap: Snapshot, cfg: FailureThresholds) -> list[Finding]:
    """Streams cut after the first token (upstream EOF without ``[DONE]``, an error event), as
    a share of the attempts that got a first token; client cancels are never counted. The
    evidence has the tokens the clients got before the cut and the engine's own error count."""
    findings = []
    for instance, ev in _judge(snap, cfg, AFTER_FIRST_TOKEN, lambda s: s.first_token_attempts):
        kind = snap.failures[instance].kinds[AFTER_FIRST_TOKEN]
        engine_errors = snap.series(instance, "requests_finished:error")
        ev.update(
            tokens_before_cut_median=kind.tokens_median,
            tokens_before_cut_max=kind.tokens_max,
            engine_finished_error=engine_errors.increase() if engine_errors is not None else None,
        )
        findings.append(
            Finding.on_instance(
                snap, "stream_interrupted", instance, _severity(ev, cfg), "tap_outcomes", ev
            )
        )
    return findings
