"""``llmslo sim``'s engine flags apply to every pod, with or without ``--config``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmslo.cli import build_parser, main
from llmslo.commands.sim import _fleet_config

FLEET_YAML = """\
nodes:
  - {name: node-0, gpus: 2}
pods:
  - {name: pod-a, node: node-0, gpus: [0]}
  - name: pod-b
    node: node-0
    gpus: [1]
    engine: {num_gpu_blocks: 4096, prefill_chunk_tokens: 1024, prefix_cache_prefixes: 8}
"""


@pytest.fixture
def fleet_file(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET_YAML, encoding="utf-8")
    return path


def test_engine_flags_override_every_pod_of_the_config_file_and_keep_its_other_settings(
    fleet_file: Path,
) -> None:
    argv = ["sim", "--config", str(fleet_file), "--prefill-chunk-tokens", "256"]
    argv += ["--prefix-cache", "64"]
    fleet = _fleet_config(build_parser().parse_args(argv))
    engines = {pod.name: pod.engine for pod in fleet.pods}
    assert {name: e.prefill_chunk_tokens for name, e in engines.items()} == {
        "pod-a": 256,
        "pod-b": 256,
    }
    assert {name: e.prefix_cache_prefixes for name, e in engines.items()} == {
        "pod-a": 64,
        "pod-b": 64,
    }
    assert engines["pod-b"].num_gpu_blocks == 4096  # what the file says and no flag touches


def test_one_engine_flag_with_a_config_file_leaves_the_other_setting_as_the_file_says(
    fleet_file: Path,
) -> None:
    argv = ["sim", "--config", str(fleet_file), "--prefix-cache", "64", "--gateway"]
    fleet = _fleet_config(build_parser().parse_args(argv))
    engines = {pod.name: pod.engine for pod in fleet.pods}
    assert engines["pod-b"].prefill_chunk_tokens == 1024
    assert engines["pod-a"].prefill_chunk_tokens == 512  # the engine default
    assert [e.prefix_cache_prefixes for e in engines.values()] == [64, 64]
    assert fleet.gateway is not None and fleet.gateway_pods() == ["pod-a", "pod-b"]


def test_without_engine_flags_the_config_file_is_taken_as_written(fleet_file: Path) -> None:
    fleet = _fleet_config(build_parser().parse_args(["sim", "--config", str(fleet_file)]))
    engines = {pod.name: pod.engine for pod in fleet.pods}
    assert engines["pod-a"].prefix_cache_prefixes is None
    assert (engines["pod-b"].prefill_chunk_tokens, engines["pod-b"].prefix_cache_prefixes) == (
        1024,
        8,
    )


def test_a_bad_engine_flag_with_a_config_file_fails_naming_the_flag(
    fleet_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sim", "--config", str(fleet_file), "--prefix-cache", "0", "--seconds", "0.5"]
    assert main(argv) == 2
    assert "--prefix-cache" in capsys.readouterr().err


def _option_help(help_text: str, flag: str) -> str:
    """The help paragraph of ``flag`` in argparse's --help output, on one line."""
    blocks = re.split(r"\n(?=  -)", help_text)  # each option's block starts at column 2
    block = next(b for b in blocks if b.lstrip().startswith(flag))
    return " ".join(block.split())


def test_the_help_says_the_engine_flags_override_the_config_file(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["sim", "--help"])
    help_text = capsys.readouterr().out
    for flag in ("--prefill-chunk-tokens", "--prefix-cache"):
        described = _option_help(help_text, flag)
        assert "every pod" in described and "--config" in described, described
