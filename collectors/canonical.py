"""Turn parsed scrapes into rows of the spine schemas, with canonical signals.

:class:`TargetCanonicalizer` keeps, per scrape target, one *template* per series: the row
columns that do not change between scrapes (metric, signal, kind, ``le``, model, engine,
remaining labels as JSON, or the dcgm-exporter label columns). A scrape then costs one
dict lookup per sample; the Arrow columns come from ``take`` on the template table.

Per target it also detects what a dashboard cannot see in one sample:

* counter resets: a cumulative series (counter, bucket, count) whose value dropped, a
  changed ``*_created`` timestamp, or a changed ``process_start_time_seconds`` — emitted
  as ``counter_reset`` rows (label ``reason``) so rate logic can restart at the right scrape
  (for a dialect with ``object_series``, kube-state-metrics, only the process start);
* frozen scheduler gauges (SGLang): the dialect's ``frozen_gauges`` are fingerprinted and
  ``gauges_unchanged_s`` says how long they have been bit-identical;
* dcgm-exporter blank sentinels (values meaning "not available"): dropped and counted;
* values no exporter can mean (see :mod:`collectors.semantics`): ``+Inf``, negative
  counters, broken histograms, duplicate series, redeclared types — that series (or
  histogram, or family) is dropped with a counted reason and an entry in
  :attr:`CanonicalBatch.errors`, the rest of the scrape kept. NaN is kept as "no value".

Unknown metrics are kept with ``signal`` null; ``*_created`` series are kept with kind
``created`` and no signal (they are timestamps, never gauges).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from collectors.dialects import DIALECT_NAMES, Detection, DialectMap, detect_dialect
from collectors.exposition import Exposition, Series
from collectors.semantics import (
    HistogramLayout,
    ScrapeShape,
    describe_sample,
    redeclared,
    reject_impossible,
)
from pipeline.codec import join_tables
from pipeline.schema import ENGINE_SAMPLES, GPU_SAMPLES, RecordSchema

__all__ = [
    "RESET_METRIC",
    "UNCHANGED_METRIC",
    "CanonicalBatch",
    "TargetCanonicalizer",
    "is_dcgm_blank",
]

log = logging.getLogger(__name__)

RESET_METRIC = "llmslo:counter_reset"
UNCHANGED_METRIC = "llmslo:scheduler_gauges_unchanged_seconds"
# A template holds a series' identifying columns, except those fixed per target
# (instance and address; and the dialect, for engines): derived from the schemas so they
# cannot drift.
_ENGINE_TEMPLATE = tuple(
    c for c in ENGINE_SAMPLES.series_columns if c not in ("instance", "address", "dialect")
)
_GPU_TEMPLATE = tuple(c for c in GPU_SAMPLES.series_columns if c not in ("instance", "address"))
_HISTOGRAM_SUFFIXES = (
    ("_bucket", "bucket"),
    ("_sum", "sum"),
    ("_count", "count"),
    ("_gsum", "sum"),
    ("_gcount", "count"),
)
_CUMULATIVE_KINDS = frozenset(("counter", "bucket", "count"))
_PROCESS_START = "process_start_time_seconds"
_HISTOGRAM_TYPES = frozenset(("histogram", "gaugehistogram"))
# DCGM "blank" values: int64 blanks ≥ 0x7ffffffffffffff0, fp64 blanks ≥ 1.4e14, int32 blanks.
_FP64_BLANK = 1.4e14
_INT32_BLANK = (2147483632.0, 2147483647.0)


#: ``json.dumps(labels, sort_keys=True)``, without making an encoder for every new series.
_LABELS_JSON = json.JSONEncoder(sort_keys=True)
_EMPTY: list[pa.Table] = []


#: Each sample schema's column names in order, by schema name (``pa.Schema.names`` builds
#: the list anew on every call).
_COLUMN_NAMES: dict[str, tuple[str, ...]] = {}

#: Lengths of the constant columns' slices a canonicalizer keeps (a scrape's groups repeat).
_CONSTANT_SIZES_KEPT = 64


def _empty_table() -> pa.Table:
    """One empty table (tables are immutable: a batch's placeholder until its rows are made)."""
    if not _EMPTY:
        _EMPTY.append(pa.table({}))
    return _EMPTY[0]


def is_dcgm_blank(values: np.ndarray) -> np.ndarray:
    """Mask of DCGM blank sentinels (not-available values) in ``values``."""
    return (values >= _FP64_BLANK) | ((values >= _INT32_BLANK[0]) & (values <= _INT32_BLANK[1]))


@dataclass
class CanonicalBatch:
    """One target's scrape as rows of ``schema``, plus what was dropped or detected.

    ``dropped`` counts samples by reason; ``errors`` describes the first few rejected
    series (``"reason: series"``), like :attr:`Exposition.errors` does for bad lines.
    """

    schema: RecordSchema
    table: pa.Table
    dropped: dict[str, int] = field(default_factory=dict)
    resets: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    #: rows left out for want of a signal (only with ``mapped_only``)
    unmapped: int = 0


@dataclass
class _Template:
    columns: tuple[object, ...]
    scale: float
    cumulative: bool
    created: bool
    process_start: bool
    frozen_watch: bool
    hist_group: int = -1  # the histogram (name, labels without le) of a bucket/sum/count
    le: float = float("nan")
    le_invalid: bool = False
    is_count: bool = False


#: Samples in the shapes kept per target, per template: a scrape's shape, or those of the
#: parts a remote-write splits a scrape into (at other places from one scrape to the next).
_SHAPE_SAMPLES_PER_TEMPLATE = 4


@dataclass
class _Shape:
    """What a scrape's template indices alone decide, kept for the next scrape of the same
    series in the same order (valid while the template table is the same)."""

    checks: ScrapeShape
    mapped: np.ndarray  # which samples have a signal
    resets: list[tuple[str, np.ndarray]]  # the positions each reset check reads
    frozen: np.ndarray  # the positions of watched (frozen) gauges
    unmapped: int  # samples without a signal
    scale: np.ndarray | None  # the samples' scales (None: all 1)
    # by mapped_only: their rows taken from the templates, by column
    taken: dict[bool, dict[str, pa.Array]] = field(default_factory=dict)


def _taker(column: pa.Array) -> Callable[[np.ndarray], pa.Array]:
    """A function taking rows of the template column ``column`` by template indices.

    A dictionary column's indices are taken in numpy and wrapped around the same dictionary
    (no bounds check: the indices are the column's own): for the few hundred rows of a
    scrape's part, a third of what Arrow's ``take`` of the table costs, and the parts of one
    target keep one dictionary, which their joins rely on (:func:`pipeline.codec.join_tables`).
    """
    if not pa.types.is_dictionary(column.type):
        return column.take
    indices, dictionary = column.indices, column.dictionary
    missing = None
    if indices.null_count:
        missing = indices.is_null().to_numpy(zero_copy_only=False)
        indices = indices.fill_null(0)
    numbers = indices.to_numpy()

    def take(idx: np.ndarray) -> pa.Array:
        mask = None if missing is None else missing[idx]
        return pa.DictionaryArray.from_arrays(numbers[idx], dictionary, mask=mask, safe=False)

    return take


def _kind_and_base(name: str, family_type: str, family_name: str) -> tuple[str, str]:
    if family_type in ("histogram", "gaugehistogram", "summary"):
        for suffix, kind in _HISTOGRAM_SUFFIXES:
            if name.endswith(suffix):
                return kind, name[: -len(suffix)]
        if family_type == "summary":
            return "gauge", name  # a quantile
    # 0.0.4: X_created is its own gauge family; OpenMetrics: a sample of the counter family X
    if name.endswith("_created") and (family_type != "counter" or name != family_name):
        return "created", name[: -len("_created")]
    if family_type == "counter":
        return "counter", name
    if family_type == "info" or name.endswith("_info"):
        return "info", name
    if family_type == "gauge":
        return "gauge", name
    return "untyped", name


class TargetCanonicalizer:
    """Canonicalises the scrapes of one target.

    ``instance`` is the name its rows carry (:func:`collectors.config.instance_name`);
    ``address`` its ``host:port`` (default: ``instance``).

    ``dialect`` is ``auto`` or one of :data:`collectors.dialects.DIALECT_NAMES`;
    ``pool`` overrides the pool (default: the series' model).
    """

    def __init__(
        self,
        instance: str,
        *,
        dialect: str = "auto",
        pool: str | None = None,
        model: str | None = None,
        address: str | None = None,
        max_templates: int = 500_000,
    ) -> None:
        if dialect != "auto" and dialect not in DIALECT_NAMES:
            raise ValueError(f"unknown dialect {dialect!r}")
        self.instance = instance
        self.address = address or instance
        self.forced = None if dialect == "auto" else dialect
        self.pool = pool
        self.model = model
        self.max_templates = max_templates
        self.detection: Detection | None = None
        self._names_seen: frozenset[str] | None = None
        self._present: frozenset[str] = frozenset()
        self._header_start_s: float | None = None
        # (key, the arrays, their slices by length)
        self._constants: (
            tuple[tuple[object, ...], dict[str, pa.Array], dict[int, dict[str, pa.Array]]] | None
        ) = None
        self._reset_templates()

    # -- templates -------------------------------------------------------------------------
    def _reset_templates(self) -> None:
        self._lookup: dict[Series, tuple[int, str]] = {}
        # same name, labels (in any order) and type: one template, so duplicates show
        self._identity: dict[tuple[object, ...], tuple[int, str]] = {}
        self._hist_groups: dict[tuple[object, ...], int] = {}
        self._templates: list[_Template] = []
        self._arrow: pa.Table | None = None
        self._shapes: dict[bytes, _Shape] = {}  # by the template indices' bytes, oldest first
        self._shape_samples = 0
        self._prev = np.empty(0)
        self._frozen_state: dict[tuple[object, object], tuple[bytes, int]] = {}

    @property
    def schema(self) -> RecordSchema:
        engine = self.detection.engine if self.detection else None
        return GPU_SAMPLES if engine is not None and engine.topic == "gpu" else ENGINE_SAMPLES

    def _template(self, series: Series, family_type: str, family_name: str) -> _Template:
        engine = self.detection.engine if self.detection else None
        kind, base = _kind_and_base(series.name, family_type, family_name)
        rule = None
        if engine is not None and kind != "created":
            rule = engine.metrics.get(series.name)
            if (
                rule is None
                and kind in ("bucket", "sum", "count", "untyped")
                and base != series.name
            ):
                rule = engine.metrics.get(base)
                if rule is not None and kind == "untyped":
                    kind = next(k for s, k in _HISTOGRAM_SUFFIXES if series.name.endswith(s))
        signal = rule.resolve(series.labels, self._present) if rule is not None else None
        scale = rule.scale if rule is not None else 1.0
        labels = dict(series.labels)
        lifted = self._lift(labels, engine)
        le, le_invalid = None, False
        if kind == "bucket":
            try:
                le = float(labels.pop("le")) * scale
            except (KeyError, ValueError):
                le = None
            le_invalid = le is None or le != le  # missing, "fast", "NaN"
            le = None if le_invalid else le
        hist_group = -1
        if family_type in _HISTOGRAM_TYPES and kind in ("bucket", "sum", "count"):
            key = (base, *sorted((k, v) for k, v in series.labels.items() if k != "le"))
            hist_group = self._hist_groups.setdefault(key, len(self._hist_groups))
        labels_json = _LABELS_JSON.encode(labels)
        if self.schema is GPU_SAMPLES:
            columns: tuple[object, ...] = (*lifted, series.name, signal, labels_json)
        else:
            columns = (*lifted, series.name, signal, kind, le, labels_json)
        return _Template(
            columns=columns,
            scale=scale if kind in ("gauge", "sum", "untyped") else 1.0,
            cumulative=kind in _CUMULATIVE_KINDS,
            created=kind == "created",
            process_start=series.name == _PROCESS_START,
            frozen_watch=engine is not None and series.name in engine.frozen_gauges,
            hist_group=hist_group,
            le=float("nan") if le is None else le,
            le_invalid=le_invalid,
            is_count=kind == "count",
        )

    def _lift(self, labels: dict[str, str], engine: DialectMap | None) -> tuple[object, ...]:
        """Pop the labels that become columns; returns the template's leading columns."""

        def take(column: str) -> str | None:
            for label in engine.columns.get(column, ()) if engine else ():
                if label in labels:
                    return labels.pop(label) or None  # "" (unallocated pod) is missing
            return None

        if self.schema is GPU_SAMPLES:
            values: dict[str, object] = {c: take(c) for c in _GPU_TEMPLATE[:9]}
            gpu = values["gpu"]
            values["gpu"] = int(gpu) if isinstance(gpu, str) and gpu.isdigit() else None
            return tuple(values.values())
        model = take("model") or self.model
        engine_id = take("engine") or ""
        return (self.pool or model, model, engine_id)

    def _add(self, series: Series, family_type: str, family_name: str) -> tuple[int, str]:
        if len(self._templates) >= self.max_templates:
            log.warning(
                "%s: more than %d series, resetting the series cache",
                self.instance,
                self.max_templates,
            )
            self._reset_templates()
        identity = (series.name, family_type, *sorted(series.labels.items()))
        hit = self._identity.get(identity)
        if hit is None:
            template = self._template(series, family_type, family_name)
            hit = (len(self._templates), family_type)
            self._templates.append(template)
            self._identity[identity] = hit
            self._arrow = None
        self._lookup[series] = hit
        return hit

    def _template_table(self) -> pa.Table:
        if self._arrow is None:
            schema = self.schema
            names = _GPU_TEMPLATE if schema is GPU_SAMPLES else _ENGINE_TEMPLATE
            rows = [t.columns for t in self._templates]
            arrays = []
            for i, name in enumerate(names):
                type_ = schema.arrow.field(name).type
                arrays.append(pa.array([r[i] for r in rows], type=type_))
            self._arrow = pa.Table.from_arrays(arrays, names=list(names))
            self._takers = {name: _taker(array) for name, array in zip(names, arrays, strict=True)}
            self._scale = np.array([t.scale for t in self._templates])
            self._cumulative = np.array([t.cumulative for t in self._templates], dtype=bool)
            self._created = np.array([t.created for t in self._templates], dtype=bool)
            self._process_start = np.array([t.process_start for t in self._templates], dtype=bool)
            self._frozen = np.array([t.frozen_watch for t in self._templates], dtype=bool)
            signal = names.index("signal")
            self._mapped = np.array([r[signal] is not None for r in rows], dtype=bool)
            ts = self._templates
            self._layout = HistogramLayout(
                [t.hist_group for t in ts],
                [t.le for t in ts],
                [t.le_invalid for t in ts],
                [t.hist_group >= 0 and t.cumulative and not t.is_count for t in ts],
                [t.is_count for t in ts],
            )
            prev = np.full(len(self._templates), np.nan)
            prev[: min(len(self._prev), len(prev))] = self._prev[: len(prev)]
            self._prev = prev
            self._shapes, self._shape_samples = {}, 0
        return self._arrow

    def _shape(self, idx: np.ndarray) -> _Shape:
        """The :class:`_Shape` of ``idx`` (after :meth:`_template_table`)."""
        key = idx.tobytes()
        shape = self._shapes.pop(key, None)
        if shape is None:
            mapped, scale = self._mapped[idx], self._scale[idx]
            budget = _SHAPE_SAMPLES_PER_TEMPLATE * len(self._templates)
            while self._shapes and self._shape_samples + len(idx) > budget:
                self._shape_samples -= len(self._shapes.pop(next(iter(self._shapes))).mapped)
            shape = _Shape(
                ScrapeShape(self._layout, idx, self._cumulative),
                mapped,
                self._reset_checks(idx),
                np.flatnonzero(self._frozen[idx]),
                len(idx) - int(np.count_nonzero(mapped)),
                None if (scale == 1.0).all() else scale,
            )
            self._shape_samples += len(idx)
        self._shapes[key] = shape  # the most recently used last
        return shape

    # -- detection ---------------------------------------------------------------------------
    def _detect(self, exposition: Exposition) -> None:
        names = frozenset(f.name for f in exposition.families)
        if names == self._names_seen:
            return
        self._names_seen = names
        sample_names = {s.name for s in exposition.series}
        label_names = {k for s in exposition.series for k in s.labels}
        detection = detect_dialect(names | sample_names, label_names, forced=self.forced)
        present = frozenset(names | sample_names)
        old = self.detection
        changed = (old is None) != (detection is None) or (
            old is not None
            and detection is not None
            and (old.engine.engine, old.dialect) != (detection.engine.engine, detection.dialect)
        )
        relevant = {
            n
            for e in ([detection.engine] if detection else [])
            for r in e.metrics.values()
            for n in r.unless
        }
        if changed or (present & relevant) != (self._present & relevant):
            self._reset_templates()
        if changed and detection is not None:
            log.info(
                "%s: dialect %s (%s)", self.instance, detection.dialect, detection.version_family
            )
        self.detection = detection
        self._present = present

    # -- the scrape ---------------------------------------------------------------------------
    def canonicalize(
        self, exposition: Exposition, ts_ms: int, *, process_start_s: float | None = None
    ) -> CanonicalBatch:
        """Rows of one scrape taken at ``ts_ms`` (Unix epoch ms).

        ``process_start_s``: a process start time the transport reported (llama.cpp's
        ``Process-Start-Time-Unix`` header); a change is a ``process_start`` reset.
        """
        self._detect(exposition)
        types = [f.type for f in exposition.families]
        family_names = [f.name for f in exposition.families]
        lookup, add = self._lookup, self._add
        indices: list[int] = []
        append = indices.append
        for series, family in zip(exposition.series, exposition.family_index, strict=True):
            family_type = types[family]
            hit = lookup.get(series)
            if hit is None or hit[1] != family_type:
                hit = add(series, family_type, family_names[family])
            append(hit[0])
        ts = np.full(len(indices), ts_ms, dtype=np.int64)
        for i, sample_ts in exposition.timestamps_ms.items():
            ts[i] = sample_ts
        return self._rows(
            describe_sample(exposition),
            np.asarray(indices, dtype=np.int64),
            np.asarray(exposition.values, dtype=np.float64),
            ts,
            ts_ms,
            process_start_s,
            redeclared(exposition),
        )

    def template_of(self, series: Series) -> tuple[int, str] | None:
        """(template index, family type) :meth:`canonicalize` gave ``series`` last, if any.

        Valid while :meth:`templates_token` is the same object: a caller may keep it and
        hand it back to :meth:`canonicalize_templates`.
        """
        return self._lookup.get(series)

    def saw_families(self, names: frozenset[str]) -> bool:
        """Whether :meth:`canonicalize`'s last scrape declared exactly the families ``names``
        (a scrape with the same families leaves the detection as it is)."""
        return names == self._names_seen

    def templates_token(self) -> object:
        """An object that stays the same while template indices keep their meaning (replaced
        when the templates start afresh: a new dialect, a cache overflow)."""
        return self._lookup

    def canonicalize_templates(
        self,
        templates: np.ndarray,
        values: np.ndarray,
        ts_ms: int,
        describe: Callable[[int], str],
        *,
        mapped_only: bool = False,
    ) -> CanonicalBatch:
        """:meth:`canonicalize` of a scrape whose series are all known: ``templates[i]`` is
        what :meth:`template_of` gave sample ``i``'s series (under the same
        :meth:`templates_token`), ``values[i]`` its value, and the scrape's families are
        those :meth:`canonicalize` last saw (so detection is unchanged). ``describe(i)``
        is sample ``i``'s line for :attr:`CanonicalBatch.errors`
        (:func:`collectors.semantics.describe_sample`; called only for a rejected sample).
        The result equals :meth:`canonicalize`'s; with ``mapped_only``, without the rows whose
        signal is null (counted in :attr:`CanonicalBatch.unmapped`)."""
        return self._rows(
            describe,
            templates,
            values,
            np.full(len(templates), ts_ms, dtype=np.int64),
            ts_ms,
            mapped_only=mapped_only,
        )

    def _rows(
        self,
        describe: Callable[[int], str],
        idx: np.ndarray,
        raw_values: np.ndarray,
        ts: np.ndarray,
        ts_ms: int,
        process_start_s: float | None = None,
        type_redeclared: np.ndarray | None = None,
        *,
        mapped_only: bool = False,
    ) -> CanonicalBatch:
        self._template_table()
        shape = self._shape(idx)
        values = raw_values if shape.scale is None else raw_values * shape.scale
        batch = CanonicalBatch(self.schema, _empty_table())
        rejected = reject_impossible(
            describe,
            idx,
            values,
            self._layout,
            self._cumulative,
            batch.dropped,
            batch.errors,
            type_redeclared,
            shape.checks,
        )
        if rejected is not None:
            idx, values, ts = idx[~rejected], values[~rejected], ts[~rejected]
        engine = self.detection.engine if self.detection else None
        keep = None
        if engine is not None and engine.blank_sentinels:
            blank = is_dcgm_blank(values)
            if blank.any():
                batch.dropped["blank_sentinel"] = int(blank.sum())
                keep = ~blank
        checks = shape.resets if rejected is None else self._reset_checks(idx)
        extra = self._detect_resets(idx, values, ts_ms, batch, checks)
        if process_start_s is not None:
            if self._header_start_s is not None and process_start_s != self._header_start_s:
                batch.resets["process_start"] = batch.resets.get("process_start", 0) + 1
                if self.schema is ENGINE_SAMPLES:
                    reason = {"reason": "process_start"}
                    extra.append(self._derived(ts_ms, RESET_METRIC, "counter_reset", 1.0, reason))
            self._header_start_s = process_start_s
        watched = shape.frozen if rejected is None else np.flatnonzero(self._frozen[idx])
        if len(watched):
            extra += self._frozen_rows(idx, values, ts_ms, watched)
        if mapped_only:  # derived rows (resets, frozen gauges) always have a signal
            mapped = shape.mapped if rejected is None else self._mapped[idx]
            batch.unmapped = (
                shape.unmapped if rejected is None else len(idx) - int(np.count_nonzero(mapped))
            )
            if keep is not None:
                keep &= mapped
                if keep.all():
                    keep = None
            elif batch.unmapped:
                keep = mapped
        # the rows taken from the templates: the same as last time for the same samples kept
        same = rejected is None and (keep is None or keep is shape.mapped)
        taken = shape.taken.get(mapped_only) if same else None
        if keep is not None:
            idx, values, ts = idx[keep], values[keep], ts[keep]
        if taken is None:
            taken = {name: take(idx) for name, take in self._takers.items()}
            if same:
                shape.taken[mapped_only] = taken
        batch.table = self._assemble(taken, ts, values, extra)
        return batch

    def _assemble(
        self,
        taken: dict[str, pa.Array],
        ts: np.ndarray,
        values: np.ndarray,
        extra: list[dict[str, object]],
    ) -> pa.Table:
        schema = self.schema
        columns: dict[str, pa.Array] = {
            **taken,
            **self._constant_columns(len(ts)),
            "ts_ms": pa.array(ts),
            "value": pa.array(values),
        }
        names = _COLUMN_NAMES.get(schema.name) or _COLUMN_NAMES.setdefault(
            schema.name, tuple(schema.arrow.names)
        )
        table = pa.Table.from_arrays([columns[name] for name in names], schema=schema.arrow)
        if extra:
            rows = pa.Table.from_pylist(
                [
                    {**{"instance": self.instance, "address": self.address, "value": 0.0}, **row}
                    for row in extra
                ],
                schema=schema.arrow,
            )
            table = join_tables([table, rows])
        return table

    def _constant_columns(self, n: int) -> dict[str, pa.Array]:
        """The columns every row of the target has the same (instance, address, dialect), of
        ``n`` rows: slices of arrays kept from one scrape to the next."""
        dialect = self.detection.dialect if self.detection else None
        key = (self.schema.name, self.instance, self.address, dialect)
        kept = self._constants
        if kept is None or kept[0] != key or len(kept[1]["instance"]) < n:
            size = max(n, 2 * len(kept[1]["instance"]) if kept and kept[0] == key else 1024)
            zeros = np.zeros(size, np.int32)
            arrays = {
                "instance": pa.DictionaryArray.from_arrays(zeros, [self.instance]),
                "address": pa.DictionaryArray.from_arrays(zeros, [self.address]),
            }
            if self.schema is ENGINE_SAMPLES:
                arrays["dialect"] = pa.DictionaryArray.from_arrays(
                    pa.array(zeros, mask=np.full(size, dialect is None)), [dialect or ""]
                )
            kept = self._constants = (key, arrays, {})
        sliced = kept[2].get(n)  # groups of a scrape's shape have the same sizes every time
        if sliced is None:
            if len(kept[2]) >= _CONSTANT_SIZES_KEPT:
                kept[2].clear()
            sliced = kept[2][n] = {name: array.slice(0, n) for name, array in kept[1].items()}
        return sliced

    def _derived(
        self, ts_ms: int, metric: str, signal: str, value: float, labels: Mapping[str, str]
    ) -> dict[str, object]:
        row: dict[str, object] = {
            "ts_ms": ts_ms,
            "metric": metric,
            "signal": signal,
            "value": value,
            "labels_json": json.dumps(dict(labels), sort_keys=True),
        }
        if self.schema is ENGINE_SAMPLES:
            row.update(
                kind="gauge",
                engine="",
                pool=self.pool or self.model,
                dialect=self.detection.dialect if self.detection else None,
            )
        return row

    def _reset_checks(self, idx: np.ndarray) -> list[tuple[str, np.ndarray]]:
        """The reset checks that apply to the samples of template indices ``idx``: each
        reason with the positions it reads (the reasons reading none left out)."""
        engine = self.detection.engine if self.detection else None
        flags = [("process_start", self._process_start)]
        if engine is None or not engine.object_series:  # objects recreated, not a restart
            flags = [("value_drop", self._cumulative), ("created", self._created), *flags]
        checks = [(reason, np.flatnonzero(flag[idx])) for reason, flag in flags]
        return [(reason, at) for reason, at in checks if len(at)]

    def _detect_resets(
        self,
        idx: np.ndarray,
        values: np.ndarray,
        ts_ms: int,
        batch: CanonicalBatch,
        checks: list[tuple[str, np.ndarray]],
    ) -> list[dict[str, object]]:
        """Count the resets ``checks`` (:meth:`_reset_checks` of ``idx``) find against the
        last values, then make ``values`` the last ones (NaN, "no value", leaves the last
        real value the reference)."""
        prev = self._prev
        rows = []
        for reason, at in checks:
            now, before = values[at], prev[idx[at]]
            # NaN never compares: a first value is no drop, and no change either
            mask = now < before if reason == "value_drop" else (before == before) & (now != before)
            count = int(np.count_nonzero(mask))
            if count:
                batch.resets[reason] = count
                rows.append(
                    self._derived(
                        ts_ms, RESET_METRIC, "counter_reset", float(count), {"reason": reason}
                    )
                )
        missing = np.isnan(values)
        if missing.any():
            known = ~missing
            prev[idx[known]] = values[known]
        else:
            prev[idx] = values
        if rows and self.schema is not ENGINE_SAMPLES:
            return []  # GPU_SAMPLES has no counter_reset signal; the collector still counts them
        return rows

    def _frozen_rows(
        self, idx: np.ndarray, values: np.ndarray, ts_ms: int, watched: np.ndarray
    ) -> list[dict[str, object]]:
        """One ``gauges_unchanged_s`` row per engine (DP rank) whose gauges are watched
        (``watched``: their positions in ``idx``)."""
        by_engine: dict[tuple[object, object], list[int]] = {}
        for position in watched.tolist():
            columns = self._templates[int(idx[position])].columns
            by_engine.setdefault((columns[1], columns[2]), []).append(position)  # (model, engine)
        rows = []
        for (model, engine), positions in sorted(by_engine.items(), key=str):
            fingerprint = values[positions].tobytes() + idx[positions].tobytes()
            known = self._frozen_state.get((model, engine))
            since_ms = ts_ms if known is None or known[0] != fingerprint else known[1]
            self._frozen_state[(model, engine)] = (fingerprint, since_ms)
            row = self._derived(
                ts_ms, UNCHANGED_METRIC, "gauges_unchanged_s", (ts_ms - since_ms) / 1000.0, {}
            )
            row.update(model=model, engine=engine, pool=self.pool or model)
            rows.append(row)
        return rows
