"""``llmslo scrape`` and ``llmslo collect`` through ``llmslo.cli.main``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmslo.cli import main
from pipeline.broker import free_port
from pipeline.bus import Bus
from tests.collectors.examples import dcgm_exposition, vllm_exposition
from tests.collectors.piecewise import Page, PiecewiseServer

PAGES = {
    "/metrics": vllm_exposition(engines=2) + "garbage line\n",
    "/dcgm": dcgm_exposition(gpus=2, lowercase=True),
}


@pytest.fixture
def exporter() -> Iterator[str]:
    """The pages served in random pieces, framings and encodings cycling per request."""
    pages = {path: Page(body=body) for path, body in PAGES.items()}
    with PiecewiseServer(pages) as server:
        yield server.host_port


def test_scrape_json_shows_dialect_signals_bounds_and_bad_lines(
    exporter: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["scrape", exporter, "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    report = json.loads(lines[0])
    assert (report["dialect"], report["bad_lines"]) == ("vllm", 1)
    assert report["signals"]["ttft"]["bounds"][:3] == [0.001, 0.005, 0.01]
    assert report["signals"]["ttft"]["bounds"][-1] == "+Inf"
    assert report["signals"]["kv_usage"]["series"] == 2
    assert "vllm:request_prompt_tokens_bucket" in report["unknown_metrics"]


def test_scrape_text_for_dcgm(exporter: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scrape", f"http://{exporter}/dcgm"]) == 0
    out = capsys.readouterr().out
    assert "dialect: dcgm" in out and "xid" in out and "fb_used_mib" in out


def test_scrape_of_a_missing_endpoint_fails_cleanly(
    exporter: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["scrape", f"http://{exporter}/nope"]) == 2
    assert f"HTTP 404 from http://{exporter}/nope" in capsys.readouterr().err


def test_scrape_of_a_closed_port_says_refused_without_tls_words(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"http://127.0.0.1:{free_port()}/metrics"
    assert main(["scrape", url]) == 2
    err = capsys.readouterr().err
    assert f"cannot connect to {url}: connection refused" in err
    assert "ssl:default" not in err


def test_collect_rounds_where_every_scrape_failed_exit_non_zero_naming_each_target(
    exporter: str, bus: Bus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing, closed = f"http://{exporter}/nope", f"http://127.0.0.1:{free_port()}/metrics"
    config = tmp_path / "llmslo.yaml"
    config.write_text(
        f"bus: {{bootstrap_servers: '{bus.bootstrap_servers}', topic_prefix: '{bus.prefix}'}}\n"
        f"collect: {{interval_s: 0.1, jitter_s: 0, targets: [{{url: '{missing}'}}, {{url: '{closed}'}}]}}\n"
    )
    assert main(["collect", "-c", str(config), "--rounds", "3"]) == 1
    out, err = capsys.readouterr()
    health = json.loads(out.strip().splitlines()[-1])["targets"]
    assert {url: (h["scrapes_ok"], h["scrapes_failed"]) for url, h in health.items()} == {
        missing: (0, 3),
        closed: (0, 3),
    }
    assert "all 6 scrapes of 2 targets failed" in err
    assert f"{missing}: http_status: HTTP 404 from {missing}" in err
    assert f"{closed}: connect: cannot connect to {closed}: connection refused" in err


def test_collect_rounds_publish_and_report_health(
    exporter: str, bus: Bus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "llmslo.yaml"
    config.write_text(
        f"bus: {{bootstrap_servers: '{bus.bootstrap_servers}', "
        f"topic_prefix: '{bus.prefix}', partitions: 2}}\n"
        f"collect: {{interval_s: 0.2, jitter_s: 0, targets: [{{url: '{exporter}'}}, {{url: 'http://{exporter}/dcgm'}}]}}\n"
    )
    assert main(["collect", "-c", str(config), "--rounds", "2"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["dropped_rows"] == 0 and summary["unpublished_rows"] == 0
    assert summary["published_rows"] > 0
    health = summary["targets"]
    assert {h["dialect"] for h in health.values()} == {"vllm", "dcgm"}
    assert all(h["up"] for h in health.values())


def test_collect_config_errors_name_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("collect: {interval_s: -1, targets: [{url: 'ftp://x'}]}\n")
    assert main(["config", "validate", str(config)]) == 2
    err = capsys.readouterr().err
    assert "collect.interval_s" in err and "collect.targets[0].url" in err


def test_collect_starts_and_stops_cleanly_while_kafka_is_down_and_says_nothing_reached_it(
    exporter: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It rides the outage out (scrapes go on, rows wait), and with nothing delivered it
    exits 1 naming the address and where it came from: no success without its bus."""
    dead = free_port()
    config = tmp_path / "llmslo.yaml"
    config.write_text(
        f"bus: {{bootstrap_servers: '127.0.0.1:{dead}'}}\n"
        f"collect: {{interval_s: 0.2, jitter_s: 0, publish_timeout_s: 1, targets: [{{url: '{exporter}'}}]}}\n"
    )
    assert main(["collect", "-c", str(config), "--rounds", "2"]) == 1
    out, err = capsys.readouterr()
    assert f"nothing reached Kafka at 127.0.0.1:{dead} (bus.bootstrap_servers of {config})" in err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["published_rows"] == 0
    assert summary["unpublished_rows"] + summary["dropped_rows"] > 0
    assert all(h["up"] for h in summary["targets"].values())
