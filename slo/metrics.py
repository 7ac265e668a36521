"""The jobs' own ``/metrics``: burn rates, budgets, alert pairs, flags, signals, job durations.

A private :class:`CollectorRegistry` per :class:`JobMetrics` so tests can read it directly
and several runners can live in one process. Gauges whose label sets come and go (groups,
signals) are cleared and re-set every cycle, so a resolved signal disappears.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from slo.evaluate import SloStatus
from slo.signals.detectors import Finding
from slo.signals.snapshot import Autoscalers
from slo.windows import format_duration

__all__ = ["JobMetrics", "group_label"]


def group_label(group: Mapping[str, str]) -> str:
    """``{"pool": "a"}`` → ``pool=a`` (empty string for an ungrouped SLO)."""
    return ",".join(f"{k}={v}" for k, v in sorted(group.items()))


class JobMetrics:
    """Prometheus metrics of ``llmslo jobs``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.burn_rate = Gauge(
            "llmslo_slo_burn_rate",
            "error ratio / (1 - objective) over a window",
            ["slo", "group", "window"],
            registry=r,
        )
        self.budget = Gauge(
            "llmslo_slo_error_budget_remaining_ratio",
            "share of the period's budget left",
            ["slo", "group"],
            registry=r,
        )
        self.sli = Gauge(
            "llmslo_slo_sli_ratio",
            "good / total over the period (absent without events)",
            ["slo", "group"],
            registry=r,
        )
        self.events = Gauge(
            "llmslo_slo_period_events", "events in the period", ["slo", "group"], registry=r
        )
        self.alert = Gauge(
            "llmslo_slo_alert_active",
            "1 while a window pair burns over its factor",
            ["slo", "group", "pair", "severity"],
            registry=r,
        )
        self.level = Gauge(
            "llmslo_degradation_level",
            "current L0-L3 level; -1 = unknown (target down or its data stale)",
            ["scope", "scope_id", "pool"],
            registry=r,
        )
        self.signal = Gauge(
            "llmslo_signal_active",
            "1 while a failure signature holds",
            ["signal", "scope", "scope_id", "pool", "basis"],
            registry=r,
        )
        self.transitions = Counter(
            "llmslo_flag_transitions", "degradation level changes", ["to_level"], registry=r
        )
        self.duration = Histogram(
            "llmslo_job_duration_seconds",
            "wall time of one job step",
            ["job"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.errors = Counter(
            "llmslo_job_errors",
            "job steps that failed (the next cycle retries)",
            ["job"],
            registry=r,
        )
        self.autoscalers_unpaired = Gauge(
            "llmslo_autoscalers_unpaired",
            "HPAs of a kube-state-metrics target that autoscaler_lag cannot judge (no "
            "workload paired), by reason",
            ["instance", "reason"],
            registry=r,
        )
        self.autoscaler_samples_malformed = Gauge(
            "llmslo_autoscaler_samples_malformed",
            "kube-state-metrics samples in the lookback dropped: labels_json is not JSON",
            ["instance"],
            registry=r,
        )
        self.last_eval = Gauge(
            "llmslo_job_last_evaluation_timestamp_seconds",
            "event time of the last cycle",
            registry=r,
        )

    def record_statuses(self, statuses: Iterable[SloStatus]) -> None:
        for gauge in (self.burn_rate, self.budget, self.sli, self.events, self.alert):
            gauge.clear()
        for status in statuses:
            slo, group = status.slo.id, group_label(status.group)
            for window, rate in status.burn_rates().items():
                self.burn_rate.labels(slo, group, format_duration(window)).set(rate)
            self.budget.labels(slo, group).set(status.budget_remaining)
            self.events.labels(slo, group).set(status.period.total)
            if status.sli is not None:
                self.sli.labels(slo, group).set(status.sli)
            for pair in status.pairs():
                self.alert.labels(slo, group, pair.pair.id, pair.pair.severity).set(
                    int(pair.alerting)
                )

    def record_findings(self, findings: Iterable[Finding]) -> None:
        self.signal.clear()
        for f in findings:
            self.signal.labels(f.signal, f.scope, f.scope_id, f.pool, f.basis).set(1)

    def record_autoscalers(self, autoscalers: Mapping[str, Autoscalers]) -> None:
        """This cycle's HPAs left unjudged and dropped samples, per kube-state-metrics target
        (re-set every cycle: a target whose problems went away shows none)."""
        self.autoscalers_unpaired.clear()
        self.autoscaler_samples_malformed.clear()
        for instance, scalers in autoscalers.items():
            if scalers.malformed_samples:
                self.autoscaler_samples_malformed.labels(instance).set(scalers.malformed_samples)
            for reason, count in Tally(scalers.unpaired.values()).items():
                self.autoscalers_unpaired.labels(instance, reason).set(count)

    def record_levels(self, levels: Mapping[tuple[str, str], tuple[str, int]]) -> None:
        """Every scope the jobs hold a level for (re-set every cycle: a forgotten one goes)."""
        self.level.clear()
        for (scope, scope_id), (pool, level) in levels.items():
            self.level.labels(scope, scope_id, pool).set(level)
