"""Generated rules pass promtool check, their generated tests pass promtool test, and the
tests catch wrong rules. Golden files pin the output (LLMSLO_UPDATE_GOLDEN=1 rewrites them)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from alerts import SIGNATURES, load_rule_model, render_bundle
from alerts.sources import le_matcher
from alerts.testgen import encode_values
from collectors.tap.telemetry import TPOT_BUCKETS_S, TTFT_BUCKETS_S
from tests.alerts.conftest import EXAMPLE_SPECS, REPO, SPECS, generate, run

GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.slow  # promtool evaluates the whole rule file at every step of every test
@pytest.mark.parametrize("spec", EXAMPLE_SPECS, ids=lambda p: p.stem)
def test_every_generated_rule_file_and_test_passes_promtool(
    spec: Path, tmp_path: Path, promtool: str
) -> None:
    rules, tests = generate(spec, tmp_path)
    checked = run(promtool, "check", "rules", str(rules))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    for test in tests:
        result = run(promtool, "test", "rules", str(test))
        assert result.returncode == 0, f"{test.name}\n{result.stdout}{result.stderr}"


def test_every_rendered_slo_and_the_signatures_get_a_test_file(tmp_path: Path) -> None:
    model = load_rule_model(SPECS / "engines.yaml")
    _, tests = generate(SPECS / "engines.yaml", tmp_path)
    assert model.skipped == ()
    assert sorted(t.name for t in tests) == sorted(
        [f"{slo.id}.test.yml" for slo in model.slos] + ["signatures.test.yml"]
    )
    document = yaml.safe_load((tmp_path / "tests" / "signatures.test.yml").read_text())
    assert len(document["tests"]) == 2 * len(SIGNATURES)  # one firing, one silent each


def test_example_spec_lists_what_only_the_jobs_can_compute(tmp_path: Path) -> None:
    rules, _ = generate(REPO / "config" / "slo.example.yaml", tmp_path)
    header = [line for line in rules.read_text().splitlines() if line.startswith("# skipped")]
    assert [re.search(r"slos\[\d\] (\S+):", line).group(1) for line in header] == [  # type: ignore[union-attr]
        "itl-jitter",
        "goodput",
        "probe-availability",
        "probe-ttft",
    ]
    assert "per chunk, not per request" in header[0]
    assert all("prober's records are stored" in line for line in header[2:])


def test_the_seeds_latency_targets_are_tap_bucket_bounds_so_they_become_rules() -> None:
    """DESIGN §4's defaults (TTFT p99 < 2 s, TPOT p99 < 80 ms) are exact bounds of the tap's
    histograms, so the example spec's tap SLOs are rules, not skipped."""
    model = load_rule_model(REPO / "config" / "slo.example.yaml")
    by_name = {slo.name: slo for slo in model.slos}
    assert le_matcher(2.0) in by_name["ttft-p99"].error_query
    assert "llmslo_tap_ttft_seconds_bucket" in by_name["ttft-p99"].error_query
    assert le_matcher(0.08) in by_name["tpot-p99"].error_query
    assert "llmslo_tap_tpot_seconds_bucket" in by_name["tpot-p99"].error_query
    for bounds in (TTFT_BUCKETS_S, TPOT_BUCKETS_S):
        assert list(bounds) == sorted(set(bounds))


@pytest.mark.parametrize(
    ("wrong", "right", "test_file"),
    [
        ("(14.4 * 0.01)", "(1.44 * 0.01)", "fleet-ttft-vllm.test.yml"),
        ('le=~"2\\\\.5"', 'le=~"1"', "fleet-ttft-vllm.test.yml"),
        ("llmslo:kv_free:ratio < 0.01", "llmslo:kv_free:ratio < 0.5", "signatures.test.yml"),
        ("total[1m])) == 0", "total[1m])) >= 0", "signatures.test.yml"),
    ],
    ids=["page factor ten times too low", "wrong bucket", "L3 threshold", "stall on any rate"],
)
def test_generated_tests_fail_on_a_wrong_rule(
    wrong: str, right: str, test_file: str, tmp_path: Path, promtool: str
) -> None:
    rules, _ = generate(SPECS / "engines.yaml", tmp_path)
    text = rules.read_text()
    assert wrong in text
    rules.write_text(text.replace(wrong, right))
    assert run(promtool, "check", "rules", str(rules)).returncode == 0
    result = run(promtool, "test", "rules", str(tmp_path / "tests" / test_file))
    assert result.returncode != 0, result.stdout


