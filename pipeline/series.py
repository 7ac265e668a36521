"""Series normalisation for high-volume sample tables (the TSDB trick).

A scrape repeats the same series (instance, metric, labels, …) every interval; only the
timestamp and value change. Storing the identifying strings once per series and only
``(ts_ms, series_id, value)`` per sample makes DuckDB appends about 8× cheaper, which is
what lets one ingester keep up with a fleet.

``series_id`` is a 63-bit hash of the series' identifying columns, computed without a
Python loop over rows: each distinct *value* is hashed once (cached, so a pod's instance
string is hashed once per process, not per sample), and the per-column hashes are mixed
row-wise with numpy. The hash depends only on the values, so it is the same in every
ingester's file and in the Parquet lake.

Values are canonicalised before hashing so that equal values get equal ids whatever
their encoding: ``-0.0`` is ``0.0``, every NaN payload is one NaN, a null entry of a
dictionary is a null, and a dictionary-encoded string is the same as a plain one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.schema import RecordSchema

__all__ = ["SeriesIndex", "SplitSamples", "series_ids"]

_MIX = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio: spreads bits when multiplied
_NULL_HASH = np.uint64(0x5BD1E9955BD1E995)
#: Distinct values whose hash is remembered, per index (about 160 B each, so ≤ 8 MB); a
#: fleet's vocabulary (instances, metrics, label sets, GPU ids) is far smaller, but one whose
#: pods are renamed on every rollout adds to it for good. Past it the cache starts afresh.
MAX_CACHED_VALUES = 50_000
#: Fingerprints of messages whose series were all known, per index (about 200 B each, so
#: ≤ 4 MB): one per scrape shape of every target. Past it they are learnt again.
MAX_COMPLETE_MESSAGES = 20_000


def _hash_value(value: object) -> int:
    return int.from_bytes(hashlib.blake2b(repr(value).encode(), digest_size=8).digest(), "little")


class _ValueHashes:
    """Hash of each distinct value, cached."""

    def __init__(self) -> None:
        self._cache: dict[object, int] = {}

    def of(self, values: list[object]) -> np.ndarray:
        """Hash of each value (a null hashes as a null), plus ``_NULL_HASH`` at index -1."""
        cache = self._cache
        out = np.empty(len(values) + 1, np.uint64)
        for i, value in enumerate(values):
            if value is None:  # a null entry of a dictionary is a null, as a masked one
                out[i] = _NULL_HASH
                continue
            hashed = cache.get(value)
            if hashed is None:
                if len(cache) >= MAX_CACHED_VALUES:
                    cache.clear()
                hashed = cache[value] = _hash_value(value)
            out[i] = hashed
        out[-1] = _NULL_HASH  # index -1 is where nulls point
        return out


def _column_hashes(column: pa.ChunkedArray, hashes: _ValueHashes) -> np.ndarray:
    array = column.combine_chunks()
    if pa.types.is_dictionary(array.type):
        per_value = hashes.of(array.dictionary.to_pylist())
        indices = array.indices.fill_null(-1) if array.null_count else array.indices
        return per_value[indices.to_numpy(zero_copy_only=False)]
    if pa.types.is_floating(array.type) or pa.types.is_integer(array.type):
        # Numbers hash by their float64 bits: 2 and 2.0 are one bound, as Prometheus means;
        # -0.0 + 0.0 is 0.0, and every NaN payload becomes the one canonical NaN.
        floats = array.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False)
        with np.errstate(invalid="ignore"):  # a signalling NaN payload is still a NaN
            floats = np.where(np.isnan(floats), np.nan, floats + 0.0)
        bits = np.ascontiguousarray(floats).view(np.uint64)
        return np.where(array.is_null().to_numpy(zero_copy_only=False), _NULL_HASH, bits * _MIX)
    # Anything else (rare): by value.
    encoded = pc.dictionary_encode(array)
    return hashes.of(encoded.dictionary.to_pylist())[
        encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False)
    ]


def _splitmix64(values: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, element-wise: a non-linear bijection of uint64."""
    with np.errstate(over="ignore"):
        mixed = values ^ (values >> np.uint64(30))
        mixed = mixed * np.uint64(0xBF58476D1CE4E5B9)
        mixed ^= mixed >> np.uint64(27)
        mixed = mixed * np.uint64(0x94D049BB133111EB)
        return mixed ^ (mixed >> np.uint64(31))


def series_ids(
    table: pa.Table, columns: tuple[str, ...], hashes: _ValueHashes | None = None
) -> np.ndarray:
    """The series id (int64 ≥ 0) of every row, from its values in ``columns``."""
    hashes = hashes or _ValueHashes()
    combined = np.zeros(table.num_rows, np.uint64)
    with np.errstate(over="ignore"):
        for column in columns:
            combined = (combined ^ _column_hashes(table.column(column), hashes)) * _MIX
            combined ^= combined >> np.uint64(29)
    return (combined >> np.uint64(1)).astype(np.int64)


