"""Live evaluators: one small function per ``live.check`` of ``rules.yaml``, over the store.

Reads go through :mod:`slo.queries` where it has the question (open findings, drills, the
tables present); the two it has not (which canonical signals any engine sample carries,
the largest completion seen at the tap) are the parameterised SQL of this module. An
absent store or a table the pipeline has not written is ``unknown`` with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb

from checks.results import Evidence, Status
from slo.queries import drills, open_findings, present_tables

__all__ = ["LIVE_CHECKS", "LiveInputs"]


@dataclass(frozen=True)
class LiveInputs:
    """The store (a read-only connection, or ``None``) and llmslo's config, if given."""

    con: duckdb.DuckDBPyConnection | None = None
    config: Mapping[str, Any] | None = None


def _tables(inputs: LiveInputs) -> set[str] | None:
    return present_tables(inputs.con) if inputs.con is not None else None


def signals_seen(con: duckdb.DuckDBPyConnection, signals: Sequence[str]) -> dict[str, int]:
    """Canonical signal → how many samples of it the store holds (absent: not seen)."""
    marks = ", ".join("?" for _ in signals)
    sql = f"SELECT signal, count(*) FROM engine_samples WHERE signal IN ({marks}) GROUP BY signal"
    return {name: int(n) for name, n in con.execute(sql, list(signals)).fetchall()}


def _counter_increase(con: duckdb.DuckDBPyConnection, signal: str) -> float:
    """Sum over series of (last − first) of a counter; resets make it an underestimate."""
    sql = """
        SELECT coalesce(sum(hi - lo), 0) FROM (
            SELECT arg_max(value, ts_ms) AS hi, arg_min(value, ts_ms) AS lo FROM engine_samples
            WHERE signal = ? GROUP BY instance, coalesce(engine, ''), metric, labels_json)"""
    row = con.execute(sql, [signal]).fetchone()
    return float(row[0]) if row else 0.0


def _lacks(inputs: LiveInputs, table: str, reason: str) -> Evidence | None:
    """``unknown`` when there is no store or it has no ``table`` yet, else ``None``."""
    tables = _tables(inputs)
    if tables is None:
        return Evidence("unknown", "no store given (--db)")
    if table not in tables:
        return Evidence("unknown", reason)
    return None


def _con(inputs: LiveInputs) -> duckdb.DuckDBPyConnection:
    assert inputs.con is not None  # callers asked _lacks first
    return inputs.con


def _engine_store(inputs: LiveInputs) -> Evidence | None:
    return _lacks(inputs, "engine_samples", "the store holds no engine samples")


def signals_present(params: Mapping[str, Any], inputs: LiveInputs) -> Evidence:
    missing_store = _engine_store(inputs)
    if missing_store:
        return missing_store
    wanted = [str(s) for s in params["signals"]]
    seen = signals_seen(_con(inputs), wanted)
    absent = [s for s in wanted if s not in seen]
    shown = ", ".join(f"{s} ({n} samples)" for s, n in sorted(seen.items())) or "none"
    ok = bool(seen) if params.get("any") else not absent
    if ok:
        return Evidence("pass", f"seen: {shown}")
    return Evidence("fail", f"not in the store: {', '.join(absent)}; seen: {shown}")


def nan_detection(params: Mapping[str, Any], inputs: LiveInputs) -> Evidence:
    missing_store = _engine_store(inputs)
    if missing_store:
        return missing_store
    if "corrupted_requests" not in signals_seen(_con(inputs), ["corrupted_requests"]):
        return Evidence(
            "fail", "no engine exports a corrupted-request counter: NaN logits go uncounted"
        )
    counted = _counter_increase(_con(inputs), "corrupted_requests")
    return Evidence("pass", f"corrupted_requests exported, {counted:g} counted in the store")


