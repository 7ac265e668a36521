"""``llmslo dashboards grafana``: write Grafana dashboard JSON for an SLO spec (thin: parse,
call :mod:`alerts.grafana`, write). ``llmslo dashboard`` (singular) serves the Streamlit app."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from alerts.grafana import dashboard_files
from alerts.load import load_rule_model
from alerts.writer import write_all
from llmslo.options import add_subcommand

__all__ = ["register", "run_grafana"]


def register(subparsers: Any) -> None:
    """Add ``dashboards`` (grafana)."""
    dashboards = add_subcommand(
        subparsers,
        "dashboards",
        "Generate Grafana dashboards (SLO overview, engines/GPUs) from an SLO spec.",
        "llmslo dashboards grafana config/slo.example.yaml -o var/grafana\n"
        "llmslo dashboards grafana tests/alerts/specs/sloth-getting-started.yaml -o var/grafana "
        "--prefix checkout",
    )
    sub = dashboards.add_subparsers(dest="dashboards_command", required=True)
    grafana = add_subcommand(
        sub,
        "grafana",
        "Write <prefix>-slos.json and <prefix>-engines.json into DIR. SPEC may be llmslo/v1, "
        "OpenSLO v1 or Sloth prometheus/v1, as for `llmslo rules generate`; the boards read "
        "the series those rules record. Nothing is written unless both boards render.",
        "llmslo dashboards grafana config/slo.example.yaml -o var/grafana\n"
        "llmslo dashboards grafana tests/alerts/specs/sloth-getting-started.yaml -o var/grafana "
        "--prefix checkout",
    )
    grafana.add_argument("spec", type=Path)
    grafana.add_argument("-o", "--output", type=Path, required=True, help="directory to write")
    grafana.add_argument(
        "--prefix",
        default="llmslo",
        help="start of the file names and dashboard uids: letters, digits, - and _ "
        "(default llmslo)",
    )
    grafana.set_defaults(handler=run_grafana)


def run_grafana(args: argparse.Namespace) -> int:
    """Render both boards, then write them; ConfigError (nothing written) on a bad spec."""
    model = load_rule_model(args.spec)
    for reason in model.skipped:
        sys.stderr.write(f"skipped: {reason}\n")
    files = {args.output / name: text for name, text in dashboard_files(model, args.prefix).items()}
    write_all(files)
    for path in files:
        print(path)
    return 0
