"""``AlertmanagerClient``: posts alert payloads to Alertmanager's ``/api/v2/alerts``.

Bounded queue, one attempt per flush, exponential backoff between flushes, and counted
drops. Alertmanager validates each alert of a batch on its own: it stores the valid ones
and answers 400 naming the first invalid one. So :meth:`submit` checks every payload the
way Alertmanager does (:func:`alert_problem`) and drops an invalid one alone, counted
``llmslo_dropped_total{component="alertmanager",reason="alertmanager_invalid"}``; a 400
that still comes back is split into single-alert POSTs, so exactly the refused ones are
counted ``reason="alertmanager_rejected"``.

When Alertmanager is down or slow the payloads wait (up to ``max_queue``; the oldest are
dropped first, ``reason="alertmanager_queue_full"``). A :meth:`flush` never blocks its
caller longer than one POST (``timeout_s``): after a failed attempt the queue waits
``backoff_s`` · 2^(failures − 1) (at most 2^``retries`` · ``backoff_s``) and flushes in
between return at once. A timed-out POST may have been stored (Alertmanager answers after
it has stored), so it counts as ``llmslo_alertmanager_post_timeouts_total``, not as a
delivery failure, and its batch is sent again later: re-posting an alert with the same
labels only updates it. Re-sending while firing (:func:`alerts.push.reconcile`) restores
alerts after an Alertmanager restart. Never raises into the caller's loop: failures are
logged once per outage and counted.
"""

from __future__ import annotations

import logging
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
from prometheus_client import CollectorRegistry, Counter

from pipeline.publisher import PublishMetrics

__all__ = ["AlertmanagerClient", "alert_problem"]

log = logging.getLogger(__name__)

#: Alertmanager's label name rule (Prometheus' legacy one, enforced by ``/api/v2/alerts``).
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

_Outcome = Literal["sent", "rejected", "failed"]


def _time(value: object) -> datetime | None:
    if value in (None, ""):
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _names_problem(kind: str, pairs: object) -> str | None:
    if not isinstance(pairs, Mapping):
        return f"{kind} must be an object"
    for name, value in pairs.items():
        if not isinstance(name, str) or not _LABEL_NAME.fullmatch(name):
            return f"invalid {kind[:-1]} name {name!r}"
        if not isinstance(value, str):
            return f"{kind[:-1]} {name} is not a string"
    return None


def alert_problem(payload: Mapping[str, Any]) -> str | None:
    """Why Alertmanager would refuse ``payload`` (``None`` when it would store it): at
    least one non-empty label, label and annotation names ``[a-zA-Z_][a-zA-Z0-9_]*`` with
    string values, RFC 3339 ``startsAt``/``endsAt`` with start before end, and an absolute
    ``generatorURL``."""
    problem = _names_problem("labels", payload.get("labels"))
    if problem is None and not any(payload["labels"].values()):
        problem = "at least one label pair required"
    if problem is None and "annotations" in payload:
        problem = _names_problem("annotations", payload["annotations"])
    if problem is not None:
        return problem
    try:
        starts, ends = _time(payload.get("startsAt")), _time(payload.get("endsAt"))
    except ValueError as exc:
        return f"startsAt/endsAt not RFC 3339: {exc}"
    if starts is not None and ends is not None and starts > ends:
        return "start time must be before end time"
    url = payload.get("generatorURL")
    if url and not (isinstance(url, str) and urlsplit(url).scheme and urlsplit(url).netloc):
        return f"generatorURL {url!r} is not an absolute URL"
    return None