def no_open_findings(params: Mapping[str, Any], inputs: LiveInputs) -> Evidence:
    lacking = _lacks(inputs, "slo_findings", "the SLO jobs have written no findings yet")
    if lacking:
        return lacking
    wanted = set(params["signals"])
    firing = [
        f"{row['signal']} on {row['scope_id']}"
        for row in open_findings(_con(inputs)).to_pylist()
        if row["signal"] in wanted
    ]
    if firing:
        return Evidence("fail", "firing: " + ", ".join(firing))
    return Evidence("pass", f"no open {' / '.join(sorted(wanted))} finding")


def table_rows(params: Mapping[str, Any], inputs: LiveInputs) -> Evidence:
    tables = _tables(inputs)
    if tables is None or inputs.con is None:
        return Evidence("unknown", "no store given (--db)")
    table = str(params["table"])
    # `empty`: what no rows mean — fail where rows must flow (GPU samples), unknown where
    # they appear only once something happened (a flag raised, a verdict asked for)
    empty: Status = "fail" if params.get("empty") == "fail" else "unknown"
    if table not in tables:
        return Evidence(empty, f"the store has no {table} table")
    # the table name comes from rules.yaml (data we ship), checked against the store's list
    row = inputs.con.execute(f"SELECT count(*) FROM {table}").fetchone()
    rows = int(row[0]) if row else 0
    return Evidence("pass" if rows else empty, f"{rows} rows in {table}")


def drills_passed(params: Mapping[str, Any], inputs: LiveInputs) -> Evidence:
    lacking = _lacks(inputs, "drills", "no drill run in the store (llmslo drill --db)")
    if lacking:
        return lacking
    every = drills(_con(inputs)).to_pylist()
    false_positives = sum(r["false_positives"] or 0 for r in every)
    rows = [r for r in every if r["fault"]]  # the healthy control injects nothing
    modes, faults = params.get("modes"), params.get("faults")
    if modes or faults:
        rows = [
            r
            for r in rows
            if any(m in r["mode"] for m in modes or ()) or r["fault"] in (faults or ())
        ]
        if not rows:
            wanted = ", ".join([*(modes or ()), *(faults or ())])
            return Evidence("unknown", f"the last drill run has no {wanted} mode")
    missed = [r["mode"] for r in rows if not r["detected"]]
    noise = f"; {false_positives} false positives"
    if missed:
        undetected = f"{len(missed)}/{len(rows)} undetected: {', '.join(missed)}"
        return Evidence("fail", f"last run: {undetected}{noise}")
    return Evidence("pass", f"last run: {len(rows)} modes, each detected{noise}")


def max_output_tokens(params: Mapping[str, Any], inputs: LiveInputs) -> Evidence:
    lacking = _lacks(inputs, "requests", "the store holds no tap request records")
    if lacking:
        return lacking
    row = _con(inputs).execute("SELECT max(completion_tokens), count(*) FROM requests").fetchone()
    largest, count = (row[0], row[1]) if row else (None, 0)
    if not count or largest is None:
        return Evidence("unknown", "no completion token counts at the tap")
    cap: Any = inputs.config
    for part in params["config_path"]:
        cap = cap.get(part) if isinstance(cap, Mapping) else None
    if cap is None:
        return Evidence("unknown", f"largest completion {largest} tokens; no cap configured")
    ok = int(largest) <= int(cap)
    return Evidence("pass" if ok else "fail", f"largest completion {largest} tokens, cap {cap}")


def not_observable(params: Mapping[str, Any], inputs: LiveInputs) -> Evidence:
    return Evidence("unknown", str(params["reason"]))


LiveCheck = Callable[[Mapping[str, Any], LiveInputs], Evidence]
#: ``live.check`` of ``rules.yaml`` → evaluator.
LIVE_CHECKS: dict[str, LiveCheck] = {
    "signals_present": signals_present,
    "nan_detection": nan_detection,
    "no_open_findings": no_open_findings,
    "table_rows": table_rows,
    "drills_passed": drills_passed,
    "max_output_tokens": max_output_tokens,
    "not_observable": not_observable,
}
