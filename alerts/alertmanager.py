"""An Alertmanager routing and inhibition snippet for the generated alerts.

Receivers ``page`` and ``ticket`` are placeholders (no integration): point them at your
pager and ticket system. Inhibitions (DESIGN §5):

* a page inhibits the ticket of the same SLO (``slo_id``);
* degradation level L3 (``LlmDegradationLevel``, the rule's and the pushed alert alike)
  inhibits L2 and L1 of the same instance, and a pool's L3 (pushed, ``scope="pool"``)
  those of the same pool;
* an engine stall inhibits the latency burn alerts (``sli_kind="latency"``) of the same
  instance (latency SLOs grouped by instance carry it).

Alertmanager counts a label missing on both alerts as equal, so each source matcher requires
the label its rule compares: without it a page with no ``slo_id`` (a stall, an L3) would
silence every ticket that has none either (crashes, ghosts, L2s), and a pool's L3 every
pool's L2.
"""

from __future__ import annotations

from typing import Any

from slo.signals.catalog import FLAG, NOTICES, SIGNALS

__all__ = ["alertmanager_config"]

_FLAG = NOTICES[FLAG].alert


def alertmanager_config(group_wait: str = "30s", repeat_interval: str = "4h") -> dict[str, Any]:
    """A complete Alertmanager config (``amtool check-config`` accepts it) as a dict."""
    return {
        "route": {
            "receiver": "ticket",
            "group_by": ["alertname", "slo_id", "instance"],
            "group_wait": group_wait,
            "group_interval": "5m",
            "repeat_interval": repeat_interval,
            "routes": [
                {"receiver": "page", "matchers": ['severity="page"']},
                {"receiver": "ticket", "matchers": ['severity="ticket"']},
            ],
        },
        "receivers": [{"name": "page"}, {"name": "ticket"}],
        "inhibit_rules": [
            {
                "source_matchers": ['severity="page"', 'slo_id=~".+"'],
                "target_matchers": ['severity="ticket"'],
                "equal": ["slo_id"],
            },
            {
                "source_matchers": [f'alertname="{_FLAG}"', 'level="L3"', 'instance=~".+"'],
                "target_matchers": [f'alertname="{_FLAG}"', 'level=~"L1|L2"'],
                "equal": ["instance"],
            },
            {
                "source_matchers": [f'alertname="{_FLAG}"', 'level="L3"', 'scope="pool"'],
                "target_matchers": [f'alertname="{_FLAG}"', 'level=~"L1|L2"', 'pool=~".+"'],
                "equal": ["pool"],
            },
            {
                "source_matchers": [
                    f'alertname="{SIGNALS["stall"].alert}"',
                    'instance=~".+"',
                ],
                "target_matchers": ['sli_kind="latency"'],
                "equal": ["instance"],
            },
        ],
    }
