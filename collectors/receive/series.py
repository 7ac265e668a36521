"""What a decoded write holds, whatever its wire format: series with their samples.

Both doors (remote-write, OTLP) decode into a :class:`PushedBatch`, which the
:class:`collectors.receive.receiver.Receiver` turns into records. A request that cannot be
read at all raises :class:`RefusedWrite` (with the HTTP status the sender gets); a series
past a per-series bound is left out and counted in :attr:`PushedBatch.refused`.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

import numpy as np

from collectors.receive.config import ReceiveLimits
from pipeline.errors import DecodeError

__all__ = [
    "STALE",
    "STALE_NAN_BITS",
    "KnownSeries",
    "PushedBatch",
    "PushedSeries",
    "RefusedWrite",
    "is_stale",
    "target_of",
]

#: Prometheus' staleness marker: a NaN with this exact bit pattern ends a series.
STALE_NAN_BITS = 0x7FF0000000000002
_STALE = struct.pack("<Q", STALE_NAN_BITS)
#: The staleness marker as a float (what an OTLP point flagged "no recorded value" becomes).
STALE: float = struct.unpack("<d", _STALE)[0]


def is_stale(value: float) -> bool:
    """Whether ``value`` is Prometheus' staleness marker (not any NaN: NaN is "no value")."""
    return math.isnan(value) and struct.pack("<d", value) == _STALE


class RefusedWrite(DecodeError):
    """A write refused as a whole; ``status`` is the HTTP status the sender gets.

    4xx: the sender must not retry (the body will never be accepted); 503: retry later.
    """

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(reason, message)
        self.status = status


@dataclass(slots=True)
class PushedSeries:
    """One series of a write: its name, labels (``__name__`` included, sorted) and samples.

    Read-only once decoded (not frozen: a frozen dataclass costs twice as much to build, and
    one is built per series of every write).

    ``target`` is the values of its ``job`` and ``instance`` labels (``""`` when absent), the
    target it belongs to; ``samples`` are ``(timestamp_ms, value)``; ``family_type`` is the
    exposition type the sender declared (``None``: not declared in this write); ``delta``:
    each value is an increment (OTLP delta temporality) the receiver adds to the series'
    running total.
    """

    name: str
    labels: tuple[tuple[str, str], ...]
    target: tuple[str, str]
    samples: list[tuple[int, float]]
    family_type: str | None = None
    delta: bool = False


@dataclass(frozen=True)
class KnownSeries:
    """One-sample series of a write that the receiver already knows, left as columns.

    ``slots[i]`` is the receiver's slot of the series (what
    :meth:`collectors.receive.receiver.Receiver.known_series` maps its serialised labels to),
    ``timestamp_ms[i]`` and ``value[i]`` its sample, ``positions[i]`` its place in the request.
    """

    slots: np.ndarray
    timestamp_ms: np.ndarray
    value: np.ndarray
    positions: np.ndarray


@dataclass
class PushedBatch:
    """A decoded write: its series, family types it declared, and what was refused.

    ``targets``: the target labels the sender declared per (job, instance) — OTLP's resource
    attributes; remote-write declares them with each target's ``up`` series instead.
    ``refused`` counts series (remote-write) or data points (OTLP) by reason.

    ``known``: the series the receiver already knows, as columns, when the decoder was given
    the receiver's known series; then ``positions[i]`` is the place of ``series[i]`` in the
    request and ``keys[i]`` its serialised labels (``b""``: not to be remembered).
    """

    series: list[PushedSeries] = field(default_factory=list)
    family_types: dict[str, str] = field(default_factory=dict)
    targets: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    known: KnownSeries | None = None
    positions: list[int] = field(default_factory=list)
    keys: list[bytes] = field(default_factory=list)

    def refuse(self, reason: str, detail: str, count: int = 1) -> None:
        """Count ``count`` series refused for ``reason``; keep the first few details."""
        self.refused[reason] = self.refused.get(reason, 0) + count
        if len(self.errors) < 5:
            self.errors.append(f"{reason}: {detail}"[:300])

    @property
    def samples(self) -> int:
        known = len(self.known.slots) if self.known is not None else 0
        return known + sum(len(s.samples) for s in self.series)


def target_of(labels: tuple[tuple[str, str], ...]) -> tuple[str, str]:
    """The (``job``, ``instance``) label values of ``labels`` (``""`` when absent)."""
    named = dict(labels)
    return named.get("job", ""), named.get("instance", "")


def labels_refusal(labels: tuple[tuple[str, str], ...], limits: ReceiveLimits) -> str | None:
    """Why a series' labels are refused (``labels_per_series``, ``label_too_long``), or None."""
    if len(labels) > limits.max_labels_per_series:
        return "labels_per_series"
    longest = limits.max_label_value_bytes
    for name, value in labels:
        if len(name) > longest or len(value) > longest:
            return "label_too_long"
    return None
