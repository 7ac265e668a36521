"""A sidecar's footprint: the tap and the collector import only what they use.

One tap runs beside every engine pod, so what its process imports is paid once per pod: the
store (DuckDB), the API (FastAPI), the SLO maths (scipy) and the dashboards must never be in
it, and the tap publishes JSON rows so it needs no pyarrow/numpy either. The RSS figures are
measured by ``bench/tap.py``; these tests hold the import closure that sets them.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from llmslo.cli import COMMAND_MODULES
from pipeline.bus import Bus
from pipeline.codec import decode_message, encode_arrow, headers_for
from pipeline.publisher import JsonRows
from pipeline.schema import ENGINE_SAMPLES, REQUEST_RECORDS
from tests.collectors.examples import vllm_exposition
from tests.collectors.piecewise import Page, PiecewiseServer

ROOT = Path(__file__).resolve().parents[2]
#: Never in a tap or a collector process: the store, the ingester, the API, the SLO maths,
#: the dashboards, alert generation and the simulator.
NOT_IN_A_SIDECAR = (
    "duckdb",
    "fastapi",
    "starlette",
    "uvicorn",
    "scipy",
    "pandas",
    "streamlit",
    "slo",
    "api",
    "alerts",
    "dashboards",
    "checks",
    "simulator",
    "pipeline.store",
    "pipeline.ingest",
)
#: Not in a tap either: it builds no Arrow table (its rows travel as JSON).
NOT_IN_A_TAP = (*NOT_IN_A_SIDECAR, "pyarrow", "numpy")


def _env() -> dict[str, str]:
    return os.environ | {"PYTHONPATH": str(ROOT)}


def _closure(code: str) -> set[str]:
    """Every module a fresh interpreter holds after running ``code``."""
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
        env=_env(),
        cwd=ROOT,
    ).stdout
    return set(out.split())


def _held(modules: set[str], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == f or m.startswith(f + ".") for f in forbidden))


def test_the_tap_commands_import_closure_excludes_the_store_the_api_and_the_slo_maths() -> None:
    modules = _closure(
        "from llmslo.cli import build_parser\n"
        "build_parser(['tap'])\n"
        # what run_tap reaches for when it runs, with Kafka and --follow-flags
        "import collectors.tap.proxy, collectors.tap.sinks, collectors.tap.flagsource\n"
        "import pipeline.bus, pipeline.publisher, llmslo.sections\n"
        "llmslo.sections.load_config(None)\n"
    )
    assert "collectors.tap.proxy" in modules  # the closure was really taken
    assert _held(modules, NOT_IN_A_TAP) == []


def test_the_collect_commands_import_closure_excludes_the_store_the_api_and_the_slo_maths() -> None:
    modules = _closure(
        "from llmslo.cli import build_parser\n"
        "build_parser(['collect'])\n"
        "import collectors.collector, pipeline.publisher, pipeline.bus\n"
    )
    assert "collectors.collector" in modules
    assert _held(modules, NOT_IN_A_SIDECAR) == []


def test_a_running_collector_publishing_arrow_never_imports_pandas_or_the_store(
    bus: Bus, tmp_path: Path
) -> None:
    """The real ``llmslo collect`` process (``console_main``), two rounds against a loopback
    exporter: it builds Arrow tables, yet pyarrow's pandas shim finds no pandas."""
    pages = {"/metrics": Page(body=vllm_exposition(engines=2))}
    config = tmp_path / "llmslo.yaml"
    with PiecewiseServer(pages) as exporter:
        config.write_text(
            json.dumps(
                {
                    "bus": {"bootstrap_servers": bus.bootstrap_servers, "topic_prefix": bus.prefix},
                    "collect": {
                        "interval_s": 0.2,
                        "jitter_s": 0,
                        "targets": [{"url": exporter.host_port}],
                    },
                }
            )
        )
        run = subprocess.run(
            [
                sys.executable,
                "-c",
                "import atexit, sys\n"
                "atexit.register(lambda: print(' '.join(sorted(sys.modules)), file=sys.stderr))\n"
                "sys.argv[1:] = ['collect', '-c', sys.argv[1], '--rounds', '2']\n"
                "from llmslo.cli import console_main\n"
                "console_main()\n",
                str(config),
            ],
            capture_output=True,
            text=True,
            env=_env(),
            cwd=ROOT,
            timeout=120,
        )
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1])["published_rows"] > 0
    modules = set(run.stderr.strip().splitlines()[-1].split())
    assert "pyarrow" in modules  # it did build Arrow tables
    assert _held(modules, (*NOT_IN_A_SIDECAR, "pandas")) == []


