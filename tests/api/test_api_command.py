"""``llmslo api --db FILE``: read-write stores verdicts; ``--read-only`` computes them,
stores nothing and says so; both answer the read routes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import httpx
import pytest

from llmslo.cli import main
from pipeline.store import Store
from tests.api.conftest import BASELINE, CANARY, TOKEN, auth, cohort_rows
from tests.slo.factories import T0_MS, insert

PARAMS = {
    "canary_instances": CANARY,
    "baseline_instances": BASELINE,
    "start": str(T0_MS),
    "end": str(T0_MS + 3_600_000),
}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "copy.duckdb"
    with Store(path) as store:
        insert(
            store,
            requests=cohort_rows(BASELINE, 300, seed=1) + cohort_rows(CANARY, 300, seed=2),
        )
    return path


@contextmanager
def api_process(*args: str) -> Iterator[str]:
    env = {**os.environ, "LLMSLO_API_TOKEN": TOKEN}
    process = subprocess.Popen(
        [sys.executable, "-m", "llmslo", "api", "--api-port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        found = re.search(r"on (http://\S+) ", line)
        assert found, (line, process.stderr.read() if process.stderr else "")
        yield found[1]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()


def _verdicts(path: Path) -> int:
    with duckdb.connect(str(path), read_only=True) as con:
        tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        if "verdicts" not in tables:
            return 0
        return len(con.execute("SELECT * FROM verdicts").fetchall())


def test_read_write_stores_the_verdict(db: Path) -> None:
    with api_process("--db", str(db)) as url:
        ready = httpx.get(f"{url}/readyz").json()
        assert ready["status"] == "ready" and ready["read_only"] is False
        answer = httpx.get(f"{url}/api/v1/verdict", params=PARAMS, headers=auth(), timeout=30)
        assert answer.status_code == 200, answer.text
        assert "stored" not in answer.json()
        assert httpx.get(f"{url}/api/v1/outcomes", params={
            "start_ms": T0_MS, "end_ms": T0_MS + 3_600_000, "bucket_ms": 3_600_000, "by": "instance",
        }).json()["count"] == 2  # fmt: skip
    assert _verdicts(db) == 1


def test_read_only_computes_but_stores_nothing_and_says_so(db: Path) -> None:
    before = db.stat().st_mtime_ns
    with api_process("--db", str(db), "--read-only") as url:
        assert httpx.get(f"{url}/readyz").json()["read_only"] is True
        answer = httpx.get(f"{url}/api/v1/verdict", params=PARAMS, headers=auth(), timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.json()["stored"] is False
        assert answer.json()["summary"]["verdict"] in {"pass", "fail", "inconclusive"}
        body = {"scope": "pool", "scope_id": "p", "level": 1, "expires_in_s": 60, "reason": "x"}
        refused = httpx.post(f"{url}/api/v1/flags/overrides", json=body, headers=auth())
        assert refused.status_code == 503 and "read-only" in refused.json()["error"]
        flags = httpx.get(f"{url}/api/v1/flags").json()
        # No override was stored, and no jobs heartbeat either: nothing to act on, said so.
        assert (flags["data"], flags["count"]) == ([], 0)
        assert (flags["stale"], flags["stale_reason"]) == (True, "no_heartbeat")
    assert _verdicts(db) == 0
    assert db.stat().st_mtime_ns == before


def test_read_only_on_a_missing_file_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.duckdb"
    assert main(["api", "--db", str(missing), "--read-only", "--api-port", "0"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not missing.exists()


def test_a_port_in_use_is_a_clear_error(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["api", "--db", str(db), "--api-port", str(port)]) == 2
    assert f"127.0.0.1:{port}" in capsys.readouterr().err


def test_readyz_is_503_once_the_store_is_closed(db: Path) -> None:
    from fastapi.testclient import TestClient

    from api.app import create_app

    con = duckdb.connect(str(db))
    with TestClient(create_app(con.cursor, token=TOKEN)) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["spec"] == "inference" and ready.json()["slos"] > 0
        con.close()
        gone = client.get("/readyz")
    assert gone.status_code == 503 and "store unavailable" in gone.json()["error"]
