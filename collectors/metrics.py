"""The collector's own Prometheus metrics (served on its ``/metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["CollectorMetrics"]


class CollectorMetrics:
    """Scrape errors by target, durations, samples, bad lines, resets and drops by reason.

    Publishing to Kafka is counted by :class:`pipeline.publisher.PublishMetrics` (component
    ``collect``) in the same registry; its drops also land in ``llmslo_collect_dropped_total``
    through :meth:`count_drop`.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.scrapes = Counter(
            "llmslo_collect_scrapes", "Scrapes attempted, by target URL", ["target"], registry=r
        )
        self.scrape_errors = Counter(
            "llmslo_collect_scrape_errors",
            "Failed scrapes, by target and reason",
            ["target", "reason"],
            registry=r,
        )
        self.scrape_seconds = Histogram(
            "llmslo_collect_scrape_duration_seconds",
            "Time to fetch and parse one target",
            ["target"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.up = Gauge(
            "llmslo_collect_target_up",
            "1 if the last scrape of the target succeeded",
            ["target"],
            registry=r,
        )
        self.ready = Gauge(
            "llmslo_collect_target_ready",
            "1 if the last readiness probe (/health, /v1/models) of the target said ready",
            ["target"],
            registry=r,
        )
        self.samples = Counter("llmslo_collect_samples", "Samples scraped", ["target"], registry=r)
        self.bad_lines = Counter(
            "llmslo_collect_bad_lines",
            "Exposition lines that failed to parse, and series rejected for impossible values",
            ["target"],
            registry=r,
        )
        self.resets = Counter(
            "llmslo_collect_counter_resets",
            "Counter resets detected, by reason",
            ["target", "reason"],
            registry=r,
        )
        self.dropped = Counter(
            "llmslo_collect_dropped",
            "Samples dropped, by reason (blank_sentinel, buffer_full, and the impossible "
            "values of collectors.semantics: non_finite_value, negative_counter, ...)",
            ["reason"],
            registry=r,
        )
        self.rounds = Counter("llmslo_collect_rounds", "Scrape rounds completed", registry=r)
        self.round_seconds = Histogram(
            "llmslo_collect_round_duration_seconds",
            "Time of one whole scrape round",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.targets = Gauge(
            "llmslo_collect_targets", "Targets currently configured or discovered", registry=r
        )

    def count_drop(self, reason: str, rows: int) -> None:
        """Count ``rows`` samples dropped for ``reason`` (a publisher's drop hook)."""
        self.dropped.labels(reason).inc(rows)
