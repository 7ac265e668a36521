"""The DuckDB SLI and the generated PromQL class the same records alike.

A real tap in front of a scripted engine answers clients with 200s, the client's 404s, the
service's 503 and 429, and client cancellations. Its records go into a real DuckDB file and
through the SLO jobs' rollup; its ``/metrics`` counters become promtool input series, and
promtool evaluates the generated error and total queries over them. Both sides must count
the 503 and 429 as bad and neither the 404s nor the cancellations as events.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from alerts.model import WINDOW_PLACEHOLDER
from alerts.sources import TAP_REQUESTS, rule_model_from_slo
from pipeline.store import Store
from slo.budget import WindowCounts
from slo.evaluate import evaluate
from slo.rollups import Rollup
from slo.spec import parse_spec
from slo.spec.model import build_model
from tests.alerts.conftest import run
from tests.collectors.tap.fakes import (
    CHAT,
    Script,
    ScriptedUpstream,
    stream_script,
    tap_over,
    wait_for,
)
from tests.slo.factories import insert

SPEC = {
    "version": "llmslo/v1",
    "service": "classes",
    "slos": [{"name": "availability", "objective": 0.99, "sli": {"kind": "availability"},
              "group_by": ["instance"]}],
}  # fmt: skip
#: What the engine does per request, by the request's first message; how many of each.
TRAFFIC = {"ok": 6, "404": 3, "503": 2, "429": 1, "cancel": 2}


def _script(request: dict[str, Any]) -> Script:
    kind = request["messages"][0]["content"]
    if kind in ("404", "503", "429"):
        body = b'{"error": {"message": "scripted"}}'
        return Script([(0.0, body)], status=int(kind), headers={"Content-Type": "application/json"})
    if kind == "cancel":
        return stream_script(40, gap_s=0.05)  # the client leaves after the first chunk
    return stream_script(2)


async def _send(url: str, kind: str) -> None:
    body = {**CHAT, "messages": [{"role": "user", "content": kind}]}
    async with aiohttp.ClientSession() as session:
        resp = await session.post(url + "/v1/chat/completions", json=body)
        if kind == "cancel":
            await resp.content.readany()
            resp.close()  # the client goes away mid-stream
            return
        await resp.read()


async def _traffic() -> tuple[list[dict[str, Any]], str]:
    up = ScriptedUpstream(_script, models=["m"])
    async with tap_over([up], max_attempts=1) as (url, sink, proxy):
        for kind, count in TRAFFIC.items():
            await asyncio.gather(*(_send(url, kind) for _ in range(count)))
        await wait_for(lambda: len(sink.requests) == sum(TRAFFIC.values()))
        metrics = generate_latest(proxy.metrics.registry).decode()
    return list(sink.requests), metrics


def _duckdb_side(rows: list[dict[str, Any]], path: Path) -> WindowCounts:
    model = build_model(parse_spec(SPEC))
    now_ms = max(r["received_ts_ms"] for r in rows) + 1
    with Store(path) as store:
        insert(store, requests=rows)
        Rollup(store.con, model, horizon_ms=86_400_000).update(now_ms)
        (status,) = evaluate(store.con, model, now_ms)
    return status.period


def _promql_side(metrics: str, tmp_path: Path, promtool: str, expected: WindowCounts) -> str:
    """Run promtool over the tap's counters: each grows by its count every minute, so a
    5-minute rate ratio is the ratio of the counts."""
    series = []
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == TAP_REQUESTS:
                inner = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()) if v)
                series.append({"series": f"{TAP_REQUESTS}{{{inner}}}",
                               "values": f"0+{sample.value:g}x10"})  # fmt: skip
    (slo,) = rule_model_from_slo(build_model(parse_spec(SPEC))).slos
    error, total = (q.replace(WINDOW_PLACEHOLDER, "5m") for q in (slo.error_query, slo.total_query))
    instance = {s["series"].split('instance="')[1].split('"')[0] for s in series}.pop()
    labels = f'{{instance="{instance}"}}'
    tests = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": series,
            "promql_expr_test": [
                {"expr": f"{error} * 60", "eval_time": "10m",
                 "exp_samples": [{"labels": labels, "value": expected.bad}]},
                {"expr": f"{total} * 60", "eval_time": "10m",
                 "exp_samples": [{"labels": labels, "value": expected.total}]},
            ],
        }],
    }  # fmt: skip
    path = tmp_path / "classes.test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    done = run(promtool, "test", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_client_404_and_a_cancel_burn_nothing_a_503_does_on_both_paths(
    tmp_path: Path, promtool: str
) -> None:
    rows, metrics = asyncio.run(_traffic())
    by_outcome = sorted((r["outcome"], r["http_status"]) for r in rows)
    assert by_outcome.count(("error_before_first_token", 404)) == 3
    assert by_outcome.count(("rejected", 503)) == 2
    assert sum(1 for o, _ in by_outcome if o == "client_cancelled") == 2
    # The jobs: 6 ok + the service's 503s and 429 are events, of which those 3 are bad.
    counts = _duckdb_side(rows, tmp_path / "llmslo.duckdb")
    assert counts == WindowCounts(9, 3)
    # The generated rules over the same tap's counters agree (promtool fails otherwise).
    _promql_side(metrics, tmp_path, promtool, counts)
