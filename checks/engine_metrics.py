"""The release regression: is every metric llmslo maps still in a new engine's ``/metrics``?

:func:`compare_scrape` detects the scrape's engine and version family with the collector's
dialect maps (``collectors/dialects/*.yaml``) and, per canonical signal that map feeds,
says which exposed names carry it. Against a ``baseline`` scrape (the release you run
today) a signal the baseline carried and the new scrape does not is ``missing`` — the
release broke a series an SLO or detector reads — and one carried under other names is
``renamed``. Without a baseline, a signal carried only by a deprecated alias (a name the
map lets yield to a newer one) is ``renamed`` too: the scrape predates the current names.
"""

from __future__ import annotations

import asyncio
import json
import xml.etree.ElementTree as ET
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import aiohttp

from collectors.collector import fetch_exposition
from collectors.dialects import DialectMap, detect_dialect
from collectors.exposition import Exposition, parse_exposition
from pipeline.errors import ConfigError

__all__ = [
    "MetricsRegression",
    "SignalPresence",
    "compare_scrape",
    "read_scrape",
    "render_regression",
]

PresenceStatus = Literal["ok", "renamed", "missing", "new", "absent"]
_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")
_MAX_BODY_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class SignalPresence:
    """One canonical signal: the names the new scrape (and the baseline) carry it under."""

    signal: str
    status: PresenceStatus
    found: tuple[str, ...]
    baseline: tuple[str, ...]
    current: tuple[str, ...]

    @property
    def detail(self) -> str:
        now = ", ".join(self.found) or "none"
        if self.status == "renamed" and self.baseline:
            return f"{', '.join(self.baseline)} → {now}"
        if self.status == "renamed":
            return f"scrape has {now}; current name {', '.join(self.current)}"
        if self.status == "missing":
            return f"baseline had {', '.join(self.baseline)}; gone"
        return now


@dataclass(frozen=True)
class MetricsRegression:
    """The comparison; ``failed`` when a signal the baseline carried is gone."""

    engine: str
    version_family: str
    baseline_family: str | None
    signals: tuple[SignalPresence, ...]

    @property
    def failed(self) -> bool:
        return any(s.status == "missing" for s in self.signals)


def read_scrape(source: str, *, timeout_s: float = 10.0) -> Exposition:
    """A ``/metrics`` body from a URL (``http://…``) or a file; raises :class:`ConfigError`."""
    if source.startswith(("http://", "https://")):
        text = asyncio.run(_fetch(source, timeout_s))
    else:
        try:
            text = Path(source).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"--engine-metrics {source}: {exc.strerror or exc}") from exc
    return parse_exposition(text)


async def _fetch(url: str, timeout_s: float) -> str:
    async with aiohttp.ClientSession() as session:
        fetched = await fetch_exposition(
            session, url, timeout_s=timeout_s, max_body_bytes=_MAX_BODY_BYTES
        )
        return fetched.text


def _names(exposition: Exposition) -> tuple[set[str], set[str]]:
    names = {f.name for f in exposition.families} | {s.name for s in exposition.series}
    for name in list(names):
        names |= {name[: -len(sfx)] for sfx in _SUFFIXES if name.endswith(sfx)}
    labels = {label for s in exposition.series for label in s.labels}
    return names, labels


def _carriers(engine: DialectMap, present: Collection[str]) -> dict[str, tuple[str, ...]]:
    """Signal → the mapped names of ``present`` that feed it (every signal of the map)."""
    out: dict[str, list[str]] = {}
    for name, rule in engine.metrics.items():
        for signal in rule.signals():
            out.setdefault(signal, [])
            if name in present:
                out[signal].append(name)
    return {signal: tuple(names) for signal, names in out.items()}


def _current(engine: DialectMap) -> dict[str, tuple[str, ...]]:
    out: dict[str, list[str]] = {}
    for name, rule in engine.metrics.items():
        for signal in rule.signals():
            out.setdefault(signal, [])
            if not rule.unless:
                out[signal].append(name)
    return {signal: tuple(names) for signal, names in out.items()}


