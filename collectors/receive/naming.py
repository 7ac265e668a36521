"""OpenTelemetry names → the Prometheus names the dialect maps know.

An OTLP metric reaches llmslo under one of three spellings of the same series:

* the scraped name itself (``vllm:num_requests_running``): an OpenTelemetry Collector's
  ``prometheus`` receiver keeps the names it scraped (counters sometimes without
  ``_total``);
* an OTel-style dotted name (``vllm.num_requests_running``), with the unit in ``unit``
  rather than in the name (``vllm.time_to_first_token`` + ``s``);
* what Prometheus' OTLP translation makes of it (dots → ``_``, the unit as a suffix —
  ``_seconds``, ``_bytes``, ``_ratio`` for a unit-``1`` gauge — and ``_total`` on a
  monotonic sum).

:func:`prometheus_name` tries, in that order, the spellings a dialect map could know —
the name as sent, the first dot as the engine's ``:`` (``vllm.`` → ``vllm:``), every dot as
``_`` — each without and with the unit suffix, with ``_total`` for a counter — and returns
the first one some map names. A name no map knows gets Prometheus' own translation (it is
counted as ``unmapped`` downstream, never stored).
"""

from __future__ import annotations

import re
from functools import cache, lru_cache

from collectors.dialects import load_dialects

__all__ = ["label_name", "prometheus_name", "unit_suffix"]

_INVALID_NAME = re.compile(r"[^a-zA-Z0-9_:]")
_INVALID_LABEL = re.compile(r"[^a-zA-Z0-9_]")
_MULTIPLE_UNDERSCORES = re.compile(r"__+")
#: UCUM units (OTel semantic conventions) → Prometheus' suffix words (otlptranslator).
_UNITS = {
    "d": "days",
    "h": "hours",
    "min": "minutes",
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "GiBy": "gibibytes",
    "KBy": "kilobytes",
    "MBy": "megabytes",
    "GBy": "gigabytes",
    "m": "meters",
    "V": "volts",
    "A": "amperes",
    "J": "joules",
    "W": "watts",
    "g": "grams",
    "Cel": "celsius",
    "Hz": "hertz",
    "%": "percent",
}


@cache
def _known() -> frozenset[str]:
    """Every metric name a dialect map recognises, histogram bases included."""
    names: set[str] = set()
    for dialect in load_dialects().values():
        names |= dialect.known_names
    return frozenset(names)


def unit_suffix(unit: str, kind: str) -> str:
    """The suffix word Prometheus appends for ``unit`` (``""``: none), ``kind`` being
    ``gauge``, ``counter`` or ``histogram``. Annotations (``{request}``) carry no suffix;
    ``1`` is ``ratio`` on gauges only, as otlptranslator does."""
    unit = re.sub(r"\{[^}]*\}", "", unit).strip()
    if unit == "1":
        return "ratio" if kind == "gauge" else ""
    if "/" in unit:
        per, _, denominator = unit.partition("/")
        words = [_UNITS.get(per, per), "per", _UNITS.get(denominator, denominator)]
        return "_".join(w for w in words if w) if per or denominator else ""
    return _UNITS.get(unit, unit)


def _sanitise(name: str, pattern: re.Pattern[str]) -> str:
    out = _MULTIPLE_UNDERSCORES.sub("_", pattern.sub("_", name))
    return f"_{out}" if out[:1].isdigit() else out


#: Names translated, kept (least recently used evicted first): a sender repeats its metrics.
MAX_CACHED_NAMES = 4096


@lru_cache(maxsize=MAX_CACHED_NAMES)
def prometheus_name(name: str, unit: str, kind: str) -> str:
    """The Prometheus name of an OTLP metric (see the module docstring); a pure function of
    its arguments, cached."""
    known = _known()
    suffix = unit_suffix(unit, kind)
    bases = dict.fromkeys(
        (
            name,
            _sanitise(name.replace(".", ":", 1), _INVALID_NAME) if "." in name else name,
            _sanitise(name, _INVALID_LABEL),
        )
    )
    spellings: list[str] = []
    for base in bases:
        with_unit = [base]
        if suffix and not base.endswith(f"_{suffix}"):
            with_unit.append(f"{base}_{suffix}")
        for form in with_unit:
            if kind == "counter" and not form.endswith("_total"):
                spellings.append(f"{form}_total")
            spellings.append(form)
    for spelling in spellings:
        if spelling in known:
            return spelling
    translated = _sanitise(name, _INVALID_LABEL)
    if suffix and not translated.endswith(f"_{suffix}"):
        translated = f"{translated}_{suffix}"
    if kind == "counter" and not translated.endswith("_total"):
        translated = f"{translated}_total"
    return translated


def label_name(key: str) -> str:
    """An attribute key as a Prometheus label name (``model.name`` → ``model_name``)."""
    if key.startswith("__") and key.endswith("__"):
        return key  # reserved names stay what they are (and are refused by the caller)
    return _sanitise(key, _INVALID_LABEL) or "_"
