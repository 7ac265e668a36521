"""The dashboards on a DuckDB file join GPUs to engines through ``detectors.gpu_pods`` as
the API does (``llmslo dashboard --db FILE -c CONFIG`` hands the mapping to the pages)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboards import SOURCE_ENV
from dashboards.sources import GPU_PODS_ENV, DuckDBSource
from llmslo.cli import build_parser
from llmslo.commands.dashboard import dashboard_env
from pipeline.store import Store
from tests.api.test_gpu_pods import ENGINE, GPU_PODS, POD, POOL, SERIES, insert_renamed


@pytest.fixture
def renamed_file(tmp_path: Path) -> Path:
    """A DuckDB file nobody writes, with one engine and its GPU named differently."""
    path = tmp_path / "renamed.duckdb"
    with Store(path) as store:
        insert_renamed(store)
    return path


def test_a_duckdb_source_with_gpu_pods_names_the_gpu_by_its_engine(renamed_file: Path) -> None:
    source = DuckDBSource(renamed_file, gpu_pods=GPU_PODS)
    try:
        rows = source.table("gpu_series", instances=[ENGINE], **SERIES).to_pylist()
    finally:
        source.close()
    assert {(row["instance"], row["pool"]) for row in rows} == {(ENGINE, POOL)}


def test_llmslo_dashboard_hands_the_config_s_gpu_pods_to_the_pages(
    renamed_file: Path, tmp_path: Path
) -> None:
    config = tmp_path / "llmslo.yaml"
    config.write_text(f"slo:\n  detectors:\n    gpu_pods: {{{POD}: '{ENGINE}'}}\n", "utf-8")
    argv = ["dashboard", "-c", str(config), "--db", str(renamed_file)]
    env = dashboard_env(build_parser().parse_args(argv))
    assert env[SOURCE_ENV] == f"db:{renamed_file.resolve()}"
    assert json.loads(env[GPU_PODS_ENV]) == GPU_PODS


def test_the_gpus_page_filtered_on_the_engine_shows_its_renamed_gpu(
    renamed_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SOURCE_ENV, f"db:{renamed_file}")
    monkeypatch.setenv(GPU_PODS_ENV, json.dumps(GPU_PODS))
    app = AppTest.from_string(
        "from dashboards.views import PAGES\nPAGES['gpus'][2]()\n", default_timeout=60
    )
    for key, value in {
        "from": SERIES["start_ms"],
        "to": SERIES["end_ms"],
        "instance": ENGINE,
    }.items():
        app.query_params[key] = str(value)
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    assert app.get("vega_lite_chart"), [c.value for c in app.caption]
    inventory = [df.value for df in app.dataframe if "engine" in df.value.columns]
    assert inventory and set(inventory[0]["engine"]) == {ENGINE}


@pytest.mark.parametrize("value", ["{not json", '["pod", "instance"]', '{"pod": 3}'])
def test_a_malformed_gpu_pods_variable_is_a_clear_message_not_a_traceback(
    renamed_file: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(SOURCE_ENV, f"db:{renamed_file}")
    monkeypatch.setenv(GPU_PODS_ENV, value)
    app = AppTest.from_string(
        "from dashboards.views import PAGES\nPAGES['gpus'][2]()\n", default_timeout=60
    )
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    assert [e.value for e in app.error] == ["Cannot read the data source:"]
    assert GPU_PODS_ENV in app.text[0].value  # the cause, as plain text under the box