@pytest.mark.parametrize(
    ("bound", "renderings"),
    [(2.0, ["2", "2.0"]), (0.05, ["0.05"]), (2560.0, ["2560", "2560.0"]), (0.001, ["0.001"])],
)
def test_le_matches_the_bound_by_value_in_every_rendering(
    bound: float, renderings: list[str]
) -> None:
    pattern = le_matcher(bound).removeprefix('le=~"').removesuffix('"').replace("\\\\", "\\")
    for text in renderings:
        assert re.fullmatch(pattern, text)
    assert not re.fullmatch(pattern, "20")
    assert not re.fullmatch(pattern, f"{bound}1")


def _golden_bundle(spec: Path) -> dict[str, str]:
    # Relative names so the golden files do not depend on where the repository lives.
    base = Path("/golden")
    files = render_bundle(load_rule_model(spec), base / "rules.yml", base / "tests")
    return {str(path.relative_to(base)): text for path, text in files.items()}


@pytest.mark.parametrize(
    "spec", [REPO / "config" / "slo.example.yaml", SPECS / "engines.yaml"], ids=lambda p: p.stem
)
def test_output_matches_the_golden_files(spec: Path) -> None:
    bundle = _golden_bundle(spec)
    assert bundle == _golden_bundle(spec), "rendering is not deterministic"
    directory = GOLDEN / spec.stem
    if os.environ.get("LLMSLO_UPDATE_GOLDEN") == "1":
        for name, text in bundle.items():
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            (directory / name).write_text(text, encoding="utf-8")
    stored = {
        str(p.relative_to(directory)): p.read_text(encoding="utf-8")
        for p in directory.rglob("*.yml")
    }
    assert sorted(stored) == sorted(bundle), "run with LLMSLO_UPDATE_GOLDEN=1 and review the diff"
    for name, text in bundle.items():
        assert stored[name] == text, f"{name} differs from the golden file"


def test_failed_tap_requests_burn_a_tap_latency_budget(tmp_path: Path, promtool: str) -> None:
    # Every answered request is fast, but 20 % of attempts fail: the jobs count failures as
    # bad events of a latency SLO, so the rules must too.
    rules, _ = generate(SPECS / "engines.yaml", tmp_path)
    labels = 'instance="10.0.0.7:8000"'
    document = {
        "rule_files": [rules.name],
        "evaluation_interval": "1m",
        "group_eval_order": [g["name"] for g in yaml.safe_load(rules.read_text())["groups"]],
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {
                        "series": f'llmslo_tap_tpot_seconds_bucket{{{labels},le="0.075"}}',
                        "values": "0+800x40",
                    },
                    {"series": f"llmslo_tap_tpot_seconds_count{{{labels}}}", "values": "0+800x40"},
                    {
                        "series": f'llmslo_tap_requests_total{{{labels},outcome="ok"}}',
                        "values": "0+800x40",
                    },
                    {
                        "series": f'llmslo_tap_requests_total{{{labels},outcome="upstream_timeout"}}',
                        "values": "0+200x40",
                    },
                ],
                "promql_expr_test": [
                    {
                        "expr": 'round(slo:sli_error:ratio_rate5m{slo="tpot-tap"}, 0.001)',
                        "eval_time": "30m",
                        "exp_samples": [
                            {
                                "labels": '{slo="tpot-tap",slo_id="fleet-tpot-tap",'
                                'slo_service="fleet",slo_window="5m",team="serving"}',
                                "value": 0.2,
                            }
                        ],
                    },
                    {
                        "expr": 'count(ALERTS{alertname="TpotTapBudgetBurn",alertstate="firing",severity="page"})',
                        "eval_time": "30m",
                        "exp_samples": [{"labels": "{}", "value": 2}],
                    },
                ],
            }
        ],
    }
    test = tmp_path / "tap-failures.test.yml"
    test.write_text(yaml.safe_dump(document))
    result = run(promtool, "test", "rules", str(test))
    assert result.returncode == 0, result.stdout + result.stderr


def _expand(notation: str) -> list[float]:
    values: list[float] = []
    for part in notation.split():
        match = re.fullmatch(r"(-?[\d.e+-]+?)(?:([+-])([\d.e+-]+))?x(\d+)", part)
        if match is None:
            values.append(float(part))
            continue
        start, sign, step, count = match.groups()
        delta = float(step or 0) * (-1 if sign == "-" else 1)
        values += [float(start) + delta * i for i in range(int(count) + 1)]
    return values


@given(st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=60))
def test_encoded_series_expand_to_the_same_counter_values(increments: list[int]) -> None:
    values = [float(sum(increments[:i])) for i in range(len(increments) + 1)]
    assert _expand(encode_values(values)) == pytest.approx(values)
