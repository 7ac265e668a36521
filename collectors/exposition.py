"""A fast parser for the Prometheus text format 0.0.4 and OpenMetrics 1.0.

:class:`ExpositionParser` turns one scrape's text into a column-oriented
:class:`Exposition`: parallel lists of series, values and family indices, with no object
per sample. It is built for the scrape loop:

* each sample line is split once at its last space; the part before it (``name{labels}``)
  is looked up in a per-parser cache of already validated series, so a repeated scrape
  costs one dict lookup and one ``float()`` per line;
* a line seen for the first time goes through the full, strict regex path; only then is
  its series cached (bounded by ``max_cached_series``);
* label dicts are shared between series with the same label text and must be treated as
  read-only.

Family grouping follows ``prometheus_client.parser`` exactly (a sample that does not belong
to the current ``# TYPE`` family becomes an untyped family of its own), so
:func:`to_metric_families` gives the same result as
``prometheus_client.parser.text_string_to_metric_families`` on valid input. Invalid lines
never raise: they are counted in :attr:`Exposition.bad_lines` and the first few are kept
with a reason in :attr:`Exposition.errors`.

Values are ``float`` (``1.0``, ``8.128902e+06``, ``NaN``, ``+Inf``, ``-Inf``); timestamps
are Unix epoch milliseconds (``int``), converted from OpenMetrics seconds when needed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from pipeline.errors import LlmsloError

__all__ = [
    "OPENMETRICS_TYPES",
    "TEXT_TYPES",
    "Exposition",
    "ExpositionParser",
    "Family",
    "Series",
    "parse_exposition",
    "to_metric_families",
]

#: ``# TYPE`` values of the text format 0.0.4 and the sample names each allows (suffixes).
TEXT_TYPES: dict[str, tuple[str, ...]] = {
    "counter": ("",),
    "gauge": ("",),
    "summary": ("_count", "_sum", ""),
    "histogram": ("_count", "_sum", "_bucket"),
    "untyped": ("",),
    "unknown": ("",),
    "info": ("",),
    "stateset": ("",),
    "gaugehistogram": ("",),
}
#: The same for OpenMetrics 1.0, where family names carry no suffix.
OPENMETRICS_TYPES: dict[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "summary": ("", "_count", "_sum", "_created"),
    "histogram": ("_count", "_sum", "_bucket", "_created"),
    "gaugehistogram": ("_gcount", "_gsum", "_bucket"),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_NAME_RE = re.compile(_NAME)
# possessive quantifiers: linear time on hostile input (no catastrophic backtracking)
_QUOTED = r'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
_LABEL_TEXT = rf'(?:[^"}}]++|{_QUOTED})*+'
# name, optional {labels}, then everything after (value, timestamp, exemplar)
_SAMPLE_RE = re.compile(rf"({_NAME})[ \t]*(?:\{{({_LABEL_TEXT})\}})?(.*)\Z", re.DOTALL)
_LABEL_PAIR_RE = re.compile(
    r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\]*+(?:\\.[^"\\]*+)*+)"[ \t]*(,|\Z)'
)
_ASCII_SPACE_RE = re.compile(r"[ \t\n\r\x0b\x0c]+")
_ESCAPE_RE = re.compile(r'\\[\\n"]')
_HELP_ESCAPE_RE = re.compile(r"\\[\\n]")
_ESCAPES = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
_MAX_ERRORS_KEPT = 20


def _unescape(text: str, pattern: re.Pattern[str] = _ESCAPE_RE) -> str:
    if "\\" not in text:
        return text
    return pattern.sub(lambda m: _ESCAPES[m.group(0)], text)


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family as declared by ``# TYPE`` / ``# HELP`` (or implied by a sample).

    ``name`` is exactly as written in the exposition (``vllm:num_preemptions_total``);
    ``type`` is ``untyped`` when no ``# TYPE`` line declared it.
    """

    name: str
    type: str
    help: str
    unit: str = ""


@dataclass(frozen=True, slots=True, eq=False)
class Series:
    """The identity of one sample line: its metric name and labels (read-only mapping).

    Compared and hashed by identity: the parser hands out the same object for the same
    line text on every scrape, which is what makes per-series caches downstream cheap.
    """

    name: str
    labels: Mapping[str, str]


