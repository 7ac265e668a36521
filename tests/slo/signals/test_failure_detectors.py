"""Failure detectors on factory data: prefill failure and interrupted streams per instance against
its pool, retries attributed to the instance that caused them, and ghosts from engine and
tap samples that are never taken at the same moment."""

from __future__ import annotations

import itertools
import random
from typing import Any

import numpy as np
import pytest

from pipeline.store import Store
from slo.signals.detectors import DetectorConfig, Finding, detect_all
from slo.signals.engine import _running_over_tap
from slo.signals.snapshot import Series, Snapshot, load_snapshot
from tests.slo.factories import T0_MS, engine_sample, insert, labels, request

CFG = DetectorConfig()
POOL = "llama-3-8b"
SECONDS = 600
_ids = itertools.count()


def pod(index: int) -> str:
    return f"10.0.0.{index + 1}:8000"


def prefill_error(**kw: Any) -> dict[str, Any]:
    """The engine answered 500 before any token (the tap holds it back, retryable)."""
    return {
        "outcome": "error_before_first_token",
        "error_kind": "http_500",
        "http_status": 500,
        "upstream_status": 500,
        "finish_reason": None,
        "ttft_s": None,
        "tpot_s": None,
        "completion_tokens": None,
        "token_chunks": 0,
        **kw,
    }


def cut_after(tokens: int) -> dict[str, Any]:
    """The upstream closed the stream after ``tokens`` tokens, without ``[DONE]``."""
    return {
        "outcome": "interrupted_after_first_token",
        "error_kind": "upstream_eof",
        "upstream_status": 200,
        "finish_reason": None,
        "completion_tokens": None,
        "token_chunks": tokens,
    }


def cancelled(tokens: int) -> dict[str, Any]:
    """The client hung up after ``tokens`` tokens."""
    return {
        "outcome": "client_cancelled",
        "error_kind": "client_disconnected",
        "upstream_status": 200,
        "finish_reason": None,
        "completion_tokens": None,
        "token_chunks": tokens,
        "client_disconnected": True,
    }


def traffic(
    shares: list[float], fields: dict[str, Any], per_pod: int = 200, seed: int = 1
) -> list[dict[str, Any]]:
    """``per_pod`` first attempts on each pod in the second half of the run (the half the
    failure detectors judge); pod i's fail with ``fields`` at ``shares[i]`` (a fixed count,
    spread at random)."""
    rng = random.Random(seed)
    rows = []
    for i, share in enumerate(shares):
        bad = set(rng.sample(range(per_pod), round(share * per_pod)))
        for n in range(per_pod):
            ts = T0_MS + SECONDS * 500 + rng.randrange(SECONDS * 500)  # the judged half
            extra = fields if n in bad else {"upstream_status": 200}
            rows.append(request(ts, instance=pod(i), pool=POOL, model=POOL, **extra))
    return rows


def detect(store: Store, requests: list[dict[str, Any]], engine: Any = ()) -> list[Finding]:
    insert(store, requests=requests, engine=engine)
    return detect_all(snapshot(store), CFG)


def snapshot(store: Store) -> Snapshot:
    return load_snapshot(store.con, T0_MS + SECONDS * 1000, int(CFG.lookback_s * 1000))


def on(findings: list[Finding], signal: str) -> dict[str, Finding]:
    return {f.scope_id: f for f in findings if f.signal == signal}


# ---------------------------------------------------------------- prefill failure


def test_prefill_failure_on_one_pod_is_found_there_with_its_evidence(store: Store) -> None:
    findings = detect(store, traffic([0, 0.3, 0, 0], prefill_error()))
    (finding,) = on(findings, "prefill_failure").values()
    assert (finding.scope, finding.scope_id, finding.severity) == ("instance", pod(1), "page")
    ev = finding.evidence
    assert (ev["failed"], ev["attempts"]) == (60, 200)
    assert ev["share"] == pytest.approx(0.3)
    assert ev["pool_rest_share"] == 0
    assert ev["upstream_statuses"] == {"500": 60} and ev["error_kinds"] == {"http_500": 60}
    assert len(ev["sample_request_ids"]) == 5
    assert not on(findings, "stream_interrupted")


