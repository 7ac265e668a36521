"""Alert-window catalogs (data) and the multi-window, multi-burn-rate maths.

A catalog is a YAML file under ``slo/windows/`` naming an SLO period and four window
pairs, each with the share of the error budget it should catch. The burn-rate factor of a
pair is *derived* (Sloth's approach, Google SRE Workbook ch. 5)::

    factor = budget_percent / 100 × period / long_window

so a 30-day period gives 14.4 / 6 / 3 / 1 and a 28-day period 13.44 / 5.6 / 2.8 / 0.933.
Adding a period is adding a YAML file, not code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pipeline.config import load_yaml
from pipeline.errors import ConfigError
from pipeline.units import DAY_MS, HOUR_MS, MINUTE_MS, SECOND_MS

__all__ = [
    "CATALOG_DIR",
    "AlertPair",
    "WindowCatalog",
    "format_duration",
    "known_periods",
    "load_catalog",
    "parse_duration_ms",
]

#: Where the shipped catalogs live: ``google-30d.yaml``, ``google-28d.yaml``, ``google-7d.yaml``.
CATALOG_DIR = Path(__file__).parent / "windows"

_UNITS_MS = {"ms": 1, "s": SECOND_MS, "m": MINUTE_MS, "h": HOUR_MS, "d": DAY_MS, "w": 7 * DAY_MS}
_DURATION = re.compile(r"^(\d{1,9})(ms|s|m|h|d|w)$")


def parse_duration_ms(text: str) -> int:
    """``"5m"`` → 300000. One positive integer and one unit of ms, s, m, h, d, w; raises ValueError.

    The one duration grammar of specs, CLI options and URL parameters (callers add their own
    bounds, as the read API caps ranges)."""
    match = _DURATION.match(text.strip()) if isinstance(text, str) else None
    if not match:
        raise ValueError(f"not a duration like 5m, 1h or 30d: {text!r}")
    if int(match.group(1)) == 0:
        raise ValueError(f"a duration must be longer than zero: {text!r}")
    return int(match.group(1)) * _UNITS_MS[match.group(2)]


def format_duration(ms: int) -> str:
    """The shortest exact form: 300000 → ``"5m"``, 86400000 → ``"1d"`` (never weeks)."""
    for unit in ("d", "h", "m", "s"):
        if ms % _UNITS_MS[unit] == 0:
            return f"{ms // _UNITS_MS[unit]}{unit}"
    return f"{ms}ms"


@dataclass(frozen=True)
class AlertPair:
    """One short/long window pair of a severity tier, with its derived burn-rate factor.

    The pair alerts when the burn rate over *both* windows exceeds ``factor``.
    """

    severity: str  # page | ticket
    name: str  # quick | slow
    budget_percent: float
    short_ms: int
    long_ms: int
    factor: float

    @property
    def id(self) -> str:
        """Stable id such as ``page-1h-5m`` (long window first, as the Workbook writes it)."""
        return f"{self.severity}-{format_duration(self.long_ms)}-{format_duration(self.short_ms)}"


@dataclass(frozen=True)
class WindowCatalog:
    """An SLO period and its alert pairs."""

    name: str
    period_ms: int
    pairs: tuple[AlertPair, ...]

    @property
    def windows_ms(self) -> tuple[int, ...]:
        """Every distinct window an evaluation needs (pairs and the period), ascending."""
        found = {self.period_ms}
        for pair in self.pairs:
            found |= {pair.short_ms, pair.long_ms}
        return tuple(sorted(found))


def burn_rate_factor(budget_percent: float, period_ms: int, long_ms: int) -> float:
    """Burn rate that spends ``budget_percent`` of the period's budget within ``long_ms``."""
    return round(budget_percent / 100.0 * period_ms / long_ms, 10)


def _parse_catalog(name: str, raw: object) -> WindowCatalog:
    if not isinstance(raw, dict) or not isinstance(raw.get("pairs"), list):
        raise ConfigError(f"window catalog {name}: needs 'period' and a list of 'pairs'")
    try:
        period_ms = parse_duration_ms(raw["period"])
        pairs = []
        for item in raw["pairs"]:
            short_ms, long_ms = parse_duration_ms(item["short"]), parse_duration_ms(item["long"])
            budget = float(item["budget_percent"])
            if not 0 < budget <= 100 or not short_ms < long_ms <= period_ms:
                raise ValueError(
                    f"pair {item} must have 0 < budget ≤ 100 and short < long ≤ period"
                )
            factor = burn_rate_factor(budget, period_ms, long_ms)
            pairs.append(
                AlertPair(item["severity"], item["name"], budget, short_ms, long_ms, factor)
            )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"window catalog {name}: {exc}") from exc
    return WindowCatalog(name, period_ms, tuple(pairs))


def known_periods(directory: Path = CATALOG_DIR) -> tuple[str, ...]:
    """Periods with a shipped catalog, e.g. ``("28d", "30d", "7d")``."""
    return tuple(sorted(p.stem.removeprefix("google-") for p in directory.glob("google-*.yaml")))


@cache
def load_catalog(period: str, directory: Path = CATALOG_DIR) -> WindowCatalog:
    """The shipped catalog for ``period`` (``30d``, ``28d``, ``7d``); ConfigError if none."""
    path = directory / f"google-{period}.yaml"
    if not path.is_file():
        known = sorted(p.stem.removeprefix("google-") for p in directory.glob("google-*.yaml"))
        raise ConfigError(
            f"no alert-window catalog for period {period!r} (known: {', '.join(known)})"
        )
    return _parse_catalog(path.name, load_yaml(path.read_text(encoding="utf-8"), str(path)))
