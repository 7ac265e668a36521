"""Helpers for the alerts tests: generate a spec's bundle into a directory, run promtool."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from alerts import load_rule_model, render_bundle, write_all
from tests.conftest import require_tool

REPO = Path(__file__).resolve().parents[2]
SPECS = Path(__file__).parent / "specs"
#: Every example spec the project ships plus the test specs (all sources and formats).
EXAMPLE_SPECS = [
    REPO / "config" / "slo.example.yaml",
    SPECS / "engines.yaml",
    SPECS / "openslo.yaml",
    SPECS / "sloth-getting-started.yaml",
]


@pytest.fixture(scope="session")
def promtool() -> str:
    """Path of promtool (Debian ``prometheus``)."""
    return require_tool("promtool")


def generate(spec: Path, out: Path) -> tuple[Path, list[Path]]:
    """Write ``spec``'s rule file and promtool tests under ``out``; returns their paths."""
    rules = out / "rules.yml"
    files = render_bundle(load_rule_model(spec), rules, out / "tests")
    write_all(files)
    return rules, sorted(p for p in files if p != rules)


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    """Run a binary, capturing text output (never raises on exit status)."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
