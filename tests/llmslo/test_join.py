"""Processes of one pipeline join its broker without being told: the address file beside
the DuckDB file, written by the broker's owner, read by the producers."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmslo.cli import main
from llmslo.progress import status_lines
from pipeline.broker import free_port
from pipeline.broker_address import address_file, published_address, read_address

ROOT = Path(__file__).resolve().parents[2]


def _llmslo(*argv: str, cwd: Path, **kwargs: object) -> subprocess.Popen[str]:
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    return subprocess.Popen(  # type: ignore[call-overload]
        [sys.executable, "-m", "llmslo", *argv], cwd=cwd, env=env, text=True, **kwargs
    )


def test_a_probe_given_no_broker_joins_the_one_llmslo_broker_started_here(tmp_path: Path) -> None:
    broker = _llmslo("broker", cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    written = tmp_path / "var" / "llmslo.duckdb.kafka"
    try:
        deadline = time.monotonic() + 60
        while not written.exists():
            assert broker.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        owner = read_address(written)
        assert owner is not None and owner.pid == broker.pid and owner.alive
        assert written.stat().st_mode & 0o044 == 0o044  # readable by the pipeline's others
        probe = _llmslo(
            "probe",
            "--url",
            f"http://127.0.0.1:{free_port()}",
            "--rounds",
            "1",
            "--timeout",
            "1",
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _, err = probe.communicate(timeout=120)
        assert f"joining the broker of `llmslo broker` (pid {broker.pid})" in err
        assert owner.bootstrap_servers in err
        assert "private" not in err and "nothing else reads" not in err
    finally:
        broker.send_signal(signal.SIGTERM)
        broker.wait(timeout=60)
    assert not written.exists(), "the address outlived its broker"


def test_a_dead_owners_address_is_ignored_with_a_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / "var" / "llmslo.duckdb.kafka"
    stale.parent.mkdir()
    stale.write_text(
        f'{{"bootstrap_servers": "127.0.0.1:{free_port()}", "pid": {dead.pid}, '
        '"command": "llmslo run"}'
    )
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["probe", "--url", url, "--rounds", "1", "--timeout", "1", "-q"]) == 1
    err = capsys.readouterr().err
    assert (
        f"ignoring var/llmslo.duckdb.kafka: its broker's process (`llmslo run`, pid {dead.pid})"
        in err
    )
    assert "nothing else reads" in err  # it said where its records went instead


def test_a_live_owners_address_is_not_taken_over(tmp_path: Path) -> None:
    where = address_file(tmp_path / "p.duckdb")
    with published_address(where, "127.0.0.1:1111", "llmslo run") as first:
        assert first
        holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            where.write_text(
                f'{{"bootstrap_servers": "127.0.0.1:2222", "pid": {holder.pid}, '
                '"command": "llmslo broker"}'
            )
            with published_address(where, "127.0.0.1:3333", "llmslo ingest") as second:
                assert not second
                found = read_address(where)
                assert found is not None and found.bootstrap_servers == "127.0.0.1:2222"
        finally:
            holder.kill()
            holder.wait()
    assert where.exists(), "removed an address that was not its own"


def test_collect_told_an_unreachable_broker_fails_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every scrape succeeds (a static /metrics page), no row reaches Kafka: exit 1."""
    (tmp_path / "metrics").write_text(
        '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 1\n'
    )
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stdout is not None
        port = server.stdout.readline().split(" port ")[1].split()[0]
        kafka = f"127.0.0.1:{free_port()}"
        status = main(
            [
                "collect",
                "--target",
                f"http://127.0.0.1:{port}/metrics",
                "--bootstrap-servers",
                kafka,
                "--rounds",
                "1",
                "-q",
            ]
        )
    finally:
        server.kill()
        server.wait()
    err = capsys.readouterr().err
    assert status == 1
    assert f"nothing reached Kafka at {kafka} (--bootstrap-servers)" in err


def test_status_lines_come_at_their_interval_and_not_when_quiet() -> None:
    count = [0]

    def describe() -> str:
        count[0] += 1
        return f"status {count[0]}"

    out = io.StringIO()
    with status_lines(describe, every_s=0.05, stream=out):
        time.sleep(0.3)
    assert out.getvalue().splitlines()[:2] == ["status 1", "status 2"]
    quiet = io.StringIO()
    with status_lines(describe, every_s=0.05, stream=quiet, quiet=True):
        time.sleep(0.15)
    assert quiet.getvalue() == ""
