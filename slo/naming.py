"""The one alert-name convention: words in CamelCase, each word's first letter raised.

Signal alerts (``Llm`` + the signal, :mod:`slo.signals.catalog`) and SLO burn alerts
(``<name>BudgetBurn``, Sloth's ``<service><name>SloBurn``) are all built here, so the rule
file and the pusher cannot spell one event two ways.
"""

from __future__ import annotations

import re

__all__ = ["alert_name"]

_SEPARATORS = re.compile(r"[^A-Za-z0-9]+")


def alert_name(*parts: str) -> str:
    """``alert_name("llm", "ghost_requests") == "LlmGhostRequests"``: split every part on
    non-alphanumerics, raise each word's first letter, keep the rest as written."""
    words = (w for part in parts for w in _SEPARATORS.split(part) if w)
    return "".join(w[:1].upper() + w[1:] for w in words)