class AlertmanagerClient:
    """Sends alert payloads to one Alertmanager (``base_url`` such as ``http://127.0.0.1:9093``).

    ``clock`` (monotonic seconds) times the backoff; tests inject one to step it.
    """

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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = base_url.rstrip("/") + "/api/v2/alerts"
        self._queue: deque[dict[str, Any]] = deque()
        self._max_queue = max_queue
        self._batch = batch_size
        self._retries = retries
        self._backoff_s = backoff_s
        self._clock = clock
        self._http = httpx.Client(timeout=timeout_s, transport=transport)
        self._failures = 0
        self._next_attempt_s = float("-inf")
        registry = registry or CollectorRegistry()
        self.registry = registry
        self.sent = Counter(
            "llmslo_alertmanager_alerts_sent",
            "Alert payloads Alertmanager accepted",
            registry=registry,
        )
        self.errors = Counter(
            "llmslo_alertmanager_post_errors",
            "POSTs to Alertmanager that failed (connection error or 5xx)",
            registry=registry,
        )
        self.timeouts = Counter(
            "llmslo_alertmanager_post_timeouts",
            "POSTs to Alertmanager without an answer within timeout_s (possibly stored)",
            registry=registry,
        )
        self.drops = PublishMetrics("alertmanager", registry)

    @property
    def pending(self) -> int:
        """Payloads waiting to be sent."""
        return len(self._queue)

    @property
    def retry_in_s(self) -> float:
        """Seconds until the next flush will post (0 when it posts at once)."""
        return max(0.0, self._next_attempt_s - self._clock())

    def submit(self, payloads: Iterable[dict[str, Any]]) -> None:
        """Queue payloads: one Alertmanager would refuse is dropped alone (logged, counted),
        and beyond ``max_queue`` the oldest are dropped (and counted)."""
        for payload in payloads:
            problem = alert_problem(payload)
            if problem is not None:
                log.warning("alert %s not sent, Alertmanager would refuse it: %s",
                            payload.get("labels"), problem)  # fmt: skip
                self.drops.dropped("alertmanager_invalid", 1)
                continue
            if len(self._queue) >= self._max_queue:
                self._queue.popleft()
                self.drops.dropped("alertmanager_queue_full", 1)
            self._queue.append(payload)

    def flush(self) -> bool:
        """Send what is queued, one attempt per batch, stopping at the first failure;
        during a backoff returns at once. True when the queue is empty afterwards."""
        if self._queue and self._clock() < self._next_attempt_s:
            return False
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
                self._post_one_by_one(batch)
        return True

    def _post_one_by_one(self, batch: list[dict[str, Any]]) -> None:
        """A refused batch, alert by alert: Alertmanager stored the valid ones already
        (re-posting only updates them), and counting the others needs their own answers."""
        if len(batch) == 1:
            self.drops.dropped("alertmanager_rejected", 1)
            return
        for i, payload in enumerate(batch):
            outcome = self._post([payload])
            if outcome == "failed":  # gone meanwhile: the rest waits for the next flush
                self._queue.extendleft(reversed(batch[i:]))
                return
            if outcome == "sent":
                self.sent.inc()
            else:
                self.drops.dropped("alertmanager_rejected", 1)

    def _post(self, batch: list[dict[str, Any]]) -> _Outcome:
        """``sent``, ``rejected`` (a 4xx: retrying cannot help) or ``failed``."""
        try:
            response = self._http.post(self.url, json=batch)
        except httpx.TimeoutException as exc:
            self.timeouts.inc()
            return self._failed(len(batch), f"no answer within the timeout ({exc!r})")
        except httpx.HTTPError as exc:
            self.errors.inc()
            return self._failed(len(batch), f"{type(exc).__name__}: {exc}")
        if response.status_code < 300:
            if self._failures:
                log.info("alertmanager %s reachable again", self.url)
            self._failures, self._next_attempt_s = 0, float("-inf")
            return "sent"
        problem = f"HTTP {response.status_code}: {response.text[:200]}"
        if 400 <= response.status_code < 500:
            log.warning("alertmanager %s refused %d alerts: %s", self.url, len(batch), problem)
            return "rejected"
        self.errors.inc()
        return self._failed(len(batch), problem)

    def _failed(self, size: int, problem: str) -> _Outcome:
        if not self._failures:
            log.warning(
                "alertmanager %s: %s; keeping %d alerts and retrying with backoff",
                self.url,
                problem,
                max(size, len(self._queue)),
            )
        self._failures += 1
        delay_s = self._backoff_s * 2 ** min(self._failures - 1, self._retries)
        self._next_attempt_s = self._clock() + delay_s
        return "failed"

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._http.close()

    def __enter__(self) -> AlertmanagerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
