"""``AlertPusher``: path B wired. Each SLO-jobs cycle → active alerts → Alertmanager and the
``alerts`` table.

Per cycle (:meth:`AlertPusher.on_cycle`, the ``SloJobs(on_cycle=...)`` hook):
:func:`~alerts.active.active_alerts` → :func:`~alerts.push.reconcile` (wall-clock
``startsAt``/``endsAt``, as Alertmanager expects) → the payloads go to the
:class:`~alerts.client.AlertmanagerClient` on a sender thread (an Alertmanager outage never
slows the jobs; the client's bounded queue, backoff and counted drops absorb it, and one
flush waits for at most one POST, so the sender keeps taking new payloads), and every state
change (started, resolved) goes to ``record`` as ALERTS rows (the Kafka ``alerts`` topic in
``llmslo run``, the table itself in ``llmslo jobs``). Never raises into the jobs' cycle:
a failure is logged and counted (``llmslo_dropped_total{component="alerts",reason}``).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from prometheus_client import CollectorRegistry

from alerts.active import FlagLevel, active_alerts
from alerts.client import AlertmanagerClient
from alerts.config import AlertmanagerConfig
from alerts.push import ActiveAlert, PushState, reconcile
from alerts.records import AlertChange, alert_rows
from pipeline.publisher import PublishMetrics
from slo.jobs import CycleResult

__all__ = ["AlertPusher", "RecordSink", "restore_state"]

log = logging.getLogger(__name__)

#: The jobs' steps whose failure leaves a cycle's picture incomplete.
_INPUT_JOBS = frozenset({"evaluate", "snapshot", "signals", "flags"})
#: Writes ALERTS rows somewhere (publisher to the ``alerts`` topic, or the table).
RecordSink = Callable[[pa.Table], object]


def restore_state(active: pa.Table) -> PushState:
    """A :class:`PushState` from ``slo.queries.alerts(con)`` (the alerts recorded as firing),
    so a restarted pusher re-sends what still fires and resolves what cleared meanwhile,
    without recording them as new."""
    firing = []
    for row in active.to_pylist():
        alert = ActiveAlert(
            json.loads(row["labels_json"] or "{}"),
            json.loads(row["annotations_json"] or "{}"),
            row["generator_url"] or "",
        )
        firing.append((alert, (row["starts_ts_ms"] or row["ts_ms"]) / 1000))
    return PushState.restore(firing)


class _Sender:
    """The one thread that talks to Alertmanager: takes payload lists, submits and flushes."""

    def __init__(self, client: AlertmanagerClient, interval_s: float = 1.0) -> None:
        self.client = client
        self.interval_s = interval_s
        self._inbox: queue.SimpleQueue[list[dict[str, Any]]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="alertmanager-push", daemon=True)
        self._thread.start()

    def put(self, payloads: list[dict[str, Any]]) -> None:
        self._inbox.put(payloads)
        self._wake.set()

    def _drain(self) -> None:
        while True:
            try:
                self.client.submit(self._inbox.get_nowait())
            except queue.Empty:
                return

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            self._drain()
            if self.client.pending:
                self.client.flush()

    def close(self, timeout_s: float) -> None:
        """Stop the thread and flush once more (skipped while the client backs off)."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self._drain()
            if self.client.pending:
                self.client.flush()


