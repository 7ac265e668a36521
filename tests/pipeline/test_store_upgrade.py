"""A DuckDB file written before request records gained columns still opens and ingests:
the new (nullable, appended) columns are added on open."""

from __future__ import annotations

from pathlib import Path

from collectors.tap.sinks import rows_to_table
from pipeline.schema import REQUEST_RECORDS
from pipeline.store import LogIdentity, Store, StoredOffset
from tests.slo.factories import request

#: Columns the request record gained for retried attempts and exact ITL summaries.
ADDED = ("upstream_status", "itl_count", "itl_p50_s", "itl_p90_s", "itl_jitter_s", "itl_histogram")
#: ... then for the tokens source and degradation flags that act, appended after those.
ADDED_FLAGS = ("tokens_source", "degradation_level", "enforced_action")
#: ... then for the prober's records, appended last.
ADDED_SOURCE = ("source",)
#: ... then for the request's own SLO targets (router headers), appended after it.
ADDED_OWN_TARGETS = ("slo_ttft_s", "slo_tpot_s", "slo_met")
#: ... then for the tap's gap error bound, appended after those.
ADDED_GAP_ERROR = ("itl_error_s", "itl_uncertain")


def test_a_file_from_before_the_new_request_columns_opens_and_ingests(tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    with Store(path) as store:
        for column in (
            ADDED + ADDED_FLAGS + ADDED_SOURCE + ADDED_OWN_TARGETS + ADDED_GAP_ERROR
        ):  # a file from before those columns
            store.con.execute(f"ALTER TABLE requests DROP COLUMN {column}")
        store.con.execute(
            "INSERT INTO requests (request_id, attempt, instance, received_ts_ms, outcome) VALUES ('old', 1, 'h:1', 0, 'ok')"
        )
    with Store(path) as store:
        table = rows_to_table(
            REQUEST_RECORDS, [request(60_000, request_id="new", itl_jitter_s=0.02)]
        )
        store.commit_batch({"requests": [table]}, group_id="g", offsets={}, now_ts_ms=0)
        got = store.con.execute(
            "SELECT request_id, itl_jitter_s FROM requests ORDER BY request_id"
        ).fetchall()
    assert got == [("new", 0.02), ("old", None)]


def test_a_file_from_before_the_enforcement_columns_gains_them(tmp_path: Path) -> None:
    path = tmp_path / "before_enforcement.duckdb"
    with Store(path) as store:
        for column in ADDED_FLAGS:
            store.con.execute(f"ALTER TABLE requests DROP COLUMN {column}")
    with Store(path) as store:
        row = request(60_000, request_id="new", tokens_source="chunks", enforced_action="fail_open")
        table = rows_to_table(REQUEST_RECORDS, [row])
        store.commit_batch({"requests": [table]}, group_id="g", offsets={}, now_ts_ms=0)
        got = store.con.execute(
            "SELECT request_id, tokens_source, degradation_level, enforced_action FROM requests"
        ).fetchall()
    assert got == [("new", "chunks", None, "fail_open")]


def test_a_file_from_before_own_targets_gains_them_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "before_own_targets.duckdb"
    with Store(path) as store:
        for column in ADDED_OWN_TARGETS:
            store.con.execute(f"ALTER TABLE requests DROP COLUMN {column}")
        store.con.execute(
            "INSERT INTO requests (request_id, attempt, instance, received_ts_ms, outcome) "
            "VALUES ('old', 1, 'h:1', 0, 'ok')"
        )
    with Store(path) as store:
        row = request(60_000, request_id="new", slo_ttft_s=0.5, slo_met=False)
        table = rows_to_table(REQUEST_RECORDS, [row])
        store.commit_batch({"requests": [table]}, group_id="g", offsets={}, now_ts_ms=0)
        got = store.con.execute(
            "SELECT request_id, slo_ttft_s, slo_tpot_s, slo_met FROM requests ORDER BY request_id"
        ).fetchall()
    assert got == [("new", 0.5, None, False), ("old", None, None, None)]


def test_a_file_from_before_offsets_carried_their_log_keeps_its_offsets(tmp_path: Path) -> None:
    path = tmp_path / "before_log_identity.duckdb"
    with Store(path) as store:
        store.con.execute("ALTER TABLE ingest_offsets DROP COLUMN topic_id")
        store.con.execute("ALTER TABLE ingest_offsets DROP COLUMN cluster_id")
        store.con.execute("INSERT INTO ingest_offsets VALUES ('g', 't', 0, 7, 1)")
    with Store(path) as store:
        # Known offset, unknown log: the ingester checks it against the partition's end.
        assert store.read_offsets("g") == {("t", 0): StoredOffset(7)}
        identity = LogIdentity("tansu_cluster", "01a23387-7347-7910-8951-7b8ba822ca59")
        store.commit_batch(
            {}, group_id="g", offsets={("t", 1): StoredOffset(3, identity)}, now_ts_ms=0
        )
        assert store.read_offsets("g")[("t", 1)] == StoredOffset(3, identity)
