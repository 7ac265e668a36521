"""The config file's sections, as one explicit table, and the loaders that use it.

The spine validates ``bus``, ``store`` and ``ingest``; every other top-level section is
owned by a package and validated by that package's model, listed here (a new package adds
a row). Every process llmslo starts loads its config through :func:`load_config`, so a
worker that never builds the command line (a Streamlit page, a uvicorn worker: their entry
modules live in ``llmslo/``) accepts and rejects exactly what ``llmslo config validate`` does.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Any

from alerts.config import AlertmanagerConfig
from api.service import ApiConfig
from collectors.config import CollectConfig
from collectors.probe import ProbeSection
from collectors.receive.config import ReceiveConfig
from collectors.tap.config import TapConfig
from pipeline import config as spine_config
from pipeline.config import LlmsloConfig, Sections
from simulator.config import FleetConfig
from slo.jobs import JobsConfig

__all__ = ["SECTIONS", "load_config", "parse_config"]

#: Top-level section name → the pydantic model that validates it (besides the spine's own).
SECTIONS: Sections = MappingProxyType(
    {
        "alertmanager": AlertmanagerConfig,
        "api": ApiConfig,
        "collect": CollectConfig,
        "probe": ProbeSection,
        "receive": ReceiveConfig,
        "simulator": FleetConfig,
        "slo": JobsConfig,
        "tap": TapConfig,
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
