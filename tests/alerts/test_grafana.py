"""The Grafana boards: they parse back through the SDK's model, their PromQL is valid
(promtool) and names only series the generated rules record or the mapped exporters expose,
their queries show the right numbers over the generated rules (promtool over synthetic
series), and golden files pin them (LLMSLO_UPDATE_GOLDEN=1 rewrites them)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import dashboard, prometheus

from alerts import generate_rules, load_rule_model, render_bundle, write_all
from alerts.grafana import QUANTILE, dashboard_files
from alerts.model import RuleModel, RuleSlo
from alerts.testgen import encode_values
from collectors.dialects import load_dialects
from llmslo.cli import main
from slo.windows import format_duration
from tests.alerts.conftest import EXAMPLE_SPECS, REPO, SPECS, run

GOLDEN = Path(__file__).parent / "golden" / "grafana"
BOARDS = ("llmslo-slos.json", "llmslo-engines.json")
#: What Grafana substitutes before a query reaches Prometheus, for promtool's benefit.
_VARIABLES = {"$__rate_interval": "5m", "$pool": ".*"}
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "group_left", "group_right"}


def _boards(spec: Path) -> tuple[RuleModel, dict[str, Any]]:
    model = load_rule_model(spec)
    return model, {name: json.loads(text) for name, text in dashboard_files(model).items()}


def _panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def _exprs(board: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in _panels(board) for t in p.get("targets", [])]


def _substituted(expr: str) -> str:
    for variable, value in _VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def series_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers left once strings, label
    matchers, ranges, grouping clauses, function calls and keywords are taken out."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.:])([A-Za-z_:][\w:]*)(\s*\()?", text):
        if match.group(2) is None and match.group(1) not in _KEYWORDS:
            names.add(match.group(1))
    return names


def _alert_names(expr: str) -> set[str]:
    names = set()
    for op, value in re.findall(r'alertname\s*(=~|=)\s*"([^"]*)"', expr):
        names |= set(value.split("|")) if op == "=~" else {value}
    return names


def _exposed_names() -> set[str]:
    names = set()
    for dialect in load_dialects().values():
        for name in dialect.metrics:
            names |= {name, f"{name}_bucket", f"{name}_count", f"{name}_sum"}
    return names


@pytest.fixture(scope="module", autouse=True)
def _sdk_plugins() -> None:
    register_default_plugins()  # so panel options and targets decode to their typed models


@pytest.mark.parametrize("spec", EXAMPLE_SPECS, ids=lambda p: p.stem)
def test_every_board_parses_back_through_the_sdk_model_unchanged(spec: Path) -> None:
    for name, text in dashboard_files(load_rule_model(spec)).items():
        model = dashboard.Dashboard.from_json(json.loads(text))
        again = json.dumps(model, cls=JSONEncoder, sort_keys=True, indent=2, ensure_ascii=False)
        assert again + "\n" == text, f"{name} does not survive the SDK's model"
        panels = [p for p in model.panels or [] if isinstance(p, dashboard.Panel)]
        assert panels, name
        for panel in panels:
            assert panel.options is not None, f"{name}: {panel.title} has no typed options"
            assert all(isinstance(t, prometheus.Dataquery) for t in panel.targets or [])
        ids = [p.id_val for p in model.panels or []]
        assert ids == list(range(1, len(ids) + 1)), f"{name}: panel ids not unique"


@pytest.mark.parametrize("spec", EXAMPLE_SPECS, ids=lambda p: p.stem)
def test_every_query_names_only_recorded_or_exposed_series(spec: Path) -> None:
    model, boards = _boards(spec)
    rules = generate_rules(model)
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    allowed = recorded | _exposed_names() | {"ALERTS"}
    for name, board in boards.items():
        for expr in _exprs(board):
            unknown = series_names(expr) - allowed
            assert not unknown, f"{name}: {sorted(unknown)} in\n{expr}"
            assert _alert_names(expr) <= alerts, f"{name}: alerts the rules lack in\n{expr}"
    slo_board = _exprs(boards["llmslo-slos.json"])
    for slo in model.slos:  # every SLO shows up, under its own label scheme
        assert any(f'{slo.scheme.id}="{slo.id}"' in e for e in slo_board), slo.id


def test_the_name_check_catches_an_unknown_series() -> None:
    expr = 'sum by (pool) (rate(vllm:num_requests_runing{pool=~".*"}[5m])) / on(pool) group_left x'
    assert series_names(expr) == {"vllm:num_requests_runing", "x"}
    assert series_names("histogram_quantile(0.99, sum by (le) (rate(a_bucket[5m]))) * 0.001") == {
        "a_bucket"
    }


@pytest.mark.parametrize("spec", EXAMPLE_SPECS, ids=lambda p: p.stem)
def test_every_query_is_valid_promql(spec: Path, tmp_path: Path, promtool: str) -> None:
    _, boards = _boards(spec)
    exprs = sorted({_substituted(e) for board in boards.values() for e in _exprs(board)})
    rules = [{"record": f"llmslo:dashboard_check_{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    checked = run(promtool, "check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"{len(exprs)} rules found" in checked.stdout


def _panel(board: dict[str, Any], row_prefix: str, title: str) -> dict[str, Any]:
    row = None
    for panel in board["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
        elif row is not None and row.startswith(row_prefix) and panel["title"] == title:
            return panel
    raise AssertionError(f"no panel {title!r} under a row {row_prefix!r}")


_PER_MIN = 10_000.0


def _expr_test(expr: str, minute: int, value: float) -> dict[str, Any]:
    return {
        "expr": expr,
        "eval_time": f"{minute}m",
        "exp_samples": [{"labels": "{}", "value": value}],
    }


def _input_series(slo: RuleSlo, burn: float, minutes: int) -> list[dict[str, str]]:
    assert slo.recipe is not None
    bad_per_min = burn * slo.budget * _PER_MIN
    bad = [bad_per_min * m for m in range(minutes + 1)]
    total = [_PER_MIN * m for m in range(minutes + 1)]
    good = [t - b for t, b in zip(total, bad, strict=True)]
    labels = ",".join(f'{k}="{v}"' for k, v in sorted(slo.recipe.labels.items()))
    recipe = slo.recipe
    if recipe.kind == "histogram":
        bucket = ",".join(filter(None, (labels, f'le="{recipe.bound}"')))
        series = [
            (f"{recipe.metric}_bucket{{{bucket}}}", good),
            (f"{recipe.metric}_count{{{labels}}}", total),
        ]
    else:
        ok = ",".join(filter(None, (labels, 'outcome="ok"')))
        error = ",".join(filter(None, (labels, 'outcome="error"')))
        series = [(f"{recipe.metric}{{{ok}}}", good), (f"{recipe.metric}{{{error}}}", bad)]
    return [{"series": name, "values": encode_values(values)} for name, values in series]


@pytest.mark.parametrize(
    ("spec", "slo_id"),
    [
        (REPO / "config" / "slo.example.yaml", "inference-availability"),
        (SPECS / "engines.yaml", "fleet-e2e-trtllm"),
        (SPECS / "engines.yaml", "fleet-tpot-sglang"),
    ],
    ids=["tap availability by pool", "trtllm e2e ungrouped", "sglang tpot, two pairs"],
)
@pytest.mark.parametrize("burn", [20.0, 0.5], ids=["burning 20x", "burning 0.5x"])
def test_the_slo_row_shows_burn_budget_left_and_alerts_over_the_generated_rules(
    spec: Path, slo_id: str, burn: float, tmp_path: Path, promtool: str
) -> None:
    model, boards = _boards(spec)
    slo = next(s for s in model.slos if s.id == slo_id)
    board = boards["llmslo-slos.json"]
    row = f"{slo.service} / {slo.name}:"
    page = slo.pairs[0]
    page_panel = f"Burn rate {format_duration(page.long_ms)}/{format_duration(page.short_ms)}"
    burn_long = _panel(board, row, f"{page_panel} ({page.severity}, ×{page.factor:g})")
    burn_long_expr = burn_long["targets"][0]["expr"]  # the long window's line
    steps = burn_long["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1]["value"] == page.factor  # the line the page alert crosses
    left = _panel(board, row, f"Error budget left ({slo.period})")["targets"][0]["expr"]
    firing = _panel(board, row, "Alerts firing")["targets"][0]["expr"]
    rules = tmp_path / "rules.yml"
    write_all(render_bundle(model, rules))
    pairs_firing = sum(1 for p in slo.pairs if p.factor < burn)
    minute = 65  # the page pair's long window (1h) is full of data
    test = {
        "rule_files": [rules.name],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": _input_series(slo, burn, 80),
                "promql_expr_test": [
                    _expr_test(f"round(sum({burn_long_expr}), 0.0001)", minute, burn),
                    _expr_test(f"round(sum({left}), 0.0001)", minute, 1 - burn),
                    _expr_test(firing, minute, pairs_firing),
                ],
            }
        ],
    }
    path = tmp_path / "dashboard.test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    result = run(promtool, "test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_cli_writes_both_boards_and_nothing_on_a_bad_spec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = SPECS / "sloth-getting-started.yaml"
    out = tmp_path / "grafana"
    assert main(["dashboards", "grafana", str(spec), "-o", str(out), "--prefix", "checkout"]) == 0
    expected = dashboard_files(load_rule_model(spec), "checkout")
    assert {p.name: p.read_text(encoding="utf-8") for p in out.iterdir()} == expected
    assert json.loads(expected["checkout-slos.json"])["uid"] == "checkout-slos"
    assert str(out / "checkout-engines.json") in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: prometheus/v1\nservice: x\nslos: [{name: a}]\n")
    empty = tmp_path / "empty"
    assert main(["dashboards", "grafana", str(bad), "-o", str(empty)]) == 2
    assert not empty.exists()
    assert main(["dashboards", "grafana", str(spec), "-o", str(empty), "--prefix", "../x"]) == 2
    assert "prefix '../x'" in capsys.readouterr().err
    assert not empty.exists()


def test_boards_match_the_golden_files() -> None:
    spec = REPO / "config" / "slo.example.yaml"
    files = dashboard_files(load_rule_model(spec))
    assert files == dashboard_files(load_rule_model(spec)), "rendering is not deterministic"
    assert sorted(files) == sorted(BOARDS)
    if os.environ.get("LLMSLO_UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (GOLDEN / name).write_text(text, encoding="utf-8")
    for name, text in files.items():
        stored = (GOLDEN / name).read_text(encoding="utf-8")
        assert stored == text, f"{name} differs: run with LLMSLO_UPDATE_GOLDEN=1, review the diff"


def _engine_panel_expr(title: str) -> str:
    _, boards = _boards(REPO / "config" / "slo.example.yaml")
    board = boards["llmslo-engines.json"]
    panel = next(p for p in _panels(board) if p.get("title") == title)
    return _substituted(panel["targets"][0]["expr"])


def test_engine_graphs_read_each_dialect_once_and_in_seconds(tmp_path: Path, promtool: str) -> None:
    """A vLLM 0.10 exposing the KV gauge under both names is one line, the current name; Triton's active
    requests, not its waiting ones, are running; its TTFT histogram in ms is read in s."""
    vllm = 'pool="llama",instance="pod-0:8000"'
    triton = 'pool="trt",instance="pod-1:8000"'
    ms_bounds = {"100": 0, "500": 1, "+Inf": 1}  # every request between 100 and 500 ms
    series = {
        f"vllm:kv_cache_usage_perc{{{vllm}}}": "0.7x10",
        f"vllm:gpu_cache_usage_perc{{{vllm}}}": "0.65x10",  # the old name must not win
        f'nv_trt_llm_request_metrics{{{triton},request_type="active"}}': "3x10",
        f'nv_trt_llm_request_metrics{{{triton},request_type="waiting"}}': "5x10",
        **{
            f'nv_inference_first_response_histogram_ms_bucket{{{triton},le="{le}"}}': f"0+{60 * n}x10"
            for le, n in ms_bounds.items()
        },
    }
    # histogram_quantile interpolates linearly inside the (100, 500] ms bucket.
    ttft_s = (100 + (500 - 100) * QUANTILE) / 1000
    cases = [
        ("KV cache usage", [(vllm, 0.7)]),
        ("Running requests", [(triton, 3.0)]),
        ("Waiting requests", [(triton, 5.0)]),
        ("TTFT p99", [(triton, ttft_s)]),
    ]
    tests = [
        {
            "expr": f"round({_engine_panel_expr(title)}, 0.000001)",
            "eval_time": "8m",
            "exp_samples": [
                {"labels": "{" + labels + "}", "value": value} for labels, value in want
            ],
        }
        for title, want in cases
    ]
    rules = tmp_path / "empty.rules.yml"
    rules.write_text("groups: []\n")
    document = {
        "rule_files": [rules.name],
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series.items()],
                "promql_expr_test": tests,
            }
        ],
    }
    path = tmp_path / "engines.test.yml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    result = run(promtool, "test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