def test_a_small_share_well_above_the_pool_is_a_ticket(store: Store) -> None:
    # 6 % against 0.5 % elsewhere: under the absolute bar, far over the pool
    findings = detect(store, traffic([0.005, 0.06, 0.005, 0.005], prefill_error(), per_pod=400))
    (finding,) = on(findings, "prefill_failure").values()
    assert (finding.scope_id, finding.severity) == (pod(1), "ticket")
    assert finding.evidence["basis_share"] == "over_pool"
    assert finding.evidence["p_value"] < CFG.failure_p_value


@pytest.mark.parametrize(
    "fields",
    [
        prefill_error(upstream_status=None, http_status=502, error_kind="connect"),
        prefill_error(outcome="rejected", upstream_status=503, error_kind="http_503"),
    ],
    ids=["connection refused (the engine never answered)", "503 not ready (readiness's)"],
)
def test_failures_the_engine_did_not_answer_are_no_prefill_failure(
    store: Store, fields: dict[str, Any]
) -> None:
    assert not on(detect(store, traffic([0, 0.5, 0, 0], fields)), "prefill_failure")


def test_the_same_small_share_everywhere_raises_nothing(store: Store) -> None:
    assert not on(detect(store, traffic([0.04] * 4, prefill_error())), "prefill_failure")


def test_a_few_failures_are_below_the_minimum_count(store: Store) -> None:
    rows = traffic([0, 0.02, 0, 0], prefill_error(), per_pod=200)  # 4 failures, 2 %
    assert not on(detect(store, rows), "prefill_failure")


def test_prefill_failure_on_most_of_the_pool_is_raised_on_the_pool(store: Store) -> None:
    findings = on(detect(store, traffic([0.4, 0.4, 0.4, 0], prefill_error())), "prefill_failure")
    assert set(findings) == {pod(0), pod(1), pod(2), POOL}
    assert findings[POOL].scope == "pool"
    assert findings[POOL].evidence["instances"] == [pod(0), pod(1), pod(2)]


# ---------------------------------------------------------------- interrupted streams


def test_streams_cut_after_the_first_token_are_found_and_client_cancels_are_not(
    store: Store,
) -> None:
    rows = traffic([0, 0, 0.2, 0], cut_after(3)) + traffic(
        [0, 0, 0, 0.4], cancelled(7), seed=2, per_pod=100
    )
    engine = [
        engine_sample(
            T0_MS + s * 1000,
            "requests_finished",
            s // 15,
            kind="counter",
            instance=pod(2),
            labels_json=labels(finished_reason="error"),
        )
        for s in range(0, SECONDS + 1, 15)
    ]
    findings = detect(store, rows, engine)
    (finding,) = on(findings, "stream_interrupted").values()
    assert finding.scope_id == pod(2) and finding.severity == "ticket"
    ev = finding.evidence
    assert (ev["failed"], ev["attempts"]) == (40, 300)  # the cancelling traffic too
    assert ev["tokens_before_cut_median"] == 3 and ev["tokens_before_cut_max"] == 3
    assert ev["error_kinds"] == {"upstream_eof": 40}
    assert ev["engine_finished_error"] == 40
    assert not on(findings, "prefill_failure")


def test_only_client_cancels_raise_no_interrupted_stream(store: Store) -> None:
    findings = detect(store, traffic([0, 0.6, 0, 0], cancelled(5)))
    assert not on(findings, "stream_interrupted")


# ---------------------------------------------------------------- retries


def retried(rows: list[dict[str, Any]], to: int | None, pods: int = 4) -> list[dict[str, Any]]:
    """A second attempt for every failed row: on pod ``to``, else on the next pod."""
    out = []
    for r in rows:
        if r["outcome"] == "ok":
            continue
        index = int(r["instance"].split(".")[3].split(":")[0]) - 1
        target = pod(to if to is not None else (index + 1) % pods)
        out.append(
            request(
                r["received_ts_ms"] + 50,
                request_id=f"{r['request_id']}-2",
                original_request_id=r["original_request_id"],
                attempt=2,
                instance=target,
                pool=POOL,
                model=POOL,
                upstream_status=200,
            )
        )
    return rows + out


def test_one_not_ready_pods_retries_are_its_own_not_a_pool_storm(store: Store) -> None:
    not_ready = prefill_error(outcome="rejected", upstream_status=503, error_kind="http_503")
    rows = retried(traffic([0, 0, 0, 0.95], not_ready), to=None)  # retried on a neighbour
    insert(store, requests=rows)
    snap = snapshot(store)
    assert not on(detect_all(snap, CFG), "retry_storm")
    assert snap.failures[pod(3)].retries_caused == 190
    assert snap.failures[pod(0)].retries_caused == 0