@dataclass
class Exposition:
    """One parsed scrape, column-oriented: sample ``i`` is ``series[i]``, ``values[i]``.

    ``family_index[i]`` indexes :attr:`families`. ``timestamps_ms`` and ``exemplars`` are
    sparse (sample index → value) because engines almost never send them.
    """

    families: list[Family] = field(default_factory=list)
    family_index: list[int] = field(default_factory=list)
    series: list[Series] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    timestamps_ms: dict[int, int] = field(default_factory=dict)
    exemplars: dict[int, tuple[Mapping[str, str], float]] = field(default_factory=dict)
    bad_lines: int = 0
    errors: list[str] = field(default_factory=list)
    openmetrics: bool = False
    #: families whose samples cannot be trusted (name → reason), e.g. a second ``# TYPE``;
    #: not bad lines (the syntax is valid): the canonicalizer rejects their samples
    rejected_families: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.values)

    def samples(self) -> Iterator[tuple[Family, Series, float]]:
        """Iterate ``(family, series, value)`` (convenience for cold paths and tests)."""
        families = self.families
        for fam, ser, val in zip(self.family_index, self.series, self.values, strict=True):
            yield families[fam], ser, val


class _Group:
    """The family being read, mutable until the next family starts."""

    __slots__ = ("allowed", "help", "index", "name", "type", "unit")

    def __init__(self, index: int, name: str, type_: str, allowed: frozenset[str]) -> None:
        self.index = index
        self.name = name
        self.type = type_
        self.help = ""
        self.unit = ""
        self.allowed = allowed


class _Line(LlmsloError):
    """A bad line, with a short reason (internal: never leaves this module)."""


class ExpositionParser:
    """Parses scrapes of one target, caching validated series across scrapes.

    Not thread-safe; use one parser per target (or per task). ``max_cached_series``
    bounds memory: when exceeded the cache is cleared and refilled.
    """

    def __init__(self, max_cached_series: int = 500_000) -> None:
        self.max_cached_series = max_cached_series
        self._series: dict[str, Series] = {}
        self._labels: dict[str, Mapping[str, str]] = {"": MappingProxyType({})}

    def parse(self, text: str, *, openmetrics: bool | None = None) -> Exposition:
        """Parse ``text``; ``openmetrics=None`` detects OpenMetrics by a ``# EOF`` line."""
        if openmetrics is None:
            tail = text[-64:].rstrip()
            openmetrics = tail.endswith("# EOF")
        state = _ParseState(self, Exposition(openmetrics=openmetrics))
        state.run(text)
        return state.out

    # -- series cache -------------------------------------------------------------------
    def _labels_for(self, text: str) -> Mapping[str, str]:
        cached = self._labels.get(text)
        if cached is not None:
            return cached
        labels: dict[str, str] = {}
        pos = 0
        stripped = text.strip(" \t")
        if stripped.endswith(","):
            stripped = stripped[:-1]
        while pos < len(stripped):
            match = _LABEL_PAIR_RE.match(stripped, pos)
            if match is None or (match.group(3) == "," and match.end() == len(stripped)):
                raise _Line("invalid labels")
            name = match.group(1)
            if name in labels:
                raise _Line(f"duplicate label {name}")
            labels[name] = _unescape(match.group(2))
            pos = match.end()
        proxy: Mapping[str, str] = MappingProxyType(labels)
        if len(self._labels) < self.max_cached_series:
            self._labels[text] = proxy
        return proxy

    def _series_for(self, name: str, label_text: str | None) -> Series:
        labels = self._labels_for(label_text or "")
        return Series(name, labels)

    def _remember(self, key: str, series: Series) -> None:
        if len(self._series) >= self.max_cached_series:
            self._series.clear()
        self._series[key] = series


def _parse_number(text: str) -> float:
    if "_" in text or not text:
        raise _Line(f"invalid value {text[:40]!r}")
    try:
        return float(text)
    except ValueError:
        raise _Line(f"invalid value {text[:40]!r}") from None


