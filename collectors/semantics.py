"""Prometheus value semantics for one scrape: which samples cannot be true.

The parser accepts every well-formed number; this module says which values no exporter
can mean, so :class:`collectors.canonical.TargetCanonicalizer` rejects those series (and
only those) with a counted reason instead of storing them:

* ``non_finite_value`` — ``+Inf`` / ``-Inf`` (``1e400`` parses as ``+Inf``) as a sample
  value; NaN is legal ("no value", e.g. a summary without observations) and is kept;
* ``negative_counter`` — a counter, bucket or count below zero;
* ``duplicate_series`` — the same name and labels twice in one scrape (label order does
  not matter); every copy is rejected, since none can be told right;
* ``type_redeclared`` — a second ``# TYPE`` for a family (found by the parser);
* ``histogram_buckets_decrease`` / ``histogram_inf_not_count`` / ``invalid_le`` — a
  histogram whose cumulative buckets drop as ``le`` grows, whose ``+Inf`` bucket differs
  from its ``_count``, or with an ``le`` that is not a number: its buckets, sum and count
  are rejected together.

Everything here is vectorised over the scrape (numpy), so the checks cost a few passes
over arrays the canonicalizer already has.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from collectors.exposition import Exposition, Series

__all__ = [
    "REASONS",
    "HistogramLayout",
    "ScrapeShape",
    "bad_histogram_groups",
    "describe_line",
    "describe_sample",
    "redeclared",
    "reject_impossible",
]

#: Every reason a sample can be rejected for, as counted in ``llmslo_collect_dropped_total``.
REASONS = (
    "non_finite_value",
    "negative_counter",
    "duplicate_series",
    "type_redeclared",
    "invalid_le",
    "histogram_buckets_decrease",
    "histogram_inf_not_count",
)


_MAX_ERRORS_KEPT = 20


class HistogramLayout:
    """Per-template facts about histogram series (arrays indexed by template).

    ``group`` is the histogram (name and labels without ``le``) a bucket/sum/count belongs
    to, or -1; ``le`` the bucket bound (NaN elsewhere); ``le_invalid`` marks a bucket whose
    ``le`` is not a number; ``is_bucket`` / ``is_count`` the sample's role.
    """

    def __init__(
        self,
        group: list[int],
        le: list[float],
        le_invalid: list[bool],
        is_bucket: list[bool],
        is_count: list[bool],
    ) -> None:
        self.group = np.array(group, dtype=np.int64)
        self.le = np.array(le, dtype=np.float64)
        self.le_invalid = np.array(le_invalid, dtype=bool)
        self.is_bucket = np.array(is_bucket, dtype=bool)
        self.is_count = np.array(is_count, dtype=bool)
        self.groups = int(self.group.max()) + 1 if len(self.group) else 0


class ScrapeShape:
    """What the checks of :func:`reject_impossible` need of a scrape's template indices
    ``idx`` alone (its duplicates, histogram groups and buckets in ``le`` order): computed
    once, it serves every scrape of the same series in the same order."""

    def __init__(self, layout: HistogramLayout, idx: np.ndarray, cumulative: np.ndarray) -> None:
        self.groups = groups_all = layout.group[idx]
        self.cumulative = cumulative[idx]
        self.cumulative_at = np.flatnonzero(self.cumulative)
        self.duplicate = np.bincount(idx, minlength=len(cumulative))[idx] > 1
        self.any_duplicate = bool(self.duplicate.any())
        present = np.flatnonzero(groups_all >= 0)
        groups, templates = groups_all[present], idx[present]
        self.invalid_le = np.unique(groups[layout.le_invalid[templates]])
        buckets = layout.is_bucket[templates] & ~layout.le_invalid[templates]
        b_group, b_le = groups[buckets], layout.le[templates[buckets]]
        order = np.lexsort((b_le, b_group))
        self.buckets = present[np.flatnonzero(buckets)[order]]  # positions in idx, le order
        self.b_group = b_group[order]
        self.same_group = self.b_group[1:] == self.b_group[:-1]
        at_inf = b_le[order] == np.inf
        self.inf_group, self.inf_at = self.b_group[at_inf], self.buckets[at_inf]
        counts = layout.is_count[templates]
        self.count_group, self.count_at = groups[counts], present[counts]
        # the groups with both a +Inf bucket and a _count: the positions of each (the last
        # one, if sent twice), whose values must agree
        inf_of, count_of = np.full((2, layout.groups), -1)
        inf_of[self.inf_group] = self.inf_at
        count_of[self.count_group] = self.count_at
        self.paired = np.flatnonzero((inf_of >= 0) & (count_of >= 0))
        self.paired_inf, self.paired_count = inf_of[self.paired], count_of[self.paired]


def bad_histogram_groups(
    layout: HistogramLayout,
    idx: np.ndarray,
    values: np.ndarray,
    shape: ScrapeShape | None = None,
) -> dict[str, np.ndarray]:
    """Histogram groups of this scrape that break the rules, by reason.

    ``idx`` are the template indices of the scrape's samples, ``values`` their values;
    ``shape`` their :class:`ScrapeShape`, when kept from an earlier scrape.
    Returns reason → array of group ids (empty dict when every histogram is sound).
    """
    shape = shape or ScrapeShape(layout, idx, np.zeros(len(layout.group), bool))
    bad: dict[str, np.ndarray] = {}
    if len(shape.invalid_le):
        bad["invalid_le"] = shape.invalid_le
    if not len(shape.buckets) and not len(shape.count_at):
        return bad
    b_val = values[shape.buckets]
    drops = shape.same_group & (b_val[1:] < b_val[:-1])  # NaN never compares
    if drops.any():
        bad["histogram_buckets_decrease"] = np.unique(shape.b_group[1:][drops])
    inf_bucket, count = values[shape.paired_inf], values[shape.paired_count]
    differs = inf_bucket != count
    if differs.any():
        # NaN (no value) is not a disagreement: x == x is false only for NaN
        differs &= (inf_bucket == inf_bucket) & (count == count)
        if differs.any():
            bad["histogram_inf_not_count"] = shape.paired[differs]
    return bad


def describe_line(series: Series, value: float) -> str:
    """A sample's exposition line, as :func:`reject_impossible`'s errors quote it."""
    labels = ",".join(f'{k}="{v}"' for k, v in series.labels.items())
    return f"{series.name}{{{labels}}} {value!r}"


def describe_sample(exposition: Exposition) -> Callable[[int], str]:
    """What :func:`reject_impossible` says of sample ``i`` of ``exposition``: its line."""

    def describe(position: int) -> str:
        return describe_line(exposition.series[position], exposition.values[position])

    return describe


def redeclared(exposition: Exposition) -> np.ndarray | None:
    """Mask of the samples of a family with a second ``# TYPE``, or None when none is."""
    if not exposition.rejected_families:
        return None
    names = [f.name in exposition.rejected_families for f in exposition.families]
    return np.array(names, dtype=bool)[np.asarray(exposition.family_index, dtype=np.int64)]