def _status(
    found: tuple[str, ...], before: tuple[str, ...] | None, current: tuple[str, ...]
) -> PresenceStatus:
    if before is None:
        if not found:
            return "absent"
        return "ok" if set(found) & set(current) or not current else "renamed"
    if before and not found:
        return "missing"
    if found and not before:
        return "new"
    if not found:
        return "absent"
    return "ok" if set(found) == set(before) else "renamed"


def compare_scrape(
    scrape: Exposition, baseline: Exposition | None = None, *, dialect: str | None = None
) -> MetricsRegression:
    """Compare ``scrape`` against ``baseline`` (or the map's current names); ``dialect``
    forces the engine's map. Raises :class:`ConfigError` when no map names the scrape."""
    names, labels = _names(scrape)
    detection = detect_dialect(names, labels, forced=dialect)
    if detection is None:
        raise ConfigError("--engine-metrics: no dialect map names any metric of this scrape")
    engine = detection.engine
    found = _carriers(engine, names)
    before: dict[str, tuple[str, ...]] | None = None
    family = None
    if baseline is not None:
        base_names, base_labels = _names(baseline)
        # the baseline is read with its own map: a release may move a component to a new
        # dialect (EPP's inference_* → llm_d_epp_*), the signals are what must survive
        base = detect_dialect(base_names, base_labels, forced=dialect)
        family = base.version_family if base else None
        before = _carriers(base.engine if base else engine, base_names)
    current = _current(engine)
    signals = tuple(
        SignalPresence(
            signal,
            _status(found.get(signal, ()), None if before is None else before.get(signal, ()),
                    current.get(signal, ())),
            found.get(signal, ()),
            before.get(signal, ()) if before else (),
            current.get(signal, ()),
        )
        for signal in sorted(set(found) | set(before or ()))
    )  # fmt: skip
    return MetricsRegression(engine.engine, detection.version_family, family, signals)


def _table(result: MetricsRegression) -> str:
    head = f"{result.engine}: {result.version_family}"
    if result.baseline_family:
        head += f" (baseline: {result.baseline_family})"
    lines = [head]
    order = {"missing": 0, "renamed": 1, "new": 2, "ok": 3, "absent": 4}
    for s in sorted(result.signals, key=lambda s: (order[s.status], s.signal)):
        lines.append(f"  {s.status.upper():<8} {s.signal:<28} {s.detail}")
    counts = {k: sum(s.status == k for s in result.signals) for k in order}
    lines.append("  " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    return "\n".join(lines) + "\n"


def _json(result: MetricsRegression) -> str:
    body = {
        "engine": result.engine,
        "version_family": result.version_family,
        "baseline_family": result.baseline_family,
        "failed": result.failed,
        "signals": [
            {
                "signal": s.signal,
                "status": s.status,
                "found": list(s.found),
                "baseline": list(s.baseline),
                "current": list(s.current),
                "detail": s.detail,
            }
            for s in result.signals
        ],
    }
    return json.dumps(body, indent=2) + "\n"


def _junit(result: MetricsRegression) -> str:
    suite = ET.Element(
        "testsuite",
        name=f"llmslo check --engine-metrics ({result.engine})",
        tests=str(len(result.signals)),
        failures=str(sum(s.status == "missing" for s in result.signals)),
        skipped=str(sum(s.status == "absent" for s in result.signals)),
    )
    for s in result.signals:
        case = ET.SubElement(
            suite, "testcase", classname=f"llmslo.metrics.{result.engine}", name=s.signal
        )
        if s.status == "missing":
            ET.SubElement(case, "failure", message=s.detail, type="missing")
        elif s.status == "absent":
            ET.SubElement(case, "skipped", message="not exposed by this scrape")
        ET.SubElement(case, "system-out").text = f"{s.status}: {s.detail}"
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def render_regression(result: MetricsRegression, fmt: str) -> str:
    """``table``, ``json`` or ``junit``."""
    return {"table": _table, "json": _json, "junit": _junit}[fmt](result)