class _ParseState:
    """One pass over one scrape (kept out of the parser so the hot loop has locals)."""

    def __init__(self, parser: ExpositionParser, out: Exposition) -> None:
        self.parser = parser
        self.out = out
        self.types = OPENMETRICS_TYPES if out.openmetrics else TEXT_TYPES
        self.group: _Group | None = None
        self.typed: set[str] = set()  # families with a # TYPE line so far

    # -- families ------------------------------------------------------------------------
    def _finish(self) -> None:
        group = self.group
        if group is not None:
            self.out.families[group.index] = Family(group.name, group.type, group.help, group.unit)
        self.group = None

    def _start(self, name: str, type_: str, allowed: frozenset[str]) -> _Group:
        self._finish()
        families = self.out.families
        group = _Group(len(families), name, type_, allowed)
        families.append(Family(name, type_, ""))
        self.group = group
        return group

    def _singleton(self, name: str) -> int:
        """A sample outside the current family: an untyped family of its own.

        (prometheus_client does the same.)
        """
        self._finish()
        families = self.out.families
        families.append(Family(name, "untyped" if not self.out.openmetrics else "unknown", ""))
        return len(families) - 1

    def bad(self, line: str, reason: str) -> None:
        out = self.out
        out.bad_lines += 1
        if len(out.errors) < _MAX_ERRORS_KEPT:
            out.errors.append(f"{reason}: {line[:120]!r}")

    # -- lines -----------------------------------------------------------------------------
    def comment(self, line: str) -> bool:
        """Handle a ``#`` line; returns False at ``# EOF``."""
        parts = _ASCII_SPACE_RE.split(line, maxsplit=3)  # as prometheus_client: ASCII only
        if len(parts) < 2 or parts[0] != "#":
            return True  # a plain comment ("#foo" or "#")
        keyword = parts[1]
        if keyword == "EOF" and self.out.openmetrics:
            return False
        if keyword not in ("HELP", "TYPE") and not (keyword == "UNIT" and self.out.openmetrics):
            return True
        if len(parts) < 3 or not _NAME_RE.fullmatch(parts[2]):
            self.bad(line, f"malformed # {keyword}")
            return True
        name = parts[2]
        group = self.group
        if keyword == "HELP":
            if group is None or group.name != name:
                group = self._start(
                    name, "untyped" if not self.out.openmetrics else "unknown", frozenset((name,))
                )
            group.help = _unescape(parts[3], _HELP_ESCAPE_RE) if len(parts) == 4 else ""
        elif keyword == "TYPE":
            type_ = parts[3].strip() if len(parts) == 4 else ""
            if type_ not in self.types:
                self.bad(line, "unknown metric type")
                return True
            if name in self.typed:  # which type is meant cannot be known (syntax is fine)
                self.out.rejected_families[name] = "type_redeclared"
            self.typed.add(name)
            suffixes = self.types[type_]
            if group is None or group.name != name:
                group = self._start(name, type_, frozenset())
            group.type = type_
            group.allowed = frozenset(name + s for s in suffixes)
        elif group is not None and group.name == name and len(parts) == 4:
            group.unit = parts[3].strip()
        return True

    def _simple_series(self, key: str, value_text: str) -> Series | None:
        """Parse ``name{labels}`` / ``name`` without the full regex (the common new line)."""
        if not value_text or "\t" in value_text or key[-1:] in ("\t", " "):
            return None
        brace = key.find("{")
        if brace < 0:
            name, label_text = key, ""
        elif key[-1] == "}":
            name, label_text = key[:brace], key[brace + 1 : -1]
        else:
            return None
        if not _NAME_RE.fullmatch(name):
            return None
        try:
            return self.parser._series_for(name, label_text)
        except _Line:
            return None  # let the full parse decide and explain

    def sample_slow(self, line: str, key: str, sep: str) -> tuple[Series, float]:
        """Full parse of a sample line; caches its series when the line is plain ``key value``."""
        value_text = line[len(key) + 1 :]
        if sep and not (self.out.openmetrics and " # " in line):
            series = self._simple_series(key, value_text)
            if series is not None:
                value = _parse_number(value_text)
                self.parser._remember(key, series)
                return series, value
        exemplar_text = ""
        body = line
        if self.out.openmetrics and " # " in line:
            body, _, exemplar_text = line.partition(" # ")
        match = _SAMPLE_RE.match(body)
        if match is None:
            raise _Line("invalid sample")
        name, label_text, rest = match.groups()
        if label_text is None and body[match.end(1) : match.end(1) + 1] not in (" ", "\t"):
            raise _Line("invalid metric name")
        tokens = rest.split()
        if not tokens or len(tokens) > 2:
            raise _Line("expected value [timestamp]")
        series = self.parser._series_for(name, label_text)
        value = _parse_number(tokens[0])
        index = len(self.out.values)
        if len(tokens) == 2:
            ts = _parse_number(tokens[1])
            if ts != ts or ts in (float("inf"), float("-inf")):
                raise _Line("invalid timestamp")
            self.out.timestamps_ms[index] = round(ts * 1000) if self.out.openmetrics else int(ts)
        if exemplar_text:
            self._exemplar(index, exemplar_text)
        if sep and len(tokens) == 1 and not exemplar_text and line == key + " " + tokens[0]:
            self.parser._remember(key, series)
        return series, value

    def _exemplar(self, index: int, text: str) -> None:
        match = re.fullmatch(rf"\{{({_LABEL_TEXT})\}}[ \t]+(\S+)(?:[ \t]+\S+)?", text.strip())
        if match is None:
            raise _Line("invalid exemplar")
        labels = self.parser._labels_for(match.group(1))
        self.out.exemplars[index] = (labels, _parse_number(match.group(2)))

    def run(self, text: str) -> None:
        out = self.out
        cache = self.parser._series
        series_out = out.series
        values_out = out.values
        family_out = out.family_index
        group_index = -1
        allowed: frozenset[str] = frozenset()
        for raw in text.split("\n"):
            line = raw.strip()
            if not line:
                continue
            if line[0] == "#":
                if not self.comment(line):
                    break
                group = self.group
                group_index, allowed = (group.index, group.allowed) if group else (-1, frozenset())
                continue
            key, sep, value_text = line.rpartition(" ")
            series = cache.get(key)
            value = 0.0
            if series is not None and "_" not in value_text:
                try:
                    value = float(value_text)
                except ValueError:
                    series = None  # e.g. a tab-separated timestamp: the slow path decides
            if series is None or "_" in value_text:
                try:
                    series, value = self.sample_slow(line, key, sep)
                except _Line as exc:
                    self.bad(line, str(exc))
                    continue
            if series.name in allowed:
                family_out.append(group_index)
            else:
                family_out.append(self._singleton(series.name))
                group_index, allowed = -1, frozenset()
            series_out.append(series)
            values_out.append(value)
        self._finish()


