"""``AlertmanagerClient``: posts alert payloads to Alertmanager's ``/api/v2/alerts``.

Bounded queue, retries with exponential backoff, and counted drops: when Alertmanager is
down the payloads wait (up to ``max_queue``; the oldest are dropped first and counted as
``llmslo_dropped_total{component="alertmanager",reason="alertmanager_queue_full"}``, the
family every bounded publisher shares), and the next :meth:`flush`
sends them. Re-sending while firing (:func:`alerts.push.reconcile`) is what restores
alerts after an Alertmanager restart. Never raises into the caller's loop: failures are
logged once per outage and counted.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, Counter

from pipeline.publisher import PublishMetrics

__all__ = ["AlertmanagerClient"]

log = logging.getLogger(__name__)


class AlertmanagerClient:
    """Sends alert payloads to one Alertmanager (``base_url`` such as ``http://127.0.0.1:9093``)."""

    def __init__(
        self,
        base_url: str,
        *,
        max_queue: int = 10_000,
        batch_size: int = 500,
        timeout_s: float = 5.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        registry: CollectorRegistry | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = base_url.rstrip("/") + "/api/v2/alerts"
        self._queue: deque[dict[str, Any]] = deque()
        self._max_queue = max_queue
        self._batch = batch_size
        self._retries = retries
        self._backoff_s = backoff_s
        self._sleep = sleep
        self._http = httpx.Client(timeout=timeout_s, transport=transport)
        self._failing = False
        registry = registry or CollectorRegistry()
        self.registry = registry
        self.sent = Counter(
            "llmslo_alertmanager_alerts_sent",
            "Alert payloads Alertmanager accepted",
            registry=registry,
        )
        self.errors = Counter(
            "llmslo_alertmanager_post_errors", "Failed POSTs to Alertmanager", registry=registry
        )
        self.drops = PublishMetrics("alertmanager", registry)

    @property
    def pending(self) -> int:
        """Payloads waiting to be sent."""
        return len(self._queue)

    def submit(self, payloads: Iterable[dict[str, Any]]) -> None:
        """Queue payloads; beyond ``max_queue`` the oldest are dropped (and counted)."""
        for payload in payloads:
            if len(self._queue) >= self._max_queue:
                self._queue.popleft()
                self.drops.dropped("alertmanager_queue_full", 1)
            self._queue.append(payload)

    def flush(self) -> bool:
        """Send everything queued; True when the queue is empty afterwards."""
        while self._queue:
            batch = [self._queue[i] for i in range(min(self._batch, len(self._queue)))]
            outcome = self._post(batch)
            if outcome == "failed":
                return False
            for _ in batch:
                self._queue.popleft()
            if outcome == "sent":
                self.sent.inc(len(batch))
            else:
                self.drops.dropped("alertmanager_rejected", len(batch))
        return True

    def _post(self, batch: list[dict[str, Any]]) -> str:
        """``sent``, ``rejected`` (a 4xx: retrying cannot help) or ``failed`` after retries."""
        problem = ""
        for attempt in range(self._retries + 1):
            if attempt:
                self._sleep(self._backoff_s * 2 ** (attempt - 1))
            try:
                response = self._http.post(self.url, json=batch)
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code < 300:
                    if self._failing:
                        log.info("alertmanager %s reachable again", self.url)
                    self._failing = False
                    return "sent"
                problem = f"HTTP {response.status_code}: {response.text[:200]}"
                if 400 <= response.status_code < 500:
                    log.warning(
                        "alertmanager %s refused %d alerts: %s", self.url, len(batch), problem
                    )
                    return "rejected"
            self.errors.inc()
        if not self._failing:
            log.warning(
                "alertmanager %s unreachable, keeping %d alerts: %s",
                self.url,
                len(self._queue),
                problem,
            )
        self._failing = True
        return "failed"

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._http.close()

    def __enter__(self) -> AlertmanagerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
