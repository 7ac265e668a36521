"""Bad specs: a field-path error, and no file written (an existing rule file is untouched)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from llmslo.commands.rules import register
from pipeline.errors import ConfigError

_ENGINE = "{kind: latency, metric: ttft, threshold_s: 2.5, source: engine, dialect: vllm}"


def _llmslo(*slos: str) -> str:
    return "version: llmslo/v1\nservice: s\nslos:\n" + "".join(f"  - {slo}\n" for slo in slos)


def _slo(name: str = "ttft", objective: str = "0.99", sli: str = _ENGINE) -> str:
    return f"{{name: {name}, objective: {objective}, sli: {sli}}}"


def _sloth(objective: str = "99.9", second: str = "") -> str:
    queries = "{events: {error_query: 'sum(rate(e[{{.window}}]))', total_query: 'sum(rate(t[{{.window}}]))'}}"
    return (
        "version: prometheus/v1\nservice: s\nslos:\n"
        f"  - {{name: a, objective: {objective}, sli: {queries}}}\n{second}"
    )


CASES = {
    "unknown engine dialect": (
        _llmslo(
            _slo(
                sli="{kind: latency, metric: ttft, threshold_s: 2.5, source: engine, dialect: tgi}"
            )
        ),
        "slos[0].sli.dialect: unknown metric source 'tgi'",
    ),
    "unknown sli source": (
        _llmslo(_slo(sli="{kind: latency, metric: ttft, threshold_s: 2.5, source: prometheus}")),
        "slos[0].sli.source",
    ),
    "threshold between two buckets": (
        _llmslo(
            _slo(
                sli="{kind: latency, metric: ttft, threshold_s: 2.0, source: engine, dialect: vllm}"
            )
        ),
        "slos[0].sli.threshold_s: 2 s is not a bucket bound of vllm:time_to_first_token_seconds (nearest: 1, 2.5)",
    ),
    "metric the dialect lacks": (
        _llmslo(
            _slo(
                sli="{kind: latency, metric: tpot, threshold_s: 0.1, source: engine, dialect: vllm-legacy}"
            )
        ),
        "slos[0].sli.metric: dialect vllm-legacy has no tpot histogram",
    ),
    "objective out of range": (
        _llmslo(_slo(), _slo(name="tpot", objective="1.5")),
        "slos[1].objective: must be in (0, 1)",
    ),
    "duplicate slo names": (_llmslo(_slo(), _slo()), "slos[1].name 'ttft' is used twice"),
    "sloth objective out of range": (
        _sloth(objective="120"),
        "slos[0].objective: must be a percentage in (0, 100)",
    ),
    "sloth duplicate names": (
        _sloth(second="  - {name: a, objective: 99, sli: {raw: {error_ratio_query: 'x'}}}\n"),
        "slos[1].name 'a' is used twice",
    ),
    "sloth plugin sli": (
        _sloth().replace("{events:", "{plugin: {id: x}, events:"),
        "slos[0].sli.plugin: SLI plugins are not supported",
    ),
}


def _generate(spec: Path, out: Path, *extra: str) -> int:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(
        ["rules", "generate", str(spec), "-o", str(out), "--tests", str(out.parent / "t"), *extra]
    )
    return int(args.handler(args))


@pytest.mark.parametrize(("text", "message"), CASES.values(), ids=CASES.keys())
def test_bad_spec_names_the_field_and_writes_nothing(
    text: str, message: str, tmp_path: Path
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    out = tmp_path / "rules.yml"
    out.write_text("previous rules\n")
    with pytest.raises(ConfigError) as error:
        _generate(spec, out)
    assert message in str(error.value)
    assert out.read_text() == "previous rules\n"
    assert not (tmp_path / "t").exists()
    assert {p.name for p in tmp_path.iterdir()} == {"spec.yaml", "rules.yml"}


def test_strict_refuses_what_only_the_jobs_can_compute(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    # 1.5 s lies between two of the tap's TTFT buckets (1 s, 2 s): only the jobs count it.
    spec.write_text(_llmslo(_slo(sli="{kind: latency, metric: ttft, threshold_s: 1.5}")))
    assert _generate(spec, tmp_path / "lenient.yml") == 0
    assert "# skipped: slos[0] ttft:" in (tmp_path / "lenient.yml").read_text()
    with pytest.raises(ConfigError, match=r"slos\[0\] ttft: no Prometheus rule"):
        _generate(spec, tmp_path / "strict.yml", "--strict")
    assert not (tmp_path / "strict.yml").exists()
