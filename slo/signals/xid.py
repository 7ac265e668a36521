"""NVIDIA XID codes as data: which class each code belongs to and how bad it is.

From NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors) and the reference table
(reference/engine-metrics.md §5): dcgm-exporter's ``DCGM_FI_DEV_XID_ERRORS`` is the value of
the *last* XID with ``err_code``/``err_msg`` labels. Each class is its own finding
(``xid_<class>``); ``takes_gpu_out`` marks codes after which the GPU cannot serve until it is
reset, which pins the instance at L3 (route away). No XID is memory *pressure*: OOM risk
rests on KV usage and the frame buffer only.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["XID_CLASSES", "XID_CODES", "XidClass", "XidCode", "classify_xid"]


@dataclass(frozen=True)
class XidClass:
    """A family of XIDs: its finding (``signal``), default severity and meaning."""

    name: str
    signal: str
    severity: str  # page | ticket
    meaning: str


@dataclass(frozen=True)
class XidCode:
    """One XID code: its class, NVIDIA's name, severity and whether the GPU is lost."""

    code: int
    xid_class: str
    name: str
    severity: str
    takes_gpu_out: bool = False


XID_CLASSES: dict[str, XidClass] = {
    c.name: c
    for c in (
        XidClass(
            "memory", "xid_memory_error", "page", "HBM/ECC errors, page retirement, row remap"
        ),
        XidClass("bus", "xid_fallen_off_bus", "page", "GPU lost from the host (bus, GSP firmware)"),
        XidClass("interconnect", "xid_interconnect", "page", "NVLink errors (TP/PP groups stall)"),
        XidClass(
            "application",
            "xid_application_fault",
            "ticket",
            "faults raised by the running program (illegal address, engine exception)",
        ),
        XidClass("other", "xid_other", "ticket", "an XID not in this table"),
    )
}

XID_CODES: dict[int, XidCode] = {
    c.code: c
    for c in (
        XidCode(13, "application", "Graphics Engine Exception", "ticket"),
        XidCode(31, "application", "GPU memory page fault (MMU fault)", "ticket"),
        XidCode(43, "application", "GPU stopped processing", "ticket"),
        XidCode(45, "application", "Preemptive cleanup, due to previous errors", "ticket"),
        XidCode(48, "memory", "Double Bit ECC Error", "page", takes_gpu_out=True),
        XidCode(63, "memory", "ECC page retirement or row remapping recorded", "ticket"),
        XidCode(64, "memory", "ECC page retirement or row remapper recording failure", "page"),
        XidCode(92, "memory", "High single-bit ECC error rate", "ticket"),
        XidCode(94, "memory", "Contained ECC error", "ticket"),
        XidCode(95, "memory", "Uncontained ECC error", "page", takes_gpu_out=True),
        XidCode(74, "interconnect", "NVLink error", "page"),
        XidCode(79, "bus", "GPU has fallen off the bus", "page", takes_gpu_out=True),
        XidCode(119, "bus", "GSP RPC timeout", "page", takes_gpu_out=True),
        XidCode(120, "bus", "GSP error", "page", takes_gpu_out=True),
    )
}


def classify_xid(code: int) -> XidCode:
    """The table row of ``code``; unknown codes are class ``other`` (ticket, GPU kept)."""
    known = XID_CODES.get(code)
    return known if known is not None else XidCode(code, "other", "unlisted XID", "ticket")
