"""The release regression over the scrapes the collector tests keep (several vLLM releases,
EPP's two API generations), through ``llmslo check --engine-metrics``."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from llmslo.cli import main
from tests.collectors.examples import epp_exposition, vllm_exposition


def _scrape(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def _regression(tmp_path: Path, *argv: str) -> tuple[int, dict[str, dict[str, object]]]:
    out = tmp_path / "metrics.json"
    status = main(["check", *argv, "--format", "json", "-o", str(out)])
    body = json.loads(out.read_text(encoding="utf-8"))
    return status, {s["signal"]: s for s in body["signals"]}


def test_a_v0_scrape_checked_against_the_current_names_reports_the_renames(
    tmp_path: Path,
) -> None:
    v0 = _scrape(tmp_path, "v0.txt", vllm_exposition(legacy=True))
    status, signals = _regression(tmp_path, "--engine-metrics", v0)
    assert status == 0  # nothing a baseline had is gone
    assert signals["kv_usage"]["status"] == "renamed"
    assert signals["kv_usage"]["found"] == ["vllm:gpu_cache_usage_perc"]
    assert signals["kv_usage"]["current"] == ["vllm:kv_cache_usage_perc"]
    assert signals["itl"]["status"] == "renamed"
    assert signals["ttft"]["status"] == "ok"


def test_upgrading_v0_to_v1_renames_but_loses_nothing(tmp_path: Path) -> None:
    v0 = _scrape(tmp_path, "v0.txt", vllm_exposition(legacy=True))
    v1 = _scrape(tmp_path, "v1.txt", vllm_exposition())
    status, signals = _regression(tmp_path, "--engine-metrics", v1, "--baseline", v0)
    assert status == 0
    assert signals["kv_usage"]["detail"] == "vllm:gpu_cache_usage_perc → vllm:kv_cache_usage_perc"
    assert signals["itl"]["baseline"] == ["vllm:time_per_output_token_seconds"]
    assert signals["itl"]["found"] == ["vllm:inter_token_latency_seconds"]
    assert signals["tpot"]["status"] == "new"


def test_a_release_that_drops_a_mapped_signal_exits_non_zero(tmp_path: Path) -> None:
    v1 = vllm_exposition()
    dropped = "\n".join(line for line in v1.splitlines() if "vllm:num_preemptions" not in line)
    baseline = _scrape(tmp_path, "v1.txt", v1)
    new = _scrape(tmp_path, "new.txt", dropped + "\n")
    status, signals = _regression(tmp_path, "--engine-metrics", new, "--baseline", baseline)
    assert status == 1
    assert signals["preemptions"]["status"] == "missing"
    assert [s for s, v in signals.items() if v["status"] == "missing"] == ["preemptions"]


def test_epp_inference_model_to_inference_objective_is_a_rename(tmp_path: Path) -> None:
    old = _scrape(tmp_path, "epp0.txt", epp_exposition(legacy=True))
    new = _scrape(tmp_path, "epp1.txt", epp_exposition())
    status, signals = _regression(tmp_path, "--engine-metrics", new, "--baseline", old)
    assert status == 0
    assert signals["gateway_requests"]["baseline"] == ["inference_model_request_total"]
    assert signals["gateway_requests"]["found"] == ["inference_objective_request_total"]


def test_the_junit_form_parses_and_fails_the_lost_signal(tmp_path: Path) -> None:
    v1 = vllm_exposition()
    baseline = _scrape(tmp_path, "v1.txt", v1)
    new = _scrape(tmp_path, "new.txt", v1.replace("vllm:num_requests_waiting", "vllm:waiting_x"))
    out = tmp_path / "metrics.xml"
    argv = ["check", "--engine-metrics", new, "--baseline", baseline, "--format", "junit"]
    assert main([*argv, "-o", str(out)]) == 1
    suite = ET.parse(out).getroot()
    failed = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None]
    assert failed == ["waiting"]
    assert suite.get("failures") == "1"


def test_a_scrape_of_no_known_engine_is_an_error_not_a_pass(tmp_path: Path, capsys) -> None:
    other = _scrape(tmp_path, "other.txt", "# TYPE foo counter\nfoo_total 1\n")
    assert main(["check", "--engine-metrics", other]) == 2
    assert "no dialect map names any metric" in capsys.readouterr().err
