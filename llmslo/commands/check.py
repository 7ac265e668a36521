"""``llmslo check``: the defences and pre-launch checklist over a deployment and the store, and
``--engine-metrics``, the release regression of an engine's ``/metrics``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from checks import (
    FORMATS,
    SEVERITIES,
    Bundle,
    LiveInputs,
    StaticInputs,
    compare_scrape,
    load_manifests,
    parse_command,
    read_scrape,
    render_regression,
    render_report,
    run_checks,
)
from llmslo.options import add_subcommand
from pipeline.config import load_yaml
from pipeline.errors import ConfigError
from pipeline.store import Store

__all__ = ["register", "run_check"]


def register(subparsers: Any) -> None:
    """Add ``check``."""
    parser = add_subcommand(
        subparsers,
        "check",
        "Check a deployment against the seeds' twelve defences and pre-launch checklist, "
        "from its manifests (static) and llmslo's store (live); or check a new engine "
        "release's /metrics against every metric llmslo maps.",
        "llmslo check -f deploy/overlays/vllm --db var/llmslo.duckdb\n"
        "llmslo check --command 'vllm serve m --max-num-seqs 128' --image vllm/vllm-openai:v0.11.0\n"
        "llmslo check -f k8s/ --config config/tap.example.yaml --spec config/slo.example.yaml \\\n"
        "    --format junit -o check.xml --fail-on critical\n"
        "llmslo check -f k8s/ --silence 'C13-zone-spread=single-zone lab cluster'\n"
        "llmslo check --engine-metrics http://vllm-0:8000/metrics --baseline prod-metrics.txt",
    )
    parser.add_argument(
        "-f", "--filename", action="append", type=Path, default=[], metavar="PATH",
        help="manifest file or directory (multi-document YAML; kustomization.yaml followed); repeatable",
    )  # fmt: skip
    parser.add_argument(
        "--command", dest="engine_command", help="a plain engine command line instead of manifests"
    )
    parser.add_argument("--image", default="", help="the image of --command (for its version)")
    parser.add_argument("--db", type=Path, help="llmslo's DuckDB store: the live evidence")
    parser.add_argument("-c", "--config", type=Path, help="llmslo/tap config YAML (tap limits)")
    parser.add_argument("--spec", type=Path, help="the SLO spec (three-part latency SLOs)")
    parser.add_argument("--format", choices=FORMATS, default="table")
    parser.add_argument("-o", "--output", default="-", help="file, or - for stdout (default)")
    parser.add_argument(
        "--fail-on", choices=SEVERITIES, default="warning",
        help="exit 1 when a rule of this severity or above fails (default warning)",
    )  # fmt: skip
    parser.add_argument(
        "--silence", action="append", default=[], metavar="ID=REASON",
        help="accept rule ID failing, for REASON (shown in every format); repeatable",
    )  # fmt: skip
    parser.add_argument(
        "--rule", action="append", default=[], help="only rules with this id prefix"
    )
    parser.add_argument(
        "--engine-metrics", metavar="URL|FILE",
        help="release regression: a new engine's /metrics, checked against llmslo's maps",
    )  # fmt: skip
    parser.add_argument("--baseline", metavar="URL|FILE", help="the running release's /metrics")
    parser.add_argument("--dialect", help="force the dialect map (default: detected)")
    parser.set_defaults(handler=run_check)


def _silences(entries: list[str]) -> dict[str, str]:
    out = {}
    for entry in entries:
        rule, sep, reason = entry.partition("=")
        if not sep or not reason.strip():
            raise ConfigError(f"--silence {entry!r}: give ID=REASON (a reason is required)")
        out[rule.strip()] = reason.strip()
    return out


def _config(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        raw = load_yaml(path.read_text(encoding="utf-8"), str(path))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"--config {path}: {exc}") from exc
    return raw if isinstance(raw, dict) else {}


def _bundle(args: argparse.Namespace) -> Bundle:
    bundle = load_manifests(args.filename)
    if args.engine_command:
        engine = parse_command(args.engine_command, image=args.image)
        if engine is None:
            bundle.problems.append("--command: no vLLM, SGLang or TRT-LLM command recognised")
        else:
            bundle.engines.append(engine)
    return bundle


def _emit(output: str, text: str) -> None:
    if output == "-":
        sys.stdout.write(text)
    else:
        Path(output).write_text(text, encoding="utf-8")


def _run_regression(args: argparse.Namespace) -> int:
    baseline = read_scrape(args.baseline) if args.baseline else None
    result = compare_scrape(read_scrape(args.engine_metrics), baseline, dialect=args.dialect)
    _emit(args.output, render_regression(result, args.format))
    return int(result.failed)


def run_check(args: argparse.Namespace) -> int:
    """Print the report; 1 when a rule at or above ``--fail-on`` fails (or a signal is gone)."""
    if args.engine_metrics:
        return _run_regression(args)
    config = _config(args.config)
    static = StaticInputs(_bundle(args), config, args.spec)
    silences = _silences(args.silence)
    if args.db is None:
        report = run_checks(static, LiveInputs(None, config), silences=silences, only=args.rule)
    else:
        with Store(args.db, read_only=True) as store:
            live = LiveInputs(store.con, config)
            report = run_checks(static, live, silences=silences, only=args.rule)
    _emit(args.output, render_report(report, args.format))
    return report.exit_status(args.fail_on)
