"""dcgm-exporter endpoints: one per node, the default counters with the real label template.

Rendered in dcgm-exporter's own text format (fixed label order ``gpu, UUID, pci_bus_id,
device, modelName, Hostname, DCGM_FI_DRIVER_VERSION[, container, namespace, pod]``, ``%f``
for doubles, counters without ``_total``), which ``prometheus_client``'s parser reads.
Utilisation follows the engine's batch: ``DCGM_FI_DEV_GPU_UTIL`` is the share of wall time
the engine was stepping since the previous scrape, ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``
additionally scales with batch occupancy. Frame buffer is ~90 % used on allocated GPUs
(engines pre-allocate). The ``xid`` fault sets ``DCGM_FI_DEV_XID_ERRORS`` (last value) with
``err_code``/``err_msg`` on the pod's GPUs.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from simulator.config import NodeConfig

if TYPE_CHECKING:
    from simulator.engine import EngineModel
    from simulator.pod import EnginePod

__all__ = ["DCGM_FIELDS", "DcgmExporter"]

DRIVER_VERSION = "550.127.05"
#: Shortest window (s) over which GPU activity is re-measured.
MIN_WINDOW_S = 0.25
#: (field, type, help) of the enabled default counters (reference/dcgm-default-counters.csv).
DCGM_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
    ),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
    ),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status"),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors",
    ),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
    ),
)
#: The ``err_msg`` dcgm-exporter writes for common XIDs (NVIDIA's XID catalogue).
XID_MESSAGES = {
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double Bit ECC Error",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
}

_INT_FIELDS = {
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
}


@dataclass
class _GpuState:
    index: int
    uuid: str
    pci_bus_id: str
    pod: EnginePod | None = None
    last_wall_s: float = 0.0
    last_busy_s: float = 0.0
    energy_mj: float = 0.0
    nvlink: float = 0.0
    activity: float = 0.0
    window_start_s: float = 0.0
    engine: EngineModel | None = None


class DcgmExporter:
    """One node's dcgm-exporter: ``GET /metrics`` on its own loopback port."""

    def __init__(self, node: NodeConfig, *, host: str) -> None:
        self.node = node.name
        self.config = node
        self.host = host
        self.port = 0
        self._runner: web.AppRunner | None = None
        self.gpus = [self._gpu(i) for i in range(node.gpus)]

    def _gpu(self, index: int) -> _GpuState:
        digest = hashlib.sha1(f"{self.node}/{index}".encode()).hexdigest()
        uuid = f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
        return _GpuState(
            index, uuid, f"00000000:{0x18 + index * 0x10:02X}:00.0", last_wall_s=time.monotonic()
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def instance(self) -> str:
        return f"{self.host}:{self.port}"

    def attach(self, pod: EnginePod) -> None:
        """Allocate the pod's GPUs on this node (pod labels appear on them)."""
        for index in pod.config.gpus:
            self.gpus[index].pod = pod

    async def start(self) -> None:
        app = web.Application()
        app.add_routes([web.get("/metrics", self._metrics), web.get("/health", self._health)])
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        await site.start()
        server = site._server
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._runner = runner

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.render(time.monotonic()).encode(), content_type="text/plain", charset="utf-8"
        )

    # ---- values -----------------------------------------------------------------------
    def _activity(self, gpu: _GpuState, now: float) -> float:
        """Share of wall time the GPU's engine spent stepping, over windows of >= 0.25 s.

        Short windows (several scrapers hitting the exporter at once) reuse the last value,
        as dcgm's own sampling interval would.
        """
        pod = gpu.pod
        if pod is None or not pod.listening:
            gpu.engine = None
            gpu.activity = 0.0
            return 0.0
        stall = pod.faults.get("stall")
        if stall is not None:
            return float(stall.engine_active)
        engine = pod.engine
        if gpu.engine is not engine:  # first look, or the pod restarted
            gpu.engine, gpu.last_busy_s, gpu.window_start_s = engine, engine.busy_s, now
            return gpu.activity
        window = now - gpu.window_start_s
        if window >= MIN_WINDOW_S:
            gpu.activity = min(1.0, max(0.0, (engine.busy_s - gpu.last_busy_s) / window))
            gpu.last_busy_s, gpu.window_start_s = engine.busy_s, now
        return gpu.activity

    def _values(self, gpu: _GpuState, now: float) -> tuple[dict[str, float], int, str]:
        pod = gpu.pod
        alive = pod is not None and pod.listening
        activity = self._activity(gpu, now)
        occupancy = 0.0
        if pod is not None and alive:
            occupancy = len(pod.engine.running) / pod.engine.config.max_num_seqs
        dt = max(0.0, now - gpu.last_wall_s)
        gpu.last_wall_s = now
        power = 72.0 + 620.0 * activity
        gpu.energy_mj += power * dt * 1000.0
        gpu.nvlink += activity * dt * 2.5e8
        xid = pod.faults.get("xid") if pod is not None else None
        xid_code, xid_msg = (
            (xid.code, xid.message or XID_MESSAGES.get(xid.code, f"Xid {xid.code}"))
            if xid is not None
            else (0, "No Error")
        )
        total = self.config.fb_total_mib
        reserved = 572
        used = int(total * 0.9) if alive else 0
        engine_active = activity * (0.55 + 0.45 * occupancy)
        values = {
            "DCGM_FI_DEV_SM_CLOCK": 1980 if activity > 0 else 345,
            "DCGM_FI_DEV_MEM_CLOCK": 2619,
            "DCGM_FI_DEV_MEMORY_TEMP": 34 + int(30 * activity),
            "DCGM_FI_DEV_GPU_TEMP": 31 + int(40 * activity),
            "DCGM_FI_DEV_POWER_USAGE": power,
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": int(gpu.energy_mj),
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
            "DCGM_FI_DEV_GPU_UTIL": round(100 * activity),
            "DCGM_FI_DEV_MEM_COPY_UTIL": round(60 * activity),
            "DCGM_FI_DEV_ENC_UTIL": 0,
            "DCGM_FI_DEV_DEC_UTIL": 0,
            "DCGM_FI_DEV_XID_ERRORS": xid_code,
            "DCGM_FI_DEV_FB_FREE": total - used - reserved,
            "DCGM_FI_DEV_FB_USED": used,
            "DCGM_FI_DEV_FB_RESERVED": reserved,
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": int(gpu.nvlink),
            "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0,
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0,
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0,
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0,
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": engine_active,
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": engine_active * 0.35,
            "DCGM_FI_PROF_DRAM_ACTIVE": activity * 0.7,
            "DCGM_FI_PROF_PCIE_TX_BYTES": 2.1e6 + 4.0e7 * activity,
            "DCGM_FI_PROF_PCIE_RX_BYTES": 3.3e6 + 6.0e7 * activity,
        }
        return values, xid_code, xid_msg

    def _labels(self, gpu: _GpuState) -> str:
        base = (
            f'gpu="{gpu.index}",UUID="{gpu.uuid}",pci_bus_id="{gpu.pci_bus_id}",'
            f'device="nvidia{gpu.index}",modelName="{self.config.gpu_model}",'
            f'Hostname="{self.node}",DCGM_FI_DRIVER_VERSION="{DRIVER_VERSION}"'
        )
        if gpu.pod is not None:
            base += (
                f',container="engine",namespace="{gpu.pod.config.namespace}",pod="{gpu.pod.name}"'
            )
        return base

    def render(self, now: float) -> str:
        """The exposition text of every GPU on the node at monotonic time ``now``."""
        per_gpu = [(self._labels(g), *self._values(g, now)) for g in self.gpus]
        lines: list[str] = []
        for field, kind, help_ in DCGM_FIELDS:
            lines.append(f"# HELP {field} {help_}\n# TYPE {field} {kind}\n")
            for labels, values, xid_code, xid_msg in per_gpu:
                value = values[field]
                text = f"{int(value)}" if field in _INT_FIELDS else f"{value:f}"
                extra = (
                    f',err_code="{xid_code}",err_msg="{xid_msg}"'
                    if field == "DCGM_FI_DEV_XID_ERRORS"
                    else ""
                )
                lines.append(f"{field}{{{labels}{extra}}} {text}\n")
        return "".join(lines)
