"""Static rules over manifests written for the tests (good and bad vLLM and SGLang pools),
a plain command line, and inputs that are not there."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.checks.helpers import MANIFESTS, run_check

#: (manifest, rule, expected static status)
EXPECTED = [
    ("vllm-good", "D01-chunked-prefill", "pass"),
    ("vllm-good", "D02-admission-thresholds", "pass"),
    ("vllm-good", "D03-prefix-cache-metric", "pass"),
    ("vllm-good", "D04-nan-detection", "pass"),
    ("vllm-good", "D05-swap-recompute", "pass"),
    ("vllm-good", "D07-prefix-aware-routing", "pass"),
    ("vllm-good", "C01-autoscaler-cooldown", "pass"),
    ("vllm-good", "C02-drain-sigterm", "pass"),
    ("vllm-good", "C03-readiness-after-load", "pass"),
    ("vllm-good", "C04-nccl-watchdog", "pass"),
    ("vllm-good", "C05-dcgm", "pass"),
    ("vllm-good", "C06-oom-restart", "pass"),
    ("vllm-good", "C11-canary-rollback", "pass"),
    ("vllm-good", "C13-zone-spread", "pass"),
    ("vllm-bad", "D01-chunked-prefill", "fail"),
    ("vllm-bad", "D02-admission-thresholds", "fail"),
    ("vllm-bad", "D03-prefix-cache-metric", "fail"),
    ("vllm-bad", "D04-nan-detection", "fail"),
    ("vllm-bad", "D05-swap-recompute", "fail"),
    ("vllm-bad", "D07-prefix-aware-routing", "fail"),
    ("vllm-bad", "C01-autoscaler-cooldown", "fail"),
    ("vllm-bad", "C02-drain-sigterm", "fail"),
    ("vllm-bad", "C03-readiness-after-load", "fail"),
    ("vllm-bad", "C04-nccl-watchdog", "fail"),
    ("vllm-bad", "C06-oom-restart", "fail"),
    ("vllm-bad", "C13-zone-spread", "fail"),
    ("sglang-good", "D01-chunked-prefill", "pass"),
    ("sglang-good", "D02-admission-thresholds", "pass"),
    ("sglang-good", "D03-prefix-cache-metric", "pass"),
    ("sglang-good", "D04-nan-detection", "pass"),
    ("sglang-good", "D05-swap-recompute", "pass"),
    ("sglang-good", "C02-drain-sigterm", "pass"),
    ("sglang-good", "C03-readiness-after-load", "pass"),
    ("sglang-good", "C04-nccl-watchdog", "pass"),
    ("sglang-bad", "D01-chunked-prefill", "fail"),
    ("sglang-bad", "D02-admission-thresholds", "fail"),
    ("sglang-bad", "D03-prefix-cache-metric", "fail"),
    ("sglang-bad", "D04-nan-detection", "fail"),
    ("sglang-bad", "C03-readiness-after-load", "fail"),
    ("sglang-bad", "C06-oom-restart", "fail"),
]


@pytest.mark.parametrize(("manifest", "rule", "expected"), EXPECTED, ids=lambda v: str(v))
def test_a_manifest_gives_the_expected_static_verdict_per_rule(
    tmp_path: Path, manifest: str, rule: str, expected: str
) -> None:
    _, rules = run_check(tmp_path, "-f", str(MANIFESTS / f"{manifest}.yaml"))
    assert rules[rule]["static"]["status"] == expected, rules[rule]["static"]["evidence"]


def test_the_evidence_names_the_flag_and_the_version_it_read(tmp_path: Path) -> None:
    _, rules = run_check(tmp_path, "-f", str(MANIFESTS / "vllm-bad.yaml"))
    assert "vllm 0.6.3" in rules["D04-nan-detection"]["static"]["evidence"]
    assert (
        "--gpu-memory-utilization 0.95" in rules["D02-admission-thresholds"]["static"]["evidence"]
    )
    assert "tcpSocket" in rules["C03-readiness-after-load"]["static"]["evidence"]


def test_a_directory_of_several_manifests_fails_a_rule_that_one_engine_fails(
    tmp_path: Path,
) -> None:
    _, rules = run_check(tmp_path, "-f", str(MANIFESTS))
    nan = rules["D04-nan-detection"]["static"]
    assert nan["status"] == "fail"
    assert "llama-good" in nan["evidence"] and "qwen-bad" in nan["evidence"]


def test_the_repository_kustomize_overlay_is_followed_to_its_engine(tmp_path: Path) -> None:
    overlay = Path(__file__).resolve().parents[2] / "deploy" / "overlays" / "vllm"
    _, rules = run_check(tmp_path, "-f", str(overlay))
    assert "Deployment/llama-3-8b" in rules["C03-readiness-after-load"]["static"]["evidence"]
    assert rules["C03-readiness-after-load"]["static"]["status"] == "pass"
    assert rules["C05-dcgm"]["static"]["status"] == "pass"  # base's dcgm PodMonitor


def test_a_command_line_is_checked_like_a_manifest(tmp_path: Path) -> None:
    _, rules = run_check(
        tmp_path,
        "--command", "vllm serve m --max-num-seqs 64 --gpu-memory-utilization 0.8",
        "--image", "vllm/vllm-openai:v0.11.0",
    )  # fmt: skip
    assert rules["D02-admission-thresholds"]["static"]["status"] == "pass"
    assert rules["D04-nan-detection"]["static"]["status"] == "fail"


def test_a_missing_file_and_an_unknown_engine_give_unknown_with_a_reason(tmp_path: Path) -> None:
    other = tmp_path / "nginx.yaml"
    other.write_text(
        "kind: Deployment\nmetadata: {name: web}\n"
        "spec: {template: {spec: {containers: [{name: web, image: nginx:1.25}]}}}\n"
        "---\n: not yaml: [\n",
        encoding="utf-8",
    )
    _, rules = run_check(tmp_path, "-f", str(tmp_path / "absent.yaml"), "-f", str(other))
    chunked = rules["D01-chunked-prefill"]["static"]
    assert chunked["status"] == "unknown"
    assert "absent.yaml: no such file" in chunked["evidence"]
    assert "nginx.yaml: unreadable" in chunked["evidence"]
    assert rules["C01-autoscaler-cooldown"]["static"]["status"] == "unknown"


def test_a_flag_the_table_does_not_know_for_an_engine_is_unknown(tmp_path: Path) -> None:
    _, rules = run_check(
        tmp_path, "--command", "trtllm-serve m --max_batch_size 64", "--image", "x/tensorrt-llm:1.0"
    )
    assert rules["D05-swap-recompute"]["static"]["status"] == "unknown"
    assert "no known preemption setting" in rules["D05-swap-recompute"]["static"]["evidence"]
    assert rules["D04-nan-detection"]["static"]["status"] == "fail"  # unsupported: no way on


def test_a_manifest_shaped_unlike_kubernetes_gives_unknown_not_a_crash(tmp_path: Path) -> None:
    odd = tmp_path / "odd.yaml"
    odd.write_text(
        "kind: Deployment\nmetadata: {name: odd}\nspec:\n  template:\n    spec:\n"
        "      terminationGracePeriodSeconds: 30s\n"
        "      containers: [{name: vllm, image: 'vllm/vllm-openai:v0.11.0', lifecycle: x}]\n"
        "---\nkind: HorizontalPodAutoscaler\nmetadata: {name: odd}\nspec: [not, a, map]\n",
        encoding="utf-8",
    )
    _, rules = run_check(tmp_path, "-f", str(odd))
    for rule in ("C02-drain-sigterm", "C01-autoscaler-cooldown"):
        assert rules[rule]["static"]["status"] == "unknown"
        assert "could not read the input" in rules[rule]["static"]["evidence"]
    assert rules["D01-chunked-prefill"]["static"]["status"] == "pass"  # the rest still runs
