"""The entry point, the gateway and its router: findings from probe records and EPP scrapes."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.store import Store
from slo.jobs import JobsConfig, SloJobs
from slo.signals.detectors import DetectorConfig, Finding, detect_all
from slo.signals.snapshot import load_snapshot
from slo.sinks import ListTransitionSink
from slo.spec import parse_spec
from slo.spec.model import build_model
from tests.slo.factories import T0_MS, engine_sample, health_row, insert, labels, request

CFG = DetectorConfig(entry_window_s=30, gateway_window_s=30)
GATEWAY = "gw:8080"
END_MS = T0_MS + 120_000
SPEC = {
    "version": "llmslo/v1",
    "service": "svc",
    "slos": [{"name": "avail", "objective": 0.99, "sli": {"kind": "availability"}}],
}


def probe(ts_ms: int, ok: bool = True, kind: str | None = None) -> dict[str, Any]:
    """One probe record through the gateway (a failed one has ``kind``)."""
    failed: dict[str, Any] = {
        "outcome": "error_before_first_token",
        "error_kind": kind,
        "http_status": None,
    }
    if kind and kind.startswith("http_"):
        failed.update(outcome="rejected", http_status=int(kind[5:]))
    extra = {} if ok else {**failed, "ttft_s": None, "tpot_s": None, "token_chunks": 0}
    return request(ts_ms, instance=GATEWAY, tap_id=f"probe:{GATEWAY}", source="probe", **extra)


def probes(failing_from_s: float | None, kind: str = "connect_refused") -> list[dict[str, Any]]:
    """A probe every 2 s for 120 s; from ``failing_from_s`` on every probe fails with ``kind``."""
    out = []
    for t_s in range(0, 120, 2):
        failed = failing_from_s is not None and t_s >= failing_from_s
        out.append(probe(T0_MS + t_s * 1000, ok=not failed, kind=kind if failed else None))
    return out


def taps() -> list[dict[str, Any]]:
    """Healthy tap records on two pods of the pool behind the gateway."""
    return [
        request(T0_MS + t_s * 1000, instance=f"10.0.0.{i}:8000")
        for t_s in range(0, 120, 1)
        for i in (1, 2)
    ]


def gateway(
    router_up: list[float] | None = None,
    answers: dict[tuple[str, str], float] | None = None,
    errors: dict[str, float] | None = None,
    ready_pods: float = 2,
    queue: float = 0,
    decisions: dict[str, float] | None = None,
) -> list[dict[str, Any]]:
    """EPP scrapes every 2 s for 120 s. Counters grow linearly from 0 at the rate given per
    scrape (``answers[(code, reason)]``, ``errors[error_code]``, ``decisions[mode]``) from
    the scrape where they first appear (60 s); ``router_up`` lists the gauge per scrape."""
    rows = []
    scrapes = range(0, 120, 2)
    for n, t_s in enumerate(scrapes):
        ts = T0_MS + t_s * 1000
        common = {"instance": GATEWAY, "dialect": "epp", "engine": None}
        up = router_up[n] if router_up else 1.0
        rows.append(
            engine_sample(ts, "router_up", up, metric="llmslo_sim_gateway_router_up", **common)
        )
        rows.append(
            engine_sample(
                ts, "pool_ready_pods", ready_pods, labels_json=labels(name="pool"), **common
            )
        )
        rows.append(engine_sample(ts, "gateway_queue", queue, **common))
        ok = labels(code="200", reason="upstream")
        rows.append(
            engine_sample(ts, "gateway_answers", 10.0 * n, kind="counter", labels_json=ok, **common)
        )
        later = max(0, n - 29)  # scrapes since 60 s
        for (code, reason), per in (answers or {}).items():
            if later:
                rows.append(
                    engine_sample(
                        ts,
                        "gateway_answers",
                        per * later,
                        kind="counter",
                        labels_json=labels(code=code, reason=reason),
                        **common,
                    )
                )
        for code, per in (errors or {}).items():
            if later:
                rows.append(
                    engine_sample(
                        ts,
                        "gateway_request_errors",
                        per * later,
                        kind="counter",
                        labels_json=labels(error_code=code, model_name="llama-3-8b"),
                        **common,
                    )
                )
        for mode, per in (decisions or {}).items():
            if later:
                rows.append(
                    engine_sample(
                        ts,
                        "gateway_decisions",
                        per * later,
                        kind="counter",
                        labels_json=labels(mode=mode),
                        **common,
                    )
                )
    return rows


def run(
    store: Store, requests: list[dict[str, Any]], engine: list[dict[str, Any]]
) -> list[Finding]:
    insert(store, requests=requests, engine=engine)
    snap = load_snapshot(store.con, END_MS, int(CFG.lookback_s * 1000))
    return detect_all(snap, CFG)


def only(findings: list[Finding], signal: str) -> Finding:
    (finding,) = [f for f in findings if f.signal == signal]
    return finding


def test_a_healthy_entry_point_and_gateway_raise_nothing(store: Store) -> None:
    assert run(store, probes(None) + taps(), gateway()) == []


def test_refused_connections_at_the_entry_are_entry_unavailable_while_taps_are_quiet(
    store: Store,
) -> None:
    findings = run(store, probes(failing_from_s=90) + taps(), [])
    f = only(findings, "entry_unavailable")
    assert (f.scope, f.scope_id, f.basis) == ("instance", GATEWAY, "probe_failed_taps_quiet")
    assert f.evidence["error_kinds"] == {"connect_refused": 15}
    assert f.evidence["last_success_ts_ms"] == T0_MS + 88_000
    assert f.evidence["tap_records"] == 240 and f.evidence["tap_unavailable"] == 0
    assert [x.signal for x in findings] == ["entry_unavailable"]  # no tap signal from probes


def test_one_failed_probe_is_not_an_outage(store: Store) -> None:
    rows = probes(None)
    rows[-3] = probe(rows[-3]["received_ts_ms"], ok=False, kind="read_timeout")
    assert run(store, rows, []) == []


def test_probe_records_do_not_count_as_a_pool_instance(store: Store) -> None:
    """Probes go through the gateway, not a pod: they must not make a 'cold' third pod that
    makes the real pods look hot, nor join tap-based detectors."""
    findings = run(store, probes(None) + taps(), [])
    assert findings == []
    snap = load_snapshot(store.con, END_MS, int(CFG.lookback_s * 1000))
    assert GATEWAY not in snap.requests and GATEWAY not in snap.latency
    assert len(snap.probes[GATEWAY]) == 60


@pytest.mark.parametrize(
    ("answers", "decisions", "policy", "severity"),
    [
        ({("503", "router_unavailable"): 2}, None, "fail_close", "page"),
        ({("429", "router_unavailable"): 2}, None, "reject", "page"),
        (None, {"fail_open": 2}, "fail_open", "ticket"),
    ],
    ids=["fail-close answers 503", "reject answers 429", "fail-open routes blind"],
)
def test_a_router_down_says_which_policy_is_in_force(
    store: Store,
    answers: dict[tuple[str, str], float] | None,
    decisions: dict[str, float] | None,
    policy: str,
    severity: str,
) -> None:
    up = [1.0] * 30 + [0.0] * 30
    findings = run(store, probes(None), gateway(router_up=up, answers=answers, decisions=decisions))
    f = only(findings, "router_unavailable")
    assert (f.scope_id, f.basis, f.severity) == (GATEWAY, "router_up_gauge", severity)
    assert f.evidence["policy"] == policy
    assert f.evidence["down_since_ts_ms"] == T0_MS + 60_000


def test_router_unavailable_answers_without_the_gauge_still_count(store: Store) -> None:
    findings = run(store, [], gateway(answers={("503", "router_unavailable"): 1}))
    f = only(findings, "router_unavailable")
    assert f.basis == "router_unavailable_answers"
    # 15 scrapes in the 30 s window: 14 increments of 1
    assert f.evidence["refused_by_code"] == {"503": 14.0}


def test_no_eligible_endpoint_from_the_epp_error_code(store: Store) -> None:
    findings = run(store, [], gateway(errors={"ServiceUnavailable": 1}, ready_pods=0))
    f = only(findings, "no_eligible_endpoint")
    assert (f.basis, f.evidence["refused"], f.evidence["pool_ready_pods"]) == (
        "epp_error_code",
        14.0,
        0.0,
    )


def test_gateway_queue_full_from_429s(store: Store) -> None:
    findings = run(store, [], gateway(answers={("429", "queue_full"): 1}, queue=64))
    f = only(findings, "gateway_queue_full")
    assert (f.basis, f.evidence["refused"], f.evidence["gateway_queue_max"]) == (
        "gateway_answers",
        14.0,
        64.0,
    )
    assert [x.signal for x in findings] == ["gateway_queue_full"]


@pytest.mark.parametrize(
    "code",
    ["InferencePoolResourceExhausted", "ResourceExhausted"],
    ids=["Inference Extension EPP", "llm-d-router EPP"],
)
def test_gateway_queue_full_from_either_epp_generations_shed_code(store: Store, code: str) -> None:
    findings = run(store, [], gateway(errors={code: 1}, queue=64))
    f = only(findings, "gateway_queue_full")
    assert (f.basis, f.evidence["refused"], f.evidence["error_code"]) == (
        "epp_error_code",
        14.0,
        code,
    )


@pytest.mark.parametrize(
    ("until_s", "reported"), [(62, False), (64, True)], ids=["2 refusals", "3 refusals"]
)
def test_refusals_count_from_a_counter_born_in_the_window(
    store: Store, until_s: int, reported: bool
) -> None:
    """The ServiceUnavailable child appears at 60 s with value 1 (prometheus-client creates a
    labelled child on first use): that first refusal counts; the minimum is 3."""
    rows = [
        r for r in gateway(errors={"ServiceUnavailable": 1}) if r["ts_ms"] <= T0_MS + until_s * 1000
    ]
    insert(store, engine=rows)
    snap = load_snapshot(store.con, T0_MS + until_s * 1000, int(CFG.lookback_s * 1000))
    signals = [f.signal for f in detect_all(snap, CFG)]
    assert signals == (["no_eligible_endpoint"] if reported else [])


def test_the_gateway_queue_is_read_once_as_a_gateway_signal_never_as_an_engine_one(
    store: Store,
) -> None:
    insert(store, requests=taps(), engine=gateway(queue=7))
    snap = load_snapshot(store.con, END_MS, int(CFG.lookback_s * 1000))
    assert snap.gateways[GATEWAY]["gateway_queue"].last() == 7.0
    assert [i for i, signals in snap.engine.items() if "gateway_queue" in signals] == []
    assert GATEWAY not in snap.engine  # an EPP scrape holds no engine signal


#: What else a front-end target may export into ``engine_samples`` beside the EPP's names:
#: the simulated gateway's prefix-locality counters, an autoscaler's replica gauges.
FRONT_END_EXTRAS = {
    "an EPP gateway": (),
    "a gateway with a prefix-locality router": ("router_prefix_lookups", "router_hints_rejected"),
    "a gateway with kube-state-metrics replica gauges": ("replicas_desired", "replicas_ready"),
}


@pytest.mark.parametrize("extras", FRONT_END_EXTRAS.values(), ids=FRONT_END_EXTRAS.keys())
def test_a_front_end_that_goes_down_gets_no_degradation_flag(
    store: Store, extras: tuple[str, ...]
) -> None:
    """Degradation levels are about engines' KV: a gateway (or any target without a KV
    signal) that stops answering its scrape is ``target_down``, not an instance whose level
    turned unknown."""
    up_until_s = 90
    health = [
        health_row(
            T0_MS + t_s * 1000,
            instance=GATEWAY,
            target=f"http://{GATEWAY}/metrics",
            dialect="epp",
            up=t_s < up_until_s,
            error_kind=None if t_s < up_until_s else "connect_refused",
        )
        for t_s in range(0, 120, 2)
    ]
    engine = gateway(queue=3) + [
        engine_sample(T0_MS + t_s * 1000, signal, t_s, instance=GATEWAY, dialect="epp")
        for t_s in range(0, 120, 2)
        for signal in extras
    ]
    engine = [row for row in engine if row["ts_ms"] < T0_MS + up_until_s * 1000]
    insert(store, requests=taps(), engine=engine, health=health)
    sink = ListTransitionSink()
    jobs = SloJobs(store.con, build_model(parse_spec(SPEC)), JobsConfig(), sink=sink)
    results = [jobs.run_once(T0_MS + t_s * 1000) for t_s in range(30, 121, 10)]
    assert all(r is not None and r.errors == [] for r in results)
    last = results[-1]
    assert last is not None
    assert any(f.signal == "target_down" and f.scope_id == GATEWAY for f in last.findings)
    assert [t for t in sink.transitions if t.scope_id == GATEWAY] == []
