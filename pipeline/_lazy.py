"""A module imported on its first attribute use, for the spine's heavy optional imports.

The spine names schemas, topics, keys and wire headers for every process, but only some
processes build Arrow tables (the ingester, the collector); a sidecar that publishes JSON
rows (the tap) must not load pyarrow and numpy (~50 MB of its RSS) just because it imported
:mod:`pipeline.schema` or :mod:`pipeline.publisher`. Modules bind ``pa = on_first_use(
"pyarrow")`` outside ``TYPE_CHECKING`` (the type checker sees the real import) and keep no
Arrow object at module level.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

__all__ = ["on_first_use"]


class _OnFirstUse:
    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)

    def __repr__(self) -> str:
        return f"<module {self._name!r}, imported on first use>"


def on_first_use(name: str) -> Any:
    """A stand-in for module ``name`` that imports it when an attribute is first read."""
    return _OnFirstUse(name)
