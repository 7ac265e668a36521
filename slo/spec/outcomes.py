"""Outcome classes: which request records are good, bad or excluded events of an SLI.

A request record has an ``outcome`` (:data:`pipeline.schema.OUTCOMES`) and the HTTP status
the client got (``http_status``, null if none was sent). Every SLI that counts request
records classifies each one as

* ``good``: the service did its job (an ``ok`` record is always good; a latency SLI then
  also asks for its threshold);
* ``bad``: the service failed (it burns the error budget);
* ``excluded``: no event of this SLI (in neither the numerator nor the denominator).

A record's class is the first that applies of: its exact status (``"404"``), its status
class (``"4xx"``) — both only for records that are not ``ok`` —, its outcome. An outcome
missing from the table (none today) is bad. The defaults follow SLO practice; the table
and the reasoning are in ``slo/README.md``. The DuckDB SQL (:mod:`slo.rollups`), the rule
generator (:mod:`alerts.sources`) and the canary judge (:mod:`api.cohorts`) all render
the same :class:`OutcomeClasses`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pipeline.schema import OUTCOMES

__all__ = [
    "DEFAULT_OUTCOMES",
    "DEFAULT_STATUSES",
    "OUTCOME_CLASSES",
    "OutcomeClass",
    "OutcomeClasses",
    "check_outcome_table",
    "check_status_table",
]

OutcomeClass = Literal["good", "bad", "excluded"]
#: The three classes, in the order reports list them.
OUTCOME_CLASSES: tuple[OutcomeClass, ...] = ("good", "bad", "excluded")

#: The class of each outcome unless an SLI says otherwise (slo/README.md, "Outcome classes").
DEFAULT_OUTCOMES: Mapping[str, OutcomeClass] = {
    "ok": "good",
    "rejected": "bad",  # the service shed load (429/503 from a full queue, an L2 refusal)
    "error_before_first_token": "bad",  # 5xx, engine errors (client 4xx: by status below)
    "interrupted_after_first_token": "bad",
    "client_cancelled": "excluded",  # the client left: ghosts and abandonment signals count it
    "deadline_exceeded": "bad",  # the service missed the deadline the client set
    "upstream_timeout": "bad",
}
#: The class of a non-``ok`` record by the status the client got, before its outcome's.
DEFAULT_STATUSES: Mapping[str, OutcomeClass] = {
    "4xx": "excluded",  # the client's malformed request (400, 404, 413, 422…)
    "429": "bad",  # … except "too many requests": the service's own load shedding
}

#: Status keys: an exact 4xx/5xx code or a class (``4xx``, ``5xx``); 1xx–3xx never fail.
_STATUS_KEY = re.compile(r"^[45](\d\d|xx)$")


def check_outcome_table(table: Mapping[str, str]) -> Mapping[str, str]:
    """``table`` if its keys are outcomes other than ``ok``; raises ``ValueError``."""
    for key in table:
        if key == "ok":
            raise ValueError("'ok' is always good (the service did its job)")
        if key not in OUTCOMES:
            raise ValueError(f"unknown outcome {key!r} (known: {', '.join(OUTCOMES[1:])})")
    return table


def check_status_table(table: Mapping[str, str]) -> Mapping[str, str]:
    """``table`` if its keys are 4xx/5xx codes or classes; raises ``ValueError``."""
    for key in table:
        if not _STATUS_KEY.match(key):
            raise ValueError(f"status {key[:20]!r}: expected a 4xx/5xx code (404) or class (4xx)")
    return table


@dataclass(frozen=True)
class OutcomeClasses:
    """The resolved table of one SLI: every outcome's class and the status overrides."""

    outcomes: Mapping[str, OutcomeClass]
    statuses: Mapping[str, OutcomeClass]

    @classmethod
    def resolve(
        cls,
        outcomes: Mapping[str, OutcomeClass] | None = None,
        statuses: Mapping[str, OutcomeClass] | None = None,
    ) -> OutcomeClasses:
        """The defaults with a spec's ``outcomes`` and ``statuses`` entries laid over them."""
        return cls(
            {**DEFAULT_OUTCOMES, **(outcomes or {})},
            dict(sorted({**DEFAULT_STATUSES, **(statuses or {})}.items())),
        )

    def classify(self, outcome: str, http_status: int | None) -> OutcomeClass:
        """The class of one record (the reference the SQL and PromQL renderings follow)."""
        if outcome != "ok" and http_status is not None:
            by_status = self.statuses.get(str(http_status)) or self.statuses.get(
                f"{http_status // 100}xx"
            )
            if by_status is not None:
                return by_status
        return self.outcomes.get(outcome, "bad")

    def codes(self, klass: OutcomeClass) -> tuple[int, ...]:
        """Exact statuses of class ``klass``."""
        return tuple(int(k) for k, v in self.statuses.items() if k.isdigit() and v == klass)

    def families(self, klass: OutcomeClass) -> tuple[int, ...]:
        """Status classes (their first digit: 4 for ``4xx``) of class ``klass``."""
        return tuple(int(k[0]) for k, v in self.statuses.items() if k.endswith("xx") and v == klass)

    def outcomes_of(self, klass: OutcomeClass) -> tuple[str, ...]:
        """Outcomes of class ``klass`` (when no status applies), in :data:`OUTCOMES` order."""
        return tuple(o for o in OUTCOMES if self.outcomes.get(o, "bad") == klass)

    @property
    def excludes_nothing(self) -> bool:
        """No record is excluded (every record is an event)."""
        return "excluded" not in self.outcomes.values() and "excluded" not in self.statuses.values()
