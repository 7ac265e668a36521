"""The SLO engine's subcommands: ``slo validate``, ``slo report`` and ``jobs``."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import logging
import re
import sys
from pathlib import Path
from typing import Any

import duckdb
from prometheus_client import CollectorRegistry

from alerts.config import AlertmanagerConfig
from alerts.pusher import AlertPusher, RecordSink, restore_state
from alerts.records import table_writer
from llmslo.options import (
    add_common_options,
    add_subcommand,
    install_stop_handlers,
    pipeline_bus,
    print_json,
    resolve_config,
    serve_metrics,
)
from llmslo.progress import add_quiet_option, progress
from llmslo.run import EXAMPLE_SPEC, add_spec_option, load_model
from pipeline.bus import Bus
from pipeline.config import LlmsloConfig
from pipeline.errors import ConfigError
from pipeline.publisher import Publisher
from pipeline.schema import ALERTS
from pipeline.store import Store
from pipeline.units import DAY_MS
from slo.buckets import check_bucket_bounds, observed_bounds
from slo.evaluate import evaluate
from slo.jobs import JobsConfig, SloJobs, data_clock
from slo.metrics import JobMetrics
from slo.own_targets import REPORT_WINDOW_MS, compare_violations
from slo.queries import alerts as recorded_alerts
from slo.replay import copy_store, data_extent, parse_instant, replay, replay_steps
from slo.report import render_json, render_own_targets, render_table
from slo.rollups.counts import Rollup
from slo.sinks import BusTransitionSink, StoreTransitionSink, TransitionSink
from slo.spec.loader import load_spec
from slo.spec.model import SloModel, build_model
from slo.windows import parse_duration_ms

__all__ = ["register"]

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    """Add ``slo`` (validate, report) and ``jobs``."""
    slo = add_subcommand(
        subparsers,
        "slo",
        "Check SLO specs and report SLO status.",
        "llmslo slo validate config/slo.example.yaml\n"
        "llmslo slo report --spec config/slo.example.yaml --db var/llmslo.duckdb --json",
    )
    sub = slo.add_subparsers(dest="slo_command", required=True)
    validate = sub.add_parser(
        "validate",
        help="validate FILE; report every error by field path",
        description="Validate an SLO spec; engine-histogram thresholds are checked "
        "against the bucket bounds in --db, or the dialect's defaults.",
    )
    validate.add_argument(
        "file",
        type=Path,
        nargs="?",
        metavar="SPEC",
        help="the spec (or --spec; default: the example)",
    )
    add_spec_option(validate)
    validate.add_argument(
        "--db", type=Path, help="check histogram thresholds against the bounds stored here"
    )
    validate.set_defaults(handler=run_validate)

    report = sub.add_parser(
        "report", help="SLO table: objective, SLI, budget left, burn rates, alerting pairs"
    )
    add_common_options(report, bus=False, db=True)
    add_spec_option(report)
    report.add_argument(
        "--at", type=int, metavar="TS_MS", help="evaluate at this event time (default: newest data)"
    )
    report.add_argument("--json", action="store_true", help="one JSON object for machines")
    report.add_argument(
        "--no-update", action="store_true", help="use the stored rollups as they are (read-only)"
    )
    report.set_defaults(handler=run_report)

    jobs = add_subcommand(
        subparsers,
        "jobs",
        "Evaluate SLOs, signals and degradation flags every interval.",
        "llmslo jobs --spec config/slo.example.yaml --db var/llmslo.duckdb --metrics-port 9468\n"
        "llmslo jobs --spec config/slo.example.yaml --db var/llmslo.duckdb --once\n"
        "llmslo jobs -c config/llmslo.example.yaml --spec config/slo.example.yaml --publish \\\n"
        "    --bootstrap-servers 127.0.0.1:9092\n"
        "llmslo jobs --spec config/slo.example.yaml --db var/llmslo.duckdb --replay "
        "--from -24h --step 1m\n"
        "llmslo jobs --spec config/slo.example.yaml --db var/llmslo.duckdb --replay \\\n"
        "    --into var/what-if.duckdb   # an edited spec over stored history, source untouched",
    )
    add_common_options(jobs, db=True)
    add_spec_option(jobs)
    jobs.add_argument(
        "--interval", type=float, help="seconds between cycles (default: slo.interval_s, 15)"
    )
    jobs.add_argument("--once", action="store_true", help="run one cycle, print a summary and exit")
    jobs.add_argument(
        "--at", type=int, metavar="TS_MS", help="with --once: event time (default: newest data)"
    )
    jobs.add_argument("--metrics-port", type=int, help="serve /metrics on this loopback port")
    jobs.add_argument(
        "--publish",
        action="store_true",
        help="publish flag transitions to Kafka (else write them to the flag_transitions table)",
    )
    replay = jobs.add_argument_group(
        "replay", "evaluate stored history step by step in event time, then exit (slo/replay.py)"
    )
    replay.add_argument(
        "--replay",
        action="store_true",
        help="run the cycle at every step of --from..--to over stored history; replaces the "
        "findings and flag transitions of that range (never publishes, never pushes alerts)",
    )
    replay.add_argument(
        "--from",
        dest="replay_from",
        metavar="T",
        help="first instant: ISO-8601 UTC (2026-12-01T06:00:00Z), epoch ms, or relative to the "
        "newest data (-24h); default: the oldest data",
    )
    replay.add_argument(
        "--to",
        dest="replay_to",
        metavar="T",
        help="last instant (as --from); default: the newest data",
    )
    replay.add_argument(
        "--step", default="1m", metavar="DURATION", help="time between steps (default 1m)"
    )
    replay.add_argument(
        "--into",
        type=Path,
        metavar="FILE",
        help="what would this spec have done: copy --db (read-only) into FILE and write the "
        "results there, leaving --db untouched (FILE is replaced)",
    )
    add_quiet_option(replay)
    # "--from -24h": argparse takes a value starting with "-" for an option unless it looks
    # like a negative number; a relative time is one here (no option of jobs looks like it).
    jobs._negative_number_matcher = re.compile(r"^-\d+(\.\d+)?[smhdw]?$")
    jobs.set_defaults(handler=run_jobs)


def _model(args: argparse.Namespace, config: LlmsloConfig) -> SloModel:
    return load_model(args.spec or config.section("slo", JobsConfig).spec)


def run_validate(args: argparse.Namespace) -> int:
    if args.file is not None and args.spec is not None and args.file != args.spec:
        raise ConfigError(f"two specs given: {args.file} and --spec {args.spec}; give one")
    spec = args.file or args.spec or EXAMPLE_SPEC
    model = build_model(load_spec(spec))
    observed = None
    if args.db:
        with Store(args.db, read_only=True) as store:
            observed = observed_bounds(store.con)
    problems = check_bucket_bounds(model, observed)
    if problems:
        raise ConfigError(f"{spec}: invalid SLO spec\n" + "\n".join(problems))
    for warning in model.warnings:
        print(f"warning: {warning}")
    print(f"{spec}: valid ({len(model.slos)} SLOs)")
    return 0


def _now(con: duckdb.DuckDBPyConnection, at: int | None) -> int:
    now = at if at is not None else data_clock(con)()
    if now is None:
        raise ConfigError(
            "the store holds no data yet: pass --at TS_MS to evaluate an empty period"
        )
    return now


def run_report(args: argparse.Namespace) -> int:
    config = resolve_config(args)
    model = _model(args, config)
    jobs_config = config.section("slo", JobsConfig)
    with Store(config.store.path, read_only=args.no_update, must_exist=True) as store:
        now = _now(store.con, args.at)
        if not args.no_update:
            Rollup(
                store.con,
                model,
                settle_ms=int(jobs_config.settle_s * 1000),
                horizon_ms=int(jobs_config.rollup_horizon_days * DAY_MS),
            ).update(now)
        statuses = evaluate(store.con, model, now)
        # the hour up to and including ``now`` (the newest record, by default)
        own = compare_violations(store.con, now - REPORT_WINDOW_MS + 1, now + 1)
    if args.json:
        report = render_json(statuses)
        if own:
            report["own_targets"] = {
                "window_ms": REPORT_WINDOW_MS,
                "rows": [dataclasses.asdict(row) for row in own],
            }
        print_json(report)
    else:
        sys.stdout.write(render_table(statuses) + render_own_targets(own, REPORT_WINDOW_MS))
    return 0


def _sink(
    store: Store, bus: Bus | None, stack: contextlib.ExitStack, registry: CollectorRegistry
) -> TransitionSink:
    if bus is not None:
        publisher = Publisher(bus.producer, component="slo-jobs", registry=registry)
        return stack.enter_context(contextlib.closing(BusTransitionSink(publisher)))
    return StoreTransitionSink(store.con)


def _alert_pusher(
    config: LlmsloConfig,
    store: Store,
    bus: Bus | None,
    stack: contextlib.ExitStack,
    registry: CollectorRegistry,
    background: bool,
) -> AlertPusher:
    """Path B: alert changes to the ``alerts`` topic (with a bus) or table, and to
    ``alertmanager.url`` when configured; resumes from the recorded alerts."""
    record: RecordSink = table_writer(store.con)
    if bus is not None:
        publisher = Publisher(bus.producer, component="slo-alerts", registry=registry)
        stack.enter_context(contextlib.closing(publisher))
        record = functools.partial(publisher.put, ALERTS)
    pusher = AlertPusher(
        config.section("alertmanager", AlertmanagerConfig),
        record,
        state=restore_state(recorded_alerts(store.con)),
        background=background,
        registry=registry,
    )
    stack.callback(pusher.close)
    return pusher


def run_replay(args: argparse.Namespace, config: LlmsloConfig, model: SloModel) -> int:
    """``jobs --replay``: the cycle over stored history, in place or into a scratch copy."""
    try:
        step_ms = parse_duration_ms(args.step)
    except ValueError as exc:
        raise ConfigError(f"--step: {exc}") from None
    path = config.store.path
    if args.into is not None:
        copy_store(path, args.into)
        path = args.into
    with Store(path, must_exist=True) as store:
        extent = data_extent(store.con)
        newest = extent[1] if extent else 0
        start_ms = parse_instant(args.replay_from, newest) if args.replay_from else None
        end_ms = parse_instant(args.replay_to, newest) if args.replay_to else None
        steps = replay_steps(store.con, start_ms=start_ms, end_ms=end_ms, step_ms=step_ms)
        with progress("replay", len(steps), "steps", quiet=args.quiet) as advance:
            summary = replay(
                store.con,
                model,
                config.section("slo", JobsConfig),
                start_ms=start_ms,
                end_ms=end_ms,
                step_ms=step_ms,
                on_step=lambda _: advance(1),
            )
    print_json({**summary.as_dict(), "db": str(path)})
    return 0


def run_jobs(args: argparse.Namespace) -> int:
    config = resolve_config(args)
    model = _model(args, config)
    if args.replay:
        return run_replay(args, config, model)
    if args.into or args.replay_from or args.replay_to:
        raise ConfigError("--from, --to and --into go with --replay")
    jobs_config = config.section("slo", JobsConfig)
    if args.interval is not None:
        jobs_config = jobs_config.model_copy(update={"interval_s": args.interval})
    metrics = JobMetrics()
    port = args.metrics_port if args.metrics_port is not None else jobs_config.metrics_port
    if port is not None:
        bound = serve_metrics(port, jobs_config.metrics_host, metrics.registry)
        print(f"serving /metrics on http://{jobs_config.metrics_host}:{bound}/metrics", flush=True)
    bus = pipeline_bus(config, args).start() if args.publish else None
    try:
        with Store(config.store.path) as store, contextlib.ExitStack() as stack:
            pusher = _alert_pusher(
                config, store, bus, stack, metrics.registry, background=not args.once
            )
            jobs = SloJobs(
                store.con,
                model,
                jobs_config,
                sink=_sink(store, bus, stack, metrics.registry),
                metrics=metrics,
                raw_pruner=store.prune,
                raw_retention_ms=int(config.store.raw_retention_days * DAY_MS),
                on_cycle=pusher.on_cycle,
            )
            if args.once:
                result = jobs.run_once(args.at)
                print_json(
                    {
                        "jobs": "once",
                        "ts_ms": result.now_ms if result else None,
                        "slos": len(result.statuses) if result else 0,
                        "alerting": sorted(
                            {
                                s.slo.id
                                for s in (result.statuses if result else [])
                                for p in s.pairs()
                                if p.alerting
                            }
                        ),
                        "signals": [
                            f"{f.signal}:{f.scope_id}" for f in (result.findings if result else [])
                        ],
                        "transitions": len(result.transitions) if result else 0,
                        "errors": result.errors if result else [],
                    }
                )
                return 0
            install_stop_handlers(jobs.stop)
            cycles = jobs.run()
    finally:
        if bus is not None:
            bus.stop()
    print_json({"jobs": "stopped", "cycles": cycles})
    return 0
