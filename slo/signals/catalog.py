"""The signal catalog: the one place a failure signal is declared (DESIGN §2).

One :class:`Signal` row per emitted signal: its name, scope, detector, default severity,
alert name, dashboard page, runbook, whether the pool roll-up raises it on a pool, and the
drill modes that expect it. :data:`NOTICES` holds the alerts that are not findings (SLO burn
per SLI kind, the degradation flag). The detector list (``DETECTORS``), the pushed alerts,
the generated signature rules, the dashboards' markers and the drill matrix all derive from
these rows, so one event has one name and one severity everywhere.

Severities are the ones an on-call engineer acts on: ``page`` (user-visible now, wake
someone), ``ticket`` (self-healing or partial, fix in working hours), ``info``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from slo.naming import alert_name
from slo.signals.config import Detector, Suspects
from slo.signals.edge import (
    detect_entry_unavailable,
    detect_gateway_queue_full,
    detect_no_eligible_endpoint,
    detect_router_unavailable,
)
from slo.signals.engine import (
    detect_fragmentation,
    detect_ghosts,
    detect_oom_risk,
    detect_preemption_cascade,
    detect_queue_growth,
    detect_stall,
    stall_suspects,
)
from slo.signals.failure import detect_prefill_failure, detect_stream_interrupted
from slo.signals.health import (
    detect_model_load_failure,
    detect_not_ready,
    detect_restart,
    detect_target_down,
    detect_xid,
)
from slo.signals.infra import (
    detect_autoscaler_lag,
    detect_kv_index_stale,
    detect_kv_transfer_timeout,
)
from slo.signals.latency import detect_itl_jitter, detect_slow_decode, detect_slow_prefill
from slo.signals.traffic import (
    detect_hot_instance,
    detect_hot_rank,
    detect_numeric_anomaly,
    detect_retry_storm,
)
from slo.signals.xid import XID_CLASSES

__all__ = [
    "FLAG",
    "NOTICES",
    "RUNBOOK_BASE_URL",
    "SIGNALS",
    "Notice",
    "Signal",
    "detectors_of",
    "runbook_url",
    "signal",
]

#: Where the runbooks live when no ``runbook_base_url`` is configured (the repository's).
RUNBOOK_BASE_URL = "docs/runbooks"


def runbook_url(base_url: str, runbook: str) -> str:
    """``{base_url}/{runbook}.md``: the ``runbook_url`` annotation of an alert."""
    return f"{base_url.rstrip('/')}/{runbook}.md"


@dataclass(frozen=True)
class Signal:
    """One failure signal and everything derived from it.

    ``scope`` names what a finding's ``scope_id`` is: an engine ``instance``, a ``pool``, or an
    ``entry`` point (gateway, router, autoscaler target). ``family`` is the detector's key in
    ``DETECTORS`` when one detector emits several signals (XID: one per class). ``alert_stem``
    is the words of the alert name when they differ from the signal's (``stall`` alerts as
    ``LlmEngineStalled``). ``pooled``: the pool roll-up raises it on a pool held by most of its
    instances (false for signals that compare an instance with its pool). ``explains``: the
    symptoms this signal causes, as ``signal`` or ``signal:basis`` (a stall's growing queue
    with free KV is ``fragmentation:admission_signature``); on the same instance in the same
    cycle they are reported in its evidence (``explained``), not as findings of their own.
    ``suspects``: where the cause explains them though it may have no finding in this cycle
    (instance → ``pending`` before it is confirmed, ``open``, ``cleared`` for a hold after
    it ends), so they are not raised there either, in the cycles before or after its own.
    """

    name: str
    scope: str
    detector: Detector
    severity: str
    page: str
    first_steps: str
    drills: tuple[str, ...] = ()
    pooled: bool = True
    family: str | None = None
    alert_stem: str | None = None
    explains: tuple[str, ...] = ()
    suspects: Suspects | None = None

    @property
    def alert(self) -> str:
        """The alert name, on the pushed alert and on the generated rule."""
        return alert_name("llm", self.alert_stem or self.name)

    @property
    def runbook(self) -> str:
        """The runbook's file stem under ``docs/runbooks/``."""
        return self.name

    @property
    def detector_key(self) -> str:
        """The detector's name in ``DETECTORS`` (and in detector-failure logs and metrics)."""
        return self.family or self.name


