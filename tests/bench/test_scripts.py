"""Every benchmark runs the way the README says (``python bench/<name>.py``), from any folder.

Run as a script, a benchmark's folder comes first on ``sys.path``: a script named like one of
our packages (``bench/api.py`` beside ``api/``) would shadow it and the benchmark would crash on import.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for p in (ROOT / "bench").glob("*.py") if p.name != "__init__.py")
PACKAGES = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"bench", "tests"}


def test_the_packages_are_found() -> None:
    assert {"pipeline", "slo", "api", "llmslo"} <= PACKAGES


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_no_benchmark_is_named_like_a_package(script: Path) -> None:
    assert script.stem not in PACKAGES, (
        f"bench/{script.name} would shadow the {script.stem} package"
    )


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_answers_help_from_another_folder(script: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(script), "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--quick" in done.stdout, f"bench/{script.name} --help names no --quick"


def test_the_readme_gives_the_dashboard_benchmarks_quick_volume_its_help_gives() -> None:
    help_text = subprocess.run(
        [sys.executable, str(ROOT / "bench/dashboard.py"), "--help"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    quick = re.search(r"--quick\s+(\d+) days? × (\d+) instances", help_text)
    assert quick is not None, help_text
    days, pods = quick.groups()
    row = next(
        line for line in (ROOT / "README.md").read_text().splitlines()
        if line.startswith("| `bench/dashboard.py`")
    )  # fmt: skip
    assert f"`--quick` is {days} d × {pods} instances" in row
