"""Alerting: Prometheus rules and their promtool tests from the SLO spec, Alertmanager config.

Owns path A of DESIGN §4–§5 (rule files that Prometheus evaluates over the engines', DCGM's
and the taps' ``/metrics``) and the library half of path B (pushing the pipeline's own
alerts to Alertmanager). Data flows one way, as in Sloth: spec file → :func:`load_rule_model`
(llmslo/v1, OpenSLO v1 and v1alpha, Sloth prometheus/v1 and its CRD, Pyrra; the formats are
:data:`slo.spec.formats.FORMATS`) → :class:`RuleModel` → generators
(:func:`generate_rules`, promtool tests, :func:`alertmanager_config`) → writer (YAML, atomic).
Metric names per source (:mod:`alerts.sources`) and signatures (:mod:`alerts.signatures`)
are data. See ``alerts/README.md`` for the rule names and how to add a signature rule.
"""

from __future__ import annotations

from alerts.alertmanager import alertmanager_config
from alerts.client import AlertmanagerClient
from alerts.files import render_bundle, rules_text
from alerts.generate import generate_rules
from alerts.load import load_rule_model
from alerts.model import RuleModel, RuleSlo
from alerts.push import ActiveAlert, PushState, reconcile
from alerts.signatures import SIGNATURES, Signature
from alerts.sloth import load_sloth, parse_sloth
from alerts.sources import rule_model_from_slo
from alerts.testgen import signature_test, slo_test
from alerts.writer import render_yaml, write_all

__all__ = [
    "SIGNATURES",
    "ActiveAlert",
    "AlertmanagerClient",
    "PushState",
    "RuleModel",
    "RuleSlo",
    "Signature",
    "alertmanager_config",
    "generate_rules",
    "load_rule_model",
    "load_sloth",
    "parse_sloth",
    "reconcile",
    "render_bundle",
    "render_yaml",
    "rule_model_from_slo",
    "rules_text",
    "signature_test",
    "slo_test",
    "write_all",
]
