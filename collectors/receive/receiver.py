"""Pushed series → the same ``engine`` / ``gpu`` / ``target_health`` records as scrapes.

A pushed series belongs to the *target* its ``job`` and ``instance`` labels name (what
Prometheus attaches to every scraped sample). Per target the :class:`Receiver` keeps one
:class:`collectors.canonical.TargetCanonicalizer` — the collector's own — and hands it, per
timestamp, the samples of that target as one :class:`collectors.exposition.Exposition`: a
scrape rebuilt from the write. The families the target has ever sent stay in that
exposition, so detection does not flip on a write carrying only part of a scrape
(remote-write shards one scrape over several requests).

The *target labels* are those of the target's ``up`` series (the labels the sender's
relabelling attached to every series of the target; a series' own ``pod`` label, as
dcgm-exporter's, is not one). They are stripped from the series, as the collector keeps
its targets' labels out of ``labels_json``. Naming follows
:func:`collectors.config.instance_name`: the ``instance`` label when the sender relabelled
it to a name, else the target's ``pod`` label, else the ``host:port`` in ``instance``
(Prometheus' default), which is always the ``address``. Target labels ``pool`` and
``dialect`` are the target's pool and dialect (``honor_labels``-style, from relabelling).

Prometheus semantics:

* a staleness marker (:data:`collectors.receive.series.STALE_NAN_BITS`) ends a series: it
  is not stored, and its deduplication state is forgotten;
* ``up`` becomes a ``target_health`` row (with ``scrape_duration_seconds`` of the same
  timestamp); the other ``scrape_*`` series are the sender's bookkeeping, counted, not stored;
* a sample is stored once: the key is (the series' labels, ``timestamp_ms``) and a sample is
  stored only if its timestamp is later than the last stored one of its series, so a WAL
  replay or a retried request is counted as ``duplicate`` (``out_of_order`` if older);
* only mapped samples are stored (a signal, or a row the canonicalizer derives); the others
  are counted as ``unmapped``.

OTLP (:mod:`collectors.receive.otlp`) has no ``up``: its resource attributes declare the
target labels (:attr:`PushedBatch.targets`), and a *delta* series' stored values are
summed per series (the same key) into the cumulative counter a scrape would show; a resent
delta point is a ``duplicate`` and is not added twice.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from collectors.canonical import TargetCanonicalizer
from collectors.config import instance_name
from collectors.exposition import Exposition, Family, Series
from collectors.health import HealthRow, health_table
from collectors.receive.series import PushedBatch, PushedSeries, is_stale
from pipeline.schema import TARGET_HEALTH, RecordSchema

__all__ = ["IngestReport", "Receiver"]

log = logging.getLogger(__name__)

#: Labels naming the target rather than the series (stripped before canonicalising).
TARGET_LABELS = frozenset(("job", "instance", "pool", "dialect"))
_ADDRESS = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[^:\[\]]+):\d{1,5}$")
_MAX_FAMILIES_PER_TARGET = 10_000


@dataclass
class IngestReport:
    """What one write became: rows per topic and samples not stored, by reason."""

    rows: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)

    def drop(self, reason: str, count: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + count


class _Target:
    """One sender's target: its naming, canonicalizer, families and series seen.

    ``series`` (labels → the :class:`Series` its samples are canonicalised as) and
    ``family_index`` (sample name → index in ``families``) are caches: ``series`` depends on
    the target labels and starts afresh on :meth:`relabel`; ``family_index`` on the declared
    types and the histograms seen, and starts afresh when either changes.
    """

    def __init__(self, job: str, address: str, max_series: int) -> None:
        self.job = job
        self.max_series = max_series
        self.address = address
        self.labels: dict[str, str] = {}
        self.families: list[Family] = []
        self.family_of: dict[str, int] = {}
        self.histograms: set[str] = set()  # bases of the _bucket series (with le) seen
        self.family_index: dict[str, int] = {}
        self.types_version = 0  # the receiver's declared-types version family_index is valid for
        self.relabel({})

    def relabel(self, labels: dict[str, str]) -> None:
        """Adopt the target labels (those of its ``up`` series): name, pool, dialect."""
        self.labels = labels
        self.pool = labels.get("pool") or None
        named = {"pod": labels["pod"]} if labels.get("pod") else {}
        if self.address and not _ADDRESS.match(self.address):
            named["instance"] = self.address  # relabelled to a name by the sender
        self.instance = instance_name(named, self.address)
        self.canonicalizer = TargetCanonicalizer(
            self.instance,
            dialect=labels.get("dialect") or "auto",
            pool=self.pool,
            address=self.address,
        )
        self.series: dict[tuple[tuple[str, str], ...], Series] = {}

    def family(self, name: str, type_: str) -> int:
        index = self.family_of.get(name)
        if index is None or self.families[index].type != type_:
            if len(self.families) >= _MAX_FAMILIES_PER_TARGET:
                self.families.clear()
                self.family_of.clear()
                self.family_index.clear()
            index = len(self.families)
            self.families.append(Family(name, type_, ""))
            self.family_of[name] = index
        return index

    def saw_histogram(self, base: str) -> None:
        """Note ``base`` as a histogram (a ``_bucket`` series with ``le`` was seen)."""
        if base not in self.histograms and len(self.histograms) < _MAX_FAMILIES_PER_TARGET:
            self.histograms.add(base)
            self.family_index.clear()  # its _sum and _count are histogram samples from now on

    def series_for(self, labels: tuple[tuple[str, str], ...], name: str) -> Series:
        known = self.series.get(labels)
        if known is None:
            if len(self.series) >= self.max_series:
                self.series.clear()
            target_labels = self.labels
            kept = {
                k: v
                for k, v in labels
                if k != "__name__" and k not in TARGET_LABELS and k not in target_labels
            }
            known = self.series[labels] = Series(name, kept)
        return known


def _family_of(name: str, declared: dict[str, str], histograms: set[str]) -> tuple[str, str]:
    """(family name, type) of a sample: what the sender declared (remote-write metadata),
    else what its name says (``histograms``: bases whose ``_bucket`` series carry ``le``)."""
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            type_ = declared.get(base)
            if type_ in ("histogram", "gaugehistogram", "summary"):
                return base, type_
            if base in histograms:
                return base, "histogram"
    if name in declared:
        return name, declared[name]
    if name.endswith("_total") and declared.get(name[: -len("_total")]) in (None, "counter"):
        return name, "counter"
    return name, "gauge"


class Receiver:
    """Turns :class:`PushedBatch` writes into records handed to ``sink(schema, table)``.

    Single-threaded (one event loop calls :meth:`ingest`); see the module docstring.
    ``max_tracked_series`` bounds the deduplication state (past it, it starts afresh);
    ``max_series_per_target`` the series a target's cache of canonical series holds (past it,
    the cache starts afresh, as the canonicalizer's own).
    """

    def __init__(
        self,
        sink: Callable[[RecordSchema, pa.Table], object],
        *,
        max_tracked_series: int = 2_000_000,
        max_series_per_target: int = 500_000,
    ) -> None:
        self.sink = sink
        self.max_tracked_series = max_tracked_series
        self.max_series_per_target = max_series_per_target
        self._targets: dict[tuple[str, str], _Target] = {}
        self._last_ts: dict[tuple[tuple[str, str], ...], int] = {}  # by the series' labels
        self._totals: dict[tuple[tuple[str, str], ...], float] = {}  # delta series
        self._family_types: dict[str, str] = {}
        self._types_version = 0  # bumped when a declared type changes

    def cached_series(self) -> int:
        """Series held in the targets' caches of canonical series (bounded per target)."""
        return sum(len(t.series) for t in self._targets.values())

    @property
    def targets(self) -> dict[tuple[str, str], str]:
        """Instance name of every target seen, by (job, instance label)."""
        return {key: t.instance for key, t in self._targets.items()}

    def ingest(self, batch: PushedBatch) -> IngestReport:
        """Canonicalise and hand over one write; returns what became of its samples."""
        report = IngestReport()
        declared = self._family_types
        for name, type_ in batch.family_types.items():
            if declared.get(name) != type_:
                declared[name] = type_
                self._types_version += 1
        for key, target_labels in batch.targets.items():
            target = self._target(key)
            if target_labels != target.labels:
                target.relabel(target_labels)
        groups: dict[_Target, dict[int, list[tuple[PushedSeries, float]]]] = defaultdict(
            lambda: defaultdict(list)
        )
        health: list[HealthRow] = []
        sort_one, sort = self._sort_one, self._sort
        for series in batch.series:
            if not sort_one(series, groups, report):
                sort(series, groups, health, report)
        for target, by_ts in groups.items():
            self._publish(target, by_ts, report)
        if health:
            self.sink(TARGET_HEALTH, health_table(health))
            report.rows[TARGET_HEALTH.name] = len(health)
        return report

    def _target(self, key: tuple[str, str]) -> _Target:
        target = self._targets.get(key)
        if target is None:
            target = self._targets[key] = _Target(key[0], key[1], self.max_series_per_target)
        return target

    def _sort_one(
        self,
        series: PushedSeries,
        groups: dict[_Target, dict[int, list[tuple[PushedSeries, float]]]],
        report: IngestReport,
    ) -> bool:
        """:meth:`_sort` of the series remote-write sends: one sample, a number, neither
        ``up`` nor delta, its series tracked or room to track it. Returns ``False``, having
        done nothing, for any other series (for :meth:`_sort`)."""
        samples = series.samples
        if len(samples) != 1 or series.delta or series.name == "up":
            return False
        ts_ms, value = samples[0]
        key = series.labels
        last = self._last_ts.get(key)
        if value != value or (last is None and len(self._last_ts) >= self.max_tracked_series):
            return False
        target = self._targets.get(series.target) or self._target(series.target)
        by_ts = groups[target]
        if last is not None and ts_ms <= last:
            report.drop("duplicate" if ts_ms == last else "out_of_order")
        else:
            self._last_ts[key] = ts_ms
            by_ts[ts_ms].append((series, value))
        name = series.name
        if (
            name.endswith("_bucket")
            and name[:-7] not in target.histograms
            and any(label == "le" for label, _ in key)
        ):
            target.saw_histogram(name[:-7])
        return True

    def _sort(
        self,
        series: PushedSeries,
        groups: dict[_Target, dict[int, list[tuple[PushedSeries, float]]]],
        health: list[HealthRow],
        report: IngestReport,
    ) -> None:
        target = self._target(series.target)
        # the deduplication key: the labels name the series, and their job and instance the target
        key = series.labels
        last = self._last_ts.get(key)
        by_ts = groups[target]
        delta = series.delta
        total = self._totals.get(key, 0.0) if delta else 0.0
        up = series.name == "up"
        accepted: list[tuple[int, float]] = []
        for ts_ms, value in series.samples:
            if value != value and is_stale(value):
                self._last_ts.pop(key, None)
                self._totals.pop(key, None)
                last, total = None, 0.0
                report.drop("stale")
                continue
            if last is not None and ts_ms <= last:
                report.drop("duplicate" if ts_ms == last else "out_of_order")
                continue
            last = ts_ms
            if delta:
                total += value
                value = total
            if up:
                accepted.append((ts_ms, value))
            else:
                by_ts[ts_ms].append((series, value))
        if last is not None:
            if len(self._last_ts) >= self.max_tracked_series and key not in self._last_ts:
                log.warning(
                    "more than %d series tracked: deduplication starts afresh", len(self._last_ts)
                )
                self._last_ts.clear()
                self._totals.clear()
            self._last_ts[key] = last
            if delta:
                self._totals[key] = total
        name = series.name
        if (
            name.endswith("_bucket")
            and name[:-7] not in target.histograms
            and any(label == "le" for label, _ in series.labels)
        ):
            target.saw_histogram(name[:-7])
        if up:
            target_labels = {
                k: v for k, v in series.labels if k not in ("__name__", "job", "instance")
            }
            if target_labels != target.labels:
                target.relabel(target_labels)
            for ts_ms, value in accepted:
                health.append(self._health_row(target, ts_ms, value, by_ts[ts_ms]))

    def _health_row(
        self, target: _Target, ts_ms: int, up: float, same_ts: list[tuple[PushedSeries, float]]
    ) -> HealthRow:
        duration = next(
            (v for s, v in same_ts if s.name == "scrape_duration_seconds"),
            0.0,
        )
        detection = target.canonicalizer.detection
        return HealthRow(
            ts_ms,
            target.instance,
            target.address,
            target.pool,
            detection.dialect if detection else None,
            up == 1.0,
            None,
            duration,
            None if up == 1.0 else "sender_reported_down",
            None if up == 1.0 else f"{target.job}: up {up:g} at the sender",
        )

    def _publish(
        self,
        target: _Target,
        by_ts: dict[int, list[tuple[PushedSeries, float]]],
        report: IngestReport,
    ) -> None:
        tables: list[pa.Table] = []
        schema: RecordSchema | None = None
        for ts_ms in sorted(by_ts):
            exposition = self._exposition(target, by_ts[ts_ms], report)
            if not len(exposition):
                continue
            batch = target.canonicalizer.canonicalize(exposition, ts_ms)
            for reason, count in batch.dropped.items():
                report.drop(reason, count)
            mapped = pc.is_valid(batch.table.column("signal"))
            kept = batch.table.filter(mapped)
            report.drop("unmapped", batch.table.num_rows - kept.num_rows)
            if kept.num_rows:
                schema = batch.schema
                tables.append(kept)
        if schema is not None:
            table = pa.concat_tables(tables).unify_dictionaries().combine_chunks()
            self.sink(schema, table)
            report.rows[schema.name] = report.rows.get(schema.name, 0) + table.num_rows

    def _exposition(
        self, target: _Target, samples: list[tuple[PushedSeries, float]], report: IngestReport
    ) -> Exposition:
        out = Exposition(families=target.families)
        if target.types_version != self._types_version:
            target.family_index.clear()
            target.types_version = self._types_version
        known_series, known_family = target.series, target.family_index
        family_index, out_series, values = out.family_index, out.series, out.values
        unmapped = 0
        for series, value in samples:
            name = series.name
            if not name or name.startswith("scrape_"):  # the sender's bookkeeping
                unmapped += 1
                continue
            s = known_series.get(series.labels) or target.series_for(series.labels, name)
            index = known_family.get(name)
            if index is None:
                family_name, type_ = _family_of(name, self._family_types, target.histograms)
                index = known_family[name] = target.family(family_name, type_)
            family_index.append(index)
            out_series.append(s)
            values.append(value)
        if unmapped:
            report.drop("unmapped", unmapped)
        return out