@dataclass(frozen=True)
class Notice:
    """An alert that is not a finding: SLO burn of one SLI kind, or the degradation flag.

    ``first_steps`` maps a level (``""`` for SLO burn, ``"L2"``/``"L3"`` for the flag) to the
    hint on the alert; ``severities`` maps a flag level to its severity (empty for SLO burn,
    whose severity is the window pair's).
    """

    key: str
    runbook: str
    page: str
    first_steps: Mapping[str, str]
    alert: str = ""
    signal: str = ""
    severities: Mapping[str, str] = field(default_factory=dict)
    drills: tuple[str, ...] = ()


def _xid_rows() -> tuple[Signal, ...]:
    return tuple(
        Signal(
            c.signal, "instance", detect_xid, c.severity, "fleet", "", drills=("xid",), family="xid"
        )
        for c in XID_CLASSES.values()
    )


#: Every signal a detector emits, one row each, in ``DETECTORS`` order.
SIGNALS: Mapping[str, Signal] = {
    s.name: s
    for s in (
        Signal(
            "stall",
            "instance",
            detect_stall,
            "page",
            "engines",
            "work held and no tokens (running > 0, or waiting with nothing running) while "
            "/health may still answer 200: take the pod out of routing, check GPU activity and "
            "py-spy stacks per rank (NCCL hang or a stuck scheduler), then restart the whole group",
            drills=("stall", "wedge_waiting"),
            alert_stem="engine_stalled",
            explains=("fragmentation:admission_signature", "queue_growth"),
            suspects=stall_suspects,
        ),
        Signal(
            "ghost_requests",
            "instance",
            detect_ghosts,
            "ticket",
            "requests",
            "the engine keeps requests whose clients left: check that the tap/router closes "
            "upstream on disconnect and that the engine aborts them (finished_reason=abort)",
            drills=("ghost",),
        ),
        Signal(
            "preemption_cascade",
            "instance",
            detect_preemption_cascade,
            "ticket",
            "engines",
            "KV is exhausted and requests are recomputed: shed load or lower max_num_seqs / long "
            "prompts on this pool before the queue runs away",
            drills=("preemption_cascade",),
        ),
        Signal(
            "fragmentation",
            "instance",
            detect_fragmentation,
            "ticket",
            "engines",
            "free KV blocks exist but no contiguous run fits: drain and restart the instance (or "
            "reshard its KV pool) at a quiet moment",
            drills=("fragmentation",),
        ),
        Signal(
            "hot_instance",
            "instance",
            detect_hot_instance,
            "ticket",
            "fleet",
            "one instance takes far more than its share: check the router's hashing and prefix "
            "affinity, warm up a replica",
            drills=("hot_instance",),
            pooled=False,
        ),
        Signal(
            "retry_storm",
            "pool",
            detect_retry_storm,
            "ticket",
            "requests",
            "retries feed the overload: cap client retries (budget, backoff with jitter)",
            drills=("retry_storm",),
        ),
        Signal(
            "numeric_anomaly",
            "instance",
            detect_numeric_anomaly,
            "page",
            "requests",
            "NaN/corrupted outputs in a batch: fence the batch, fall back to a smaller batch, "
            "check the GPU (XID) and the model build",
            drills=("nan_burst",),
        ),
        Signal(
            "queue_growth",
            "instance",
            detect_queue_growth,
            "ticket",
            "engines",
            "waiting grows without bound: admission control (429 + Retry-After) beats letting "
            "queued requests time out",
            drills=("fragmentation",),
        ),
        Signal(
            "oom_risk",
            "instance",
            detect_oom_risk,
            "page",
            "gpus",
            "KV and frame buffer near full: stop admitting long prompts, move traffic to the "
            "small-model replica (L3)",
            drills=("kv_leak", "xid"),
        ),
        Signal(
            "target_down",
            "instance",
            detect_target_down,
            "page",
            "fleet",
            "",
            drills=("not_ready", "crash", "model_load_failure"),
        ),
        # A restart heals itself (restartPolicy: Always, LeaderWorkerSet rebuilds the group):
        # it is a ticket. A crash loop pages through target_down / worker_not_ready and the
        # availability SLO's burn.
        Signal(
            "crash",
            "instance",
            detect_restart,
            "ticket",
            "fleet",
            "",
            drills=("crash",),
        ),
        Signal(
            "worker_not_ready",
            "instance",
            detect_not_ready,
            "page",
            "fleet",
            "",
            drills=("not_ready", "model_load_failure"),
        ),
        Signal(
            "model_load_failure",
            "instance",
            detect_model_load_failure,
            "page",
            "fleet",
            "",
            drills=("model_load_failure",),
        ),
        *_xid_rows(),
        Signal(
            "slow_prefill",
            "instance",
            detect_slow_prefill,
            "ticket",
            "fleet",
            "",
            drills=("slow_prefill",),
            pooled=False,
        ),
        Signal(
            "slow_decode",
            "instance",
            detect_slow_decode,
            "ticket",
            "fleet",
            "",
            drills=("slow_decode",),
            pooled=False,
        ),
        Signal(
            "hot_rank",
            "instance",
            detect_hot_rank,
            "ticket",
            "fleet",
            "",
        ),
        Signal(
            "entry_unavailable",
            "entry",
            detect_entry_unavailable,
            "page",
            "fleet",
            "",
            drills=(
                "gateway_down",
                "gateway_down_dynamo",
                "router_down",
                "router_down_llm_d",
                "router_down_dynamo",
            ),
        ),
        Signal(
            "router_unavailable",
            "entry",
            detect_router_unavailable,
            "page",
            "fleet",
            "",
            drills=("router_down", "router_down_llm_d", "router_down_dynamo"),
        ),
        Signal(
            "no_eligible_endpoint",
            "entry",
            detect_no_eligible_endpoint,
            "page",
            "fleet",
            "",
        ),
        Signal(
            "gateway_queue_full",
            "entry",
            detect_gateway_queue_full,
            "page",
            "fleet",
            "",
        ),
        Signal(
            "kv_transfer_timeout",
            "instance",
            detect_kv_transfer_timeout,
            "ticket",
            "fleet",
            "",
            drills=("kv_transfer_timeout",),
        ),
        Signal(
            "kv_index_stale",
            "entry",
            detect_kv_index_stale,
            "ticket",
            "fleet",
            "",
            drills=("stale_kv_index",),
        ),
        Signal(
            "autoscaler_lag",
            "entry",
            detect_autoscaler_lag,
            "page",
            "fleet",
            "",
            drills=("autoscaler_lag",),
        ),
        Signal(
            "prefill_failure",
            "instance",
            detect_prefill_failure,
            "ticket",
            "fleet",
            "",
            drills=("prefill_failure",),
        ),
        Signal(
            "stream_interrupted",
            "instance",
            detect_stream_interrupted,
            "ticket",
            "fleet",
            "",
            drills=("failure_after_first_token",),
        ),
        Signal(
            "itl_jitter",
            "instance",
            detect_itl_jitter,
            "ticket",
            "fleet",
            "",
            drills=("itl_jitter",),
            pooled=False,
        ),
    )
}

