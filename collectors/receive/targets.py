"""A pushed series' *target*: the sender's scrape target its ``job`` and ``instance`` labels
name, with its naming, its canonicalizer and the families and series it has sent
(:class:`collectors.receive.receiver.Receiver` keeps one per target; the naming rules are
in that module's docstring)."""

from __future__ import annotations

import re

from collectors.canonical import TargetCanonicalizer
from collectors.config import instance_name
from collectors.exposition import Family, Series

__all__ = ["TARGET_LABELS", "Target", "family_of"]

#: Labels naming the target rather than the series (stripped before canonicalising).
TARGET_LABELS = frozenset(("job", "instance", "pool", "dialect"))
_ADDRESS = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[^:\[\]]+):\d{1,5}$")
_MAX_FAMILIES_PER_TARGET = 10_000


class Target:
    """One sender's target: its naming, canonicalizer, families and series seen.

    ``series`` (labels → the :class:`Series` its samples are canonicalised as) and
    ``family_index`` (sample name → index in ``families``) are caches: ``series`` depends on
    the target labels and starts afresh on :meth:`relabel`; ``family_index`` on the declared
    types and the histograms seen, and starts afresh when either changes.
    """

    def __init__(self, job: str, address: str, max_series: int, index: int = 0) -> None:
        self.index = index  # in the receiver's list of targets
        self.epoch = 0  # bumped whenever the slots' cached templates may no longer hold
        self.templates_token: object = None  # the canonicalizer's, when templates were cached
        self.job = job
        self.max_series = max_series
        self.address = address
        self.labels: dict[str, str] = {}
        self.families: list[Family] = []
        self.family_names: frozenset[str] = frozenset()  # of ``families``
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
        self.epoch += 1

    def family(self, name: str, type_: str) -> int:
        index = self.family_of.get(name)
        if index is None or self.families[index].type != type_:
            if len(self.families) >= _MAX_FAMILIES_PER_TARGET:
                self.families.clear()
                self.family_of.clear()
                self.family_index.clear()
                self.epoch += 1
            index = len(self.families)
            self.families.append(Family(name, type_, ""))
            self.family_names = frozenset(f.name for f in self.families)
            self.family_of[name] = index
        return index

    def saw_histogram(self, base: str) -> None:
        """Note ``base`` as a histogram (a ``_bucket`` series with ``le`` was seen)."""
        if base not in self.histograms and len(self.histograms) < _MAX_FAMILIES_PER_TARGET:
            self.histograms.add(base)
            self.family_index.clear()  # its _sum and _count are histogram samples from now on
            self.epoch += 1

    def series_for(self, labels: tuple[tuple[str, str], ...], name: str) -> Series:
        known = self.series.get(labels)
        if known is None:
            if len(self.series) >= self.max_series:
                self.series.clear()
                self.epoch += 1
            target_labels = self.labels
            kept = {
                k: v
                for k, v in labels
                if k != "__name__" and k not in TARGET_LABELS and k not in target_labels
            }
            known = self.series[labels] = Series(name, kept)
        return known


def family_of(name: str, declared: dict[str, str], histograms: set[str]) -> tuple[str, str]:
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
