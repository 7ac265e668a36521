"""The time units are declared once, in :mod:`pipeline.units`; every other module imports them."""

from __future__ import annotations

import ast
from pathlib import Path

from pipeline.units import DAY_MS, HOUR_MS, MINUTE_MS, SECOND_MS, ceil_to, floor_to

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline", "collectors", "simulator", "slo", "alerts", "api", "dashboards", "llmslo")
FOLDERS = (*PACKAGES, "tests", "bench")
#: A name that reads as a time unit (``MINUTE_MS``, ``_HOUR_MS``, ``DAY``, ``MIN`` …) bound
#: to a number or to arithmetic
UNIT_NAMES = {"SECOND", "MINUTE", "MIN", "HOUR", "DAY"}
#: The values of the units, so ``HOUR = 3_600_000`` is caught under any name.
UNIT_VALUES = {SECOND_MS, MINUTE_MS, HOUR_MS, DAY_MS} - {SECOND_MS}  # 1_000 is too common


def _is_unit(name: str) -> bool:
    return name.strip("_").removesuffix("_MS") in UNIT_NAMES


def _literal(node: ast.expr) -> int | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, int) else None


def _unit_declarations(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Assign):
            continue
        targets = [
            t for target in node.targets for t in ast.walk(target) if isinstance(t, ast.Name)
        ]
        values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
        arithmetic = all(_literal(v) is not None or isinstance(v, ast.BinOp) for v in values)
        for target in targets:
            if _is_unit(target.id) and target.id.isupper() and arithmetic:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {target.id}")
        if any(_literal(v) in UNIT_VALUES for v in values) and all(t.id.isupper() for t in targets):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} = {ast.unparse(node.value)}")
    return found


def test_no_module_but_pipeline_units_declares_a_time_unit() -> None:
    own = ROOT / "pipeline" / "units.py"
    paths = [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py")) if p != own]
    found = [line for path in paths for line in _unit_declarations(path)]
    assert found == [], "time units declared outside pipeline/units.py:\n" + "\n".join(found)


def test_the_units_are_what_their_names_say() -> None:
    assert (SECOND_MS, MINUTE_MS, HOUR_MS, DAY_MS) == (1_000, 60_000, 3_600_000, 86_400_000)


def test_buckets_are_epoch_aligned_floors_and_ceilings() -> None:
    assert [floor_to(t, MINUTE_MS) for t in (-1, 0, 59_999, 60_000)] == [-60_000, 0, 0, 60_000]
    assert [ceil_to(t, MINUTE_MS) for t in (-1, 0, 1, 60_000)] == [0, 0, 60_000, 60_000]