class AlertPusher:
    """Computes, records and pushes path B's alerts, one SLO-jobs cycle at a time."""

    def __init__(
        self,
        config: AlertmanagerConfig,
        record: RecordSink,
        *,
        state: PushState | None = None,
        client: AlertmanagerClient | None = None,
        background: bool = True,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``client`` defaults to one for ``config.url`` (none without a URL: record only).
        ``background=False`` posts within :meth:`on_cycle` (tests, ``--once``)."""
        self.config = config
        self.record = record
        self.state = state or PushState()
        self.clock = clock
        self.metrics = PublishMetrics("alerts", registry)
        if client is None and config.url is not None:
            client = AlertmanagerClient(
                str(config.url),
                max_queue=config.max_queue,
                timeout_s=config.timeout_s,
                retries=config.retries,
                backoff_s=config.backoff_s,
                registry=self.metrics.registry,
            )
        self.client = client
        self._sender = _Sender(client) if client is not None and background else None
        self._pools: dict[str, str] = {}
        self._link_starts_ms = {key: int(s * 1000) for key, s in self.state.starts_s.items()}

    def on_cycle(self, result: CycleResult) -> list[AlertChange]:
        """The jobs hook: push and record what this cycle finds. Never raises.

        A cycle whose evaluation or detection failed is skipped: its empty lists mean "not
        known", not "clear", so nothing is resolved on its account.
        """
        failed = sorted({e.split(":", 1)[0] for e in result.errors} & _INPUT_JOBS)
        if failed:
            log.warning("alerts: cycle at %d skipped, %s failed", result.now_ms, ", ".join(failed))
            self.metrics.dropped("cycle_incomplete", 1)
            return []
        try:
            return self.push(result.now_ms, result)
        except Exception:  # the jobs' loop must not die on the alert path
            log.exception("alert push failed at %d", result.now_ms)
            self.metrics.dropped("push_failed", 1)
            return []

    def _flags(self, result: CycleResult) -> list[FlagLevel]:
        for transition in result.transitions:
            if transition.scope == "instance" and transition.pool:
                self._pools[transition.scope_id] = transition.pool
        for finding in result.findings:
            if finding.scope == "instance" and finding.pool:
                self._pools[finding.scope_id] = finding.pool
        # only the instances the jobs still hold a level for: the jobs forget departed pods
        self._pools = {i: p for i, p in self._pools.items() if ("instance", i) in result.flags}
        return [
            FlagLevel(
                scope,
                scope_id,
                scope_id if scope == "pool" else self._pools.get(scope_id),
                state.level,
                state.since_ts_ms,
            )
            for (scope, scope_id), state in sorted(result.flags.items())
        ]

    def push(self, now_ms: int, result: CycleResult) -> list[AlertChange]:
        """Reconcile the cycle's active alerts with what was sent; returns the state changes."""
        active = active_alerts(
            now_ms,
            result.statuses,
            result.findings,
            self._flags(result),
            dashboard_url=None
            if self.config.dashboard_url is None
            else str(self.config.dashboard_url),
            starts_ms=self._link_starts_ms,
            include_info=self.config.include_info,
            runbook_base_url=self.config.runbook_base_url,
        )
        # Links start where the alert first showed (event time), so they stay the same
        # while it fires and do not count as a change that forces a re-send.
        self._link_starts_ms = {
            alert.key: self._link_starts_ms.get(
                alert.key, now_ms if alert.since_s is None else int(alert.since_s * 1000)
            )
            for alert in active
        }
        before = self.state
        self.state, payloads = reconcile(before, active, self.clock(), self.config.resend_s)
        changes = self._changes(now_ms, before, self.state)
        if changes:
            self.record(alert_rows(changes))
        if payloads and self.client is not None:
            if self._sender is not None:
                self._sender.put(payloads)
            else:
                self.client.submit(payloads)
                self.client.flush()
        return changes

    @staticmethod
    def _changes(now_ms: int, before: PushState, after: PushState) -> list[AlertChange]:
        started = [
            AlertChange(now_ms, "firing", sent.alert, int(sent.starts_s * 1000))
            for key, sent in sorted(after.sent.items())
            if key not in before.sent
        ]
        resolved = [
            AlertChange(now_ms, "resolved", sent.alert, int(sent.starts_s * 1000))
            for key, sent in sorted(before.sent.items())
            if key not in after.sent
        ]
        return started + resolved

    def close(self, timeout_s: float = 10.0) -> None:
        """Send what is queued (bounded wait) and close the HTTP client."""
        if self._sender is not None:
            self._sender.close(timeout_s)
        if self.client is not None:
            self.client.close()
