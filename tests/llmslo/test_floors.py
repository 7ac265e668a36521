"""The floors hold: the spine imports no package of ours above it; nobody imports private modules
of another package; ``llmslo`` is imported by nobody."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLOOR = {
    "pipeline": 1,
    "collectors": 2,
    "simulator": 2,
    "slo": 2,
    "alerts": 3,
    "api": 3,
    "dashboards": 3,
    "llmslo": 4,
}


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _modules() -> list[tuple[str, Path]]:
    return [(package, path) for package in FLOOR for path in sorted((ROOT / package).rglob("*.py"))]


@pytest.mark.parametrize(("package", "path"), _modules(), ids=lambda v: str(v))
def test_imports_never_run_up_a_floor_nor_into_private_modules(package: str, path: Path) -> None:
    for name in _imports(path):
        top, *rest = name.split(".")
        if top not in FLOOR or top == package:
            continue
        assert FLOOR[top] < FLOOR[package], f"{path.relative_to(ROOT)} imports {name} (upward)"
        assert not any(part.startswith("_") for part in rest), (
            f"{path.relative_to(ROOT)} imports a private module of {top}: {name}"
        )
