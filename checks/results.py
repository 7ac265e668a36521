"""Rule results: each rule's static and live evidence side by side, one status per rule,
silences with their reason, the exit decision of ``--fail-on``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from checks.catalog import SEVERITIES, Rule, Severity

__all__ = ["CheckReport", "Evidence", "RuleResult", "Status", "worst"]

Status = Literal["pass", "fail", "unknown"]


def worst(statuses: Iterable[Status]) -> Status:
    """Several verdicts of one side as one: any fail fails, else any unknown, else pass."""
    seen = set(statuses)
    return "fail" if "fail" in seen else "unknown" if "unknown" in seen else "pass"


@dataclass(frozen=True)
class Evidence:
    """One side's answer for one rule: its status and what it saw."""

    status: Status
    detail: str


@dataclass(frozen=True)
class RuleResult:
    """One rule with both sides. ``status``: fail if either side fails, pass if one passes
    and none fails, else unknown; ``silenced``: the reason given with ``--silence``."""

    rule: Rule
    static: Evidence
    live: Evidence
    silenced: str | None = None

    @property
    def status(self) -> Status:
        sides = (self.static.status, self.live.status)
        if "fail" in sides:
            return "fail"
        return "pass" if "pass" in sides else "unknown"

    def fails_at(self, fail_on: Severity) -> bool:
        """A failed, unsilenced rule at or above ``fail_on``."""
        above = SEVERITIES.index(self.rule.severity) >= SEVERITIES.index(fail_on)
        return self.status == "fail" and self.silenced is None and above


@dataclass(frozen=True)
class CheckReport:
    """Every rule's result, in table order."""

    results: tuple[RuleResult, ...]

    def exit_status(self, fail_on: Severity) -> int:
        """1 when a rule fails at or above ``fail_on``, else 0."""
        return int(any(r.fails_at(fail_on) for r in self.results))
