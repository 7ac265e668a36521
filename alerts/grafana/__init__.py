"""Grafana dashboards generated from the same rule model and catalogs as the rule files.

Two boards, built with the Grafana Foundation SDK and rendered deterministically
(:func:`dashboard_files`): the SLO overview (:func:`slo_overview`, over the series
:func:`alerts.generate_rules` records) and the engines/GPUs board (:func:`engines_board`,
over the metric names of the engine dialect maps). Here beside the rule generator, not in
``dashboards/`` (the Streamlit app, on the same floor), because both are generated from
:class:`~alerts.model.RuleModel` and the signature table.
"""

from __future__ import annotations

from alerts.grafana._engines import (
    ENGINE_PANELS,
    GPU_PANELS,
    SignalPanel,
    engines_board,
    signal_expr,
)
from alerts.grafana._panels import render_dashboard
from alerts.grafana._slo import slo_overview
from alerts.model import RuleModel

__all__ = [
    "ENGINE_PANELS",
    "GPU_PANELS",
    "SignalPanel",
    "dashboard_files",
    "engines_board",
    "render_dashboard",
    "signal_expr",
    "slo_overview",
]


def dashboard_files(model: RuleModel, prefix: str = "llmslo") -> dict[str, str]:
    """File name → dashboard JSON for ``model``: ``<prefix>-slos.json`` and
    ``<prefix>-engines.json``; ``prefix`` is also the start of each board's uid."""
    return {
        f"{prefix}-slos.json": render_dashboard(slo_overview(model, uid=f"{prefix}-slos")),
        f"{prefix}-engines.json": render_dashboard(engines_board(uid=f"{prefix}-engines")),
    }
