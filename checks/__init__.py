"""Deployment checks: the seeds' defences and pre-launch checklist as rules, proven twice.

Owns ``llmslo check``'s library: the rule table (``rules.yaml``) and the engine flag table
(``flags.yaml``, flag names per engine release with their documentation), the deployment as
written (:mod:`checks.manifests`: Kubernetes manifests or a command line), the static and
live evaluators (:mod:`checks.static`, :mod:`checks.live`: the store through
:mod:`slo.queries`), the run and its renderers (table, JSON, JUnit XML), and the release
regression of an engine's ``/metrics`` against the collector's dialect maps
(:mod:`checks.engine_metrics`). ``docs/checks.md`` lists every rule; a rule is a row of
``rules.yaml`` naming an evaluator, and an evaluator is one small function.
"""

from __future__ import annotations

from checks.catalog import SEVERITIES, Rule, Severity, load_flags, load_rules
from checks.engine_metrics import MetricsRegression, compare_scrape, read_scrape, render_regression
from checks.live import LiveInputs
from checks.manifests import Bundle, EngineContainer, load_manifests, parse_command
from checks.report import FORMATS, render_report
from checks.results import CheckReport, Evidence, RuleResult
from checks.runner import run_checks
from checks.static import StaticInputs

__all__ = [
    "FORMATS",
    "SEVERITIES",
    "Bundle",
    "CheckReport",
    "EngineContainer",
    "Evidence",
    "LiveInputs",
    "MetricsRegression",
    "Rule",
    "RuleResult",
    "Severity",
    "StaticInputs",
    "compare_scrape",
    "load_flags",
    "load_manifests",
    "load_rules",
    "parse_command",
    "read_scrape",
    "render_regression",
    "render_report",
    "run_checks",
]
