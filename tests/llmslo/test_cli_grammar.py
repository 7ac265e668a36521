"""One CLI grammar: the same flag names for the same things in every command, one default spec.

Table-driven over the real parser of ``llmslo``: every subcommand (walked, so a new one is
checked too) spells the shared flags one way, the table says which command has which, and
every command that takes an SLO spec falls back to the example spec when given none.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from llmslo.cli import build_parser
from llmslo.options import EXAMPLE_SPEC, resolve_spec

#: A shared flag's one spelling: its option strings, exactly.
SPELLING = {
    "--config": ("-c", "--config"),
    "--db": ("--db",),
    "--spec": ("--spec",),
    "--host": ("--host",),
    "--port": ("--port",),
    "--bootstrap-servers": ("--bootstrap-servers",),
}
#: Spellings a user must not meet in ``--help`` any more (still parsed, hidden).
RETIRED = {"--listen", "--api-listen"}

#: Command → the shared flags it must offer.
SHARED = {
    "api": {"--config", "--db", "--spec", "--host", "--port"},
    "dashboard": {"--config", "--db", "--host", "--port"},
    "broker": {"--host", "--port"},
    "receive": {"--config", "--host", "--port", "--bootstrap-servers"},
    "tap": {"--config", "--host", "--port", "--bootstrap-servers"},
    "run": {"--config", "--db", "--spec", "--bootstrap-servers"},
    "jobs": {"--config", "--db", "--spec", "--bootstrap-servers"},
    "ingest": {"--config", "--db", "--bootstrap-servers"},
    "collect": {"--config", "--bootstrap-servers"},
    "probe": {"--config", "--bootstrap-servers"},
    "sim": {"--config"},
    "sim history": {"--config", "--db", "--bootstrap-servers"},
    "slo validate": {"--config", "--db", "--spec"},
    "slo report": {"--config", "--db", "--spec"},
    "rules generate": {"--spec"},
    "dashboards grafana": {"--spec"},
    "alerts": {"--config", "--db"},
    "lake export": {"--config", "--db"},
    "check": {"--config", "--db", "--spec"},
}

#: Command line (without the spec) of every command whose spec defaults to the example.
DEFAULT_SPEC = {
    "api": ["api"],
    "run": ["run"],
    "jobs": ["jobs"],
    "slo validate": ["slo", "validate"],
    "slo report": ["slo", "report"],
    "rules generate": ["rules", "generate", "-o", "-"],
    "dashboards grafana": ["dashboards", "grafana", "-o", "out"],
}


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    if path:
        yield " ".join(path), parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


COMMANDS = dict(_commands(build_parser()))


def _visible_options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS]


def test_the_table_names_real_commands() -> None:
    assert set(SHARED) <= set(COMMANDS)
    assert set(DEFAULT_SPEC) <= set(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_shared_flags_have_one_spelling_in_every_command(command: str) -> None:
    """``-c`` always goes with ``--config``; no command shows a retired spelling."""
    for action in _visible_options(COMMANDS[command]):
        for name, spelling in SPELLING.items():
            if name in action.option_strings:
                assert tuple(action.option_strings) == spelling, f"{command}: {name}"
        assert not RETIRED & set(action.option_strings), f"{command}: {action.option_strings}"


@pytest.mark.parametrize("command", sorted(SHARED))
def test_each_command_offers_its_shared_flags(command: str) -> None:
    offered = {s for a in _visible_options(COMMANDS[command]) for s in a.option_strings}
    assert SHARED[command] <= offered, f"{command} lacks {SHARED[command] - offered}"


@pytest.mark.parametrize("command", sorted(DEFAULT_SPEC))
def test_every_spec_defaults_to_the_example_and_help_says_so(command: str) -> None:
    (spec,) = [a for a in COMMANDS[command]._actions if "--spec" in a.option_strings]
    assert "config/slo.example.yaml" in str(spec.help)
    args = build_parser().parse_args(DEFAULT_SPEC[command])
    assert resolve_spec(args) == EXAMPLE_SPEC


@pytest.mark.parametrize(
    ("argv", "dest", "value"),
    [
        (["api", "--api-port", "0"], "port", 0),
        (["tap", "--listen", "127.0.0.1:9"], "listen", "127.0.0.1:9"),
        (["slo", "validate", "mine.yaml"], "spec_positional", "mine.yaml"),
        (["rules", "generate", "mine.yaml", "-o", "-"], "spec_positional", "mine.yaml"),
    ],
    ids=["api --api-port", "tap --listen", "slo validate SPEC", "rules generate SPEC"],
)
def test_old_spellings_still_parse(argv: list[str], dest: str, value: object) -> None:
    args = build_parser().parse_args(argv)
    assert str(getattr(args, dest)) == str(value)
