"""The SLO spec formats llmslo reads, as one table, and how a document is recognised.

Every supported format is a row of :data:`FORMATS`: its name, the header fields that mark a
document as that format (``version`` for Sloth's and llmslo's own files, ``apiVersion`` and
``kind`` for Kubernetes-style objects), and whether its SLIs are PromQL (read only by the
rule generator) or llmslo SLIs (evaluated over the stored tables too). The converters are the
modules beside this one (:mod:`.sloth_k8s`, :mod:`.openslo_v1alpha`, :mod:`.pyrra`); Sloth's
``prometheus/v1`` body is modelled in :mod:`alerts.sloth`, llmslo/v1 in
:mod:`slo.spec.document` and OpenSLO v1 in :mod:`slo.spec.openslo`.

:func:`identify` names a document's format; :func:`describe_unknown` explains a document that
matches none: which format it looks like (by its header), and which formats are supported.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FORMATS",
    "ObjectMeta",
    "SpecFormat",
    "describe_unknown",
    "identify",
    "object_meta",
    "supported_formats",
]


@dataclass(frozen=True)
class SpecFormat:
    """One input format: the header values that identify it and the kind of SLI it holds.

    ``promql`` formats carry PromQL queries: only ``llmslo rules generate`` can use them.
    """

    name: str
    version: str | None = None
    api_version: str | None = None
    kind: str | None = None
    promql: bool = False

    @property
    def header(self) -> str:
        """The header as a user writes it: ``version: prometheus/v1`` or
        ``apiVersion: pyrra.dev/v1alpha1, kind: ServiceLevelObjective``."""
        if self.version is not None:
            return f"version: {self.version}"
        kind = f", kind: {self.kind}" if self.kind else ""
        return f"apiVersion: {self.api_version}{kind}"

    def matches(self, raw: Any) -> bool:
        """True when ``raw`` (a loaded YAML document) carries this format's header."""
        if not isinstance(raw, dict):
            return False
        if self.version is not None:
            return raw.get("version") == self.version
        return raw.get("apiVersion") == self.api_version and (
            self.kind is None or raw.get("kind") == self.kind
        )


#: Every format llmslo reads. OpenSLO v1 documents of any kind (SLO, SLI) belong together.
FORMATS: tuple[SpecFormat, ...] = (
    SpecFormat("llmslo/v1", version="llmslo/v1"),
    SpecFormat("OpenSLO v1", api_version="openslo/v1"),
    SpecFormat("Sloth prometheus/v1", version="prometheus/v1", promql=True),
    SpecFormat(
        "Sloth Kubernetes CRD",
        api_version="sloth.slok.dev/v1",
        kind="PrometheusServiceLevel",
        promql=True,
    ),
    SpecFormat(
        "OpenSLO v1alpha (as Sloth reads it)",
        api_version="openslo/v1alpha",
        kind="SLO",
        promql=True,
    ),
    SpecFormat(
        "Pyrra", api_version="pyrra.dev/v1alpha1", kind="ServiceLevelObjective", promql=True
    ),
)


@dataclass(frozen=True)
class ObjectMeta:
    """The Kubernetes identity of an input object, reused for the PrometheusRule written
    from it (name, namespace, labels)."""

    name: str
    namespace: str | None = None
    labels: tuple[tuple[str, str], ...] = ()


def object_meta(raw: dict[str, Any], path: str) -> ObjectMeta:
    """``metadata`` of a Kubernetes-style document; ValueError names the missing field."""
    metadata = raw.get("metadata")
    if not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str):
        raise ValueError(f"{path}metadata.name: required")
    labels = metadata.get("labels") or {}
    if not isinstance(labels, dict):
        raise ValueError(f"{path}metadata.labels: must be a mapping")
    namespace = metadata.get("namespace")
    return ObjectMeta(
        metadata["name"],
        str(namespace) if namespace else None,
        tuple(sorted((str(k), str(v)) for k, v in labels.items())),
    )


def identify(raw: Any) -> SpecFormat | None:
    """The format whose header ``raw`` carries, or None."""
    return next((fmt for fmt in FORMATS if fmt.matches(raw)), None)


def supported_formats() -> str:
    """One line listing every supported format with its header."""
    return "; ".join(f"{fmt.name} ({fmt.header})" for fmt in FORMATS)


def _close(value: Any, candidates: list[str]) -> str | None:
    if not isinstance(value, str):
        return None
    found = difflib.get_close_matches(value, candidates, n=1, cutoff=0.6)
    return found[0] if found else None


def _looks_like(raw: dict[str, Any]) -> str:
    api, kind, version = raw.get("apiVersion"), raw.get("kind"), raw.get("version")
    if version is not None:
        near = _close(version, [f.version for f in FORMATS if f.version])
        if near is not None:
            fmt = next(f for f in FORMATS if f.version == near)
            return f"version {version!r} looks like {fmt.name} ({fmt.header})"
        return f"version {version!r} is not a format llmslo reads"
    if api is None and kind is None:
        return "no 'version' or 'apiVersion'/'kind' header"
    same_api = [f for f in FORMATS if f.api_version is not None and f.api_version == api]
    if same_api:
        fmt = same_api[0]
        near_kind = _close(kind, [f.kind for f in same_api if f.kind])
        hint = f" (did you mean kind {near_kind!r}?)" if near_kind and near_kind != kind else ""
        return f"apiVersion {api!r} is {fmt.name}, but kind {kind!r} is not supported{hint}"
    near_api = _close(api, [f.api_version for f in FORMATS if f.api_version])
    if near_api is not None:
        fmt = next(f for f in FORMATS if f.api_version == near_api)
        return f"apiVersion {api!r}, kind {kind!r} looks like {fmt.name} ({fmt.header})"
    near_kind = _close(kind, [f.kind for f in FORMATS if f.kind])
    if near_kind is not None:
        fmt = next(f for f in FORMATS if f.kind == near_kind)
        return f"kind {kind!r} looks like {fmt.name} ({fmt.header}), but apiVersion is {api!r}"
    return f"apiVersion {api!r}, kind {kind!r} is not a format llmslo reads"


def describe_unknown(raw: Any) -> str:
    """Why ``raw`` is not a supported document: what it looks like, and what is supported."""
    if not isinstance(raw, dict):
        what = f"the top level must be a mapping, got {type(raw).__name__}"
    else:
        what = _looks_like(raw)
    return f"{what}; supported formats: {supported_formats()}"
