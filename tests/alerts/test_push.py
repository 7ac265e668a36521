"""Path B against a real Alertmanager on loopback: pushed alerts are visible (API and
amtool), inhibitions apply, cleared alerts resolve, and a restart loses nothing still firing.
``reconcile`` (the pure state logic) is tested on its own first."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

from alerts.client import AlertmanagerClient
from alerts.push import ActiveAlert, PushState, reconcile, to_rfc3339
from tests.alerts.conftest import Alertmanager, free_port
from tests.alerts.conftest import eventually as _eventually
from tests.conftest import require_tool

PAGE = ActiveAlert(
    {
        "alertname": "ChatTtftBudgetBurn",
        "slo_id": "chat-ttft",
        "severity": "page",
        "window": "1h-5m",
    },
    {"summary": "chat ttft burning 14.4× too fast", "evidence": "5m error ratio 0.2"},
    generator_url="http://127.0.0.1:8501/slo?slo=chat-ttft",
)
TICKET = ActiveAlert(
    {
        "alertname": "ChatTtftBudgetBurn",
        "slo_id": "chat-ttft",
        "severity": "ticket",
        "window": "1d-2h",
    }
)


def test_reconcile_sends_new_alerts_once_then_every_resend_interval() -> None:
    state, sent = reconcile(PushState(), [PAGE], now_s=1000.0, resend_s=60)
    assert sent == [
        {
            "labels": dict(PAGE.labels),
            "annotations": dict(PAGE.annotations),
            "startsAt": to_rfc3339(1000.0),
            "endsAt": to_rfc3339(1240.0),
            "generatorURL": PAGE.generator_url,
        }
    ]
    state, sent = reconcile(state, [PAGE], now_s=1030.0, resend_s=60)
    assert sent == []
    state, sent = reconcile(state, [PAGE], now_s=1060.0, resend_s=60)
    assert [(p["startsAt"], p["endsAt"]) for p in sent] == [(to_rfc3339(1000), to_rfc3339(1300))]
    assert state.firing == (PAGE,)


def test_reconcile_resolves_a_cleared_alert_once_with_its_original_start() -> None:
    state, _ = reconcile(PushState(), [PAGE, TICKET], now_s=1000.0)
    state, sent = reconcile(state, [TICKET], now_s=1010.0)
    assert sent == [
        {
            "labels": dict(PAGE.labels),
            "annotations": dict(PAGE.annotations),
            "startsAt": to_rfc3339(1000.0),
            "endsAt": to_rfc3339(1010.0),
            "generatorURL": PAGE.generator_url,
        }
    ]
    assert state.firing == (TICKET,)
    assert reconcile(state, [TICKET], now_s=1020.0)[1] == []


def test_reconcile_uses_the_conditions_start_and_resends_changed_evidence() -> None:
    early = ActiveAlert(PAGE.labels, PAGE.annotations, since_s=900.0)
    state, sent = reconcile(PushState(), [early], now_s=1000.0)
    assert sent[0]["startsAt"] == to_rfc3339(900.0)
    changed = ActiveAlert(PAGE.labels, {"evidence": "5m error ratio 0.4"}, since_s=900.0)
    _, sent = reconcile(state, [changed], now_s=1001.0)
    assert [(p["annotations"], p["startsAt"]) for p in sent] == [
        ({"evidence": "5m error ratio 0.4"}, to_rfc3339(900.0))
    ]


def _by_severity(manager: Alertmanager) -> dict[str, dict[str, Any]]:
    return {a["labels"].get("severity", a["labels"].get("level", "")): a for a in manager.alerts()}


def test_pushed_alerts_are_visible_inhibited_and_resolved(alertmanager: Alertmanager) -> None:
    amtool = require_tool("amtool")
    kv_l3 = ActiveAlert(
        {"alertname": "LlmDegradationLevel", "level": "L3", "instance": "pod-0:8000"}
    )
    kv_l2 = ActiveAlert(
        {"alertname": "LlmDegradationLevel", "level": "L2", "instance": "pod-0:8000"}
    )
    with AlertmanagerClient(alertmanager.url) as client:
        state, payloads = reconcile(PushState(), [PAGE, TICKET, kv_l3, kv_l2], now_s=time.time())
        client.submit(payloads)
        assert client.flush()
        shown = _eventually(lambda: len(alertmanager.alerts()) == 4 and _by_severity(alertmanager))
        assert shown["page"]["generatorURL"] == PAGE.generator_url
        assert shown["page"]["annotations"]["evidence"] == "5m error ratio 0.2"

        def inhibited() -> dict[str, str] | None:
            states = {k: v["status"]["state"] for k, v in _by_severity(alertmanager).items()}
            return states if states.get("ticket") == states.get("L2") == "suppressed" else None

        states = _eventually(inhibited)
        assert states == {
            "page": "active",
            "ticket": "suppressed",
            "L3": "active",
            "L2": "suppressed",
        }

        def amtool_query(*flags: str) -> set[str]:
            query = subprocess.run(
                [
                    amtool, "alert", "query", "-o", "json", *flags,
                    f"--alertmanager.url={alertmanager.url}", "alertname=ChatTtftBudgetBurn",
                ],
                capture_output=True, text=True, timeout=30, check=True,
            )  # fmt: skip
            return {a["labels"]["severity"] for a in json.loads(query.stdout)}

        assert amtool_query() == {"page"}  # amtool hides inhibited alerts by default
        assert amtool_query("--active", "--inhibited") == {"page", "ticket"}

        _, payloads = reconcile(state, [TICKET, kv_l3, kv_l2], now_s=time.time())
        client.submit(payloads)
        assert client.flush()

        def page_resolved() -> dict[str, dict[str, Any]] | None:
            shown = _by_severity(alertmanager)
            return shown if "page" not in shown else None

        remaining = _eventually(page_resolved)
        assert sorted(remaining) == ["L2", "L3", "ticket"]
        assert remaining["ticket"]["status"]["state"] == "active"  # its page is gone


def test_restart_mid_run_loses_no_alert_that_still_fires(alertmanager: Alertmanager) -> None:
    clock = [0.0]
    with AlertmanagerClient(
        alertmanager.url, retries=2, backoff_s=0.01, timeout_s=1, clock=lambda: clock[0]
    ) as client:
        now = time.time()
        state, payloads = reconcile(PushState(), [PAGE], now_s=now, resend_s=1)
        client.submit(payloads)
        assert client.flush()
        assert _eventually(lambda: len(alertmanager.alerts()) == 1)

        alertmanager.stop()  # forgets every alert (only silences persist)
        state, payloads = reconcile(state, [PAGE], now_s=now + 1, resend_s=1)
        client.submit(payloads)
        delays = []
        for _ in range(4):
            assert not client.flush()
            delays.append(round(client.retry_in_s, 3))
            assert not client.flush()  # within the backoff: no attempt
            clock[0] += client.retry_in_s
        assert client.pending == 1
        assert delays == [0.01, 0.02, 0.04, 0.04]  # exponential backoff, capped at 2^retries
        assert client.errors._value.get() == 4

        alertmanager.start()
        assert client.flush()  # the queued re-send goes out once it is back
        shown = _eventually(alertmanager.alerts)
        assert [a["labels"]["severity"] for a in shown] == ["page"]
        assert shown[0]["startsAt"].startswith(to_rfc3339(now)[:19])


def test_queue_is_bounded_and_drops_are_counted() -> None:
    with AlertmanagerClient(f"http://127.0.0.1:{free_port()}", max_queue=3, retries=0) as client:
        _, payloads = reconcile(
            PushState(),
            [ActiveAlert({"alertname": "A", "n": str(i)}) for i in range(5)],
            now_s=1000.0,
        )
        client.submit(payloads)
        assert client.pending == 3
        assert (
            client.registry.get_sample_value(
                "llmslo_dropped_total",
                {"component": "alertmanager", "reason": "alertmanager_queue_full"},
            )
            == 2
        )
        assert not client.flush()
        assert client.pending == 3


def test_an_l3_or_a_page_silences_only_its_own_instance_pool_or_slo(
    alertmanager: Alertmanager,
) -> None:
    """Alertmanager counts a label missing on both sides as equal: a page without ``slo_id``
    or a pool's L3 must not silence the tickets and L2s of everything else."""

    def flag(level: str, scope: str, scope_id: str, pool: str) -> ActiveAlert:
        labels = {"alertname": "LlmDegradationLevel", "level": level, "scope": scope}
        return ActiveAlert({**labels, scope: scope_id, "pool": pool, "origin": "llmslo"})

    crash = ActiveAlert(
        {"alertname": "LlmCrash", "severity": "ticket", "instance": "pod-9:8000", "pool": "b"}
    )
    stall = ActiveAlert(
        {"alertname": "LlmEngineStalled", "severity": "page", "instance": "pod-1:8000"}
    )
    sent = {
        "pool a L3": flag("L3", "pool", "a", "a"),
        "pool b L2": flag("L2", "pool", "b", "b"),
        "pod-0 (pool a) L2": flag("L2", "instance", "pod-0:8000", "a"),
        "pod-5 (pool b) L2": flag("L2", "instance", "pod-5:8000", "b"),
        "crash ticket": crash,
        "stall page": stall,
    }
    with AlertmanagerClient(alertmanager.url) as client:
        _, payloads = reconcile(PushState(), list(sent.values()), now_s=time.time())
        client.submit(payloads)
        assert client.flush()
    names = {alert.key: name for name, alert in sent.items()}

    def states() -> dict[str, str] | None:
        shown = {
            names[tuple(sorted(a["labels"].items()))]: a["status"]["state"]
            for a in alertmanager.alerts()
        }
        return shown if shown.get("pod-0 (pool a) L2") == "suppressed" else None

    assert _eventually(states) == {
        "pool a L3": "active",
        "pool b L2": "active",
        "pod-0 (pool a) L2": "suppressed",
        "pod-5 (pool b) L2": "active",
        "crash ticket": "active",
        "stall page": "active",
    }
