"""PromQL quoting: every value from a spec reaches a rule file through these.

A label value pasted between quotes unescaped can close the string and add matchers
(``a", slo_id=~".+``): the rule still passes ``promtool check rules`` and selects what its
author chose. :func:`matcher` and :func:`regex_matcher` quote per PromQL's string rules
(Go's: backslash, double quote and control characters escaped) and, for regex matchers,
escape RE2's metacharacters first, so a value only ever matches itself.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["matcher", "quote", "regex_literal", "regex_matcher"]

_RE2_SPECIAL = frozenset("\\.+*?()|[]{}^$")
_STRING_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def quote(value: str) -> str:
    """``value`` as a double-quoted PromQL string literal."""
    out = []
    for char in value:
        if char in _STRING_ESCAPES:
            out.append(_STRING_ESCAPES[char])
        elif not char.isprintable():
            out.append(f"\\u{ord(char):04x}" if ord(char) <= 0xFFFF else f"\\U{ord(char):08x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def regex_literal(text: str) -> str:
    """``text`` as an RE2 pattern matching exactly ``text`` (not yet quoted)."""
    return "".join("\\" + c if c in _RE2_SPECIAL else c for c in text)


def matcher(label: str, value: str, op: str = "=") -> str:
    """``label="value"`` (or ``!=``), the value quoted. ``label`` is a validated name."""
    return f"{label}{op}{quote(value)}"


def regex_matcher(label: str, values: Iterable[str], op: str = "=~") -> str:
    """``label=~"a|b"`` matching exactly the given values (or ``!~``)."""
    return f"{label}{op}{quote('|'.join(regex_literal(v) for v in values))}"