#: The pseudo-signal of a drill mode that counts a degradation flag above L0 as detection.
FLAG = "flag"

#: The alerts that are not findings: SLO burn per SLI kind, and the degradation flag.
NOTICES: Mapping[str, Notice] = {
    n.key: n
    for n in (
        Notice(
            "slo:latency",
            "slo-latency",
            "slo",
            {
                "": "see the latency page for the pools and instances that burn; check for "
                "stalls, preemptions and slow prefill before scaling"
            },
        ),
        Notice(
            "slo:availability",
            "slo-availability",
            "slo",
            {
                "": "see outcomes by instance; errors before the first token point at admission "
                "or crashes, interrupted streams at the engine"
            },
        ),
        Notice(
            "slo:goodput",
            "slo-goodput",
            "slo",
            {"": "goodput burns when any latency target is missed: open the latency page"},
        ),
        # L1 is invisible to users (speculative decoding off), L2 partly (some 429s), L3 is a
        # real degradation (small model, banner): only L3 wakes someone.
        Notice(
            FLAG,
            "degradation-level",
            "flags",
            {
                "L2": "L2: reject prompts > 16K tokens with 429 + Retry-After until KV recovers",
                "L3": "L3: switch to the small-model replica, front end shows the economy-mode "
                "banner",
            },
            alert=alert_name("llm", "degradation_level"),
            signal="degradation",
            severities={"L1": "ticket", "L2": "ticket", "L3": "page"},
            drills=("kv_leak",),
        ),
    )
}


def signal(name: str) -> Signal:
    """The catalog row of ``name``; :class:`KeyError` for a signal nobody declared."""
    return SIGNALS[name]


def detectors_of(rows: Mapping[str, Signal]) -> dict[str, Detector]:
    """Detector key → detector, once per detector, in row order (``DETECTORS``)."""
    out: dict[str, Detector] = {}
    for row in rows.values():
        out.setdefault(row.detector_key, row.detector)
    return out
