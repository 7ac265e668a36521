"""dcgm-exporter endpoints: default counters, label template, FB preallocation, activity."""

from __future__ import annotations

import csv
import threading
import time
from pathlib import Path

from tests.simulator.conftest import completion, get, post_quietly, scrape, wait_for

CSV = Path(__file__).resolve().parents[3] / "shared" / "reference" / "dcgm-default-counters.csv"


def _enabled_fields() -> set[str]:
    fields = set()
    for row in csv.reader(CSV.read_text().splitlines()):
        if row and not row[0].startswith("#") and row[0].strip() and row[1].strip() != "label":
            fields.add(row[0].strip())
    return fields


def test_every_default_counter_is_exposed_and_parses(make_fleet):
    fleet = make_fleet(["vllm", "vllm"])
    samples = scrape(fleet.dcgm[0].url)
    names = {n.removesuffix("_total") for n in samples}
    if CSV.exists():
        assert _enabled_fields() <= names
    for rows in samples.values():
        assert {lab["gpu"] for lab, _, _ in rows} == {"0", "1"}


def test_label_template_and_pod_labels_only_on_allocated_gpus(make_fleet):
    fleet = make_fleet(["vllm"])  # node-0 has one GPU per pod; add an idle GPU by config below
    text = get(fleet.dcgm[0].url + "/metrics")[1].decode()
    line = next(x for x in text.splitlines() if x.startswith("DCGM_FI_DEV_GPU_UTIL{"))
    keys = [kv.split("=")[0] for kv in line[line.index("{") + 1 : line.index("}")].split('",')]
    assert keys[:7] == [
        "gpu",
        "UUID",
        "pci_bus_id",
        "device",
        "modelName",
        "Hostname",
        "DCGM_FI_DRIVER_VERSION",
    ]
    assert keys[7:] == ["container", "namespace", "pod"]


def test_unallocated_gpu_has_no_pod_labels():
    from simulator import Fleet, FleetConfig, NodeConfig, PodConfig

    config = FleetConfig(
        nodes=[NodeConfig(name="n", gpus=2)], pods=[PodConfig(name="p", node="n", gpus=[1])]
    )
    with Fleet(config) as fleet:
        rows = {lab["gpu"]: lab for lab, _, _ in scrape(fleet.dcgm[0].url)["DCGM_FI_DEV_FB_USED"]}
        assert "pod" not in rows["0"] and rows["1"]["pod"] == "p" and rows["1"]["Hostname"] == "n"


def test_frame_buffer_is_preallocated_about_90_percent(make_fleet):
    fleet = make_fleet(["vllm"])
    s = scrape(fleet.dcgm[0].url)
    used = s["DCGM_FI_DEV_FB_USED"][0][1]
    total = used + s["DCGM_FI_DEV_FB_FREE"][0][1] + s["DCGM_FI_DEV_FB_RESERVED"][0][1]
    assert 0.88 <= used / total <= 0.92


def test_utilisation_follows_the_batch(make_fleet):
    fleet = make_fleet(["vllm"], speed=1.0)
    pod, dcgm = fleet.pods[0], fleet.dcgm[0]
    scrape(dcgm.url)
    time.sleep(0.3)
    idle = scrape(dcgm.url)
    assert idle["DCGM_FI_DEV_GPU_UTIL"][0][1] == 0
    for _ in range(8):
        threading.Thread(
            target=post_quietly, args=(pod.url + "/v1/completions", completion(400)), daemon=True
        ).start()
    assert wait_for(lambda: scrape(pod.url)["vllm:num_requests_running"][0][1] == 8)
    scrape(dcgm.url)
    time.sleep(0.4)
    busy = scrape(dcgm.url)
    assert busy["DCGM_FI_DEV_GPU_UTIL"][0][1] > 50
    assert busy["DCGM_FI_PROF_GR_ENGINE_ACTIVE"][0][1] > 0.3
    assert busy["DCGM_FI_DEV_POWER_USAGE"][0][1] > idle["DCGM_FI_DEV_POWER_USAGE"][0][1]
