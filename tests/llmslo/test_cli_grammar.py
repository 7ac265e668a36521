"""One CLI grammar: the same flag for the same thing in every command, one default spec."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmslo.cli import build_parser, main
from llmslo.run import load_model


def _commands() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    def walk(
        parser: argparse.ArgumentParser, name: str
    ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        for action in subs:
            for word, child in action.choices.items():
                yield from walk(child, f"{name} {word}".strip())
        if name:
            yield name, parser

    yield from walk(build_parser(), "")


COMMANDS = dict(_commands())


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings]


def _by_dest(parser: argparse.ArgumentParser, *dests: str) -> list[argparse.Action]:
    return [a for a in _options(parser) if a.dest in dests]


def test_every_command_is_walked() -> None:
    assert {"run", "api", "jobs", "slo validate", "slo report", "sim", "tap", "check"} <= set(
        COMMANDS
    )


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_config_file_is_dash_c_and_config(name: str) -> None:
    for action in _by_dest(COMMANDS[name], "config"):
        assert action.option_strings[:2] == ["-c", "--config"], name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_duckdb_file_is_db(name: str) -> None:
    for action in _options(COMMANDS[name]):
        if "duckdb" in (action.help or "").lower() and action.dest not in ("into",):
            assert "--db" in action.option_strings, (name, action.option_strings)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_an_slo_spec_is_spec_with_one_stated_default(name: str) -> None:
    for action in _by_dest(COMMANDS[name], "spec"):
        if name == "check":  # checks a spec when given one; none is no check
            continue
        assert action.option_strings == ["--spec"], name
        assert "example spec shipped with llmslo" in (action.help or ""), name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_port_a_command_listens_on_is_port(name: str) -> None:
    """Its main listening port is ``--port``; a second port says what it serves
    (``--metrics-port``); older spellings stay as aliases after it."""
    for action in _options(COMMANDS[name]):
        spellings = action.option_strings
        if any(s.endswith("-port") or s == "--port" for s in spellings):
            assert spellings[0] in ("--port", "--metrics-port"), (name, spellings)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_address_a_command_listens_on_is_host(name: str) -> None:
    """A listen address is ``--host`` (and its port ``--port``); ``HOST:PORT`` in one flag
    (the tap's ``--listen``) is only a deprecated alias."""
    for action in _options(COMMANDS[name]):
        if action.dest == "host":
            assert action.option_strings == ["--host"], name
        if action.dest == "listen":
            assert (action.help or "").startswith("deprecated"), name
            assert _by_dest(COMMANDS[name], "host") and _by_dest(COMMANDS[name], "port"), name


@pytest.mark.parametrize(
    ("argv", "listen"),
    [
        pytest.param([], "127.0.0.1:8100", id="the configured address by default"),
        pytest.param(["--port", "0"], "127.0.0.1:0", id="--port alone keeps the host"),
        pytest.param(["--host", "0.0.0.0", "--port", "9"], "0.0.0.0:9", id="--host and --port"),
        pytest.param(["--listen", "10.0.0.1:7"], "10.0.0.1:7", id="--listen still works"),
        pytest.param(["--listen", "10.0.0.1:7", "--port", "8"], "10.0.0.1:8", id="--port wins"),
    ],
)
def test_the_tap_serves_where_host_and_port_say(argv: list[str], listen: str) -> None:
    from llmslo.commands.tap import tap_config
    from llmslo.sections import load_config

    args = build_parser(["tap"]).parse_args(["tap", "--upstream", "http://127.0.0.1:1", *argv])
    assert tap_config(load_config(None), args).listen == listen


@pytest.mark.parametrize("name", ["ingest", "collect", "probe", "run"])
def test_a_long_running_process_can_be_quieted(name: str) -> None:
    assert [a.option_strings for a in _by_dest(COMMANDS[name], "quiet")] == [["-q", "--quiet"]]


def test_jobs_start_on_the_example_spec_when_given_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As `llmslo run`, `llmslo api` and the dashboard do, instead of refusing to start."""
    assert main(["jobs", "--db", str(tmp_path / "j.duckdb"), "--once"]) == 0
    assert json.loads(capsys.readouterr().out)["jobs"] == "once"


@pytest.mark.parametrize("name", ["run", "api", "jobs", "slo report", "slo validate"])
def test_commands_that_read_a_spec_default_to_the_example(name: str) -> None:
    assert COMMANDS[name].parse_args([]).spec is None
    documented = Path(__file__).resolve().parents[2] / "config" / "slo.example.yaml"
    assert [s.id for s in load_model(None).slos] == [s.id for s in load_model(documented).slos]
