"""The README's commands and every ``--help`` example are ones llmslo accepts as written (its
own parser, every flag and subcommand), and the files they read exist in a fresh clone: a
spec or config they name is in the repository, a DuckDB file is one a command makes under
``var/`` (the demo's, a history, a run's)."""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmslo.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
#: Options whose value is written, not read.
_OUTPUTS = {"-o", "--output", "--tests", "--into", "--json", ">"}
_FILE = re.compile(r"^[\w./-]+\.(ya?ml|duckdb)$")


def _joined(text: str) -> list[str]:
    """Lines with their ``\\`` continuations joined."""
    return re.sub(r"\\\n\s*", " ", text).splitlines()


#: The documents whose ``sh`` blocks are commands to run: the README, the package READMEs, docs/.
DOCUMENTS = [
    ROOT / "README.md",
    *sorted(ROOT.glob("*/README.md")),
    *sorted(ROOT.glob("docs/**/*.md")),
]


def _readme_commands() -> Iterator[str]:
    for document in DOCUMENTS:
        for block in re.findall(r"```(?:sh|bash|console)\n(.*?)```", document.read_text(), re.S):
            yield from (
                line.strip() for line in _joined(block) if line.strip().startswith("llmslo ")
            )


def _help_examples(parser: argparse.ArgumentParser) -> Iterator[str]:
    if parser.epilog:
        yield from (line.strip() for line in _joined(parser.epilog) if "llmslo " in line)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from _help_examples(child)


def _read_files(command: str) -> Iterator[str]:
    words = command.split("#")[0].replace("&&", " ").split()
    for before, word in zip(["", *words], words, strict=False):
        if before not in _OUTPUTS and _FILE.match(word) and not word.startswith("var/"):
            yield word


COMMANDS = sorted({*_readme_commands(), *_help_examples(build_parser())})


def test_the_examples_were_found() -> None:
    assert len(COMMANDS) > 50


@pytest.mark.parametrize("command", COMMANDS)
def test_every_file_an_example_reads_is_in_the_repository_or_made_under_var(command: str) -> None:
    missing = [name for name in _read_files(command) if not (ROOT / name).is_file()]
    assert not missing, f"{command!r} reads {missing}, which a fresh clone does not have"


def _invocations(command: str) -> Iterator[list[str]]:
    """The argument lists of each ``llmslo`` in ``command`` (joined by ``&&`` or a pipe),
    without a comment or a redirection."""
    for part in re.split(r"&&|\|", command.split("#")[0]):
        words = shlex.split(part.split(">")[0])
        if words[:1] == ["llmslo"]:
            yield words[1:]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_example_parses_as_written(command: str) -> None:
    for argv in _invocations(command):
        try:
            build_parser().parse_args(argv)
        except SystemExit as exit_:
            assert exit_.code == 0, f"llmslo refuses the documented command {command!r}"
