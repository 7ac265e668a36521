"""Config sections are one explicit table: any process gets the CLI's validation and errors."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmslo.cli import build_parser, main
from llmslo.sections import SECTIONS, load_config

BAD = (
    "tap:\n  max_attempts: 0\n"
    "slo:\n  interval_s: 0\n"
    "collect:\n  bogus: 1\n"
    "simulator:\n  speed: 0\n"
    "nonsense: {}\n"
)


def test_every_package_section_is_in_the_table() -> None:
    assert sorted(SECTIONS) == [
        "alertmanager",
        "api",
        "collect",
        "probe",
        "receive",
        "simulator",
        "slo",
        "tap",
    ]


def test_a_process_without_the_command_line_gets_the_same_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(BAD)
    assert main(["config", "validate", str(path)]) == 2
    cli_error = capsys.readouterr().err.removeprefix("llmslo config: ").strip()
    # A fresh interpreter that imports only the loader, as a Streamlit page or a uvicorn
    # worker would: no command module may be needed for the sections to be known.
    worker = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\n"
            "from llmslo.sections import load_config\n"
            "from pipeline.errors import ConfigError\n"
            "try:\n"
            f"    load_config({str(path)!r})\n"
            "except ConfigError as exc:\n"
            "    print(exc)\n"
            "print('cli imported' if any(m.startswith(('llmslo.cli', 'llmslo.commands')) for m in sys.modules) else 'no cli')\n",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    *error_lines, imported = worker.stdout.strip().splitlines()
    assert imported == "no cli"
    assert "\n".join(error_lines) == cli_error
    for field in (
        "tap.max_attempts",
        "slo.interval_s",
        "collect.bogus",
        "simulator.speed",
        "nonsense: unknown section",
    ):
        assert field in cli_error


def test_the_example_config_loads_with_every_section() -> None:
    example = Path(__file__).resolve().parents[2] / "config" / "llmslo.example.yaml"
    assert load_config(example).bus.bootstrap_servers == "embedded"


@pytest.mark.parametrize(
    "spec",
    [
        "version: llmslo/v1\nservice: chat\nslos: []\n",
        "version: prometheus/v1\nservice: chat\nslos: []\n",
        "apiVersion: openslo/v1\nkind: SLO\nmetadata: {name: x}\nspec: {}\n",
    ],
    ids=["llmslo/v1", "sloth prometheus/v1", "openslo"],
)
def test_an_slo_spec_given_as_config_points_to_slo_validate(
    spec: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "slo.yaml"
    path.write_text(spec)
    assert main(["config", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "this is an SLO spec, not an llmslo config" in err
    assert f"`llmslo slo validate {path}`" in err
    assert "unknown section" not in err and len(err.strip().splitlines()) == 1


def test_a_config_with_one_stray_key_still_names_it_an_unknown_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("bus: {}\nslos: []\n")
    assert main(["config", "validate", str(path)]) == 2
    assert "slos: unknown section" in capsys.readouterr().err


EXAMPLES = Path(__file__).resolve().parents[2] / "config"


def _blocks(text: str) -> dict[str, str]:
    """Top-level section name (live or commented out) → its lines."""
    blocks: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        top = re.match(r"^(?:# )?(\w+):", line)
        if top:
            current = blocks.setdefault(top.group(1), [])
        current.append(line)
    return {name: "\n".join(lines) for name, lines in blocks.items()}


def test_the_example_config_shows_every_section_and_every_key_of_its_live_sections() -> None:
    text = (EXAMPLES / "llmslo.example.yaml").read_text()
    blocks, live = _blocks(text), yaml.safe_load(text)
    assert {"bus", "store", "ingest", *SECTIONS} <= set(blocks)
    for name in set(live) & set(SECTIONS):
        missing = [
            field
            for field in SECTIONS[name].model_fields
            if not re.search(rf"^\s*#?\s*{field}:", blocks[name], re.M)
        ]
        assert not missing, f"{name}: the example does not show {missing}"


def test_each_process_has_its_own_metrics_port_in_the_examples() -> None:
    ports = {
        "ingest": yaml.safe_load((EXAMPLES / "llmslo.example.yaml").read_text())["ingest"],
        "collect": yaml.safe_load((EXAMPLES / "collectors.example.yaml").read_text())["collect"],
        "tap": yaml.safe_load((EXAMPLES / "tap.example.yaml").read_text())["tap"],
    }
    by_process = {name: section["metrics_port"] for name, section in ports.items()}
    subparsers = build_parser(["jobs"])._subparsers
    assert subparsers is not None
    jobs_help = subparsers._group_actions[0].choices["jobs"].epilog  # type: ignore[index]
    port = re.search(r"--metrics-port (\d+)", jobs_help)
    assert port is not None, jobs_help
    by_process["jobs"] = int(port.group(1))
    assert len(set(by_process.values())) == len(by_process), by_process
