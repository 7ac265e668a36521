"""The config file's sections, as one explicit table, and the loaders that use it.

The spine validates ``bus``, ``store`` and ``ingest``; every other top-level section is
owned by a package and validated by that package's model, listed here (a new package adds
a row). Every process llmslo starts loads its config through :func:`load_config`, so a
worker that never builds the command line (a Streamlit page, a uvicorn worker: their entry
modules live in ``llmslo/``) accepts and rejects exactly what ``llmslo config validate`` does.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pipeline import config as spine_config
from pipeline.config import LlmsloConfig

__all__ = ["SECTIONS", "SectionTable", "load_config", "parse_config"]


class SectionTable(Mapping[str, type[BaseModel]]):
    """Section name → its model, imported from ``"module:Class"`` only when looked up.

    The names are known without importing anything (an unknown section is an error in every
    process); a model is imported when a file has its section or a component asks for it.
    So a tap loading a config with only ``tap`` and ``bus`` never imports the SLO jobs' or the
    API's models, and the packages behind them (scipy, FastAPI).
    """

    def __init__(self, paths: Mapping[str, str]) -> None:
        self._paths = dict(paths)

    def __getitem__(self, name: str) -> type[BaseModel]:
        module, _, attr = self._paths[name].partition(":")
        model: type[BaseModel] = getattr(importlib.import_module(module), attr)
        return model

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)


#: Top-level section name → the pydantic model that validates it (besides the spine's own).
SECTIONS = SectionTable(
    {
        "alertmanager": "alerts.config:AlertmanagerConfig",
        "api": "api.service:ApiConfig",
        "collect": "collectors.config:CollectConfig",
        "probe": "collectors.probe:ProbeSection",
        "receive": "collectors.receive.config:ReceiveConfig",
        "simulator": "simulator.config:FleetConfig",
        "slo": "slo.jobs:JobsConfig",
        "tap": "collectors.tap.config:TapConfig",
    }
)


def load_config(path: str | Path | None) -> LlmsloConfig:
    """Read and validate an llmslo config file with every section; ``None`` gives the defaults.

    Raises :class:`pipeline.errors.ConfigError` listing every problem by field path.
    """
    return spine_config.load_config(path, sections=SECTIONS)


def parse_config(raw: Any, source: str = "<config>") -> LlmsloConfig:
    """Validate an already-loaded YAML document with every section; raises ``ConfigError``."""
    return spine_config.parse_config(raw, source, sections=SECTIONS)
