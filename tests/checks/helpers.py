"""Run ``llmslo check`` as a user does (``main(argv)``) and read its JSON report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmslo.cli import main

MANIFESTS = Path(__file__).parent / "manifests"


def run_check(tmp_path: Path, *argv: str) -> tuple[int, dict[str, dict[str, Any]]]:
    """Exit status and the rules by id."""
    out = tmp_path / "check.json"
    status = main(["check", *argv, "--format", "json", "-o", str(out)])
    rules = json.loads(out.read_text(encoding="utf-8"))["rules"]
    return status, {rule["id"]: rule for rule in rules}
