"""The router's verdict on requests' own latency targets, as llm-d's EPP gives it.

llm-d's router reads a request's targets from ``x-llm-d-slo-ttft-ms`` and
``x-llm-d-slo-tpot-ms`` (milliseconds) and, when the response has ended, counts one violation
per target its own measurement missed (``llm_d_epp_request_slo_violation_total{type}``):

* TTFT: from the request's arrival at the router (its flow-control queue included) to the
  first token-bearing chunk of the stream; for an answer that is not a stream, its whole
  latency;
* TPOT: (end of the stream − first token) / (tokens − 1), for two tokens or more.

Only a response that ended (200, stream complete) is judged: a cut stream or a refusal has
no verdict here (its outcome is the taps' to count). A header that is not a positive decimal
number of at most 10 minutes is no target. Each gateway request with a target gets a
:class:`ResponseTimer`; requests without one cost nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["TPOT_HEADER", "TTFT_HEADER", "OwnTargets", "ResponseTimer", "read_targets"]

TTFT_HEADER = "x-llm-d-slo-ttft-ms"
TPOT_HEADER = "x-llm-d-slo-tpot-ms"
#: The largest target taken, ms (the record schema's bound on the tap's side).
MAX_TARGET_MS = 600_000.0
#: An SSE event longer than this (bytes) is not a chunk of ours: dropped, not buffered.
MAX_EVENT_BYTES = 1 << 20


@dataclass(frozen=True)
class OwnTargets:
    """A request's own targets, seconds; ``None`` where it set none (or an unusable one)."""

    ttft_s: float | None = None
    tpot_s: float | None = None


def _target_s(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return value / 1000.0 if math.isfinite(value) and 0 < value <= MAX_TARGET_MS else None


def read_targets(headers: Mapping[str, str]) -> OwnTargets | None:
    """The targets ``headers`` carry, or ``None`` when there is no usable one. Never raises."""
    targets = OwnTargets(_target_s(headers.get(TTFT_HEADER)), _target_s(headers.get(TPOT_HEADER)))
    return targets if targets.ttft_s is not None or targets.tpot_s is not None else None


def _is_token(event: bytes) -> bool:
    """Whether one SSE event is a token-bearing chunk (not the role-only chunk, the
    finish-only chunk, the usage chunk or ``[DONE]``)."""
    if not event.startswith(b"data: ") or event.startswith(b"data: [DONE]"):
        return False
    try:
        chunk = json.loads(event[6:])
    except ValueError:
        return False
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return False
    choice = choices[0]
    delta = choice.get("delta")
    content = delta.get("content") if isinstance(delta, dict) else choice.get("text")
    return isinstance(content, str) and content != ""


class ResponseTimer:
    """One response as the router times it (seconds on the gateway's clock).

    ``received_s``: when the request reached the router. Feed every piece of a streamed
    body with :meth:`feed`, then :meth:`finish` at its end; :meth:`missed` gives the types
    (``ttft``, ``tpot``) whose target the response missed.
    """

    def __init__(self, targets: OwnTargets, received_s: float) -> None:
        self.targets = targets
        self.received_s = received_s
        self.first_token_s: float | None = None
        self.tokens = 0
        self.ended_s: float | None = None
        self._pending = b""

    def feed(self, piece: bytes, now_s: float) -> None:
        """A piece of the SSE body, as it passed the router at ``now_s``."""
        events = (self._pending + piece).split(b"\n\n")
        self._pending = events.pop()
        if len(self._pending) > MAX_EVENT_BYTES:
            self._pending = b""
        for event in events:
            if _is_token(event.strip()):
                self.tokens += 1
                if self.first_token_s is None:
                    self.first_token_s = now_s

    def finish(self, now_s: float, *, streamed: bool) -> None:
        """The response ended at ``now_s``; an answer that was not a stream counts its whole
        latency as its TTFT."""
        self.ended_s = now_s
        if not streamed:
            self.first_token_s = now_s

    def missed(self) -> list[str]:
        """The target types this ended response missed (empty before :meth:`finish`)."""
        if self.ended_s is None or self.first_token_s is None:
            return []
        out = []
        ttft_s = self.first_token_s - self.received_s
        if self.targets.ttft_s is not None and ttft_s > self.targets.ttft_s:
            out.append("ttft")
        if self.targets.tpot_s is not None and self.tokens > 1:
            tpot_s = (self.ended_s - self.first_token_s) / (self.tokens - 1)
            if tpot_s > self.targets.tpot_s:
                out.append("tpot")
        return out
