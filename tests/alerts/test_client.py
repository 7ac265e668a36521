"""``AlertmanagerClient`` against what Alertmanager really does: a slow one that stores
before it answers, and a batch with one alert it refuses (it stores the others)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from alerts.client import AlertmanagerClient
from alerts.push import ActiveAlert, PushState, reconcile, to_rfc3339
from tests.alerts.conftest import Alertmanager
from tests.alerts.conftest import eventually as _eventually
from tests.loopback import RecordingServer

_SLOW_S = 1.0
_TIMEOUT_S = 0.3


@pytest.fixture
def slow_alertmanager() -> Iterator[RecordingServer]:
    """Stores every POSTed batch, then answers 200 after ``_SLOW_S`` (an overloaded
    Alertmanager: the alerts are in, the answer is late)."""
    with RecordingServer(status=200, delay_s=_SLOW_S) as server:
        yield server


def _payloads(*alerts: ActiveAlert) -> list[dict[str, Any]]:
    return reconcile(PushState(), list(alerts), now_s=time.time())[1]


def test_a_slow_alertmanager_gets_one_post_per_flush_and_the_sender_is_not_blocked(
    slow_alertmanager: RecordingServer,
) -> None:
    with AlertmanagerClient(
        slow_alertmanager.url, timeout_s=_TIMEOUT_S, retries=3, backoff_s=0.5
    ) as client:
        client.submit(_payloads(ActiveAlert({"alertname": "ChatTtftBudgetBurn"})))
        started = time.perf_counter()
        assert not client.flush()
        blocked_s = time.perf_counter() - started
        assert not client.flush()  # backing off: returns at once, posts nothing
        blocked_twice_s = time.perf_counter() - started
        assert 0 < client.retry_in_s <= 0.5
        time.sleep(_SLOW_S)  # let the server's late answer finish
        assert [r.method for r in slow_alertmanager.received] == ["POST"]
        assert blocked_s < _TIMEOUT_S + 0.25 and blocked_twice_s < _TIMEOUT_S + 0.3
        assert client.timeouts._value.get() == 1 and client.errors._value.get() == 0
        assert client.pending == 1  # possibly stored: sent again later, which only updates it


def test_one_invalid_alert_does_not_cost_the_valid_ones_of_its_batch(
    alertmanager: Alertmanager,
) -> None:
    now = time.time()
    valid = _payloads(ActiveAlert({"alertname": "ChatTtftBudgetBurn", "severity": "page"}))
    backwards = {
        "labels": {"alertname": "Backwards"},
        "startsAt": to_rfc3339(now),
        "endsAt": to_rfc3339(now - 60),  # Alertmanager: "start time must be before end time"
    }
    nameless = {"labels": {"bad-name": "x"}, "startsAt": to_rfc3339(now)}
    with AlertmanagerClient(alertmanager.url, retries=0) as client:
        client.submit([*valid, backwards, nameless])
        assert client.flush()
        shown = _eventually(alertmanager.alerts)
        assert [a["labels"]["alertname"] for a in shown] == ["ChatTtftBudgetBurn"]
        dropped = {
            reason: client.registry.get_sample_value(
                "llmslo_dropped_total", {"component": "alertmanager", "reason": reason}
            )
            for reason in ("alertmanager_invalid", "alertmanager_rejected")
        }
        assert client.sent._value.get() == 1
        assert dropped == {"alertmanager_invalid": 2, "alertmanager_rejected": None}
