"""A cluster-wide kube-state-metrics target: every HPA keeps its own replica series, is
paired with the deployment it scales, and autoscaler_lag judges each one apart.

The scrapes are real-shaped exposition text (HELP/TYPE lines, three HPAs, deployments
without an HPA, series nobody maps) through the real canonicalizer into DuckDB.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from collectors.canonical import TargetCanonicalizer
from collectors.exposition import ExpositionParser
from llmslo.sections import load_config
from pipeline.errors import ConfigError
from pipeline.store import Store
from slo.jobs import JobsConfig, SloJobs
from slo.metrics import JobMetrics
from slo.signals.detectors import DetectorConfig, Finding, detect_all
from slo.signals.snapshot import Snapshot, load_snapshot
from slo.sinks import ListTransitionSink
from tests.slo.factories import T0_MS, engine_sample, insert
from tests.slo.test_jobs import MODEL

KSM = "kube-state-metrics.monitoring:8080"
GATEWAY = "gateway-0"
STEP_S, END_S = 5, 600
NOW_MS = T0_MS + END_S * 1000
CFG = DetectorConfig()

Replicas = Callable[[float], tuple[int, int]]  # t (s) → (HPA desired, deployment ready)


def steady(desired: int, ready: int) -> Replicas:
    return lambda t: (desired, ready)


def lagging_from(start_s: float, before: int, wanted: int) -> Replicas:
    """Scaled out at ``start_s`` to ``wanted`` replicas; no new one ever gets ready."""
    return lambda t: (wanted if t >= start_s else before, before)


#: (namespace, HPA, deployment it scales): the HPA and deployment names differ for one.
HPAS = [
    ("serving", "llm-pool", "llm-pool"),
    ("serving", "embedder", "embedder-v2"),
    ("batch", "reranker", "reranker"),
]


def _family(name: str, kind: str, samples: Iterable[tuple[dict[str, str], float]]) -> str:
    lines = [f"# HELP {name} kube-state-metrics.", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        lines.append(f"{name}{{{text}}} {value}")
    return "\n".join(lines) + "\n"


def ksm_scrape(
    t: float,
    replicas: dict[str, Replicas],
    info: Callable[[str, str, str], dict[str, str] | None] | None = None,
) -> str:
    """One scrape of a cluster-wide kube-state-metrics at ``t`` s: the HPAs of :data:`HPAS`
    with ``replicas[hpa](t)``, their info series (``info(ns, hpa, deployment)`` → extra
    labels, ``None`` for no series; default: the real ones), their deployments, and what
    else such a target exports."""
    info = info or (
        lambda ns, hpa, dep: {
            "scaletargetref_api_version": "apps/v1",
            "scaletargetref_kind": "Deployment",
            "scaletargetref_name": dep,
        }
    )
    hpa_labels = {hpa: {"namespace": ns, "horizontalpodautoscaler": hpa} for ns, hpa, _ in HPAS}
    now = {hpa: replicas[hpa](t) for _, hpa, _ in HPAS}
    infos = [(hpa_labels[h], info(ns, h, d)) for ns, h, d in HPAS]
    deployments = [({"namespace": ns, "deployment": d}, now[h][1]) for ns, h, d in HPAS]
    deployments.append(({"namespace": "kube-system", "deployment": "coredns"}, 2))
    return "".join(
        [
            _family(
                "kube_horizontalpodautoscaler_info",
                "gauge",
                [({**labels, **extra}, 1) for labels, extra in infos if extra is not None],
            ),
            _family(
                "kube_horizontalpodautoscaler_spec_max_replicas",
                "gauge",
                [(hpa_labels[h], 8) for _, h, _ in HPAS],
            ),
            _family(
                "kube_horizontalpodautoscaler_spec_min_replicas",
                "gauge",
                [(hpa_labels[h], 1) for _, h, _ in HPAS],
            ),
            _family(
                "kube_horizontalpodautoscaler_status_condition",
                "gauge",
                [
                    ({**hpa_labels[h], "condition": "AbleToScale", "status": "true"}, 1)
                    for _, h, _ in HPAS
                ],
            ),
            _family(
                "kube_horizontalpodautoscaler_status_current_replicas",
                "gauge",
                [(hpa_labels[h], now[h][1]) for _, h, _ in HPAS],
            ),
            _family(
                "kube_horizontalpodautoscaler_status_desired_replicas",
                "gauge",
                [(hpa_labels[h], now[h][0]) for _, h, _ in HPAS],
            ),
            _family(
                "kube_deployment_spec_replicas",
                "gauge",
                [({"namespace": ns, "deployment": d}, now[h][0]) for ns, h, d in HPAS]
                + [(deployments[-1][0], 2)],
            ),
            _family("kube_deployment_status_replicas_ready", "gauge", deployments),
            _family(
                "kube_pod_info",
                "gauge",
                [({"namespace": "serving", "pod": "llm-pool-0", "node": "gpu-1"}, 1)],
            ),
        ]
    )


def scrape_rows(text_at: Callable[[float], str], instance: str = KSM) -> list[Any]:
    """Every scrape of ``text_at(t)`` (t = 0, 5, … s) through the real parser and
    canonicalizer of one target named ``instance``, as Arrow tables."""
    canonicalizer, parser = TargetCanonicalizer(instance), ExpositionParser()
    return [
        canonicalizer.canonicalize(parser.parse(text_at(t)), T0_MS + t * 1000).table
        for t in range(0, END_S + 1, STEP_S)
    ]


def gateway_queue(queue: Callable[[float], float]) -> list[dict[str, Any]]:
    common = {"instance": GATEWAY, "pool": "", "model": None, "dialect": "epp"}
    return [
        engine_sample(T0_MS + t * 1000, "gateway_queue", queue(t), **common)
        for t in range(0, END_S + 1, STEP_S)
    ]


def snapshot(
    store: Store,
    replicas: dict[str, Replicas],
    queue: Callable[[float], float] = lambda t: 0.0,
    info: Callable[[str, str, str], dict[str, str] | None] | None = None,
    instance: str = KSM,
) -> Snapshot:
    """Ten minutes of scrapes of one kube-state-metrics target named ``instance`` (each
    problem is logged once per process and target: tests that read the log name their own)."""
    tables = scrape_rows(lambda t: ksm_scrape(t, replicas, info), instance)
    store.commit_batch({"engine_samples": tables}, group_id="test", offsets={}, now_ts_ms=0)
    insert(store, engine=gateway_queue(queue))
    return load_snapshot(store.con, NOW_MS, int(CFG.lookback_s * 1000))


def lag_findings(snap: Snapshot, cfg: DetectorConfig = CFG) -> list[Finding]:
    return [f for f in detect_all(snap, cfg) if f.signal == "autoscaler_lag"]


HEALTHY = {
    "llm-pool": steady(1, 1),
    "embedder": steady(2, 2),
    "reranker": steady(2, 6),  # scaling in: more ready than desired, for a while
}
QUEUE_GROWS = lambda t: max(0.0, (t - 300) / 10)  # noqa: E731 (0 → 30 from t = 300 s)


def test_a_three_hpa_scrape_keeps_each_hpa_desired_and_its_deployments_ready(
    store: Store,
) -> None:
    replicas = {**HEALTHY, "llm-pool": lagging_from(300, 1, 4)}
    snap = snapshot(store, replicas)
    scalers = snap.autoscalers[KSM]
    seen = {
        name: (s.deployment, s.paired_by, s.desired.last(), s.ready.last())
        for name, s in scalers.paired.items()
    }
    assert seen == {
        "serving/llm-pool": ("serving/llm-pool", "info", 4.0, 1.0),
        "serving/embedder": ("serving/embedder-v2", "info", 2.0, 2.0),
        "batch/reranker": ("batch/reranker", "info", 2.0, 6.0),
    }
    llm = scalers.paired["serving/llm-pool"]
    assert len(llm.desired) == END_S // STEP_S + 1  # one value per scrape, not a sum
    assert llm.max_replicas is not None and llm.max_replicas.last() == 8.0
    assert llm.spec_replicas is not None and llm.spec_replicas.last() == 4.0
    assert scalers.unpaired == {}
    assert KSM not in snap.engine  # not an engine: no pool membership, no summed gauges


@pytest.mark.parametrize(
    ("lagging", "wanted", "ready", "deployment"),
    [
        pytest.param("llm-pool", 4, 1, "serving/llm-pool", id="the llm pool lags"),
        pytest.param(
            "embedder", 5, 2, "serving/embedder-v2", id="an HPA whose deployment has another name"
        ),
        pytest.param("reranker", 6, 2, "batch/reranker", id="an HPA of another namespace"),
    ],
)
def test_a_lagging_hpa_beside_two_healthy_ones_is_found_and_named(
    store: Store, lagging: str, wanted: int, ready: int, deployment: str
) -> None:
    replicas = {**HEALTHY, lagging: lagging_from(300, ready, wanted)}
    [found] = lag_findings(snapshot(store, replicas, QUEUE_GROWS))
    assert (found.scope, found.scope_id, found.basis) == ("instance", KSM, "queue_growth")
    ev = found.evidence
    assert ev["autoscaler"].endswith(f"/{lagging}") and ev["deployment"] == deployment
    assert (ev["desired"], ev["ready"], ev["paired_by"]) == (wanted, ready, "info")
    assert ev["behind_s"] == 300.0 and ev["max_replicas"] == 8.0
    assert "also_lagging" not in ev  # the healthy ones are not named


def test_healthy_hpas_beside_a_growing_queue_find_nothing(store: Store) -> None:
    """The sum over the cluster would say desired 5 < ready 9; per HPA nothing is behind."""
    assert lag_findings(snapshot(store, HEALTHY, QUEUE_GROWS)) == []


def test_two_lagging_hpas_of_one_target_name_the_longest_and_list_the_other(
    store: Store,
) -> None:
    replicas = {
        **HEALTHY,
        "llm-pool": lagging_from(300, 1, 4),
        "embedder": lagging_from(400, 2, 3),
    }
    [found] = lag_findings(snapshot(store, replicas, QUEUE_GROWS))
    assert found.evidence["autoscaler"] == "serving/llm-pool"
    assert found.evidence["also_lagging"] == [
        {
            "autoscaler": "serving/embedder",
            "deployment": "serving/embedder-v2",
            "desired": 3.0,
            "ready": 2.0,
            "behind_s": 200.0,
        }
    ]


@pytest.mark.parametrize(
    ("chosen", "found"),
    [
        pytest.param([], True, id="by default every HPA is judged"),
        pytest.param(["serving/llm-pool"], True, id="the lagging HPA is listed"),
        pytest.param(["serving/embedder"], False, id="only another HPA is listed"),
    ],
)
def test_detectors_autoscalers_limits_which_hpas_are_judged(
    store: Store, chosen: list[str], found: bool
) -> None:
    snap = snapshot(store, {**HEALTHY, "llm-pool": lagging_from(300, 1, 4)}, QUEUE_GROWS)
    assert bool(lag_findings(snap, DetectorConfig(autoscalers=chosen))) is found


def test_an_autoscaler_not_written_as_namespace_slash_name_is_refused_by_field_path(
    tmp_path: Path,
) -> None:
    path = tmp_path / "llmslo.yaml"
    path.write_text("slo:\n  detectors: {autoscalers: [serving/llm-pool, llm-pool]}\n")
    with pytest.raises(
        ConfigError, match=r"slo\.detectors\.autoscalers\[1\]: .*'llm-pool' is not namespace/name"
    ):
        load_config(path)
    path.write_text("slo:\n  detectors: {autoscalers: [serving/llm-pool]}\n")
    assert load_config(path).section("slo", JobsConfig).detectors.autoscalers == [
        "serving/llm-pool"
    ]


def _without_info(ns: str, hpa: str, dep: str) -> dict[str, str] | None:
    return None  # kube-state-metrics before the info series (or it is not allowed)


def _malformed_info(ns: str, hpa: str, dep: str) -> dict[str, str] | None:
    if hpa == "llm-pool":
        return {"scaletargetref_kind": "Deployment"}  # no scaletargetref_name
    if hpa == "embedder":
        return {"scaletargetref_kind": "StatefulSet", "scaletargetref_name": dep}
    return {"scaletargetref_kind": "Deployment", "scaletargetref_name": "gone"}


@pytest.mark.parametrize(
    ("info", "paired", "unpaired"),
    [
        pytest.param(
            _without_info,
            {"serving/llm-pool": "same_name", "batch/reranker": "same_name"},
            {"serving/embedder": "no_info"},
            id="no info series: HPAs pair with the deployment of their own name",
        ),
        pytest.param(
            _malformed_info,
            {"serving/llm-pool": "same_name"},
            {
                "serving/embedder": "target_kind:StatefulSet",
                "batch/reranker": "target_not_exported",
            },
            id="info without a target name, of another kind, or naming an absent deployment",
        ),
    ],
)
def test_missing_or_malformed_info_pairs_what_it_can_and_reports_the_rest(
    store: Store,
    caplog: pytest.LogCaptureFixture,
    info: Callable[[str, str, str], dict[str, str] | None],
    paired: dict[str, str],
    unpaired: dict[str, str],
) -> None:
    replicas = {**HEALTHY, "llm-pool": lagging_from(300, 1, 4)}
    target = f"ksm-{info.__name__}:8080"
    with caplog.at_level(logging.WARNING, logger="slo.signals._autoscalers"):
        snap = snapshot(store, replicas, QUEUE_GROWS, info, target)
        load_snapshot(store.con, NOW_MS, int(CFG.lookback_s * 1000))  # the next cycle
    scalers = snap.autoscalers[target]
    assert {n: s.paired_by for n, s in scalers.paired.items()} == paired
    assert scalers.unpaired == unpaired
    for name, reason in unpaired.items():  # logged once, with the target and the reason
        logged = [r.getMessage() for r in caplog.records if f"'{name}'" in r.getMessage()]
        assert len(logged) == 1 and target in logged[0] and reason in logged[0], logged
    [found] = lag_findings(snap)  # what could be paired is still judged
    assert found.evidence["autoscaler"] == "serving/llm-pool"


def test_the_jobs_count_the_hpas_they_cannot_judge_by_reason(store: Store) -> None:
    snapshot(store, HEALTHY, info=_malformed_info)
    metrics = JobMetrics()
    jobs = SloJobs(store.con, MODEL, JobsConfig(), sink=ListTransitionSink(), metrics=metrics)
    result = jobs.run_once(NOW_MS)
    assert result is not None and result.errors == []
    counts = {
        reason: metrics.registry.get_sample_value(
            "llmslo_autoscalers_unpaired", {"instance": KSM, "reason": reason}
        )
        for reason in ("target_kind:StatefulSet", "target_not_exported", "no_info")
    }
    assert counts == {"target_kind:StatefulSet": 1.0, "target_not_exported": 1.0, "no_info": None}


def test_the_collector_keeps_every_hpa_and_deployment_apart_in_its_rows() -> None:
    canonicalizer = TargetCanonicalizer(KSM)
    text = ksm_scrape(0, {**HEALTHY, "llm-pool": steady(4, 1)})
    rows = canonicalizer.canonicalize(ExpositionParser().parse(text), T0_MS).table.to_pylist()
    assert canonicalizer.detection is not None
    assert canonicalizer.detection.dialect == "kube-state-metrics"

    def named(signal: str, label: str) -> dict[tuple[str, str], Any]:
        out = {}
        for row in rows:
            if row["signal"] == signal:
                labels = json.loads(row["labels_json"])
                out[(labels["namespace"], labels[label])] = (row["kind"], row["value"], labels)
        return out

    desired = named("replicas_desired", "horizontalpodautoscaler")
    assert {k: v[1] for k, v in desired.items()} == {
        ("serving", "llm-pool"): 4.0,
        ("serving", "embedder"): 2.0,
        ("batch", "reranker"): 2.0,
    }
    ready = named("replicas_ready", "deployment")
    assert {k: v[1] for k, v in ready.items()} == {
        ("serving", "llm-pool"): 1.0,
        ("serving", "embedder-v2"): 2.0,
        ("batch", "reranker"): 6.0,
        ("kube-system", "coredns"): 2.0,
    }
    info = named("autoscaler_target", "horizontalpodautoscaler")
    assert {k: (v[0], v[2]["scaletargetref_name"]) for k, v in info.items()} == {
        ("serving", "llm-pool"): ("info", "llm-pool"),
        ("serving", "embedder"): ("info", "embedder-v2"),
        ("batch", "reranker"): ("info", "reranker"),
    }


def test_samples_with_malformed_labels_are_dropped_and_counted_not_fatal(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """A third-party JSON producer's labels that are not JSON: whose replicas they are
    cannot be told, so they are dropped; the rest of the target is still judged."""
    target = "ksm-malformed-labels:8080"
    broken = {"instance": target, "pool": "", "model": None, "dialect": "kube-state-metrics"}
    insert(
        store,
        engine=[
            engine_sample(T0_MS + t * 1000, "replicas_desired", 9, labels_json="{bad", **broken)
            for t in (500, 505)
        ],
    )
    with caplog.at_level(logging.WARNING, logger="slo.signals._autoscalers"):
        snap = snapshot(
            store, {**HEALTHY, "llm-pool": lagging_from(300, 1, 4)}, QUEUE_GROWS, None, target
        )
    assert snap.autoscalers[target].malformed_samples == 2
    assert any(target in r.getMessage() and "labels_json" in r.getMessage() for r in caplog.records)
    [found] = lag_findings(snap)
    assert (found.evidence["autoscaler"], found.evidence["desired"]) == ("serving/llm-pool", 4.0)
    metrics = JobMetrics()
    jobs = SloJobs(store.con, MODEL, JobsConfig(), sink=ListTransitionSink(), metrics=metrics)
    assert jobs.run_once(NOW_MS) is not None
    assert (
        metrics.registry.get_sample_value(
            "llmslo_autoscaler_samples_malformed", {"instance": target}
        )
        == 2.0
    )


def test_an_hpa_deleted_while_behind_is_no_longer_judged(store: Store) -> None:
    """Behind from t = 300 s, deleted with its deployment at 500 s: its rows stay in the
    lookback, but the target's newer scrapes no longer have it."""
    replicas = {**HEALTHY, "llm-pool": lagging_from(300, 1, 4)}

    def text_at(t: float) -> str:
        text = ksm_scrape(t, replicas)
        if t < 500:
            return text
        return "".join(line + "\n" for line in text.splitlines() if "llm-pool" not in line)

    store.commit_batch(
        {"engine_samples": scrape_rows(text_at)}, group_id="test", offsets={}, now_ts_ms=0
    )
    insert(store, engine=gateway_queue(QUEUE_GROWS))
    snap = load_snapshot(store.con, NOW_MS, int(CFG.lookback_s * 1000))
    assert "serving/llm-pool" in snap.autoscalers[KSM].paired  # still in the lookback
    assert lag_findings(snap) == []
