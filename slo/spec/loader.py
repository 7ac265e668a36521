"""Reading an SLO spec file: llmslo/v1, or OpenSLO v1 documents converted on the way in.

The one place that knows both formats, so that :mod:`slo.spec` (the llmslo/v1 model) and
:mod:`slo.spec.openslo` (the importer, built on that model) do not import each other.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from pipeline.config import load_yaml_documents
from pipeline.errors import ConfigError
from slo.spec.document import SloDocument, parse_spec
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
    if docs and is_openslo(docs):
        return openslo_to_spec(docs, source=str(path))
    if len(docs) > 1:
        raise ConfigError(f"{path}: one llmslo/v1 document expected, found {len(docs)}")
    return parse_spec(docs[0] if docs else None, source=str(path))
