"""The deployment as written: Kubernetes manifests or a plain command line, as evidence.

:func:`load_manifests` reads YAML files or directories (multi-document; a directory's
``kustomization.yaml`` is followed through its ``resources`` and ``components``, patches are
not applied) and never raises on bad input: a missing file or a document that is not YAML
becomes a ``problem`` the rules report as ``unknown``. :func:`parse_command` turns a plain
command line into the same :class:`EngineContainer`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from checks.catalog import EngineFlags, load_flags

__all__ = ["Bundle", "EngineContainer", "Manifest", "load_manifests", "parse_command"]

#: Kinds whose pod template holds engine containers.
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "LeaderWorkerSet", "Pod", "Job")
_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True)
class Manifest:
    """One YAML document: where it came from, its kind and name, its body."""

    source: str
    kind: str
    name: str
    body: Mapping[str, Any]


@dataclass(frozen=True)
class EngineContainer:
    """One container (or command line) that runs an inference engine.

    ``flags``: ``--name`` → value (``"true"`` for a bare switch); ``version``: from the
    image tag, ``None`` when the tag names none (``latest``, a digest).
    """

    where: str
    engine: str
    version: tuple[int, ...] | None
    flags: Mapping[str, str]
    env: Mapping[str, str]
    container: Mapping[str, Any] = field(default_factory=dict)
    pod: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Bundle:
    """Everything ``-f`` and ``--command`` gave: documents, engine containers, problems."""

    manifests: list[Manifest] = field(default_factory=list)
    engines: list[EngineContainer] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def given(self) -> bool:
        return bool(self.manifests or self.engines or self.problems)


def parse_flags(argv: Sequence[str]) -> dict[str, str]:
    """``--a=b``, ``--a b`` and bare ``--a`` (→ ``"true"``); positionals are skipped."""
    flags: dict[str, str] = {}
    i = 0
    while i < len(argv):
        token = str(argv[i])
        i += 1
        if not token.startswith("--"):
            continue
        name, eq, value = token.partition("=")
        if not eq:
            value = "true"
            if i < len(argv) and not str(argv[i]).startswith("--"):
                value = str(argv[i])
                i += 1
        flags[name] = value
    return flags


def _version(image: str) -> tuple[int, ...] | None:
    tag = image.rsplit("/", 1)[-1].partition("@")[0].partition(":")[2]
    match = _VERSION.match(tag)
    return tuple(int(part) for part in match.groups() if part is not None) if match else None


def _engine_of(words: str, image: str, flags: Mapping[str, EngineFlags]) -> str | None:
    for name, engine in flags.items():
        if any(key in image for key in engine.images):
            return name
    for name, engine in flags.items():
        if any(command in words for command in engine.commands):
            return name
    return None


def parse_command(line: str, *, image: str = "") -> EngineContainer | None:
    """An engine command line (``vllm serve … --max-num-seqs 128``); ``None`` if no engine."""
    argv = shlex.split(line)
    env = dict(word.split("=", 1) for word in argv if "=" in word and not word.startswith("-"))
    engine = _engine_of(" ".join(argv), image, load_flags())
    if engine is None:
        return None
    return EngineContainer("--command", engine, _version(image), parse_flags(argv), env)


def _containers(doc: Manifest) -> Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    spec = doc.body.get("spec") or {}
    if doc.kind == "Pod":
        pods = [spec]
    elif doc.kind == "LeaderWorkerSet":
        template = (spec.get("leaderWorkerTemplate") or {}).get("workerTemplate") or {}
        pods = [template.get("spec") or {}]
    else:
        pods = [((spec.get("template") or {}).get("spec")) or {}]
    for pod in pods:
        for container in pod.get("containers") or []:
            if isinstance(container, Mapping):
                yield pod, container


def _engine_container(
    doc: Manifest, pod: Mapping[str, Any], container: Mapping[str, Any]
) -> EngineContainer | None:
    argv = [str(w) for w in (container.get("command") or []) + (container.get("args") or [])]
    image = str(container.get("image") or "")
    engine = _engine_of(" ".join(argv), image, load_flags())
    if engine is None:
        return None
    env = {
        str(item.get("name")): str(item.get("value", ""))
        for item in container.get("env") or []
        if isinstance(item, Mapping)
    }
    where = f"{doc.source} {doc.kind}/{doc.name} container {container.get('name')}"
    return EngineContainer(where, engine, _version(image), parse_flags(argv), env, container, pod)


def _yaml_files(path: Path, seen: set[Path], problems: list[str]) -> list[Path]:
    path = path.resolve()
    if path in seen:
        return []
    seen.add(path)
    if not path.exists():
        problems.append(f"{path}: no such file or directory")
        return []
    if path.is_file():
        return [path]
    kustomization = next(
        (path / n for n in ("kustomization.yaml", "kustomization.yml") if (path / n).exists()),
        None,
    )
    if kustomization is None:
        return sorted(p for p in path.rglob("*.y*ml") if p.suffix in (".yaml", ".yml"))
    files = [kustomization]
    try:
        raw = yaml.safe_load(kustomization.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        problems.append(f"{kustomization}: not valid YAML: {exc}")
        return files
    for entry in list(raw.get("resources") or []) + list(raw.get("components") or []):
        files += _yaml_files(path / str(entry), seen, problems)
    return files


def _shown(path: Path) -> str:
    """The path relative to the working directory when under it (reports stay short)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def load_manifests(paths: Sequence[Path]) -> Bundle:
    """Read every document under ``paths``; problems are collected, never raised."""
    bundle = Bundle()
    seen: set[Path] = set()
    for path in paths:
        for file in _yaml_files(path, seen, bundle.problems):
            try:
                docs = list(yaml.safe_load_all(file.read_text(encoding="utf-8")))
            except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
                bundle.problems.append(f"{file}: unreadable: {exc}")
                continue
            for doc in docs:
                if not isinstance(doc, Mapping) or "kind" not in doc:
                    continue
                name = str((doc.get("metadata") or {}).get("name", "?"))
                bundle.manifests.append(Manifest(_shown(file), str(doc["kind"]), name, doc))
    for doc in bundle.manifests:
        if doc.kind in WORKLOAD_KINDS:
            for pod, container in _containers(doc):
                found = _engine_container(doc, pod, container)
                if found is not None:
                    bundle.engines.append(found)
    return bundle