@dataclass(frozen=True)
class SplitSamples:
    """Samples as stored: one row per sample, and the series not stored before."""

    values: pa.Table  # ts_ms, series_id, value
    new_series: pa.Table  # series_id + the schema's series columns


class SeriesIndex:
    """Splits sample tables into values and new series, remembering the series it has seen.

    ``known`` holds the ids already stored (any order); call :meth:`mark_stored` once the series of a
    split have been committed (a rolled-back transaction must not mark them).
    """

    def __init__(self, schema: RecordSchema, known: np.ndarray | None = None) -> None:
        self.schema = schema
        self._known = np.unique(known) if known is not None else np.empty(0, np.int64)  # sorted
        self._hashes = _ValueHashes()
        # Fingerprints of messages whose series were all known: the next scrape of the same
        # pod has the same fingerprint and skips the (cache-missing) lookup of every row.
        self._complete: set[tuple[int, int, int]] = set()

    def is_known(self, ids: np.ndarray) -> np.ndarray:
        """For each id, whether its series is already stored."""
        positions = np.searchsorted(self._known, ids)
        inside = positions < len(self._known)
        found = np.zeros(len(ids), bool)
        found[inside] = self._known[positions[inside]] == ids[inside]
        return found

    def _unknown_rows(self, ids: np.ndarray, message_rows: Sequence[int]) -> np.ndarray:
        counts = np.asarray(message_rows, np.int64).reshape(-1)
        if counts.sum() != len(ids) or (counts < 0).any():
            raise ValueError(f"message_rows {list(message_rows)[:10]} do not add up to {len(ids)}")
        counts = counts[counts > 0]  # an empty message has nothing to look up
        if not len(counts):
            return np.empty(0, np.int64)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        unsigned = ids.view(np.uint64)
        with np.errstate(over="ignore"):
            # A message's fingerprint: (rows, Σ id, Σ splitmix64(id)). The second sum must be
            # non-linear per id: Σ(id·c) would be c·Σid, no information beyond the first.
            sums = np.add.reduceat(unsigned, starts)
            mixed = np.add.reduceat(_splitmix64(unsigned), starts)
        unknown: list[np.ndarray] = []
        for start, count, first_sum, second_sum in zip(
            starts.tolist(), counts.tolist(), sums.tolist(), mixed.tolist(), strict=True
        ):
            fingerprint = (count, first_sum, second_sum)
            if fingerprint in self._complete:
                continue
            rows = np.flatnonzero(~self.is_known(ids[start : start + count])) + start
            if len(rows):
                unknown.append(rows)
            else:
                if len(self._complete) >= MAX_COMPLETE_MESSAGES:
                    self._complete.clear()
                self._complete.add(fingerprint)
        return np.concatenate(unknown) if unknown else np.empty(0, np.int64)

    def split(self, table: pa.Table, message_rows: Sequence[int] | None = None) -> SplitSamples:
        """``table`` (rows of the schema) as values plus the series not yet known.

        ``message_rows`` gives the row count of each message the table was concatenated
        from (default: one message), so repeated messages are recognised as a whole.
        Messages of zero rows and an empty table are fine; counts that do not add up to
        ``table.num_rows`` are a bug of the caller (``ValueError``).
        """
        ids = series_ids(table, self.schema.series_columns, self._hashes)
        values = pa.Table.from_arrays(
            [table.column("ts_ms"), pa.array(ids, pa.int64()), table.column("value")],
            names=["ts_ms", "series_id", "value"],
        )
        unknown_rows = self._unknown_rows(ids, message_rows or [table.num_rows])
        fresh_ids, first = np.unique(ids[unknown_rows], return_index=True)
        take = pa.array(unknown_rows[first], pa.int64())
        new_series = pa.Table.from_arrays(
            [pa.array(fresh_ids, pa.int64())]
            + [pc.take(table.column(name), take) for name in self.schema.series_columns],
            names=["series_id", *self.schema.series_columns],
        )
        return SplitSamples(values, new_series)

    def forget(self, ids: np.ndarray) -> None:
        """Record that these series were deleted from the store (retention pruned them)."""
        if len(ids):
            self._known = self._known[~np.isin(self._known, ids)]
            # A remembered "all known" message may name a forgotten series.
            self._complete.clear()

    def mark_stored(self, ids: pa.Array | pa.ChunkedArray) -> None:
        """Record that these series are now in the store."""
        # Stored series are never stored again, so a merge of two sorted runs suffices
        # (np.union1d would hash-unique the whole set on every commit).
        self._known = np.sort(np.concatenate([self._known, ids.to_numpy()]), kind="stable")
