"""Renderers of a :class:`~checks.results.CheckReport`: a table for people, JSON and JUnit
XML for CI. Deterministic (table order, no timestamps)."""

from __future__ import annotations

import json
import textwrap
import xml.etree.ElementTree as ET
from typing import Any

from checks.results import CheckReport, RuleResult

__all__ = ["FORMATS", "render_json", "render_junit", "render_report", "render_table"]

FORMATS = ("table", "json", "junit")
_MARK = {"pass": "PASS", "fail": "FAIL", "unknown": "?"}


def _status(result: RuleResult) -> str:
    return "silenced" if result.silenced and result.status == "fail" else result.status


def render_table(report: CheckReport) -> str:
    """Per rule: id, severity, status, then the seed, each side's evidence and the fix."""
    lines: list[str] = []
    for r in report.results:
        lines.append(
            f"{_status(r).upper():<8} {r.rule.id:<28} {r.rule.severity:<8} {r.rule.source}"
        )
        lines.append(f"         seed:   {r.rule.seed}")
        for side, ev in (("static", r.static), ("live", r.live)):
            body = textwrap.shorten(ev.detail, 400, placeholder=" …")
            lines.append(f"         {side + ':':<7} {_MARK[ev.status]:<4} {body}")
        if r.silenced:
            lines.append(f"         silenced: {r.silenced}")
        elif r.status != "pass":
            lines.append(f"         fix:    {r.rule.fix}")
    counts = {s: sum(_status(r) == s for r in report.results) for s in _MARK | {"silenced": ""}}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    return "\n".join(lines) + "\n"


def _result_json(r: RuleResult) -> dict[str, Any]:
    return {
        "id": r.rule.id,
        "severity": r.rule.severity,
        "source": r.rule.source,
        "seed": r.rule.seed,
        "status": _status(r),
        "static": {"status": r.static.status, "evidence": r.static.detail},
        "live": {"status": r.live.status, "evidence": r.live.detail},
        "fix": r.rule.fix,
        "silenced": r.silenced,
    }


def render_json(report: CheckReport) -> str:
    """``{"rules": [...]}``, one object per rule."""
    return json.dumps({"rules": [_result_json(r) for r in report.results]}, indent=2) + "\n"


def render_junit(report: CheckReport) -> str:
    """One ``testcase`` per rule; fail → ``failure``, unknown → ``skipped``, silenced →
    ``skipped`` with the reason."""
    suite = ET.Element(
        "testsuite",
        name="llmslo check",
        tests=str(len(report.results)),
        failures=str(sum(_status(r) == "fail" for r in report.results)),
        skipped=str(sum(_status(r) in ("unknown", "silenced") for r in report.results)),
    )
    for r in report.results:
        case = ET.SubElement(
            suite, "testcase", classname=f"llmslo.check.{r.rule.severity}", name=r.rule.id
        )
        evidence = f"static: {r.static.detail}\nlive: {r.live.detail}"
        status = _status(r)
        if status == "fail":
            failure = ET.SubElement(case, "failure", message=r.rule.fix, type=r.rule.severity)
            failure.text = evidence
        elif status in ("unknown", "silenced"):
            ET.SubElement(case, "skipped", message=r.silenced or evidence)
        out = ET.SubElement(case, "system-out")
        out.text = f"{r.rule.source}: {r.rule.seed}\n{evidence}"
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def render_report(report: CheckReport, fmt: str) -> str:
    """The report in ``fmt`` (one of :data:`FORMATS`)."""
    return {"table": render_table, "json": render_json, "junit": render_junit}[fmt](report)
