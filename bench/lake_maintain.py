"""Benchmark: one ``llmslo lake maintain`` pass over a small generated Iceberg lake.

Appends ``--batches`` small batches (``--rows`` engine samples each, 8 instances) to each of
``--hours`` closed hours of ``engine_samples``, as ingesters do (one commit, one data file
per batch), in a local warehouse with a SQLite catalog, then runs one maintenance pass
(:class:`pipeline.iceberg.maintenance.LakeMaintainer`; retention keeps everything, every
snapshot but the head expires, and the files only expired snapshots referenced are
deleted). Printed: data files and bytes of the current snapshot before and after, the
objects under the table's directory before and after, the files and bytes the pass deleted
(reclaimed), snapshots, and the pass's wall time; the last line is one JSON object.

``--quick`` (< 60 s) is 2 hours × 100 batches. Usage:
``python bench/lake_maintain.py [--quick] [--hours 3] [--batches 300] [--rows 200]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from pipeline._offsets import LogIdentity, StoredOffset  # noqa: E402
from pipeline.codec import conform  # noqa: E402
from pipeline.iceberg.config import IcebergConfig  # noqa: E402
from pipeline.iceberg.lake import IcebergLake  # noqa: E402
from pipeline.iceberg.maintenance import LakeMaintainer, MaintenancePolicy  # noqa: E402
from pipeline.iceberg.tables import lake_topics  # noqa: E402
from pipeline.schema import ENGINE_SAMPLES  # noqa: E402
from pipeline.units import DAY_MS, HOUR_MS  # noqa: E402

TABLE = "engine_samples"


def batch(first: int, rows: int, hour_ms: int, batches: int) -> pa.Table:
    """``rows`` samples of 8 instances spread over the hour, numbered from ``first``."""
    seq = np.arange(first, first + rows, dtype=np.int64)
    step_ms = HOUR_MS // max(1, batches * rows)
    return conform(
        ENGINE_SAMPLES,
        pa.table(
            {
                "ts_ms": hour_ms + (seq % (batches * rows)) * step_ms,
                "instance": pa.array([f"pod-{i % 8}" for i in range(rows)]).dictionary_encode(),
                "metric": pa.array(["vllm:num_requests_running"] * rows).dictionary_encode(),
                "signal": pa.array(["running"] * rows).dictionary_encode(),
                "kind": pa.array(["gauge"] * rows).dictionary_encode(),
                "value": (seq % 97).astype(np.float64),
            }
        ),
    )


def objects(path: Path) -> tuple[int, int]:
    """Files and bytes under ``path``."""
    files = [p for p in path.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 hours × 100 batches")
    parser.add_argument("--hours", type=int, default=3)
    parser.add_argument("--batches", type=int, default=300, help="batches (files) per hour")
    parser.add_argument("--rows", type=int, default=200, help="rows per batch")
    args = parser.parse_args()
    if args.quick:
        args.hours, args.batches = 2, 100
    now_ms = int(time.time() * 1000)
    first_hour_ms = (now_ms - (args.hours + 1) * HOUR_MS) // HOUR_MS * HOUR_MS
    with tempfile.TemporaryDirectory(prefix="llmslo-lake-bench-") as tmp:
        config = IcebergConfig(catalog_uri=f"sqlite:///{tmp}/catalog.db", warehouse=f"{tmp}/wh")
        lake = IcebergLake(config, group_id="bench", topics=lake_topics("b."))
        log = LogIdentity("cluster", "topic")
        started = time.perf_counter()
        offset = 0
        for hour in range(args.hours):
            for _ in range(args.batches):
                offset += 1
                rows = batch(
                    offset * args.rows, args.rows, first_hour_ms + hour * HOUR_MS, args.batches
                )
                lake.append_batch({TABLE: [rows]}, {("b.engine", 0): StoredOffset(offset, log)})
        append_s = time.perf_counter() - started
        table_dir = Path(tmp) / "wh" / "llmslo.db" / TABLE
        if not table_dir.exists():
            table_dir = next(Path(tmp, "wh").rglob(TABLE))
        stored_before = objects(table_dir)
        snapshots_before = len(lake.table(TABLE).snapshots())
        maintainer = LakeMaintainer(lake, MaintenancePolicy(retention_ms=7 * DAY_MS, keep_ms=0))
        started = time.perf_counter()
        report = maintainer.maintain(TABLE, int(time.time() * 1000))
        maintain_s = time.perf_counter() - started
        stored_after = objects(table_dir)
        assert lake.read_offsets()[("b.engine", 0)].next_offset == offset
        result = {
            "hours": args.hours,
            "batches_per_hour": args.batches,
            "rows_per_batch": args.rows,
            "append_s": round(append_s, 1),
            "data_files": [report.files_before, report.files_after],
            "data_bytes": [report.bytes_before, report.bytes_after],
            "stored_objects": [stored_before[0], stored_after[0]],
            "stored_bytes": [stored_before[1], stored_after[1]],
            "files_deleted": report.files_deleted,
            "bytes_reclaimed": report.bytes_deleted,
            "snapshots": [snapshots_before, len(lake.table(TABLE).snapshots())],
            "hours_compacted": report.hours_compacted,
            "maintain_s": round(maintain_s, 2),
        }
    print(
        f"{TABLE}: data files {report.files_before} → {report.files_after}, "
        f"bytes {report.bytes_before:,} → {report.bytes_after:,}; stored objects "
        f"{stored_before[0]:,} → {stored_after[0]:,}, bytes {stored_before[1]:,} → "
        f"{stored_after[1]:,} ({report.bytes_deleted:,} reclaimed); maintain {maintain_s:.2f} s"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
