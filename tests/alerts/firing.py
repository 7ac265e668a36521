"""When alerts fire: run promtool over synthetic series and read which alerts are firing at
every evaluation minute, so two rule files can be compared by behaviour, not by text.

promtool reports a ``promql_expr_test`` whose samples differ from the expected ones with
what it got; each minute is asked to return nothing, so every minute with a firing alert is
reported with its label sets, and a minute that is not reported had none.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.alerts.conftest import run

_FAILURE = re.compile(r"time: ([0-9hms.]+),\s*\n\s*exp:.*\n\s*got: (.*)")
_LABELS = re.compile(r"\{([^}]*)\}")
_PAIR = re.compile(r'(\w+)="([^"]*)"')
_UNIT_S = {"h": 3600, "m": 60, "s": 1}

#: minute → the label sets (as sorted tuples) of the alerts firing then.
Timeline = dict[int, frozenset[tuple[tuple[str, str], ...]]]


def _minutes(text: str) -> int:
    seconds = sum(int(n) * _UNIT_S[u] for n, u in re.findall(r"(\d+)([hms])", text))
    return seconds // 60


def firing_timeline(
    promtool: str,
    rules: Path,
    series: dict[str, str],
    minutes: int,
    by: tuple[str, ...],
    work: Path,
) -> Timeline:
    """Which alerts (by the labels ``by``) fire at each minute 0..``minutes`` of ``series``
    (promtool ``values`` notation, one sample a minute), under the rules of ``rules``."""
    groups = [g["name"] for g in yaml.safe_load(rules.read_text())["groups"]]
    query = f'count by ({", ".join(by)}) (ALERTS{{alertstate="firing"}})'
    document = {
        "rule_files": [str(rules.resolve())],
        "evaluation_interval": "1m",
        "group_eval_order": groups,
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": k, "values": v} for k, v in series.items()],
                "promql_expr_test": [
                    {"expr": query, "eval_time": f"{m}m", "exp_samples": []}
                    for m in range(minutes + 1)
                ],
            }
        ],
    }
    test = work / f"{rules.stem}.timeline.test.yml"
    test.write_text(yaml.safe_dump(document))
    result = run(promtool, "test", "rules", str(test))
    output = result.stdout + result.stderr
    if result.returncode != 0 and "got:" not in output:
        raise AssertionError(f"promtool failed without a result:\n{output}")
    timeline: Timeline = {}
    for time, got in _FAILURE.findall(output):
        sets = frozenset(tuple(sorted(_PAIR.findall(body))) for body in _LABELS.findall(got))
        timeline[_minutes(time)] = sets
    return timeline
