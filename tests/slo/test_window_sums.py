"""Window sums kept across cycles give the full evaluation's answers, cycle after cycle."""

from __future__ import annotations

import random
from typing import Any

import pytest

from pipeline.store import Store
from pipeline.units import DAY_MS, HOUR_MS, MINUTE_MS
from slo.evaluate import evaluate
from slo.rollups.counts import Rollup
from slo.spec import parse_spec
from slo.spec.model import SloModel, build_model
from slo.window_sums import WindowSums
from tests.slo.factories import T0_MS, insert, request

SPEC: dict[str, Any] = {
    "version": "llmslo/v1",
    "service": "svc",
    "slos": [
        {
            "name": "ttft",
            "objective": 0.99,
            "sli": {"kind": "latency", "metric": "ttft", "threshold_s": 2.0},
            "group_by": ["pool"],
        },
        {"name": "avail", "objective": 0.999, "period": "28d", "sli": {"kind": "availability"}},
    ],
}
POOLS = ("llama-3-8b", "qwen-7b")


def model() -> SloModel:
    return build_model(parse_spec(SPEC))


def records(
    rng: random.Random, start_ms: int, end_ms: int, n: int, **kw: Any
) -> list[dict[str, Any]]:
    """``n`` records in [start, end): some slow, some rejected, on a few pods and pools."""
    rows = []
    for _ in range(n):
        bad = rng.random() < 0.2
        rows.append(
            request(
                rng.randrange(start_ms, end_ms),
                ttft_s=None if bad else rng.choice([0.5, 1.9, 2.5]),
                outcome="rejected" if bad else "ok",
                http_status=503 if bad else 200,
                instance=f"10.0.0.{rng.randrange(3)}:8000",
                pool=kw.get("pool", rng.choice(POOLS)),
            )
        )
    return rows


def statuses(store: Store, m: SloModel, now_ms: int, sums: WindowSums | None) -> list[Any]:
    return [
        (s.slo.id, dict(s.group), dict(s.windows)) for s in evaluate(store.con, m, now_ms, sums)
    ]


@pytest.mark.parametrize(
    "first_ms",
    [
        T0_MS + 31 * DAY_MS + 7 * HOUR_MS + 23 * MINUTE_MS,
        T0_MS + 31 * DAY_MS + 58 * MINUTE_MS + 20_000,
        T0_MS + 32 * DAY_MS - 2 * MINUTE_MS,
    ],
    ids=["mid-hour", "across an hour's end", "across midnight"],
)
def test_kept_sums_equal_the_full_evaluation_while_rows_arrive_between_cycles(
    store: Store, first_ms: int
) -> None:
    """Each cycle (15 s apart, some a few minutes): new rows now, late rows minutes and days
    back, once a pool never seen; told rollup, then both evaluations. Every window's counts
    of every SLO and group are equal, and the checks are not vacuous (counts move)."""
    rng = random.Random(first_ms)
    m = model()
    insert(store, requests=records(rng, T0_MS, first_ms, 3_000))
    rollup = Rollup(store.con, m, horizon_ms=40 * DAY_MS)
    rollup.note_written({"requests": T0_MS})
    rollup.update(first_ms)
    sums = WindowSums(store.con, m)
    rollup.take_changes()  # the first count reads everything anyway
    now, seen = first_ms, set()
    for cycle in range(16):
        step = 15_000 if cycle % 5 else 3 * MINUTE_MS + 15_000
        new = records(rng, now, now + step, 20)
        if cycle % 4 == 1:
            new += records(rng, now - 40 * MINUTE_MS, now - 20 * MINUTE_MS, 5)  # late
        if cycle == 6:
            new += records(rng, now - 2 * DAY_MS, now - DAY_MS, 5)  # days late
        if cycle == 9:
            new += records(rng, now - 5 * MINUTE_MS, now, 5, pool="mistral-7b")  # a new key
        now += step
        insert(store, requests=new)
        rollup.note_written({"requests": min(r["received_ts_ms"] for r in new)})
        rollup.update(now)
        sums.note_changes(rollup.take_changes())
        got, want = statuses(store, m, now, sums), statuses(store, m, now, None)
        assert got == want, f"cycle {cycle} at {now}"
        seen.add(repr(want))
    assert len(seen) == 16
    assert any(group.get("pool") == "mistral-7b" for _, group, _ in want)


def test_a_rebuilt_slo_and_pruned_minutes_are_read_again(store: Store) -> None:
    """A changed definition rebuilds an SLO's rows (deletes, then recomputes), pruning drops
    minutes: the kept sums follow both."""
    rng = random.Random(3)
    m = model()
    now = T0_MS + 31 * DAY_MS + 30 * MINUTE_MS
    insert(store, requests=records(rng, T0_MS, now, 2_000))
    rollup = Rollup(store.con, m, horizon_ms=40 * DAY_MS)
    rollup.update(now)
    sums = WindowSums(store.con, m)
    assert statuses(store, m, now, sums) == statuses(store, m, now, None)
    spec = {**SPEC, "slos": [dict(SPEC["slos"][0]), SPEC["slos"][1]]}
    spec["slos"][0]["sli"] = {"kind": "latency", "metric": "ttft", "threshold_s": 1.0}
    changed = build_model(parse_spec(spec))
    rebuilt = Rollup(store.con, changed, horizon_ms=40 * DAY_MS)
    rebuilt.update(now + MINUTE_MS)
    rebuilt.prune(now - 29 * DAY_MS)
    sums.note_changes(rebuilt.take_changes())
    # The SLOs keep their ids and windows, so the sums kept for the old model serve.
    assert statuses(store, changed, now + MINUTE_MS, sums) == statuses(
        store, changed, now + MINUTE_MS, None
    )
