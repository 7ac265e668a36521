"""``llmslo rules generate`` and ``llmslo rules alertmanager`` (thin: parse, call, write)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from alerts.alertmanager import alertmanager_config
from alerts.files import prometheus_rule_text, render_bundle, rules_text
from alerts.load import load_rule_model
from alerts.operator import alertmanager_config_object, parse_labels
from alerts.writer import render_yaml, write_all
from llmslo.options import add_subcommand

__all__ = ["register", "run_alertmanager", "run_generate"]


def register(subparsers: Any) -> None:
    """Add ``rules`` (generate, alertmanager), each with ``--format`` for the Operator."""
    rules = add_subcommand(
        subparsers,
        "rules",
        "Generate Prometheus rules, promtool tests and Alertmanager config from an SLO spec.",
        "llmslo rules generate config/slo.example.yaml -o var/rules/slo.rules.yml --tests var/rules/tests\n"
        "llmslo rules generate tests/alerts/specs/sloth-getting-started.yaml -o -\n"
        "llmslo rules generate tests/alerts/specs/sloth-crd-getting-started.yaml -o slo.rules.yaml\n"
        "llmslo rules generate tests/alerts/specs/pyrra-http-ratio.yaml --format rules -o -\n"
        "llmslo rules generate config/slo.example.yaml --format prometheusrule \\\n"
        "    --namespace monitoring --label release=kube-prometheus-stack -o slo.rules.yaml\n"
        "llmslo rules alertmanager -o var/rules/alertmanager.yml\n"
        "llmslo rules alertmanager --format alertmanagerconfig --namespace inference -o -",
    )
    sub = rules.add_subparsers(dest="rules_command", required=True)
    generate = sub.add_parser(
        "generate",
        help="write the rule file (and promtool tests) for SPEC",
        description="SPEC may be llmslo/v1, OpenSLO v1 or v1alpha, Sloth prometheus/v1 or "
        "its PrometheusServiceLevel CRD, or Pyrra ServiceLevelObjectives (one or more "
        "documents). A Sloth CRD is written as a PrometheusRule named like it unless "
        "--format rules. Nothing is written unless every file renders.",
    )
    generate.add_argument("spec", type=Path)
    generate.add_argument("-o", "--output", required=True, help="rule file, or - for stdout")
    generate.add_argument("--tests", type=Path, help="directory for the promtool test files")
    generate.add_argument(
        "--strict", action="store_true", help="refuse SLOs that only the SLO jobs can compute"
    )
    generate.add_argument(
        "--no-signatures", action="store_true", help="SLO rules only, no failure signatures"
    )
    _add_object_options(generate, ("plain", "prometheusrule", "rules"), "llmslo-slo")
    generate.set_defaults(handler=run_generate)
    manager = sub.add_parser("alertmanager", help="print an Alertmanager routing/inhibition config")
    manager.add_argument("-o", "--output", default="-", help="file, or - for stdout (default)")
    _add_object_options(manager, ("plain", "alertmanagerconfig"), "llmslo")
    manager.set_defaults(handler=run_alertmanager)


def _add_object_options(
    parser: argparse.ArgumentParser, formats: tuple[str, ...], default_name: str
) -> None:
    """``--format`` and, for the Prometheus Operator's object, its name, namespace and labels.

    ``--format`` and ``--name`` default to None so that a Kubernetes input object can supply
    them (``rules`` is another name for ``plain``)."""
    parser.add_argument(
        "--format",
        choices=formats,
        default=None,
        help=f"plain file (default; also 'rules') or a Prometheus Operator {formats[1]} "
        "object (default for a Sloth PrometheusServiceLevel input)",
    )
    parser.add_argument("--name", default=None, help=f"object name (default {default_name})")
    parser.set_defaults(default_name=default_name)
    parser.add_argument("--namespace", help="object namespace (default: none, kubectl's)")
    parser.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="K=V",
        help="object label, e.g. the one your Prometheus' ruleSelector matches; repeatable",
    )


def run_generate(args: argparse.Namespace) -> int:
    """Render everything first, then write it all; ConfigError (nothing written) on bad input."""
    model = load_rule_model(args.spec, strict=args.strict)
    signatures = not args.no_signatures
    for reason in model.skipped:
        sys.stderr.write(f"skipped: {reason}\n")
    meta = model.kubernetes
    output_format = args.format or ("prometheusrule" if meta is not None else "plain")
    if output_format == "prometheusrule":
        if args.tests is not None:
            sys.stderr.write("--tests needs --format plain (promtool reads plain rule files)\n")
            return 2
        labels = {**dict(meta.labels if meta else ()), **parse_labels(args.label)}
        name = args.name or (meta.name if meta else args.default_name)
        namespace = args.namespace or (meta.namespace if meta else None)
        text = prometheus_rule_text(model, name, namespace, labels, signatures)
        _emit(args.output, text)
        return 0
    if args.output == "-":
        if args.tests is not None:
            sys.stderr.write("--tests needs -o FILE (the tests name the rule file)\n")
            return 2
        sys.stdout.write(rules_text(model, signatures))
        return 0
    write_all(render_bundle(model, Path(args.output), args.tests, signatures))
    return 0


def run_alertmanager(args: argparse.Namespace) -> int:
    """Print or write the Alertmanager snippet (or the AlertmanagerConfig object)."""
    document = alertmanager_config()
    if args.format == "alertmanagerconfig":
        document = alertmanager_config_object(
            document, args.name or args.default_name, args.namespace, parse_labels(args.label)
        )
    _emit(
        args.output, render_yaml(document, header="# Generated by `llmslo rules alertmanager`.\n")
    )
    return 0


def _emit(output: str, text: str) -> None:
    if output == "-":
        sys.stdout.write(text)
    else:
        write_all({Path(output): text})
