"""The rule table (``rules.yaml``) and the engine flag table (``flags.yaml``), validated once.

Both are data beside this module; :func:`load_rules` and :func:`load_flags` raise
:class:`pipeline.errors.ConfigError` naming the file and field on a bad table.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.config import format_validation_error
from pipeline.errors import ConfigError

__all__ = [
    "SEVERITIES",
    "EngineFlags",
    "FeatureSetting",
    "Rule",
    "Severity",
    "load_flags",
    "load_rules",
    "version_tuple",
]

_DIR = Path(__file__).parent
Severity = Literal["info", "warning", "critical"]
#: Severities, lowest first (``--fail-on`` compares positions).
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Evaluator(BaseModel):
    """An evaluator name (``check``) and its parameters (every other key)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    check: str

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class Rule(_Model):
    """One rule: where it comes from, how it is proven statically and live, how to fix it."""

    id: str = Field(pattern=r"^[A-Z]\d\d-[a-z0-9-]+$")
    source: str
    seed: str
    severity: Severity
    static: Evaluator
    live: Evaluator
    fix: str


class FeatureSetting(_Model):
    """How one engine release sets one feature (see the header of ``flags.yaml``)."""

    min: str | None = None
    max: str | None = None
    flag: str | None = None
    negate: str | None = None
    env: str | None = None
    off_value: str | None = None
    default: str | None = None
    fixed: str | None = None
    unsupported: str | None = None
    note: str = ""

    def holds(self, version: tuple[int, ...] | None) -> bool:
        """Whether ``version`` is in ``[min, max)``; an unknown version matches only the
        last entry, which the caller picks."""
        if version is None:
            return False
        low = version_tuple(self.min) if self.min else ()
        return version >= low and (self.max is None or version < version_tuple(self.max))


class EngineFlags(_Model):
    """One engine: how to recognise it (image, command) and its features per release."""

    images: tuple[str, ...]
    commands: tuple[str, ...]
    source: str
    features: dict[str, tuple[FeatureSetting, ...]]


class _Flags(_Model):
    engines: dict[str, EngineFlags]


class _Rules(_Model):
    rules: tuple[Rule, ...]


def version_tuple(text: str) -> tuple[int, ...]:
    """``"0.10"`` → ``(0, 10)``."""
    return tuple(int(part) for part in text.split("."))


def _load(name: str, model: type[BaseModel]) -> Any:
    path = _DIR / name
    try:
        return model.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    except ValidationError as exc:
        raise ConfigError(f"{path}: invalid\n" + format_validation_error(exc)) from exc


@cache
def load_rules() -> tuple[Rule, ...]:
    """The rules, in table order; ids are unique."""
    rules: tuple[Rule, ...] = _load("rules.yaml", _Rules).rules
    ids = [rule.id for rule in rules]
    if len(set(ids)) != len(ids):
        raise ConfigError("checks/rules.yaml: duplicate rule ids")
    return rules


@cache
def load_flags() -> dict[str, EngineFlags]:
    """The engine flag table, by engine name (``vllm``, ``sglang``, ``trtllm``)."""
    engines: dict[str, EngineFlags] = _load("flags.yaml", _Flags).engines
    return engines
