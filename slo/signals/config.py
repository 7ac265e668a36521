"""The ``detectors`` section of the SLO config: :class:`DetectorConfig`.

Each family's thresholds sit beside its detectors (``EngineThresholds`` in
:mod:`slo.signals.engine`, …; those several families read in
:class:`~slo.signals.findings.CommonThresholds`). :class:`DetectorConfig` inherits them all,
so users write one flat mapping (``detectors: {stall_for_s: 20, entry_window_s: 30}``) and
every detector reads ``cfg.<threshold>``.
"""

from __future__ import annotations

from collections.abc import Callable

from slo.signals.edge import EdgeThresholds
from slo.signals.engine import EngineThresholds
from slo.signals.failure import FailureThresholds
from slo.signals.findings import Finding
from slo.signals.health import HealthThresholds
from slo.signals.infra import InfraThresholds
from slo.signals.latency import LatencyThresholds
from slo.signals.snapshot import Snapshot
from slo.signals.traffic import TrafficThresholds

__all__ = ["Detector", "DetectorConfig", "Suspects"]


class DetectorConfig(
    TrafficThresholds,
    LatencyThresholds,
    FailureThresholds,
    EngineThresholds,
    HealthThresholds,
    EdgeThresholds,
    InfraThresholds,
):
    """Thresholds of every detector (seconds, fractions, counts), one flat model.

    It declares none of its own: a new threshold goes into its family's model.
    """


#: A detector: reads one snapshot with the thresholds, returns its findings.
Detector = Callable[[Snapshot, DetectorConfig], list[Finding]]

#: Where a cause explains symptoms though it has no finding now (pending, or just
#: cleared): reads one snapshot with the thresholds, returns instance → why.
Suspects = Callable[[Snapshot, DetectorConfig], dict[str, str]]
