"""The receiver's per-target caches: bounded, and never answering with a target's old labels;
the one-sample path sorting a series exactly as the general path."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from collectors.receive.receiver import Receiver
from collectors.receive.series import STALE_NAN_BITS, PushedBatch, PushedSeries, target_of
from pipeline.schema import RecordSchema

T0 = 1_764_000_000_000
TARGET = {"job": "vllm", "instance": "10.0.0.7:8000"}
RUNNING = "vllm:num_requests_running"
LATENCY = "vllm:e2e_request_latency_seconds"


def pushed(*series: tuple[dict[str, str], int, float]) -> PushedBatch:
    batch = PushedBatch()
    for labels, ts_ms, value in series:
        sorted_labels = tuple(sorted(labels.items()))
        batch.series.append(
            PushedSeries(
                labels["__name__"], sorted_labels, target_of(sorted_labels), [(ts_ms, value)]
            )
        )
    return batch


def engine_rows(tables: list[tuple[RecordSchema, pa.Table]]) -> list[dict[str, object]]:
    return [row for schema, t in tables if schema.name != "target_health" for row in t.to_pylist()]


def test_a_series_after_its_target_is_relabelled_keeps_no_old_target_label() -> None:
    tables: list[tuple[RecordSchema, pa.Table]] = []
    receiver = Receiver(lambda schema, table: tables.append((schema, table)))
    running = {"__name__": RUNNING, **TARGET, "pod": "vllm-0", "zone": "a", "model_name": "m"}
    up = {"__name__": "up", **TARGET, "pod": "vllm-0", "zone": "a", "pool": "chat"}
    receiver.ingest(pushed((up, T0, 1.0), (running, T0, 3.0)))
    # the sender's relabelling changes: zone is no longer a target label, the pool is new
    up = {"__name__": "up", **TARGET, "pod": "vllm-1", "pool": "batch"}
    tables.clear()
    receiver.ingest(pushed((up, T0 + 5000, 1.0), (running, T0 + 5000, 4.0)))
    (row,) = engine_rows(tables)
    assert (row["instance"], row["pool"], row["value"]) == ("vllm-1", "batch", 4.0)
    assert json.loads(str(row["labels_json"])) == {"zone": "a"}


def test_a_sum_seen_before_its_buckets_becomes_a_histogram_sum_once_they_arrive() -> None:
    tables: list[tuple[RecordSchema, pa.Table]] = []
    receiver = Receiver(lambda schema, table: tables.append((schema, table)))
    base = {**TARGET, "model_name": "m"}
    total = {"__name__": f"{LATENCY}_sum", **base}
    receiver.ingest(pushed((total, T0, 1.5)))
    assert [r["kind"] for r in engine_rows(tables)] in ([], ["gauge"])
    tables.clear()
    bucket = {"__name__": f"{LATENCY}_bucket", **base, "le": "+Inf"}
    count = {"__name__": f"{LATENCY}_count", **base}
    receiver.ingest(
        pushed((total, T0 + 5000, 2.5), (bucket, T0 + 5000, 2.0), (count, T0 + 5000, 2.0))
    )
    kinds = {r["metric"]: r["kind"] for r in engine_rows(tables)}
    assert kinds == {
        f"{LATENCY}_sum": "sum",
        f"{LATENCY}_bucket": "bucket",
        f"{LATENCY}_count": "count",
    }


def test_a_targets_series_cache_is_bounded_and_its_rows_stay_right() -> None:
    tables: list[tuple[RecordSchema, pa.Table]] = []
    receiver = Receiver(
        lambda schema, table: tables.append((schema, table)), max_series_per_target=4
    )
    for round_ in range(3):
        receiver.ingest(
            pushed(
                *(
                    (
                        {"__name__": RUNNING, **TARGET, "model_name": "m", "engine": str(e)},
                        T0 + round_ * 5000,
                        float(e),
                    )
                    for e in range(10)
                )
            )
        )
        assert receiver.cached_series() <= 4
    rows = engine_rows(tables)
    assert len(rows) == 30
    assert sorted((r["engine"], r["value"]) for r in rows[-10:]) == sorted(
        (str(e), float(e)) for e in range(10)
    )


# -- the one-sample path sorts a series exactly as the general path does ------------------

STALE = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]
_LABEL_SETS = [
    {"__name__": "up", "pool": "chat"},
    {"__name__": "scrape_duration_seconds"},
    {"__name__": RUNNING, "model_name": "m", "engine": "0"},
    {"__name__": RUNNING, "model_name": "m", "engine": "1"},
    {"__name__": "vllm:prompt_tokens_total", "model_name": "m"},
    {"__name__": f"{LATENCY}_bucket", "model_name": "m", "le": "0.5"},
    {"__name__": f"{LATENCY}_bucket", "model_name": "m", "le": "+Inf"},
    {"__name__": f"{LATENCY}_sum", "model_name": "m"},
    {"__name__": f"{LATENCY}_count", "model_name": "m"},
]
_INSTANCES = ["10.0.0.7:8000", "10.0.0.8:8000"]
_SAMPLE = st.tuples(
    st.integers(0, 4).map(lambda step: T0 + 5000 * step),
    st.sampled_from([0.0, 1.0, 2.5, 7.0, float("nan"), STALE]),
)
_WRITE = st.lists(
    st.tuples(
        st.integers(0, len(_LABEL_SETS) - 1),
        st.sampled_from(_INSTANCES),
        st.lists(_SAMPLE, min_size=0, max_size=3),
        st.booleans(),  # delta
    ),
    max_size=25,
)


class _SeriesBySeries(Receiver):
    """The receiver with every series sorted by the general path (no one-sample path)."""

    def _sort_one(self, *args: object) -> bool:
        return False


def _write(written: list[tuple[int, str, list[tuple[int, float]], bool]]) -> PushedBatch:
    batch = PushedBatch()
    for label_set, instance, samples, delta in written:
        labels = tuple(sorted((_LABEL_SETS[label_set] | TARGET | {"instance": instance}).items()))
        name = dict(labels)["__name__"]
        batch.series.append(PushedSeries(name, labels, target_of(labels), samples, delta=delta))
    return batch


def _published(tables: list[tuple[RecordSchema, pa.Table]]) -> list[tuple[str, str]]:
    out = [(schema.name, json.dumps(t.to_pylist(), sort_keys=True)) for schema, t in tables]
    tables.clear()
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(_WRITE, min_size=1, max_size=5), st.sampled_from([3, 2_000_000]))
def test_the_one_sample_path_stores_and_drops_what_the_general_path_does(
    writes: list[list[tuple[int, str, list[tuple[int, float]], bool]]], max_tracked: int
) -> None:
    fast: list[tuple[RecordSchema, pa.Table]] = []
    general: list[tuple[RecordSchema, pa.Table]] = []
    receiver = Receiver(lambda s, t: fast.append((s, t)), max_tracked_series=max_tracked)
    reference = _SeriesBySeries(lambda s, t: general.append((s, t)), max_tracked_series=max_tracked)
    for written in writes:
        report, expected = receiver.ingest(_write(written)), reference.ingest(_write(written))
        assert (report.rows, report.dropped) == (expected.rows, expected.dropped)
        assert _published(fast) == _published(general)
    assert receiver.targets == reference.targets


_FIRST_WRITE = """
import sys
from collectors.receive.receiver import Receiver
from collectors.receive.series import PushedBatch, PushedSeries, target_of

receiver = Receiver(lambda schema, table: None)
batch = PushedBatch()
for name, value in (("up", 1.0), ("vllm:num_requests_running", 3.0)):
    labels = tuple(sorted({"__name__": name, "job": "vllm", "instance": "10.0.0.7:8000"}.items()))
    batch.series.append(PushedSeries(name, labels, target_of(labels), [(1_764_000_000_000, value)]))
before = set(sys.modules)
report = receiver.ingest(batch)
assert report.rows == {"target_health": 1, "engine_sample": 1}, report
print(sorted(set(sys.modules) - before))
"""


def test_a_receivers_first_write_loads_no_module() -> None:
    # in a fresh interpreter: what a first write needs is loaded with the receiver, not
    # inside the write (pyarrow's first conversion of a list would import pandas)
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", _FIRST_WRITE],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": ""},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "[]"
