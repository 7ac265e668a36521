"""Jitter error of a tap: the gaps it recorded against the gaps the engine really left.

The engine stand-in notes when it wrote each token event (``perf_counter`` just before and
just after the write, per ``x-request-id``: the send, where the kernel stamps the segment,
happens in between); the tap writes its records (``itl_gaps_s``) to a JSON-lines file.
Per gap, error = recorded − emitted (bracket midpoints). A gap whose own reference is
loose (a bracket wider than :data:`REFERENCE_SLACK_S`: the engine stand-in was descheduled
inside its write) is left out and counted (``reference_skipped``), so the figure is the
tap's error, not the stand-in's. Reported as p50/p99 of |error| in ms over every gap, over
the gaps of records the tap did not flag ``timing_uncertain`` (what the jitter SLI
counts), and the share of records flagged.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["emissions_of", "jitter_errors", "run_jitter_load"]

#: Request ids of the jitter phases start with this, so the engine notes their emissions.
PREFIX = "jit-"
#: A write bracket wider than this does not pin the emission time: that gap is left out.
REFERENCE_SLACK_S = 0.0005


def run_jitter_load(
    url: str, streams: int, duration_s: float, tokens: int, gap_ms: float, tag: str, out: Any
) -> None:
    """Closed-loop streams with ids ``jit-TAG-W-N`` (run in a process of its own)."""
    import aiohttp

    async def main() -> int:
        body = json.dumps(
            {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "stream": True,
                "max_tokens": tokens,
                "bench_gap_ms": gap_ms,
            }
        ).encode()
        stop_at = time.perf_counter() + duration_s
        done = 0

        async def worker(session: aiohttp.ClientSession, w: int) -> None:
            nonlocal done
            await asyncio.sleep(w * gap_ms / 1000 / max(streams, 1))
            n = 0
            while time.perf_counter() < stop_at:
                n += 1
                headers = {
                    "Content-Type": "application/json",
                    "x-request-id": f"{PREFIX}{tag}-{w}-{n}",
                }
                try:
                    async with session.post(
                        url + "/v1/chat/completions", data=body, headers=headers
                    ) as resp:
                        async for _ in resp.content.iter_any():
                            pass
                    done += 1
                except aiohttp.ClientError:
                    continue

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            await asyncio.gather(*(worker(session, w) for w in range(streams)))
        return done

    out.put(asyncio.run(main()))


def emissions_of(upstream_url: str, tag: str) -> dict[str, list[list[float]]]:
    """The engine's token write times of the requests tagged ``tag`` (and forgets them)."""
    with urllib.request.urlopen(f"{upstream_url}/bench/emissions?tag={PREFIX}{tag}-") as resp:
        return dict(json.loads(resp.read()))


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def jitter_errors(records_file: Path, emissions: dict[str, list[list[float]]]) -> dict[str, Any]:
    """p50/p99 |recorded gap − emitted gap| (ms), all gaps and unflagged records' gaps."""
    every: list[float] = []
    certain: list[float] = []
    records = flagged = skipped = 0
    for line in records_file.read_text().splitlines():
        row = json.loads(line)
        times = emissions.get(row["request_id"])
        if times is None or row["outcome"] != "ok":
            continue
        records += 1
        errors = []
        for rec, (one, two) in zip(row["itl_gaps_s"], itertools.pairwise(times), strict=False):
            if max(one[1] - one[0], two[1] - two[0]) > REFERENCE_SLACK_S:
                skipped += 1
                continue
            emit = (two[0] + two[1]) / 2 - (one[0] + one[1]) / 2
            errors.append(abs(rec - emit) * 1e3)
        every += errors
        if row.get("timing_uncertain"):
            flagged += 1
        else:
            certain += errors

    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 3)

    return {
        "records": records,
        "gaps": len(every),
        "reference_skipped": skipped,
        "err_p50_ms": rounded(_pct(every, 0.5)),
        "err_p99_ms": rounded(_pct(every, 0.99)),
        "certain_err_p50_ms": rounded(_pct(certain, 0.5)),
        "certain_err_p99_ms": rounded(_pct(certain, 0.99)),
        "flagged_share": round(flagged / records, 4) if records else None,
    }
