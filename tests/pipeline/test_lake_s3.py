"""The Parquet lake on object storage (``store.lake_dir: s3://…``), on moto's S3 server.

Hours land once as whole objects and read back equal; a wrong secret is refused naming
bucket and key, writes nothing, and no secret reaches the output or the logs.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import duckdb
import pytest

from llmslo.cli import main
from pipeline.config import LlmsloConfig
from pipeline.lake import create_lake_views, export_hours
from pipeline.s3 import ObjectStore, ObjectStoreError, S3Config
from pipeline.store import Store
from pipeline.units import HOUR_MS
from tests.pipeline.lake_servers import BUCKET, S3Server, s3_server
from tests.pipeline.test_lake import T0, _store_hours

__all__ = ["s3_server"]  # fixtures

LAKE = f"s3://{BUCKET}/parquet"
#: 10:30: the hours 08 and 09 are complete (and past their grace), 10 is still open.
NOW_MS = T0 + 2 * HOUR_MS + HOUR_MS // 2


def _objects(s3: S3Server, credentials: Path, **options: Any) -> ObjectStore:
    return ObjectStore(S3Config(endpoint=s3.endpoint, credentials_file=credentials, **options))


def _lake_values(objects: ObjectStore) -> list[float]:
    con = duckdb.connect()
    create_lake_views(con, LAKE, objects=objects)
    return [v for (v,) in con.execute("SELECT value FROM engine_samples ORDER BY value").fetchall()]


def test_hours_land_once_as_objects_and_read_back_equal(
    s3_server: S3Server, tmp_path: Path
) -> None:
    objects = _objects(s3_server, s3_server.credentials_file(tmp_path / "creds"))
    with Store(tmp_path / "a.duckdb") as store:
        _store_hours(store, hours=3, per_hour=100)
        first = export_hours(store, LAKE, "ingest-a", now_ts_ms=NOW_MS, objects=objects)
        again = export_hours(store, LAKE, "ingest-a", now_ts_ms=NOW_MS, objects=objects)
        # A crash after the upload and before the ledger: the hour goes again, to its key.
        store.con.execute("DELETE FROM lake_exports WHERE hour_start_ms = ?", [T0])
        redone = export_hours(store, LAKE, "ingest-a", now_ts_ms=NOW_MS, objects=objects)
    assert [(w.table, w.rows) for w in first] == [("engine_samples", 100)] * 2
    assert first[0].path == f"{LAKE}/engine_samples/date=2025-11-29/hour=08/ingest-a.parquet"
    assert again == []
    assert [w.path for w in redone] == [first[0].path]
    assert sorted(s3_server.objects()) == [
        "parquet/engine_samples/date=2025-11-29/hour=08/ingest-a.parquet",
        "parquet/engine_samples/date=2025-11-29/hour=09/ingest-a.parquet",
    ]
    assert _lake_values(objects) == [float(v) for v in range(200)]  # none twice


def test_a_wrong_secret_is_refused_naming_bucket_and_key_and_writes_nothing(
    s3_server: S3Server, tmp_path: Path
) -> None:
    bad = _objects(s3_server, s3_server.credentials_file(tmp_path / "bad", secret="not-the-secret"))
    with Store(tmp_path / "a.duckdb") as store:
        _store_hours(store, hours=3, per_hour=100)
        with pytest.raises(ObjectStoreError) as refused:
            export_hours(store, LAKE, "ingest-a", now_ts_ms=NOW_MS, objects=bad)
        assert store.con.execute("SELECT count(*) FROM lake_exports").fetchone() == (0,)
        message = str(refused.value)
        assert f"bucket {BUCKET!r}" in message
        assert "key 'parquet/engine_samples/date=2025-11-29/hour=08/ingest-a.parquet'" in message
        assert "refused" in message and "not-the-secret" not in message
        assert bad.retries == 0  # a refusal is not retried
        assert s3_server.objects() == []
        # With the right key the same hours go out: nothing was marked exported.
        good = _objects(s3_server, s3_server.credentials_file(tmp_path / "good"))
        assert len(export_hours(store, LAKE, "ingest-a", now_ts_ms=NOW_MS, objects=good)) == 2


def _export_command(
    tmp_path: Path, s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[str], Path]:
    db = tmp_path / "a.duckdb"
    with Store(db) as store:
        _store_hours(store, hours=3, per_hour=100)
    config = tmp_path / "llmslo.yaml"
    config.write_text(f"store:\n  lake_dir: {LAKE}\n  s3:\n    endpoint: {s3.endpoint}\n")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.access_key_id)
    argv = ["lake", "export", "-c", str(config), "--db", str(db), "--ingester", "ingest-a"]
    return argv, config


def test_the_export_command_takes_the_secret_from_the_environment_and_never_prints_it(
    s3_server: S3Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    argv, config = _export_command(tmp_path, s3_server, monkeypatch)
    secret = s3_server.secret_access_key
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    caplog.set_level(logging.DEBUG)
    assert main(argv) == 0
    assert main(["config", "validate", str(config)]) == 0
    out, err = capsys.readouterr()
    assert [e["rows"] for e in json.loads(out.splitlines()[0])["exported"]] == [
        100,
        100,
        100,
    ]  # every hour is past (T0 is in 2025)
    assert len(s3_server.objects()) == 3
    dumped = LlmsloConfig.model_validate({"store": {"lake_dir": LAKE}}).model_dump_json()
    for text in (out, err, caplog.text, dumped):
        assert secret not in text


def test_the_export_command_refuses_a_wrong_secret_without_printing_it(
    s3_server: S3Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    argv, _ = _export_command(tmp_path, s3_server, monkeypatch)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-0123456789")
    caplog.set_level(logging.DEBUG)
    assert main(argv) != 0
    out, err = capsys.readouterr()
    assert f"bucket {BUCKET!r}" in err and "hour=08/ingest-a.parquet" in err
    for text in (out, err, caplog.text):
        assert "wrong-secret-0123456789" not in text
    assert s3_server.objects() == []
