"""The config file: the example validates; every error names its field path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel, Field

from llmslo.cli import main
from pipeline.config import load_config, parse_config
from pipeline.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "llmslo.example.yaml"


def test_the_example_config_is_valid_and_matches_the_defaults() -> None:
    # The spine's own sections; the packages' sections are validated by llmslo.sections.
    raw = yaml.safe_load(EXAMPLE.read_text())
    config = parse_config({name: raw[name] for name in ("bus", "store", "ingest")})
    assert config.bus.bootstrap_servers == "embedded"
    assert config.ingest.metrics_port == 9465
    assert config.store.raw_retention_days == 7


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"bus": {"partitions": 0}}, "bus.partitions: Input should be greater than or equal to 1"),
        (
            {"ingest": {"batch_max_rows": -5}},
            "ingest.batch_max_rows: Input should be greater than 0",
        ),
        ({"bus": {"topic_prefix": "a b"}}, "bus.topic_prefix: String should match pattern"),
        ({"bus": {"security_protocol": "TLS"}}, "bus.security_protocol: Input should be"),
        ({"store": {"pathh": "x"}}, "store.pathh: Extra inputs are not permitted"),
        ({"nonsense": {}}, "nonsense: unknown section"),
    ],
    ids=[
        "zero partitions",
        "negative batch",
        "prefix with a space",
        "unknown protocol",
        "typo in a key",
        "unknown section",
    ],
)
def test_errors_name_the_field_path(raw: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    assert expected in str(caught.value)


def test_all_errors_of_a_file_are_reported_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"bus": {"partitions": 0}, "ingest": {"batch_max_ms": 0}})
    assert "bus.partitions" in str(caught.value) and "ingest.batch_max_ms" in str(caught.value)


def test_registered_sections_are_validated_by_their_owner() -> None:
    class Widget(BaseModel):
        size: int = Field(1, gt=0)

    sections = {"widget_for_test": Widget}
    assert (
        parse_config({"widget_for_test": {"size": 3}}, sections=sections)
        .section("widget_for_test", Widget)
        .size
        == 3
    )
    with pytest.raises(ConfigError, match=r"widget_for_test\.size"):
        parse_config({"widget_for_test": {"size": 0}}, sections=sections)


@pytest.mark.parametrize(
    "text",
    ["bus: [unclosed", "- a list\n- at the top", "bus:\n  partitions: many"],
    ids=["broken YAML", "a list at the top level", "a word where a number belongs"],
)
def test_config_validate_command_reports_bad_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["config", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err


def test_config_validate_command_accepts_the_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "validate", str(EXAMPLE)]) == 0
    assert "valid" in capsys.readouterr().out


def test_a_missing_file_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config("/nonexistent/llmslo.yaml")