def test_one_pods_prefill_failures_retried_on_itself_are_no_pool_storm(store: Store) -> None:
    rows = retried(traffic([0, 0, 0.8, 0, 0, 0], prefill_error()), to=2, pods=6)
    findings = detect(store, rows)
    assert not on(findings, "retry_storm")
    assert on(findings, "prefill_failure")[pod(2)].evidence["retries_caused"] == 160


def test_failures_across_the_pool_driving_retries_are_a_storm(store: Store) -> None:
    rows = retried(traffic([0.3, 0.3, 0.3, 0.3], prefill_error()), to=None)
    (storm,) = on(detect(store, rows), "retry_storm").values()
    assert storm.scope == "pool" and storm.scope_id == POOL
    ev = storm.evidence
    assert ev["retries_by_cause"] == {pod(i): 60 for i in range(4)}
    assert ev["causing_instances"] == [pod(i) for i in range(4)]
    assert ev["amplification"] == pytest.approx(1040 / 800)
    assert ev["unattributed_retries"] == 0


# ---------------------------------------------------------------- ghosts


def ghost_samples(
    index: int, ghosts: int, aborts_follow: bool, seed: int = 3, until_s: int = SECONDS
) -> list[dict[str, Any]]:
    """Clients that cancel: ``live`` streams open at the tap, 1.5 disconnects/s. The engine
    is scraped every 2 s; the tap publishes every 5 s, 0.7 s off the scrapes (never the same
    moment). The engine runs ``live`` + ``ghosts``; it aborts each disconnect only if
    ``aborts_follow``."""
    rng = random.Random(seed)
    live = [rng.randint(2, 6) for _ in range(SECONDS + 1)]
    inst = {"instance": pod(index), "pool": POOL, "model": POOL}
    rows = []
    for s in range(0, until_s + 1, 2):
        ts = T0_MS + s * 1000
        rows.append(engine_sample(ts, "running", live[s] + ghosts, **inst))
        rows.append(
            engine_sample(
                ts,
                "requests_finished",
                1.5 * s if aborts_follow else 0.0,
                kind="counter",
                labels_json=labels(finished_reason="abort"),
                **inst,
            )
        )
    tap = {**inst, "dialect": "tap", "engine": ""}
    for s in range(0, until_s - 4, 5):
        ts = T0_MS + s * 1000 + 700
        rows.append(
            engine_sample(ts, "tap_in_flight", live[s], metric="llmslo_tap_in_flight", **tap)
        )
        rows.append(
            engine_sample(
                ts,
                "tap_disconnects",
                1.5 * s,
                kind="counter",
                metric="llmslo_tap_disconnects_total",
                **tap,
            )
        )
    return rows


def test_ghosts_are_found_from_engine_and_tap_samples_taken_at_different_moments(
    store: Store,
) -> None:
    engine = ghost_samples(0, ghosts=3, aborts_follow=False) + ghost_samples(
        1, ghosts=0, aborts_follow=True, seed=4
    )
    findings = detect(store, [], engine)
    (finding,) = on(findings, "ghost_requests").values()
    assert finding.scope_id == pod(0)
    ev = finding.evidence
    assert ev["running_over_tap_in_flight"] >= 1 and ev["ghosts"] >= 1
    assert ev["engine_aborts"] == 0 and ev["tap_disconnects"] > 50


def test_a_running_excess_the_engine_aborts_is_no_ghost(store: Store) -> None:
    """Running above the tap's gauge (a burst between its samples) with every disconnect
    aborted by the engine: the clients that left are gone from the engine too."""
    findings = detect(store, [], ghost_samples(0, ghosts=3, aborts_follow=True))
    assert not on(findings, "ghost_requests")


def test_disconnects_without_a_running_excess_are_no_ghost(store: Store) -> None:
    """An engine that counts no aborts at all (no such counter): disconnects alone say
    nothing; its running count shows nothing left behind."""
    findings = detect(store, [], ghost_samples(0, ghosts=0, aborts_follow=False))
    assert not on(findings, "ghost_requests")


