"""Where a pipeline process's memory is: DuckDB's own accounting, the C heap, Arrow.

RSS alone cannot tell a cache filling toward its bound from a leak. :class:`MemoryCollector`
serves, on every scrape, ``llmslo_memory_bytes{part=...}``:

* ``duckdb``: what DuckDB says it holds (``duckdb_memory()``: cached blocks of the file,
  rows not yet checkpointed, indexes), bounded by ``duckdb_limit``;
* ``duckdb_limit``: the configured ``memory_limit`` of the buffer pool;
* ``malloc_in_use`` and ``malloc_free``: glibc's heap (``mallinfo2``): bytes handed out to
  the interpreter and C extensions that use ``malloc``, and bytes freed but kept by the
  allocator (fragmentation); absent where the C library has no ``mallinfo2``;
* ``arrow``: bytes held by pyarrow's memory pool (``pa.total_allocated_bytes()``).

DuckDB's own allocator is not glibc's: what it frees and keeps appears in RSS only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Iterator
from typing import Any

import duckdb
import pyarrow as pa
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["MemoryCollector", "duckdb_memory_bytes", "malloc_bytes"]


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _load_mallinfo2() -> Any:
    name = ctypes.util.find_library("c")
    try:
        function = ctypes.CDLL(name).mallinfo2 if name else None
    except (OSError, AttributeError):  # not glibc, or glibc before 2.33
        return None
    if function is not None:
        function.restype = _MallInfo2
    return function


_MALLINFO2 = _load_mallinfo2()


def malloc_bytes() -> dict[str, int]:
    """glibc's heap: ``in_use`` (allocated, mmapped blocks included) and ``free`` (kept), bytes.

    Empty where the C library has no ``mallinfo2``.
    """
    if _MALLINFO2 is None:
        return {}
    info = _MALLINFO2()
    return {"in_use": int(info.uordblks + info.hblkhd), "free": int(info.fordblks)}


def duckdb_memory_bytes(con: duckdb.DuckDBPyConnection) -> tuple[int, int]:
    """(bytes DuckDB holds, its ``memory_limit`` in bytes), from DuckDB's own accounting."""
    held = con.execute("SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory()")
    held_bytes = int(held.fetchone()[0])  # type: ignore[index]
    limit = con.execute("SELECT current_setting('memory_limit')").fetchone()
    return held_bytes, _parse_size(str(limit[0]))  # type: ignore[index]


_UNITS = {
    "B": 1,
    "BYTES": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    "KIB": 1024,
    "MIB": 1024**2,
    "GIB": 1024**3,
    "TIB": 1024**4,
}


def _parse_size(text: str) -> int:
    """``"167.8 MiB"`` (DuckDB's way of printing a size) → bytes."""
    number = text.rstrip("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz ")
    unit = text[len(number) :].strip().upper() or "B"
    return int(float(number) * _UNITS.get(unit, 1))


class MemoryCollector(Collector):
    """``llmslo_memory_bytes{part}``, read on each scrape through a cursor of its own.

    ``con`` is a cursor the collector alone uses (scrapes are serialised by a lock);
    register it with ``registry`` at construction.
    """

    def __init__(
        self, con: duckdb.DuckDBPyConnection, *, registry: CollectorRegistry | None = None
    ) -> None:
        self._con = con
        self._lock = threading.Lock()
        if registry is not None:
            registry.register(self)

    def parts(self) -> dict[str, int]:
        """Bytes by part (see the module docstring)."""
        with self._lock:
            try:
                held, limit = duckdb_memory_bytes(self._con)
            except duckdb.Error:  # the store is closing: report the rest
                held = limit = -1
        parts = {"arrow": int(pa.total_allocated_bytes())}
        if held >= 0:
            parts |= {"duckdb": held, "duckdb_limit": limit}
        parts |= {f"malloc_{name}": value for name, value in malloc_bytes().items()}
        return parts

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("llmslo_memory_bytes", _HELP, labels=["part"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("llmslo_memory_bytes", _HELP, labels=["part"])
        for part, value in sorted(self.parts().items()):
            family.add_metric([part], value)
        yield family


_HELP = (
    "Memory of this process by part: DuckDB's own accounting and its limit, glibc's heap "
    "in use and kept free, pyarrow's pool (bytes)"
)
