"""Workload traces: Azure LLM inference CSV, Mooncake JSONL, and Poisson arrivals.

Every reader yields :class:`TraceRequest` with the arrival offset in seconds from the
first request. Readers are a boundary: malformed input raises
:class:`pipeline.errors.ConfigError` naming the file and line.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pipeline.errors import ConfigError

__all__ = [
    "TraceRequest",
    "load_trace",
    "poisson_arrivals",
    "read_azure_csv",
    "read_mooncake_jsonl",
]


@dataclass(frozen=True)
class TraceRequest:
    """One request of a workload: arrival offset (s), prompt and output tokens."""

    offset_s: float
    prompt_tokens: int
    output_tokens: int


def _parse_azure_ts(text: str) -> float:
    """``2023-11-16 18:17:03.9799600`` (7 fractional digits) → Unix seconds (UTC assumed)."""
    whole, _, frac = text.strip().partition(".")
    base = datetime.fromisoformat(whole + "+00:00").timestamp()
    if frac and not frac.isdigit():
        raise ValueError(f"bad fractional seconds {frac!r}")
    return base + (int(frac) / 10 ** len(frac) if frac else 0.0)


def _positive(value: str, what: str) -> int:
    number = int(value)
    if number < 0:
        raise ValueError(f"{what} must be >= 0")
    return number


def read_azure_csv(path: Path) -> list[TraceRequest]:
    """Azure ``TIMESTAMP,ContextTokens,GeneratedTokens`` (CRLF, no final newline)."""
    text = Path(path).read_text(encoding="utf-8-sig")
    lines = text.splitlines()
    if not lines or lines[0].strip().split(",")[:3] != [
        "TIMESTAMP",
        "ContextTokens",
        "GeneratedTokens",
    ]:
        raise ConfigError(f"{path}:1: expected header TIMESTAMP,ContextTokens,GeneratedTokens")
    out: list[TraceRequest] = []
    first: float | None = None
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            ts_text, context, generated = line.split(",")[:3]
            ts = _parse_azure_ts(ts_text)
            prompt, output = (
                _positive(context, "ContextTokens"),
                _positive(generated, "GeneratedTokens"),
            )
        except ValueError as exc:
            raise ConfigError(f"{path}:{number}: {exc}") from exc
        first = ts if first is None else first
        out.append(TraceRequest(ts - first, max(1, prompt), max(1, output)))
    return out


def read_mooncake_jsonl(path: Path) -> list[TraceRequest]:
    """Mooncake ``{"timestamp": ms, "input_length": n, "output_length": m, ...}`` per line."""
    out: list[TraceRequest] = []
    first: float | None = None
    with Path(path).open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                ts = float(row["timestamp"]) / 1000.0
                if not math.isfinite(ts):
                    raise ValueError("timestamp is not finite")
                prompt = _positive(str(int(row["input_length"])), "input_length")
                output = _positive(str(int(row["output_length"])), "output_length")
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(f"{path}:{number}: {exc!r}") from exc
            first = ts if first is None else first
            out.append(TraceRequest(ts - first, max(1, prompt), max(1, output)))
    return out


def load_trace(path: Path) -> list[TraceRequest]:
    """Read a trace, choosing the reader from the extension (.csv or .jsonl/.json)."""
    suffix = Path(path).suffix.lower()
    try:
        if suffix == ".csv":
            return read_azure_csv(path)
        if suffix in (".jsonl", ".json"):
            return read_mooncake_jsonl(path)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read trace: {exc}") from exc
    raise ConfigError(f"{path}: unknown trace format (expected .csv or .jsonl)")


def poisson_arrivals(
    rate_per_s: float,
    duration_s: float,
    *,
    seed: int = 0,
    mean_prompt_tokens: float = 512.0,
    mean_output_tokens: float = 128.0,
) -> Iterator[TraceRequest]:
    """Poisson arrivals at ``rate_per_s`` for ``duration_s``, exponential token lengths."""
    if rate_per_s <= 0:
        raise ConfigError("rate: must be > 0")
    rng = random.Random(seed)
    t = rng.expovariate(rate_per_s)
    while t < duration_s:
        prompt = max(1, int(rng.expovariate(1.0 / mean_prompt_tokens)))
        output = max(1, int(rng.expovariate(1.0 / mean_output_tokens)))
        yield TraceRequest(t, prompt, output)
        t += rng.expovariate(rate_per_s)
