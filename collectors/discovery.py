"""Targets from the config plus Prometheus-style file discovery (file_sd), reloaded on change.

A file_sd file (JSON or YAML) is a list of groups::

    [{"targets": ["10.0.0.7:8000", "10.0.0.8:8000"],
      "labels": {"dialect": "vllm", "pool": "llama-3-8b", "__metrics_path__": "/metrics"}}]

Recognised labels: ``__scheme__``, ``__metrics_path__``, ``dialect``, ``pool``, ``model``;
every other label not starting with ``__`` is kept on the target (:attr:`TargetConfig.labels`),
so ``instance`` or ``pod`` name the instance (:func:`collectors.config.instance_name`) and
``node`` etc. travel with it. A label value that is not 1–253 printable characters fails the
file with an error naming it. A file that fails to parse keeps its previous targets (and the error is
reported by :attr:`TargetDiscovery.errors`), so a half-written file never empties a fleet.
"""

from __future__ import annotations

import glob
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from collectors.config import (
    NAMING_LABELS,
    CollectConfig,
    TargetConfig,
    check_labels,
    normalise_url,
)
from pipeline.config import load_yaml

__all__ = ["TargetDiscovery", "parse_file_sd"]

log = logging.getLogger(__name__)

#: file_sd labels that set a target's fields rather than travel as its labels.
_FIELD_LABELS = ("dialect", "pool", "model")


def parse_file_sd(text: str, source: str = "<file_sd>") -> list[TargetConfig]:
    """Targets of one file_sd document; raises ``ValueError`` naming ``source``."""
    try:
        raw: Any = json.loads(text) if text.lstrip().startswith("[") else load_yaml(text, source)
    except (ValueError, yaml.YAMLError) as exc:
        raise ValueError(f"{source}: not valid JSON/YAML: {exc}") from exc
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError(f"{source}: expected a list of target groups")
    targets: list[TargetConfig] = []
    for i, group in enumerate(raw):
        if not isinstance(group, dict) or not isinstance(group.get("targets", []), list):
            raise ValueError(f"{source}[{i}]: a group needs a 'targets' list")
        labels = group.get("labels") or {}
        if not isinstance(labels, dict):
            raise ValueError(f"{source}[{i}].labels: expected a mapping")
        try:
            names = check_labels(
                {
                    k: v
                    for k, v in labels.items()
                    if not str(k).startswith("__") and k not in _FIELD_LABELS
                }
            )
        except ValueError as exc:
            raise ValueError(f"{source}[{i}].labels: {exc}") from exc
        naming = [name for name in NAMING_LABELS if name in names]
        if naming and len(group.get("targets", [])) > 1:
            # Two engines under one name would merge their samples: one name, one target.
            raise ValueError(
                f"{source}[{i}]: label {naming[0]!r} names one instance but the group has "
                f"{len(group['targets'])} targets"
            )
        for j, address in enumerate(group.get("targets", [])):
            try:
                url = normalise_url(
                    str(address),
                    str(labels.get("__metrics_path__", "/metrics")),
                    str(labels.get("__scheme__", "http")),
                )
                targets.append(
                    TargetConfig(
                        url=url,
                        dialect=labels.get("dialect", "auto"),
                        pool=labels.get("pool"),
                        model=labels.get("model"),
                        labels=names,
                    )
                )
            except (ValueError, ValidationError) as exc:
                raise ValueError(f"{source}[{i}].targets[{j}]: {exc}") from exc
    return targets


class TargetDiscovery:
    """The current target list: static targets, then file_sd targets (deduplicated by URL)."""

    def __init__(
        self, config: CollectConfig, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self.clock = clock
        self.errors: dict[str, str] = {}
        self._files: dict[str, tuple[int, list[TargetConfig]]] = {}
        self._checked_s: float | None = None

    def targets(self) -> list[TargetConfig]:
        """All targets now, re-reading changed file_sd files at most every ``file_sd_refresh_s``."""
        now = self.clock()
        if self._checked_s is None or now - self._checked_s >= self.config.file_sd_refresh_s:
            self._checked_s = now
            self._refresh()
        merged: dict[str, TargetConfig] = {t.url: t for t in self.config.targets}
        for path in sorted(self._files):
            for target in self._files[path][1]:
                merged.setdefault(target.url, target)
        return list(merged.values())

    def _refresh(self) -> None:
        paths = sorted({p for pattern in self.config.file_sd for p in glob.glob(pattern)})
        for gone in set(self._files) - set(paths):
            del self._files[gone]
        for path in paths:
            try:
                mtime = Path(path).stat().st_mtime_ns
            except OSError:
                continue
            known = self._files.get(path)
            if known is not None and known[0] == mtime:
                continue
            try:
                targets = parse_file_sd(Path(path).read_text(encoding="utf-8"), path)
            except (OSError, ValueError) as exc:
                self.errors[path] = str(exc)
                log.warning(
                    "file_sd %s: %s (keeping %d previous targets)",
                    path,
                    exc,
                    len(known[1]) if known else 0,
                )
                if known is not None:
                    self._files[path] = (mtime, known[1])
                continue
            self.errors.pop(path, None)
            self._files[path] = (mtime, targets)
            log.info("file_sd %s: %d targets", path, len(targets))
