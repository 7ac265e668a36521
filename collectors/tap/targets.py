"""Per-request SLO targets a router stamps on a request, and a record judged against them.

llm-d's router (its SLO-aware scheduling) forwards a request's own latency targets as
``x-llm-d-slo-ttft-ms`` and ``x-llm-d-slo-tpot-ms`` (milliseconds). The tap records them
on the request's rows (``slo_ttft_s``, ``slo_tpot_s``) and whether the request met them
(``slo_met``): goodput per request against its own SLO rather than one spec's threshold.

The headers are client input: a value is a target only when it is a decimal number in
(0, :data:`MAX_TARGET_MS`] ms; anything else is ignored (the request is judged against the
targets that are usable, or none) and reported for the caller to count. A target is a
column value, never a grouping key, and never an error for the client.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from pipeline.schema import MAX_OWN_TARGET_S

__all__ = ["MAX_TARGET_MS", "NO_TARGETS", "OwnTargets", "met_own_targets", "parse_own_targets"]

#: The largest target accepted, ms: the record schema's bound (beyond it, a mistake).
MAX_TARGET_MS = MAX_OWN_TARGET_S * 1000.0


@dataclass(frozen=True)
class OwnTargets:
    """A request's own latency targets in seconds; ``None`` where it set none (or an unusable one)."""

    ttft_s: float | None = None
    tpot_s: float | None = None

    @property
    def any(self) -> bool:
        """The request carries at least one usable target."""
        return self.ttft_s is not None or self.tpot_s is not None


#: A request without targets.
NO_TARGETS = OwnTargets()


#: A target as written: decimal digits with an optional fraction (no sign, exponent, ``_``).
_DECIMAL = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,6})?")


def _target_s(raw: str) -> float | None:
    """``raw`` ms as seconds, or ``None`` unless it is a decimal number in (0, MAX_TARGET_MS]."""
    text = raw.strip()
    if _DECIMAL.fullmatch(text) is None:
        return None
    value = float(text)
    return value / 1000.0 if 0 < value <= MAX_TARGET_MS else None


def parse_own_targets(
    headers: Mapping[str, str], *, ttft_header: str, tpot_header: str
) -> tuple[OwnTargets, tuple[str, ...]]:
    """The targets ``headers`` carry, and one ``bad_slo_<metric>_header`` per unusable value.

    A header absent is no target and no problem. Never raises (hot path).
    """
    found: dict[str, float | None] = {}
    problems: list[str] = []
    for metric, header in (("ttft", ttft_header), ("tpot", tpot_header)):
        raw = headers.get(header)
        found[metric] = None if raw is None else _target_s(raw)
        if raw is not None and found[metric] is None:
            problems.append(f"bad_slo_{metric}_header")
    if found["ttft"] is None and found["tpot"] is None:
        return NO_TARGETS, tuple(problems)
    return OwnTargets(found["ttft"], found["tpot"]), tuple(problems)


def met_own_targets(targets: OwnTargets, ttft_s: float | None, tpot_s: float | None) -> bool | None:
    """Whether the measured latencies are within the request's own targets.

    Each target is judged where its latency was measured (TPOT needs two tokens, TTFT a
    first token): ``False`` if any measured one exceeds its target, ``True`` if all measured
    ones are within theirs, ``None`` without targets or without any targeted measurement
    (a request that failed before its first token: its outcome judges it).
    """
    judged = [
        value <= target
        for target, value in ((targets.ttft_s, ttft_s), (targets.tpot_s, tpot_s))
        if target is not None and value is not None
    ]
    return all(judged) if judged else None
