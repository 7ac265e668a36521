"""Engine dialects as data: one YAML map per engine, validated once at load.

Each ``*.yaml`` beside this module describes one exporter family (vLLM, SGLang,
TensorRT-LLM, llama.cpp, dcgm-exporter, the routers in front of a pool, NVIDIA Dynamo's
workers and planner, KServe's controller): which labels become columns, how to tell its
version families apart, and which exposed metric feeds which canonical signal of
:mod:`pipeline.signals`. ``collectors/README.md`` explains the format and how to add one.

:func:`detect_dialect` picks the engine whose map names the most metrics of a scrape (in
``metrics`` or in a version family's conditions), then the first version family whose
conditions hold. ``README.md`` beside this module gives the source of every name.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipeline.config import format_validation_error, load_yaml
from pipeline.errors import ConfigError
from pipeline.signals import ENGINE_SIGNALS, GPU_SIGNALS

__all__ = [
    "DIALECT_NAMES",
    "Detection",
    "DialectMap",
    "DialectName",
    "MetricRule",
    "VersionRule",
    "detect_dialect",
    "load_dialects",
]

_DIR = Path(__file__).parent
#: A dialect (the ``dialect`` column): those of the maps beside this module, one ``versions``
#: entry's ``dialect`` each (a test holds the two equal). ``--dialect`` and
#: ``targets[].dialect`` accept these and ``auto``.
DialectName = Literal[
    "vllm",
    "vllm-legacy",
    "sglang",
    "trtllm",
    "llamacpp",
    "dcgm",
    "epp",
    "dynamo-frontend",
    "dynamo",
    "kserve",
    "kube-state-metrics",
]
#: The values of :data:`DialectName`, in its order.
DIALECT_NAMES: tuple[DialectName, ...] = get_args(DialectName)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MetricRule(_Model):
    """How one exposed metric maps to a signal.

    ``signal`` for the whole metric, or ``label`` + ``values`` for category families
    (Triton's ``request_type="active"``); ``unless``: only when none of these metric names
    are in the same scrape (deprecated aliases yield to the new name); ``scale``
    multiplies values and ``le`` bounds to reach the signal's unit (ms → s = 0.001).
    """

    signal: str | None = None
    label: str | None = None
    values: dict[str, str] = Field(default_factory=dict)
    unless: tuple[str, ...] = ()
    scale: float = Field(1.0, gt=0)

    @model_validator(mode="after")
    def _one_form(self) -> MetricRule:
        if (self.signal is None) == (self.label is None):
            raise ValueError("give either 'signal' or 'label' with 'values'")
        if self.label is not None and not self.values:
            raise ValueError("'label' needs a non-empty 'values' map")
        return self

    def signals(self) -> list[str]:
        return [self.signal] if self.signal else list(self.values.values())

    def resolve(self, labels: Mapping[str, str], present: Collection[str]) -> str | None:
        """The signal of one series, or ``None`` (category not mapped, or superseded)."""
        if self.unless and any(name in present for name in self.unless):
            return None
        if self.label is not None:
            return self.values.get(labels.get(self.label, ""))
        return self.signal


class VersionRule(_Model):
    """A version family: holds when every condition given holds (none given: always)."""

    family: str
    dialect: str
    any_of: tuple[str, ...] = ()
    all_of: tuple[str, ...] = ()
    any_label: tuple[str, ...] = ()

    def matches(self, names: Collection[str], label_names: Collection[str]) -> bool:
        return (
            (not self.any_of or any(n in names for n in self.any_of))
            and all(n in names for n in self.all_of)
            and (not self.any_label or any(n in label_names for n in self.any_label))
        )


class DialectMap(_Model):
    """One engine's map (one YAML file)."""

    engine: str
    topic: Literal["engine", "gpu"]
    columns: dict[str, tuple[str, ...]]
    versions: tuple[VersionRule, ...] = Field(min_length=1)
    metrics: dict[str, MetricRule]
    frozen_gauges: tuple[str, ...] = ()
    blank_sentinels: bool = False
    #: The series describe objects the exporter watches (kube-state-metrics: pods, HPAs):
    #: an object recreated restarts its counters and ``*_created``, the exporter did not
    #: restart, so only a changed process start counts as a reset.
    object_series: bool = False

    @field_validator("metrics", mode="before")
    @classmethod
    def _short_form(cls, raw: object) -> object:
        if isinstance(raw, dict):
            return {k: {"signal": v} if isinstance(v, str) else v for k, v in raw.items()}
        return raw

    @model_validator(mode="after")
    def _known_signals(self) -> DialectMap:
        vocabulary = GPU_SIGNALS if self.topic == "gpu" else ENGINE_SIGNALS
        for name, rule in self.metrics.items():
            for signal in rule.signals():
                if signal not in vocabulary:
                    raise ValueError(f"metrics[{name}]: unknown {self.topic} signal {signal!r}")
        return self

    @property
    def known_names(self) -> frozenset[str]:
        """The metric names this map recognises: those it maps, and those its version
        families test for (a planner's names tell its family even where none is mapped)."""
        tested = (n for v in self.versions for n in (*v.any_of, *v.all_of))
        return frozenset((*self.metrics, *tested))

    @property
    def dialects(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(v.dialect for v in self.versions))


@cache
def load_dialects(directory: Path = _DIR) -> dict[str, DialectMap]:
    """Every engine map in ``directory``, by engine name; raises :class:`ConfigError`."""
    maps: dict[str, DialectMap] = {}
    for path in sorted(directory.glob("*.yaml")):
        try:
            raw = load_yaml(path.read_text(encoding="utf-8"), str(path))
            dialect = DialectMap.model_validate(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        except ValidationError as exc:
            raise ConfigError(
                f"{path}: invalid dialect map\n" + format_validation_error(exc)
            ) from exc
        maps[dialect.engine] = dialect
    return maps


@dataclass(frozen=True)
class Detection:
    """The outcome of dialect detection for one scrape."""

    engine: DialectMap
    dialect: str
    version_family: str
    matched_metrics: int


def _base_names(names: Collection[str]) -> set[str]:
    out = set(names)
    for name in names:
        for suffix in ("_bucket", "_sum", "_count", "_total", "_created"):
            if name.endswith(suffix):
                out.add(name[: -len(suffix)])
    return out


def detect_dialect(
    names: Collection[str], label_names: Collection[str], *, forced: str | None = None
) -> Detection | None:
    """Detect the engine and version family of a scrape from its metric and label names.

    ``names``: family and sample names present; ``forced``: a value of
    :data:`DIALECT_NAMES` (the version family is still detected within it). Returns
    ``None`` when no map names any metric of the scrape (everything stays raw).
    """
    maps = load_dialects()
    present = _base_names(names)
    best: tuple[int, DialectMap] | None = None
    for engine in maps.values():
        if forced is not None and forced not in engine.dialects:
            continue
        score = sum(1 for name in engine.known_names if name in present)
        if best is None or score > best[0]:
            best = (score, engine)
    if best is None or (best[0] == 0 and forced is None):
        return None
    score, engine = best
    for version in engine.versions:
        if forced is not None and version.dialect != forced:
            continue
        if version.matches(present, label_names):
            return Detection(engine, version.dialect, version.family, score)
    fallback = next(v for v in engine.versions if forced is None or v.dialect == forced)
    return Detection(engine, fallback.dialect, fallback.family, score)