def reject_impossible(
    describe: Callable[[int], str],
    idx: np.ndarray,
    values: np.ndarray,
    layout: HistogramLayout,
    cumulative: np.ndarray,
    dropped: dict[str, int],
    errors: list[str],
    type_redeclared: np.ndarray | None = None,
    shape: ScrapeShape | None = None,
) -> np.ndarray | None:
    """Mask of the samples to reject, or None when every sample is sound.

    ``idx``/``values`` are the scrape's template indices and (scaled) values;
    ``cumulative`` marks counter/bucket/count templates; ``type_redeclared`` the samples of a
    redeclared family (:func:`redeclared`); ``shape`` the :class:`ScrapeShape` of ``idx``,
    when kept from an earlier scrape (made here otherwise). Adds each rejected sample to
    ``dropped[reason]`` and describes the first few in ``errors`` (``"reason: "`` and
    ``describe(i)``, :func:`describe_sample`).
    """
    shape = shape or ScrapeShape(layout, idx, cumulative)
    histograms = bad_histogram_groups(layout, idx, values, shape)
    if (
        not histograms
        and type_redeclared is None
        and not shape.any_duplicate
        and not np.isinf(values).any()
        and not (values[shape.cumulative_at] < 0).any()
    ):
        return None  # every sample sound: what a scrape almost always is
    bad = np.zeros(len(idx), dtype=bool)

    def reject(mask: np.ndarray, reason: str) -> None:
        if not mask.any():
            return
        new = np.flatnonzero(mask & ~bad)
        if not len(new):
            return
        bad[new] = True
        dropped[reason] = dropped.get(reason, 0) + len(new)
        for position in new[: max(_MAX_ERRORS_KEPT - len(errors), 0)].tolist():
            errors.append(f"{reason}: {describe(position)}"[:200])

    reject(np.isinf(values), "non_finite_value")
    reject(shape.cumulative & (values < 0), "negative_counter")
    reject(shape.duplicate, "duplicate_series")
    if type_redeclared is not None:
        reject(type_redeclared, "type_redeclared")
    for reason, ids in histograms.items():
        reject(np.isin(shape.groups, ids), reason)
    return bad if bad.any() else None
