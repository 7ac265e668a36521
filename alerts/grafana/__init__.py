"""Grafana dashboards generated from the same rule model and catalogs as the rule files.

Two boards, built with the Grafana Foundation SDK and rendered deterministically
(:func:`dashboard_files`): the SLO overview (:func:`slo_overview`, over the series
:func:`alerts.generate_rules` records) and the engines/GPUs board (:func:`engines_board`,
over the metric names of the engine dialect maps). Here beside the rule generator, not in
``dashboards/`` (the Streamlit app, on the same floor), because both are generated from
:class:`~alerts.model.RuleModel` and the signature table.
"""

from __future__ import annotations

import re

from alerts.grafana._engines import (
    ENGINE_PANELS,
    GPU_PANELS,
    QUANTILE,
    SignalPanel,
    engines_board,
    signal_expr,
)
from alerts.grafana._panels import render_dashboard
from alerts.grafana._slo import slo_overview
from alerts.model import RuleModel
from pipeline.errors import ConfigError

__all__ = [
    "ENGINE_PANELS",
    "GPU_PANELS",
    "QUANTILE",
    "SignalPanel",
    "dashboard_files",
    "engines_board",
    "render_dashboard",
    "signal_expr",
    "slo_overview",
]


#: Grafana's uid limit (40 characters) less the longest suffix, ``-engines``.
_PREFIX = re.compile(r"[A-Za-z0-9_-]{1,32}")


def dashboard_files(model: RuleModel, prefix: str = "llmslo") -> dict[str, str]:
    """File name → dashboard JSON for ``model``: ``<prefix>-slos.json`` and
    ``<prefix>-engines.json``; ``prefix`` is also the start of each board's uid, so
    :class:`ConfigError` unless it is 1–32 letters, digits, ``-`` or ``_``."""
    if not _PREFIX.fullmatch(prefix):
        raise ConfigError(
            f"prefix {prefix!r}: expected 1-32 letters, digits, '-' or '_' "
            "(it names the files and the dashboards' uids)"
        )
    return {
        f"{prefix}-slos.json": render_dashboard(slo_overview(model, uid=f"{prefix}-slos")),
        f"{prefix}-engines.json": render_dashboard(engines_board(uid=f"{prefix}-engines")),
    }
