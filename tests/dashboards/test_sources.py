"""The two data sources answer alike: a read-only DuckDB file and the HTTP read API (Arrow)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dashboards.sources import ApiSource, DuckDBSource, SourceError
from pipeline.errors import QueryError
from pipeline.store import Store
from tests.dashboards.conftest import END_MS, HOUR_MS, History
from tests.dashboards.real_api import api_app, serve

DAY = {"start_ms": END_MS - 24 * HOUR_MS, "end_ms": END_MS, "bucket_ms": HOUR_MS}


@pytest.fixture(scope="module")
def api_url(history_db: History) -> Iterator[str]:
    with serve(api_app(history_db.path)) as url:
        yield url


def _questions(history: History) -> list[tuple[str, dict[str, Any]]]:
    pod = history.instances[1]
    return [
        ("slo_status", {}),
        ("slo_status", {"slo_id": "chat-ttft"}),
        ("budget_series", {"slo_id": "chat-ttft", "objective": 0.995, **DAY, "group": {"instance": pod}}),
        ("findings", {"start_ms": DAY["start_ms"], "end_ms": END_MS, "limit": 5}),
        ("open_findings", {"at_ms": END_MS - 150 * 60_000}),
        ("current_flags", {"scope": "instance"}),
        ("flag_timeline", {"start_ms": DAY["start_ms"], "end_ms": END_MS, "scope_id": pod}),
        ("latency_percentiles", {"metric": "ttft", **DAY, "by": "instance", "pool": "llama-3-8b"}),
        ("outcome_counts", {**DAY, "instance": pod}),
        ("ghost_counts", {**DAY, "ghost_grace_s": 2.0}),
        ("engine_series", {"signals": ["running", "kv_usage"], **DAY, "instances": [pod, history.instances[2]]}),
        ("gpu_series", {"signals": ["gpu_util", "xid"], **DAY, "hostname": "node-0"}),
        ("verdicts", {}),
    ]  # fmt: skip


def test_the_api_answers_every_question_with_the_same_arrow_table(
    history_db: History, api_url: str
) -> None:
    local, remote = DuckDBSource(history_db.path), ApiSource(api_url)
    try:
        for question, params in _questions(history_db):
            expected = local.table(question, **dict(params))
            got = remote.table(question, **dict(params))
            if question == "verdicts":
                # The API declares its verdicts table (not null, documented fields); the file
                # read gives DuckDB's plain types: same columns, same rows.
                assert got.to_pylist() == expected.to_pylist() and got.num_rows == 1
                continue
            assert got.schema == expected.schema, question
            assert got.equals(expected), question
            assert question == "verdicts" or expected.num_rows > 0 or question == "ghost_counts"
        assert remote.meta() == local.meta()
        first = local.meta().instances[0]
        assert (first["instance"], first["pool"]) == (history_db.instances[0], "llama-3-8b")
    finally:
        local.close()
        remote.close()


def test_a_bad_parameter_is_a_query_error_naming_it_on_both_sources(
    history_db: History, api_url: str
) -> None:
    for source in (DuckDBSource(history_db.path), ApiSource(api_url)):
        with pytest.raises(QueryError) as raised:
            source.table("latency_percentiles", metric="ttft", start_ms=0, end_ms=1, bucket_ms=7)
        assert raised.value.parameter == "bucket_ms", source


def test_an_unreachable_api_or_a_missing_file_is_a_source_error(tmp_path: Path) -> None:
    with serve(api_app(_empty(tmp_path))) as url:
        pass  # stopped: nothing listens there any more
    with pytest.raises(SourceError, match=re.escape(url)):
        ApiSource(url, timeout_s=2).meta()
    with pytest.raises(SourceError, match="no such DuckDB file"):
        DuckDBSource(tmp_path / "nope.duckdb")


def test_a_file_another_process_writes_is_refused_with_the_way_out(tmp_path: Path) -> None:
    path = _empty(tmp_path)
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "open"
        with pytest.raises(SourceError, match="use --api instead"):
            DuckDBSource(path)
    finally:
        writer.kill()
        writer.wait()


WRITER = "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('open', flush=True); time.sleep(60)"


def test_a_json_answer_where_arrow_was_asked_is_refused(history_db: History, api_url: str) -> None:
    import httpx

    def json_only(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"data": [], "count": 0})

    source = ApiSource("http://127.0.0.1:9", transport=httpx.MockTransport(json_only))
    with pytest.raises(SourceError, match="expected Arrow"):
        source.table("slo_status")


def _empty(tmp_path: Path) -> Path:
    path = tmp_path / "empty.duckdb"
    with Store(path):
        pass
    return path
