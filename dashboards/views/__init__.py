"""The dashboard pages, one module each; :data:`PAGES` maps URL path to (title, page)."""

from __future__ import annotations

from collections.abc import Callable

from dashboards.views import canary, engines, flags, fleet, gpus, latency, requests, slo

__all__ = ["PAGES"]

#: URL path (deep-link contract) → (title, icon, page function), in menu order.
PAGES: dict[str, tuple[str, str, Callable[[], None]]] = {
    "fleet": ("Fleet", ":material/dashboard:", fleet.PAGE),
    "slo": ("SLO", ":material/target:", slo.PAGE),
    "latency": ("Latency", ":material/timer:", latency.PAGE),
    "engines": ("Engines", ":material/memory:", engines.PAGE),
    "gpus": ("GPUs", ":material/developer_board:", gpus.PAGE),
    "requests": ("Requests", ":material/swap_horiz:", requests.PAGE),
    "flags": ("Flags & findings", ":material/flag:", flags.PAGE),
    "canary": ("Canary", ":material/science:", canary.PAGE),
}
