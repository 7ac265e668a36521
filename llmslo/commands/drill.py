"""``llmslo drill``: inject every failure mode into a simulated fleet, report what was detected."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from llmslo.drill.hogs import HOG_CLASSES
from llmslo.drill.matrix import JOBS, MAX_PODS, DrillProfile, run_drill, select_modes
from llmslo.drill.report import render_markdown, write_drills
from llmslo.options import add_subcommand
from llmslo.progress import add_quiet_option, progress
from pipeline.errors import ConfigError
from pipeline.store import Store

__all__ = ["register"]

EXAMPLES = """\
llmslo drill                                   # every mode + 2 healthy minutes (26 modes, 12 fleets, ~11 min)
llmslo drill --jobs 1                          # one fleet at a time (~29 min on 2 cores)
llmslo drill --modes stall,kv_leak --healthy-minutes 1 -o var/drill.md --json var/drill.json
llmslo drill --modes none --healthy-minutes 30 --healthy-load 0.7  # DESIGN §8's healthy run
llmslo drill --hog 2                           # the same matrix beside one busy process per core
"""


def register(subparsers: Any) -> None:
    """Add ``drill``."""
    parser = add_subcommand(
        subparsers,
        "drill",
        "Chaos drill: inject each failure mode into a simulated fleet and report detection.",
        EXAMPLES,
    )
    parser.add_argument(
        "--modes", default="all", help="all, none, or comma-separated modes (default all)"
    )
    parser.add_argument(
        "--healthy-minutes",
        type=float,
        default=2.0,
        help="length of the fault-free control run, 0 for none (default 2)",
    )
    parser.add_argument(
        "--healthy-load",
        type=float,
        default=None,
        help="the healthy control's load as a share of the rate one pod serves without "
        "degrading, e.g. 0.7 (no preemption and KV free never below 10 %%, measured on the "
        "simulator's engine model in virtual time, ~20 s; default: the mode fleets' "
        f"{DrillProfile.rate_per_pod:g} req/s per pod)",
    )
    parser.add_argument("--seed", type=int, default=0, help="injection moments (default 0)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=JOBS,
        help=f"fleets run at a time, each in a worker process of its own (default {JOBS})",
    )
    parser.add_argument(
        "--max-pods",
        type=int,
        default=MAX_PODS,
        help="pods at a time across the running fleets: the longest fleet that fits starts "
        f"next, 0 for no bound (default {MAX_PODS})",
    )
    parser.add_argument(
        "--hog",
        type=int,
        default=0,
        metavar="N",
        help="run N busy processes beside the fleets for the whole drill (a node that is never "
        "idle; stopped with the drill; default 0)",
    )
    parser.add_argument(
        "--hog-class",
        choices=HOG_CLASSES,
        default="besteffort",
        help="the hogs' CPU weight: besteffort (SCHED_IDLE, a BestEffort pod beside a "
        "Guaranteed inference pod; default) or equal (the fleets' own)",
    )
    parser.add_argument("-o", "--output", default="-", help="Markdown report file, - for stdout")
    parser.add_argument("--json", type=Path, help="also write the report as JSON here")
    parser.add_argument("--db", type=Path, help="append the results to this DuckDB's drills table")
    parser.add_argument(
        "--workdir", type=Path, default=Path("var/drill"), help="logs and per-fleet stores"
    )
    add_quiet_option(parser)
    parser.set_defaults(handler=run_drill_cmd)


def run_drill_cmd(args: argparse.Namespace) -> int:
    if args.healthy_minutes < 0:
        raise ConfigError("--healthy-minutes: must be ≥ 0")
    modes = [] if args.modes.strip() == "none" else select_modes(args.modes)
    profile = DrillProfile(
        healthy_minutes=args.healthy_minutes,
        healthy_load=args.healthy_load,
        seed=args.seed,
        hogs=args.hog,
        hog_class=args.hog_class,
    )
    healthy = args.healthy_minutes > 0
    with progress("drill", len(modes) + healthy, "modes", quiet=args.quiet) as advance:
        report = run_drill(
            modes,
            args.workdir,
            profile,
            healthy_control=healthy,
            jobs=args.jobs,
            max_pods=args.max_pods or None,
            say=lambda text: print(text, file=sys.stderr, flush=True),
            advance=advance,
        )
    text = render_markdown(report)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
    if args.json is not None:
        args.json.write_text(json.dumps(report.as_dict(), sort_keys=True, indent=1))
    if args.db is not None:
        with Store(args.db) as store:
            write_drills(store.con, report)
    for failure in report.failed:
        print(f"llmslo drill: fleet {failure.name} failed: {failure.error}", file=sys.stderr)
    if report.interrupted:
        print(
            f"llmslo drill: interrupted; the fleets were stopped, the report holds the "
            f"{len(report.fleets)} that finished",
            file=sys.stderr,
        )
        return 130
    return 1 if report.failed else 0