def parse_exposition(text: str, *, openmetrics: bool | None = None) -> Exposition:
    """Parse one exposition without a cache (one-shot use; the collector keeps parsers)."""
    return ExpositionParser().parse(text, openmetrics=openmetrics)


def to_metric_families(exposition: Exposition) -> list[object]:
    """The same families ``prometheus_client``'s parser yields (for comparison and tooling).

    Applies prometheus_client's munging: in the 0.0.4 format a counter family loses its
    ``_total`` suffix, or its samples gain one. Exemplars are not converted.
    """
    from prometheus_client.metrics_core import Metric
    from prometheus_client.samples import Sample

    by_family: list[list[Sample]] = [[] for _ in exposition.families]
    for i, (fam, ser, val) in enumerate(
        zip(exposition.family_index, exposition.series, exposition.values, strict=True)
    ):
        ts_ms = exposition.timestamps_ms.get(i)
        ts = None if ts_ms is None else ts_ms / 1000
        by_family[fam].append(Sample(ser.name, dict(ser.labels), val, ts))
    metrics: list[object] = []
    for family, samples in zip(exposition.families, by_family, strict=True):
        name = family.name
        if family.type == "counter" and not exposition.openmetrics:
            if name.endswith("_total"):
                name = name[:-6]
            else:
                samples = [Sample(s.name + "_total", *s[1:]) for s in samples]
        metric = Metric(name, family.help, family.type)
        metric.samples = samples
        metrics.append(metric)
    return metrics
