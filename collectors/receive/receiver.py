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

Known remote-write series (one sample, tracked, seen once through the general path) get a
*slot*, keyed by their serialised labels (:meth:`Receiver.known_series`): the decoder leaves
them as columns (:attr:`PushedBatch.known`), and their deduplication, grouping per (target,
timestamp) and canonicalisation run on arrays from the slot's state and cached template
(:meth:`collectors.canonical.TargetCanonicalizer.canonicalize_templates`), with exactly the
semantics above; anything else takes the general path (``docs/receivers.md``, Throughput).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from collectors.canonical import CanonicalBatch
from collectors.exposition import Exposition
from collectors.health import HealthRow, health_table
from collectors.receive._slots import NONE, Slots
from collectors.receive.series import KnownSeries, PushedBatch, PushedSeries, is_stale
from collectors.receive.targets import Target, family_of
from collectors.semantics import describe_line
from pipeline.codec import join_tables
from pipeline.schema import TARGET_HEALTH, RecordSchema

__all__ = ["IngestReport", "Receiver"]

log = logging.getLogger(__name__)

#: One target's samples of one timestamp, as sorted for :meth:`Receiver._publish`.
_Samples = list[tuple[PushedSeries, float]]


@dataclass
class IngestReport:
    """What one write became: rows per topic and samples not stored, by reason."""

    rows: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)

    def drop(self, reason: str, count: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + count


def _load_list_conversion() -> None:
    """Make pyarrow load now what it loads on its first conversion of a Python list (it asks
    pandas, when installed, whether the list is a pandas object: importing pandas costs
    0.2–0.3 CPU seconds), so the first write does not pay it."""
    pa.array([], pa.string())


class Receiver:
    """Turns :class:`PushedBatch` writes into records handed to ``sink(schema, table)``.

    Single-threaded (one event loop calls :meth:`ingest`); see the module docstring.
    ``max_tracked_series`` bounds the deduplication state (past it, it starts afresh);
    ``max_series_per_target`` the series a target's cache of canonical series holds (past it,
    the cache starts afresh, as the canonicalizer's own). Constructing one loads what its
    first write would otherwise load lazily (see :func:`_load_list_conversion`).
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
        self._targets: dict[tuple[str, str], Target] = {}
        self._last_ts: dict[tuple[tuple[str, str], ...], int] = {}  # by the series' labels
        self._totals: dict[tuple[tuple[str, str], ...], float] = {}  # delta series
        self._family_types: dict[str, str] = {}
        self._types_version = 0  # bumped when a declared type changes
        self._target_list: list[Target] = []
        self._slots = Slots()
        _load_list_conversion()

    def cached_series(self) -> int:
        """Series held in the targets' caches of canonical series (bounded per target)."""
        return sum(len(t.series) for t in self._targets.values())

    @property
    def targets(self) -> dict[tuple[str, str], str]:
        """Instance name of every target seen, by (job, instance label)."""
        return {key: t.instance for key, t in self._targets.items()}

    def known_series(self) -> Mapping[bytes, int]:
        """The series with a slot, by their serialised remote-write labels: what
        :meth:`collectors.receive.remote_write.RemoteWriteDecoder.decode` leaves as columns
        (:attr:`PushedBatch.known`). Read-only; valid until the next :meth:`ingest`."""
        return self._slots.of_key

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
        if batch.known is None:
            self._ingest_series(batch.series, report)
        else:
            self._ingest_known(batch, batch.known, report)
        return report

    def _ingest_series(self, series_list: list[PushedSeries], report: IngestReport) -> None:
        """Sort, canonicalise and hand over ``series_list`` one series at a time."""
        groups: dict[Target, dict[int, _Samples]] = defaultdict(lambda: defaultdict(list))
        health: list[HealthRow] = []
        self._slots.sync_in(series_list, self._last_ts)
        sort_one, sort = self._sort_one, self._sort
        for series in series_list:
            if not sort_one(series, groups, report):
                sort(series, groups, health, report)
        self._slots.sync_out(series_list, self._last_ts)
        for target, by_ts in groups.items():
            self._publish(target, by_ts, report)
        self._sink_health(health, report)

    def _sink_health(self, health: list[HealthRow], report: IngestReport) -> None:
        if health:
            self.sink(TARGET_HEALTH, health_table(health))
            report.rows[TARGET_HEALTH.name] = len(health)

    def _target(self, key: tuple[str, str]) -> Target:
        target = self._targets.get(key)
        if target is None:
            index = len(self._target_list)
            target = Target(key[0], key[1], self.max_series_per_target, index)
            self._targets[key] = target
            self._target_list.append(target)
        return target

    # -- slots: the series a remote-write sends on every scrape, handled as columns --------

    def _remember(self, batch: PushedBatch) -> None:
        """Give a slot to the series of ``batch`` that remote-write sends on every scrape
        and the general path has just sorted: one sample, tracked, neither ``up`` nor the
        sender's ``scrape_*``, not delta, a histogram bucket only once its histogram is known
        (so sorting it again would change nothing but its deduplication state)."""
        new: list[tuple[bytes, PushedSeries, int]] = []
        taken: set[tuple[tuple[str, str], ...]] = set()  # one slot per label set
        slot_of_labels, tracked = self._slots.of_labels, self._last_ts
        for key, series in zip(batch.keys, batch.series, strict=True):
            name = series.name
            if (
                not key
                or not name
                or name == "up"
                or name.startswith("scrape_")
                or series.delta
                or len(series.samples) != 1
                or series.labels in slot_of_labels
                or series.labels in taken
                or key in self._slots.of_key
                or series.labels not in tracked
            ):
                continue
            target = self._targets[series.target]
            if (
                name.endswith("_bucket")
                and name[:-7] not in target.histograms
                and any(label == "le" for label, _ in series.labels)
            ):
                continue
            new.append((key, series, target.index))
            taken.add(series.labels)
        if not new:
            return
        if len(self._slots) + len(new) > self.max_tracked_series:
            self._slots = Slots()
        self._slots.add(new, tracked)

    def _ingest_known(self, batch: PushedBatch, known: KnownSeries, report: IngestReport) -> None:
        """:meth:`ingest` of a write whose known series are columns: their deduplication,
        grouping and canonicalisation are done on arrays, the other series sorted one by one
        as :meth:`_ingest_series` does, with the same result (stored rows, their order and
        every count).

        A known sample that is NaN (maybe a staleness marker) or whose series has no
        deduplication state joins the others. The whole write is sorted one series at a time
        when a series is sent twice, when the tracked series may overflow, or when two series
        of it have the same labels sent differently."""
        slots, positions = known.slots, known.positions
        odd = np.isnan(known.value) | (self._slots.last[slots] == NONE)
        odd_count = int(np.count_nonzero(odd))
        general = list(zip(batch.positions, batch.series, strict=True))
        if odd_count:
            general += self._slots.as_series(known, odd)
            general.sort(key=lambda pair: pair[0])
        repeated = self._slots.repeated(slots)  # a series sent at several timestamps
        whole = len(self._last_ts) + len(general) >= self.max_tracked_series or (
            repeated and odd_count > 0 and bool(np.isin(slots[odd], slots[~odd]).any())
        )
        if not whole and batch.series and self._slots.series:
            in_write = np.zeros(len(self._slots.series), bool)
            in_write[slots] = True
            slot_of = self._slots.of_labels
            whole = any(
                (slot := slot_of.get(series.labels)) is not None and in_write[slot]
                for series in batch.series
            )
        if whole:
            self._ingest_whole(batch, known, report)
            return
        fast = ~odd
        f_slots, f_ts, f_values = slots[fast], known.timestamp_ms[fast], known.value[fast]
        f_positions = positions[fast]
        groups: dict[Target, dict[int, _Samples]] = defaultdict(lambda: defaultdict(list))
        health: list[HealthRow] = []
        general_series = [series for _, series in general]
        self._slots.sync_in(general_series, self._last_ts)
        sort_one, sort = self._sort_one, self._sort
        first_at: dict[Target, int] = {}
        for position, series in general:
            if not sort_one(series, groups, report):
                sort(series, groups, health, report)
            first_at.setdefault(self._targets[series.target], position)
        self._slots.sync_out(general_series, self._last_ts)
        self._remember(batch)
        # deduplication: a sample is stored if later than its series' last stored one
        duplicate, older = self._slots.deduplicate(f_slots, f_ts, f_positions, repeated)
        if duplicate.any():
            report.drop("duplicate", int(np.count_nonzero(duplicate)))
        if older.any():
            report.drop("out_of_order", int(np.count_nonzero(older)))
        target_of = self._slots.target[f_slots]
        ids, first = np.unique(target_of, return_index=True)
        for index, position in zip(ids.tolist(), f_positions[first].tolist(), strict=True):
            target = self._target_list[index]
            first_at[target] = min(first_at.get(target, position), position)
        stored = ~(duplicate | older)
        f_slots, f_ts, f_values = f_slots[stored], f_ts[stored], f_values[stored]
        f_positions, target_of = f_positions[stored], target_of[stored]
        # one run per (target, timestamp), in request order within it
        order = np.lexsort((f_positions, f_ts, target_of))
        f_slots, f_ts, f_values = f_slots[order], f_ts[order], f_values[order]
        f_positions, target_of = f_positions[order], target_of[order]
        cuts = np.flatnonzero((np.diff(target_of) != 0) | (np.diff(f_ts) != 0)) + 1
        runs: dict[int, dict[int, tuple[int, int, bool]]] = defaultdict(dict)
        templates = self._slots.template[f_slots]
        if len(f_ts):
            starts = np.concatenate([[0], cuts])
            # whether a run's cached templates may not hold, as the write starts
            epochs = np.array([self._target_list[index].epoch for index in ids.tolist()])
            void = (templates < 0) | (
                self._slots.epoch[f_slots] != epochs[np.searchsorted(ids, target_of)]
            )
            for target_index, ts_ms, start, end, run_void in zip(
                target_of[starts].tolist(),
                f_ts[starts].tolist(),
                starts.tolist(),
                [*cuts.tolist(), len(f_ts)],
                np.logical_or.reduceat(void, starts).tolist(),
                strict=True,
            ):
                runs[target_index][ts_ms] = (start, end, run_void)
        columns = (f_slots, f_values, f_positions, templates)
        position_of = {id(series): position for position, series in general}
        for target in sorted(first_at, key=first_at.__getitem__):
            self._publish_known(
                target,
                groups.get(target, {}),
                runs.get(target.index, {}),
                columns,
                position_of,
                report,
            )
        self._sink_health(health, report)

    def _ingest_whole(self, batch: PushedBatch, known: KnownSeries, report: IngestReport) -> None:
        """:meth:`_ingest_known` of a write sorted one series at a time."""
        every = list(zip(batch.positions, batch.series, strict=True))
        every += self._slots.as_series(known, np.ones(len(known.slots), bool))
        every.sort(key=lambda pair: pair[0])
        self._ingest_series([series for _, series in every], report)
        self._remember(batch)

    def _publish_known(
        self,
        target: Target,
        by_ts: dict[int, _Samples],
        runs: dict[int, tuple[int, int, bool]],
        columns: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
        position_of: dict[int, int],
        report: IngestReport,
    ) -> None:
        """:meth:`_publish` of one target's samples of a write: those sorted one by one
        (``by_ts``) and the known ones stored (``runs``: their slice of ``columns``, and
        whether their cached templates were void as the write started, by timestamp). A
        timestamp of known samples alone, whose templates are cached and valid, is
        canonicalised from them; any other is rebuilt as a scrape, in request order, and its
        known series' templates are cached (so for the target's later timestamps, the
        templates are read again)."""
        slots, values, positions, templates = columns
        tables: list[pa.Table] = []
        schema: RecordSchema | None = None
        slot_series = self._slots.series
        cached = True  # the templates as the write started are the target's
        for ts_ms in sorted(by_ts.keys() | runs.keys()):
            run = runs.get(ts_ms)
            batch, rebuilt = None, True
            if run is not None and ts_ms not in by_ts and not (cached and run[2]):
                run_slots = slots[run[0] : run[1]]
                batch = self._canonicalize_known(
                    target,
                    run_slots,
                    templates[run[0] : run[1]] if cached else self._templates_of(target, run_slots),
                    values[run[0] : run[1]],
                    ts_ms,
                )
                rebuilt = batch is None
            if batch is None:
                cached = False
                samples = list(by_ts.get(ts_ms, ()))
                if run is not None:
                    placed = [(position_of[id(series)], series, value) for series, value in samples]
                    placed += [
                        (position, slot_series[slot], value)
                        for position, slot, value in zip(
                            positions[run[0] : run[1]].tolist(),
                            slots[run[0] : run[1]].tolist(),
                            values[run[0] : run[1]].tolist(),
                            strict=True,
                        )
                    ]
                    placed.sort(key=lambda entry: entry[0])
                    samples = [(series, value) for _, series, value in placed]
                labels: list[tuple[tuple[str, str], ...]] = []
                exposition = self._exposition(target, samples, report, labels)
                if not len(exposition):
                    continue
                batch = target.canonicalizer.canonicalize(exposition, ts_ms)
                self._slots.cache_templates(target, exposition, labels)
            for reason, count in batch.dropped.items():
                report.drop(reason, count)
            if rebuilt:
                mapped = pc.is_valid(batch.table.column("signal"))
                kept = batch.table.filter(mapped)
                report.drop("unmapped", batch.table.num_rows - kept.num_rows)
            else:  # canonicalised without its unmapped rows
                kept = batch.table
                report.drop("unmapped", batch.unmapped)
            if kept.num_rows:
                schema = batch.schema
                tables.append(kept)
        if schema is not None:
            table = tables[0] if len(tables) == 1 else join_tables(tables)
            self.sink(schema, table)
            report.rows[schema.name] = report.rows.get(schema.name, 0) + table.num_rows

    def _templates_of(self, target: Target, slots: np.ndarray) -> np.ndarray | None:
        """The cached templates of ``target``'s ``slots``, or ``None`` if one is void."""
        templates = self._slots.template[slots]
        if (templates < 0).any() or (self._slots.epoch[slots] != target.epoch).any():
            return None
        return templates

    def _canonicalize_known(
        self,
        target: Target,
        slots: np.ndarray,
        templates: np.ndarray | None,
        values: np.ndarray,
        ts_ms: int,
    ) -> CanonicalBatch | None:
        """The canonical rows of known samples of one target and timestamp from their cached
        ``templates`` (``None``: one is void), or ``None`` when a template may not hold
        (then the scrape is rebuilt)."""
        canonicalizer = target.canonicalizer
        if (
            templates is None
            or target.types_version != self._types_version
            or canonicalizer.templates_token() is not target.templates_token
            or not canonicalizer.saw_families(target.family_names)
        ):
            return None
        slot_series, known = self._slots.series, target.series

        def describe(position: int) -> str:
            series = known[slot_series[int(slots[position])].labels]
            return describe_line(series, values[position].item())

        return canonicalizer.canonicalize_templates(
            templates, values, ts_ms, describe, mapped_only=True
        )

    def _sort_one(
        self,
        series: PushedSeries,
        groups: dict[Target, dict[int, list[tuple[PushedSeries, float]]]],
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
        groups: dict[Target, dict[int, list[tuple[PushedSeries, float]]]],
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
                self._slots = Slots()  # their state is the deduplication state
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
        self, target: Target, ts_ms: int, up: float, same_ts: list[tuple[PushedSeries, float]]
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
        target: Target,
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
            table = join_tables(tables)
            self.sink(schema, table)
            report.rows[schema.name] = report.rows.get(schema.name, 0) + table.num_rows

    def _exposition(
        self,
        target: Target,
        samples: list[tuple[PushedSeries, float]],
        report: IngestReport,
        labels: list[tuple[tuple[str, str], ...]] | None = None,
    ) -> Exposition:
        """``samples`` as one scrape of ``target``; ``labels`` (when given) gets the pushed
        labels of each of its samples."""
        out = Exposition(families=target.families)
        if target.types_version != self._types_version:
            target.family_index.clear()
            target.types_version = self._types_version
            target.epoch += 1
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
                family_name, type_ = family_of(name, self._family_types, target.histograms)
                index = known_family[name] = target.family(family_name, type_)
            family_index.append(index)
            out_series.append(s)
            values.append(value)
            if labels is not None:
                labels.append(series.labels)
        if unmapped:
            report.drop("unmapped", unmapped)
        return out