def test_a_running_tap_publishing_to_kafka_never_imports_arrow_or_the_store(
    tmp_path: Path,
) -> None:
    """The real ``llmslo tap`` process, from start to a clean stop, under ``-X importtime``."""
    log = tmp_path / "imports.txt"
    with log.open("w") as err:
        tap = subprocess.Popen(
            [
                *(sys.executable, "-X", "importtime", "-m", "llmslo", "tap"),
                *("--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:9"),
                *("--bootstrap-servers", "embedded", "--follow-flags"),
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=_env(),
            cwd=ROOT,
        )
        try:
            assert tap.stdout is not None
            banner = json.loads(tap.stdout.readline())
            assert banner["tap"] == "listening" and banner["kafka"] is True
        finally:
            tap.send_signal(signal.SIGTERM)
            assert tap.wait(timeout=60) == 0
    imported = set(re.findall(r"^import time:.*\|\s*([\w.]+)$", log.read_text(), re.M))
    assert "collectors.tap.sinks" in imported
    assert _held(imported, NOT_IN_A_TAP) == []


def test_json_rows_decode_exactly_as_the_arrow_tables_of_the_same_rows() -> None:
    """The wire stays one format: what the tap now publishes as JSON, every consumer decodes
    to the very table (types, values, nulls) the Arrow message of the same rows gave."""
    from collectors.tap import ListSink, TapConfig, TapProxy
    from collectors.tap.sinks import rows_to_table
    from tests.collectors.tap.fakes import CHAT, ScriptedUpstream, post, stream_script

    sink = ListSink()

    async def scenario() -> None:
        ups = [ScriptedUpstream(lambda req: stream_script(6, gap_s=0.001)) for _ in range(2)]
        urls = [await up.start() for up in ups]
        # Two upstreams: the engine samples carry two instance keys (two messages).
        config = TapConfig(listen="127.0.0.1:0", upstreams=urls, kafka=False, gauge_interval_s=0.05)
        proxy = TapProxy(config, sink)
        port = await proxy.start()
        for _ in range(4):
            await post(f"http://127.0.0.1:{port}", CHAT)
        await post(f"http://127.0.0.1:{port}", CHAT | {"stream": False})
        await asyncio.sleep(0.2)
        await proxy.stop()
        for up in ups:
            await up.stop()

    asyncio.run(scenario())
    assert len(sink.requests) == 5
    assert len(JsonRows(sink.samples).by_key(ENGINE_SAMPLES.key_field)) == 2
    for schema, given in ((REQUEST_RECORDS, sink.requests), (ENGINE_SAMPLES, sink.samples)):
        as_arrow = decode_message(
            encode_arrow(schema, rows_to_table(schema, given)), headers_for(schema)
        )
        batch = JsonRows(given)
        for key, part in batch.by_key(schema.key_field):
            as_json = decode_message(part.payload, headers_for(schema, "application/json"))
            expected = [
                r for r in as_arrow.table.to_pylist() if r[schema.key_field] == key.decode()
            ]
            assert as_json.table.schema.equals(as_arrow.table.schema)
            assert as_json.table.to_pylist() == expected


def test_every_command_is_registered_by_the_module_the_table_names() -> None:
    registered: dict[str, str] = {}
    for path in dict.fromkeys(COMMAND_MODULES.values()):
        subparsers = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(path).register(subparsers)
        registered |= dict.fromkeys(subparsers.choices, path)
    assert registered == dict(COMMAND_MODULES)
