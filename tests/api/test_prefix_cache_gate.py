"""The canary judge's prefix-cache gate over a recorded simulator fleet: a canary whose
prefix cache never hits (``engine.prefix_cache_broken``) fails on that metric alone."""

from __future__ import annotations

import random
from pathlib import Path

import duckdb
import pytest

from api.cohorts import Cohort, TimeRange, load_samples
from api.judge import JudgeConfig, Verdict, judge
from pipeline.store import Store
from tests.checks.fleet import record_fleet
from tests.slo.factories import insert, request

Fleet = tuple[Path, dict[str, str]]


def _bounds(con: duckdb.DuckDBPyConnection) -> tuple[int, int]:
    row = con.execute("SELECT min(ts_ms), max(ts_ms) FROM engine_samples").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    path = tmp_path_factory.mktemp("canary") / "fleet.duckdb"
    pods = {"broken": {"prefix_cache_broken": True}, "base": {}, "twin": {}}
    instances = record_fleet(path, pods)
    with Store(path) as store:
        lo, hi = _bounds(store.con)
        rng = random.Random(4)
        # the same request population on every pod: only the engines' cache differs
        rows = [
            request(
                rng.randint(lo, hi), instance=instance, ttft_s=rng.lognormvariate(-1.2, 0.3),
                tpot_s=rng.lognormvariate(-3.5, 0.2), e2e_s=rng.lognormvariate(1.2, 0.3),
            )
            for instance in instances.values()
            for _ in range(400)
        ]  # fmt: skip
        insert(store, requests=rows)
    return path, instances


def _verdict(fleet: Fleet, canary: str, baseline: str) -> Verdict:
    path, instances = fleet
    with Store(path, read_only=True) as store:
        lo, hi = _bounds(store.con)
        span = TimeRange(start_ms=lo, end_ms=hi + 1)
        sides = [
            load_samples(store.con, Cohort(instances=(instances[name],)), span)
            for name in (canary, baseline)
        ]
    return judge(sides[0], sides[1], JudgeConfig())


def test_a_canary_with_a_broken_prefix_cache_fails_on_the_cache_metric_alone(fleet: Fleet) -> None:
    verdict = _verdict(fleet, "broken", "base")
    metrics = {m.name: m for m in verdict.metrics}
    cache = metrics["prefix_cache_hit_rate"]
    assert cache.classification == "Low"
    assert cache.canary == 0.0 and cache.baseline is not None and cache.baseline > 0.5
    assert {m.classification for n, m in metrics.items() if n != "prefix_cache_hit_rate"} == {
        "Pass"
    }
    assert verdict.verdict == "fail"
    assert verdict.reason.startswith("prefix_cache_hit_rate Low")


def test_a_canary_with_a_working_cache_passes_the_same_gate(fleet: Fleet) -> None:
    verdict = _verdict(fleet, "twin", "base")
    cache = next(m for m in verdict.metrics if m.name == "prefix_cache_hit_rate")
    assert cache.classification == "Pass"
    assert cache.ratio == pytest.approx(1.0, abs=0.2)
    assert verdict.verdict == "pass"


def test_the_share_is_configurable(fleet: Fleet) -> None:
    path, instances = fleet
    with Store(path, read_only=True) as store:
        lo, hi = _bounds(store.con)
        span = TimeRange(start_ms=lo, end_ms=hi + 1)
        twin = load_samples(store.con, Cohort(instances=(instances["twin"],)), span)
        base = load_samples(store.con, Cohort(instances=(instances["base"],)), span)
    assert twin.prefix_cache is not None and base.prefix_cache is not None
    # a share above 1 cannot be configured; at 1.0 a canary must match the baseline's rate
    with pytest.raises(ValueError):
        JudgeConfig(prefix_cache_min_share=1.5)
    strict = JudgeConfig(prefix_cache_min_share=1.0)
    result = next(m for m in judge(twin, base, strict).metrics if m.name == "prefix_cache_hit_rate")
    ratio = (twin.prefix_cache[0] / twin.prefix_cache[1]) / (
        base.prefix_cache[0] / base.prefix_cache[1]
    )
    assert result.classification == ("Low" if ratio < 1.0 else "Pass")
