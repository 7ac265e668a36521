"""The *slots* of known remote-write series: the state that lets
:class:`collectors.receive.receiver.Receiver` take the series a remote-write sends on every
scrape as columns (``docs/receivers.md``, Throughput).

A slot is given to a series once the general path has sorted it; it is keyed by the
series' serialised labels (what the decoder sees) and by its parsed labels (what the general
path sees), and holds in arrays, by slot: the last stored timestamp (the deduplication
state, :data:`NONE` when there is none), the target's index, the canonical template cached
for it in the target's canonicalizer (``-1``: none) and the target's epoch that template is
of (a template is valid only while its target's epoch has not moved).
"""

from __future__ import annotations

import numpy as np

from collectors.exposition import Exposition
from collectors.receive.series import KnownSeries, PushedSeries
from collectors.receive.targets import Target

__all__ = ["NONE", "Slots"]

#: A slot's deduplication state when it has none (never stored, or ended by staleness).
NONE = np.iinfo(np.int64).min

_Labels = tuple[tuple[str, str], ...]


class Slots:
    """The slots of one receiver (single-threaded, as the receiver)."""

    def __init__(self) -> None:
        self.of_key: dict[bytes, int] = {}
        self.of_labels: dict[_Labels, int] = {}
        self.series: list[PushedSeries] = []
        self.last = np.empty(0, np.int64)  # the last stored timestamp, or NONE
        self.target = np.empty(0, np.int64)  # the target's index
        self.template = np.empty(0, np.int64)  # in the target's canonicalizer, or -1
        self.epoch = np.empty(0, np.int64)  # the target's epoch the template is of
        self._mark = np.empty(0, np.int64)  # scratch of :meth:`repeated`

    def __len__(self) -> int:
        return len(self.series)

    def add(self, new: list[tuple[bytes, PushedSeries, int]], tracked: dict[_Labels, int]) -> None:
        """Give a slot to each (serialised labels, series, target index) of ``new``, its
        deduplication state taken from ``tracked`` (which must hold it)."""
        first = len(self.series)
        for offset, (key, series, _) in enumerate(new):
            self.of_key[key] = self.of_labels[series.labels] = first + offset
            self.series.append(series)
        self.last = np.concatenate(
            [self.last, np.array([tracked[s.labels] for _, s, _ in new], np.int64)]
        )
        self.target = np.concatenate([self.target, np.array([t for _, _, t in new], np.int64)])
        self.template = np.concatenate([self.template, np.full(len(new), -1)])
        self.epoch = np.concatenate([self.epoch, np.full(len(new), -1)])

    def repeated(self, slots: np.ndarray) -> bool:
        """Whether a slot occurs more than once in ``slots`` (a series sent at several
        timestamps in one write): each slot is marked with its position, and a slot that
        occurs twice keeps only one of them (no sort, as ``np.unique`` would)."""
        if len(self._mark) < len(self.series):
            self._mark = np.empty(len(self.series), np.int64)
        position = np.arange(len(slots))
        self._mark[slots] = position
        return bool((self._mark[slots] != position).any())

    def sync_in(self, series_list: list[PushedSeries], tracked: dict[_Labels, int]) -> None:
        """Before the general path sorts ``series_list``: their slots' deduplication state
        into ``tracked`` (which holds every tracked series; a slot's value is newer)."""
        if not self.series:
            return
        slot_of, last = self.of_labels, self.last
        for series in series_list:
            slot = slot_of.get(series.labels)
            if slot is not None and last[slot] != NONE:
                tracked[series.labels] = int(last[slot])

    def sync_out(self, series_list: list[PushedSeries], tracked: dict[_Labels, int]) -> None:
        """After the general path sorted ``series_list``: ``tracked`` into their slots."""
        if not self.series:
            return
        slot_of, last = self.of_labels, self.last
        for series in series_list:
            slot = slot_of.get(series.labels)
            if slot is not None:
                last[slot] = tracked.get(series.labels, NONE)

    def cache_templates(
        self, target: Target, exposition: Exposition, labels: list[_Labels]
    ) -> None:
        """Cache the templates ``target``'s canonicalizer gave the slotted series of
        ``exposition`` (``labels[i]``: the pushed labels of its sample ``i``)."""
        if not self.series:
            return
        canonicalizer = target.canonicalizer
        token = canonicalizer.templates_token()
        if token is not target.templates_token:
            target.epoch += 1  # every template cached before is void
            target.templates_token = token
        slot_of, families = self.of_labels, exposition.families
        for pushed, series, family in zip(
            labels, exposition.series, exposition.family_index, strict=True
        ):
            slot = slot_of.get(pushed)
            if slot is None:
                continue
            hit = canonicalizer.template_of(series)
            # valid while the target's cache of series holds this series (else the next
            # scrape makes a new one: a new template lookup)
            valid = (
                hit is not None
                and hit[1] == families[family].type
                and target.series.get(pushed) is series
            )
            self.template[slot] = hit[0] if hit is not None and valid else -1
            self.epoch[slot] = target.epoch

    def deduplicate(
        self, slots: np.ndarray, ts: np.ndarray, positions: np.ndarray, repeated: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """(duplicate, older) masks of known samples (``slots``, ``ts``, ``positions`` in the
        request), their slots' state updated with those stored. A series sent several times
        in the write is taken in request order: its first samples in one pass, its second
        ones in the next, …"""
        if not repeated or not len(slots):  # none of them, when each known sample was odd
            last = self.last[slots]
            duplicate, older = ts == last, ts < last
            stored = ~(duplicate | older)
            self.last[slots[stored]] = ts[stored]
            return duplicate, older
        order = np.lexsort((positions, slots))
        by_slot = slots[order]
        run_start = np.flatnonzero(np.concatenate([[True], by_slot[1:] != by_slot[:-1]]))
        run_length = np.diff(np.concatenate([run_start, [len(slots)]]))
        rank = np.empty(len(slots), np.int64)
        rank[order] = np.arange(len(slots)) - np.repeat(run_start, run_length)
        duplicate = np.zeros(len(slots), bool)
        older = np.zeros(len(slots), bool)
        for occurrence in range(int(rank.max()) + 1):
            at = np.flatnonzero(rank == occurrence)
            last = self.last[slots[at]]
            duplicate[at], older[at] = ts[at] == last, ts[at] < last
            stored = at[ts[at] > last]
            self.last[slots[stored]] = ts[stored]
        return duplicate, older

    def as_series(self, known: KnownSeries, which: np.ndarray) -> list[tuple[int, PushedSeries]]:
        """The known samples ``which`` selects, as (place in the request, one-sample series)
        for the general path."""
        slot_series = self.series
        return [
            (position, PushedSeries(series.name, series.labels, series.target, [(ts_ms, value)]))
            for position, series, ts_ms, value in zip(
                known.positions[which].tolist(),
                [slot_series[slot] for slot in known.slots[which].tolist()],
                known.timestamp_ms[which].tolist(),
                known.value[which].tolist(),
                strict=True,
            )
        ]
