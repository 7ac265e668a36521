"""What CI reads: JUnit XML that a standard parser takes, the exit status of ``--fail-on``,
silences that keep their reason, and the table people read."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from llmslo.cli import main
from tests.checks.helpers import MANIFESTS, run_check

BAD = str(MANIFESTS / "vllm-bad.yaml")
GOOD = str(MANIFESTS / "vllm-good.yaml")


def test_junit_parses_with_one_testcase_per_rule_and_failures_for_failed_rules(
    tmp_path: Path,
) -> None:
    out = tmp_path / "check.xml"
    main(["check", "-f", BAD, "--format", "junit", "-o", str(out)])
    suite = ET.parse(out).getroot()
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    assert len(cases) == 27
    assert cases["D04-nan-detection"].find("failure") is not None
    assert cases["D06-defragmentation"].find("skipped") is not None
    assert int(suite.get("failures", "0")) == sum(
        case.find("failure") is not None for case in cases.values()
    )


def test_a_failed_critical_rule_exits_non_zero_even_at_the_critical_threshold(
    tmp_path: Path,
) -> None:
    assert run_check(tmp_path, "-f", BAD, "--fail-on", "critical")[0] == 1


def test_only_warnings_failing_pass_a_critical_gate_but_not_a_warning_gate(tmp_path: Path) -> None:
    ok = tmp_path / "ok.yaml"
    # the good pool without its InferencePool: D07 (warning) fails, nothing critical does
    ok.write_text(
        "\n---\n".join(
            doc for doc in Path(GOOD).read_text().split("\n---\n") if "InferencePool" not in doc
        ),
        encoding="utf-8",
    )
    argv = ("-f", str(ok), "--rule", "D01", "--rule", "D07")
    assert run_check(tmp_path, *argv, "--fail-on", "critical")[0] == 0
    status, rules = run_check(tmp_path, *argv, "--fail-on", "warning")
    assert status == 1 and rules["D07-prefix-aware-routing"]["status"] == "fail"


def test_a_silenced_rule_keeps_its_reason_and_no_longer_fails_the_run(tmp_path: Path) -> None:
    ok = ("-f", BAD, "--rule", "C13")
    assert run_check(tmp_path, *ok)[0] == 1
    status, rules = run_check(tmp_path, *ok, "--silence", "C13-zone-spread=one-zone lab cluster")
    assert status == 0
    assert rules["C13-zone-spread"]["status"] == "silenced"
    assert rules["C13-zone-spread"]["silenced"] == "one-zone lab cluster"


def test_a_silence_without_a_reason_is_refused(tmp_path: Path, capsys) -> None:
    assert main(["check", "-f", BAD, "--silence", "C13-zone-spread"]) == 2
    assert "a reason is required" in capsys.readouterr().err


def test_the_table_shows_seed_evidence_and_fix_of_a_failed_rule(tmp_path: Path, capsys) -> None:
    main(["check", "-f", BAD, "--rule", "D04"])
    text = capsys.readouterr().out
    assert "FAIL     D04-nan-detection" in text
    assert "seed:   Turn on the batch fence" in text
    assert "no NaN check of logits before vLLM 0.10" in text
    assert "fix:    vLLM >= 0.10: env VLLM_COMPUTE_NANS_IN_LOGITS=1" in text


def test_an_error_names_the_check_command(tmp_path: Path, capsys) -> None:
    assert main(["check", "--command", "vllm serve m", "--config", str(tmp_path / "no.yaml")]) == 2
    assert capsys.readouterr().err.startswith("llmslo check: --config")