def test_ghosts_clear_once_the_window_has_passed_them(store: Store) -> None:
    late = ghost_samples(0, ghosts=3, aborts_follow=False, until_s=SECONDS - 90)
    healthy_after = [
        r
        for r in ghost_samples(0, ghosts=0, aborts_follow=True)
        if r["ts_ms"] > T0_MS + (SECONDS - 90) * 1000
    ]
    assert not on(detect(store, [], late + healthy_after), "ghost_requests")


def test_unaligned_samples_match_only_within_the_match_window() -> None:
    running = Series(np.array([0, 2000, 4000, 40000]), np.array([5.0, 5.0, 5.0, 5.0]))
    tap = Series(np.array([700, 5700, 10700]), np.array([1.0, 3.0, 2.0]))
    # 0 has no tap sample before it, 40000 none after within 15 s
    assert _running_over_tap(running, tap, 15_000).tolist() == [2.0, 2.0]


def test_failures_that_stopped_half_a_lookback_ago_are_cleared(store: Store) -> None:
    rows = traffic([0, 0.5, 0, 0], prefill_error())
    for r in rows:  # the same traffic, in the first half of the lookback
        r["received_ts_ms"] -= SECONDS * 500
    rows += traffic([0, 0, 0, 0], {}, seed=5)
    assert not on(detect(store, rows), "prefill_failure")


def two_taps(ghosts: int, aborts_follow: bool) -> list[dict[str, Any]]:
    """As :func:`ghost_samples`, with two taps in front of the pod (each with half of the
    streams and disconnects), publishing 2.5 s apart from each other."""
    rows = [r for r in ghost_samples(0, ghosts, aborts_follow) if r["dialect"] != "tap"]
    live = {r["ts_ms"]: r["value"] - ghosts for r in rows if r["signal"] == "running"}
    tap = {"instance": pod(0), "pool": POOL, "model": POOL, "dialect": "tap", "engine": ""}
    for name, offset_ms in (("tap-a", 700), ("tap-b", 3200)):
        for s in range(0, SECONDS - 4, 5):
            ts = T0_MS + s * 1000 + offset_ms
            streams = live[T0_MS + (s - s % 2) * 1000] / 2
            for signal, value, kind in (
                ("tap_in_flight", streams, "gauge"),
                ("tap_disconnects", 0.75 * s, "counter"),
            ):
                rows.append(
                    engine_sample(
                        ts, signal, value, kind=kind, labels_json=labels(tap_id=name), **tap
                    )
                )
    return rows


def test_two_taps_publishing_at_their_own_moments_are_summed_not_taken_one_at_a_time(
    store: Store,
) -> None:
    insert(store, engine=two_taps(ghosts=0, aborts_follow=True))
    snap = snapshot(store)
    in_flight, running = snap.series(pod(0), "tap_in_flight"), snap.series(pod(0), "running")
    assert in_flight is not None and running is not None
    assert in_flight.values.mean() == pytest.approx(running.values.mean(), rel=0.15)
    disconnects = snap.series(pod(0), "tap_disconnects")
    assert disconnects is not None
    assert disconnects.increase() == pytest.approx(1.5 * 590, abs=8)
    assert not on(detect_all(snap, CFG), "ghost_requests")


def test_ghosts_behind_two_taps_are_found(store: Store) -> None:
    findings = detect(store, [], two_taps(ghosts=3, aborts_follow=False))
    assert set(on(findings, "ghost_requests")) == {pod(0)}


def test_clients_hanging_up_on_finished_streams_are_no_ghosts(store: Store) -> None:
    """The drill's healthy pod: clients that close right after the last token are counted
    as disconnects by the tap (and recorded ``client_cancelled`` with a finish reason), the
    engine has nothing to abort; the tap's 5 s gauge misses short streams, so running looks
    above it. Neither is a ghost."""
    engine = ghost_samples(0, ghosts=2, aborts_follow=False)
    finished = [
        request(
            T0_MS + n * 2000 // 3 - 3000,
            instance=pod(0),
            pool=POOL,
            model=POOL,
            outcome="client_cancelled",
            error_kind="client_disconnected",
            finish_reason="length",
            client_disconnected=True,
            disconnect_ts_ms=T0_MS + n * 2000 // 3,
        )
        for n in range(1, int(1.5 * SECONDS))
    ]
    assert not on(detect(store, finished, engine), "ghost_requests")
