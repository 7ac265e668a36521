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
    "checks": 3,
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


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Module → the modules of ours it imports (any import, ``TYPE_CHECKING`` ones included:
    a circle there is still a circle a reader has to untangle). A package's ``__init__`` that
    re-exports is an edge to the module it re-exports from; an import of a package is an edge
    to its ``__init__``, of a name from a package to that submodule when there is one."""
    modules = {_module_name(path): path for _, path in _modules()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for imported in _imports(path):
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                edges.add(imported)
        graph[name] = edges
    return graph


def test_no_module_imports_itself_through_a_circle() -> None:
    graph = _import_graph()
    # A package's __init__ importing its own submodules is how it re-exports, not a circle
    # a reader has to follow: leave those edges out.
    for name, edges in graph.items():
        edges -= {m for m in list(edges) if m.startswith(name + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert circles == [], "import circles: " + "; ".join(" → ".join(c) for c in circles)
