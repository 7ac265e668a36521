"""The drill's profile (its compressed timings, stated in the report), the config it gives
the pipeline, one fleet's run record and the scheduling helpers :mod:`llmslo.drill.matrix` and
:mod:`llmslo.drill.fleet` share."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from llmslo.drill.modes import DrillMode
from llmslo.drill.score import FalsePositive
from llmslo.sections import parse_config
from pipeline.config import LlmsloConfig

__all__ = [
    "DrillProfile",
    "FleetRun",
    "drill_config",
    "fleet_rng",
    "injection_times",
    "sleep_until",
]


@dataclass(frozen=True)
class DrillProfile:
    """Timings (seconds) and sizes of a drill (the 26-mode matrix planned as 12 fleets and
    the control, two at a time on 2 cores; ``docs/drills.md`` has the measured wall time).

    Compressed against the production defaults, and stated in every report: scrape and
    jobs every 2 s (5 s and 15 s), ``stall_for_s`` 20 (60), flag dwell 20 s (120),
    fragmentation/queue windows 40 s (300/120), ghost window 20 s (60), detector lookback
    60 s (600), a crash reported 40 s after the restart (300). Everything else (the fault, the engine's speed,
    the other detector thresholds, the SLO windows) runs as in production.
    ``healthy_load``: the control fleet's offered load as a share of the rate one pod serves
    without degrading (``simulator.capacity.sustainable_capacity``); ``None`` runs it at
    ``rate_per_pod``. ``prefill_chunk_tokens``: the pods' step budget, the demo's 256 (an
    operator's setting for the example spec's 30 ms ITL-jitter target; the engine default
    512 leaves ~5 ms of modelled margin, so host scheduling noise alone burns that SLO).
    """

    warmup_s: float = 30.0
    jitter_s: float = 15.0  # injection at warm-up + uniform(0, jitter)
    hold_s: float = 50.0  # a mode's own DrillMode.hold_s (the fast ones: 30) wins
    clear_s: float = 40.0
    scrape_s: float = 2.0
    interval_s: float = 2.0
    stall_for_s: float = 20.0
    dwell_s: float = 20.0
    detector_window_s: float = 40.0  # fragmentation_for_s and queue_for_s (defaults 300, 120)
    edge_window_s: float = 20.0  # entry_window_s and gateway_window_s (defaults 60, 60)
    probe_interval_s: float = 2.0  # the prober's interval where a gateway runs (default 10)
    lookback_s: float = 60.0  # raw rows per cycle (default 600): hot_instance compares halves
    restart_hold_s: float = 40.0  # a crash stays reported this long (default 300)
    rate_per_pod: float = 1.5  # requests per second (the mode fleets)
    healthy_load: float | None = None  # control's share of sustainable capacity; None: rate_per_pod
    prefill_chunk_tokens: int = 256  # the pods' engine step budget (engine default 512)
    start_gap_s: float = 20.0  # least time between two fleets' starts (llmslo.drill.jobs)
    modes_per_fleet: int = 7
    healthy_pods: int = 2
    healthy_minutes: float = 2.0
    seed: int = 0
    hogs: int = 0  # busy processes beside the fleets for the whole drill (llmslo.drill.hogs)
    hog_class: str = "besteffort"  # their CPU weight (llmslo.drill.hogs.HOG_CLASSES)


@dataclass
class FleetRun:
    """One fleet of the drill: its modes, its healthy instances and its false positives."""

    name: str
    modes: list[str]
    healthy_instances: list[str]
    minutes: float
    false_positives: list[FalsePositive] = field(default_factory=list)
    rate_per_pod: float = 0.0  # requests per second offered to each pod
    load_share: float | None = None  # rate_per_pod / one pod's saturated throughput
    sustainable_share: float | None = None  # rate_per_pod / the rate served without degrading
    alerts: list[str] = field(default_factory=list)  # every alertname Alertmanager received
    harness_lag_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # loop lateness
    inject_s: list[float] = field(default_factory=list)  # each mode's injection, s from start
    started_ts_ms: int = 0  # the start its schedule counts from: load begins (Unix epoch ms)
    wall_s: float | None = None  # the fleet's wall seconds, start-up to teardown
    setup_s: float | None = None  # of which starting it (Alertmanager, broker, pipeline, edges)


def drill_config(
    bootstrap: str,
    db: Path,
    profile: DrillProfile,
    gpu_pods: dict[str, str],
    alertmanager_url: str | None = None,
) -> LlmsloConfig:
    """Embedded defaults with the drill profile's compressed windows (and the alert pusher
    posting to ``alertmanager_url`` when given)."""
    window = profile.detector_window_s
    detectors = {
        "stall_for_s": profile.stall_for_s,
        "fragmentation_for_s": window,
        "queue_for_s": window,
        "lookback_s": profile.lookback_s,
        "entry_window_s": profile.edge_window_s,
        "gateway_window_s": profile.edge_window_s,
        "restart_hold_s": profile.restart_hold_s,
        "gpu_pods": gpu_pods,
        "kv_transfer_window_s": window / 2,
        "ghost_window_s": window / 2,
        "kv_index_window_s": window,
        "autoscaler_lag_for_s": window / 2,
    }
    raw = {
        "bus": {"bootstrap_servers": bootstrap, "partitions": 4},
        "store": {"path": str(db)},
        "ingest": {"group_id": "llmslo-drill", "batch_max_ms": 250},
        "slo": {
            "interval_s": profile.interval_s,
            "detectors": detectors,
            "flags": {"dwell_s": profile.dwell_s},
        },
    }
    if alertmanager_url is not None:
        raw["alertmanager"] = {"url": alertmanager_url}
    return parse_config(raw, source="drill profile")


def injection_times(
    modes: list[DrillMode], profile: DrillProfile, rng: random.Random
) -> list[float]:
    """Seconds from a fleet's start at which each mode's fault is set: the warm-up plus a
    seeded uniform draw in ``[0, jitter_s]``, so detection is not timed to a known moment."""
    return [round(profile.warmup_s + rng.uniform(0, profile.jitter_s), 1) for _ in modes]


def fleet_rng(seed: int, fleet_index: int) -> random.Random:
    """The random source of fleet ``fleet_index``'s injection moments: derived from (seed,
    index) alone, so they do not depend on which other fleets run or in what order."""
    return random.Random(f"llmslo-drill:{seed}:{fleet_index}")


def sleep_until(deadline: float) -> None:
    """Sleep until the monotonic clock reads ``deadline`` (at once if it is past)."""
    time.sleep(max(0.0, deadline - time.monotonic()))
