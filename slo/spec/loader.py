"""Reading an SLO spec file: llmslo/v1, or OpenSLO v1 documents converted on the way in.

The one place that knows both formats, so that :mod:`slo.spec` (the llmslo/v1 model) and
:mod:`slo.spec.openslo` (the importer, built on that model) do not import each other. A
document of another format is refused with what it looks like and what is supported
(:mod:`slo.spec.formats`); the PromQL formats (Sloth, OpenSLO v1alpha, Pyrra) are read by
the rule generator only, since their SLIs cannot be evaluated over llmslo's tables.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from pipeline.config import load_yaml_documents
from pipeline.errors import ConfigError
from slo.spec.document import SloDocument, parse_spec
from slo.spec.formats import describe_unknown, identify
from slo.spec.openslo import is_openslo, openslo_to_spec

__all__ = ["load_spec"]


def load_spec(path: str | Path) -> SloDocument:
    """Read and validate an SLO spec file (llmslo/v1, or OpenSLO v1 documents).

    Raises :class:`ConfigError` naming field paths.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text") from exc
    try:
        docs = [doc for doc in load_yaml_documents(text, str(path)) if doc is not None]
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    for index, doc in enumerate(docs):
        _check_header(doc, f"{path}: document {index + 1}")
    if docs and is_openslo(docs):
        return openslo_to_spec(docs, source=str(path))
    if len(docs) > 1:
        raise ConfigError(f"{path}: one llmslo/v1 document expected, found {len(docs)}")
    return parse_spec(docs[0] if docs else None, source=str(path))


def _check_header(doc: object, where: str) -> None:
    """Refuse a document whose header names another format (or none we know)."""
    fmt = identify(doc)
    if fmt is not None and fmt.promql:
        raise ConfigError(
            f"{where} is {fmt.name}: its SLIs are PromQL, which `llmslo rules generate` "
            "reads; the SLO jobs need llmslo/v1 or OpenSLO v1 with llmslo metric sources"
        )
    headed = isinstance(doc, dict) and bool({"apiVersion", "kind", "version"} & doc.keys())
    if fmt is None and (headed or not isinstance(doc, dict)):
        raise ConfigError(f"{where}: {describe_unknown(doc)}")
