"""Processes started one by one join one broker: ``llmslo broker``/``run`` print its address
once and keep it in the address file; the other commands read it when given none, and an
address nobody answers at is refused with a sentence saying which address to use."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka.admin import KafkaAdminClient

from llmslo.cli import build_parser, main
from llmslo.options import resolve_config
from pipeline.address import ADDRESS_FILE_ENV
from pipeline.broker import free_port


def _start_broker(address_file: Path) -> subprocess.Popen[str]:
    """``llmslo broker`` (no -v), until its first line is printed."""
    process = subprocess.Popen(
        [sys.executable, "-m", "llmslo", "broker"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, ADDRESS_FILE_ENV: str(address_file)},
    )
    assert process.stdout is not None
    process.first_line = process.stdout.readline()  # type: ignore[attr-defined]
    return process


@pytest.fixture(scope="module")
def _shared_broker(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    path = tmp_path_factory.mktemp("join") / "var" / "broker.address"
    process = _start_broker(path)
    yield process, path
    process.kill()
    process.wait()


@pytest.fixture
def address_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A test's own address file, named by the environment as a user's shell would."""
    path = tmp_path / "var" / "broker.address"
    monkeypatch.setenv(ADDRESS_FILE_ENV, str(path))
    return path


@pytest.fixture
def broker_process(
    _shared_broker: tuple[subprocess.Popen[str], Path], monkeypatch: pytest.MonkeyPatch
) -> subprocess.Popen[str]:
    """The module's running ``llmslo broker``; its address file is the one in use."""
    process, path = _shared_broker
    monkeypatch.setenv(ADDRESS_FILE_ENV, str(path))
    return process


@pytest.fixture
def broker_address_file(_shared_broker: tuple[subprocess.Popen[str], Path]) -> Path:
    return _shared_broker[1]


def test_broker_prints_its_address_once_and_keeps_it_in_the_file_while_it_runs(
    address_file: Path,
) -> None:
    process = _start_broker(address_file)
    try:
        line: str = process.first_line  # type: ignore[attr-defined]
        address = address_file.read_text().strip()
        assert line.startswith(f"bootstrap servers: {address}")
        assert str(address_file) in line
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert not address_file.exists()  # a stopped broker is not joined
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize(
    "argv",
    [
        ["collect"],
        ["probe", "--url", "http://127.0.0.1:1"],
        ["ingest"],
        ["jobs", "--publish"],
        ["tap"],
        ["receive"],
        ["run"],
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_commands_given_no_address_join_the_running_broker(
    broker_process: subprocess.Popen[str], broker_address_file: Path, argv: list[str]
) -> None:
    config = resolve_config(build_parser().parse_args(argv))
    assert config.bus.bootstrap_servers == broker_address_file.read_text().strip()


def test_ingest_given_no_address_really_uses_that_broker(
    broker_process: subprocess.Popen[str], broker_address_file: Path, tmp_path: Path
) -> None:
    """The topics ``ingest`` creates appear on the broker ``llmslo broker`` printed."""
    address = broker_address_file.read_text().strip()
    argv = ["ingest", "--db", str(tmp_path / "x.duckdb"), "--exit-when-idle", "1"]
    assert main(argv) == 0
    admin = KafkaAdminClient(bootstrap_servers=address)
    try:
        assert "llmslo.requests" in admin.list_topics()
    finally:
        admin.close()


@pytest.mark.parametrize(
    "argv",
    [
        ["ingest", "--db", "x.duckdb"],
        ["probe", "--url", "http://127.0.0.1:1", "--rounds", "1"],
        ["jobs", "--publish", "--once", "--db", "x.duckdb"],
    ],
    ids=["ingest", "probe", "jobs --publish"],
)
def test_an_address_nobody_answers_at_fails_fast_naming_the_way_out(
    argv: list[str],
    broker_process: subprocess.Popen[str],
    broker_address_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    dead = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    assert main([*argv, "--bootstrap-servers", dead]) == 2
    assert time.monotonic() - started < 10
    err = capsys.readouterr().err
    assert f"nothing answers at {dead}" in err
    assert broker_address_file.read_text().strip() in err  # the broker to use instead
    assert "embedded" in err
    assert not (tmp_path / "x.duckdb").exists()  # refused before anything was done


def test_a_stale_address_file_is_refused_naming_the_file(
    address_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    address_file.parent.mkdir(parents=True)
    address_file.write_text(f"127.0.0.1:{free_port()}\n")
    assert main(["probe", "--url", "http://127.0.0.1:1", "--rounds", "1"]) == 2
    err = capsys.readouterr().err
    assert str(address_file) in err and "nothing answers there" in err


def test_no_address_and_no_running_broker_says_the_broker_is_private(
    address_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = resolve_config(build_parser().parse_args(["collect", "--target", "127.0.0.1:1"]))
    assert config.bus.bootstrap_servers == "embedded"
    assert "private embedded broker that no other process reads" in capsys.readouterr().err
