"""Every dialect the maps define can be forced wherever a dialect is chosen: a target's
``dialect`` in the config file and ``llmslo scrape --dialect``; anything else is refused
with the list of names."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from collectors.config import TargetConfig
from collectors.dialects import DIALECT_NAMES, load_dialects
from llmslo.cli import main
from tests.collectors.examples import vllm_exposition
from tests.collectors.piecewise import Page, PiecewiseServer

#: The registry: the dialects of the maps in collectors/dialects/*.yaml.
MAPPED = sorted({name for engine in load_dialects().values() for name in engine.dialects})


@pytest.fixture(scope="module")
def exporter() -> Iterator[str]:
    with PiecewiseServer({"/metrics": Page(body=vllm_exposition(engines=1))}) as server:
        yield server.host_port


def test_the_dialect_names_are_those_of_the_maps() -> None:
    assert sorted(DIALECT_NAMES) == MAPPED
    assert len(set(DIALECT_NAMES)) == len(DIALECT_NAMES)


def _validate(tmp_path: Path, dialect: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    config = tmp_path / "llmslo.yaml"
    config.write_text(f"collect: {{targets: [{{url: '127.0.0.1:8000', dialect: '{dialect}'}}]}}\n")
    code = main(["config", "validate", str(config)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("dialect", ["auto", *MAPPED])
def test_the_config_accepts_every_dialect_of_the_maps(
    tmp_path: Path, dialect: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _validate(tmp_path, dialect, capsys)
    assert code == 0, err
    assert TargetConfig(url="127.0.0.1:8000", dialect=dialect).dialect == dialect


@pytest.mark.parametrize("dialect", ["vllm_v1", "VLLM", "", "tgi"])
def test_an_unknown_dialect_is_refused_with_the_valid_names(
    tmp_path: Path, dialect: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _validate(tmp_path, dialect, capsys)
    assert code == 2
    (line,) = [line for line in err.splitlines() if "collect.targets[0].dialect" in line]
    for name in ["auto", *MAPPED]:
        assert f"'{name}'" in line


def test_the_config_schema_lists_the_dialects() -> None:
    schema = TargetConfig.model_json_schema()["properties"]["dialect"]
    assert sorted(schema["enum"]) == sorted(["auto", *MAPPED]) and schema["default"] == "auto"


@pytest.mark.parametrize("dialect", MAPPED)
def test_scrape_can_force_every_dialect_of_the_maps(
    exporter: str, dialect: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["scrape", exporter, "--dialect", dialect, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dialect"] == dialect
