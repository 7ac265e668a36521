"""``llmslo run``: the pipeline process, and the :class:`Pipeline` the demo reuses.

``run`` is what a deployment runs beside its collectors and taps: the exactly-once
ingester and the SLO jobs in one process sharing one DuckDB file (DuckDB has one writer
per file, so the two cannot be separate processes), with raw-row retention and, when
``store.lake_dir`` is set, the hourly Parquet export. The HTTP API (section ``api:``)
is served from the same process, reading through cursors of the writer's connection
(DuckDB lets no other process open the file); manual flag overrides go to the ``flags``
topic like the jobs' transitions.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import textwrap
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack, closing
from importlib import resources
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from alerts.config import AlertmanagerConfig
from alerts.push import alert_ttl_s
from alerts.pusher import AlertPusher, restore_state
from api import create_app
from collectors.probe import ProbeSection
from collectors.receive.config import ReceiveConfig
from collectors.receive.service import ReceiveService
from llmslo.api_server import ApiServer, api_config
from llmslo.commands.probe import probe_until
from llmslo.commands.spine import ingest_status
from llmslo.options import (
    add_common_options,
    install_stop_handlers,
    pipeline_bus,
    print_json,
    resolve_config,
    serve_metrics,
)
from llmslo.progress import add_quiet_option, status_lines
from llmslo.roles import ROLES, run_ingest_role, run_jobs_role
from pipeline.bus import Bus
from pipeline.config import LlmsloConfig
from pipeline.errors import ConfigError, LlmsloError
from pipeline.ingest import Ingester, IngestMetrics
from pipeline.lake import export_hours, lake_object_store
from pipeline.memory import MemoryCollector
from pipeline.publisher import Publisher
from pipeline.schema import ALERTS
from pipeline.store import Store
from pipeline.units import DAY_MS
from slo.jobs import CycleResult, JobsConfig, SloJobs
from slo.metrics import JobMetrics
from slo.queries import alerts as recorded_alerts
from slo.sinks import BusTransitionSink
from slo.spec.loader import load_spec
from slo.spec.model import SloModel, build_model

__all__ = [
    "EXAMPLE_SPEC",
    "Pipeline",
    "add_spec_option",
    "broker_dir",
    "load_model",
    "register",
]

log = logging.getLogger(__name__)

#: The SLO spec used when none is configured (the seeds' targets), shipped inside ``slo``.
EXAMPLE_SPEC = Path(str(resources.files("slo").joinpath("slo.example.yaml")))


def register(subparsers: Any) -> None:
    """Add ``run``."""
    run = subparsers.add_parser(
        "run",
        help="Run the pipeline process: exactly-once ingest + SLO jobs on one DuckDB file.",
        description="Run the pipeline process: exactly-once ingest + SLO jobs on one DuckDB file.",
        epilog=textwrap.dedent(
            """\
            examples:
              llmslo run -c config/llmslo.example.yaml --spec config/slo.example.yaml
              llmslo run --bootstrap-servers 127.0.0.1:9092 --db var/llmslo.duckdb --metrics-port 9465
              LLMSLO_API_TOKEN=... llmslo run --api-port 8190   # the HTTP API on loopback (default)
            """
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common_options(run, db=True)
    add_spec_option(run)
    run.add_argument(
        "--metrics-port",
        type=int,
        help="serve ingest and job /metrics on this port (ingest.metrics_host)",
    )
    run.add_argument(
        "--port",
        "--api-port",
        dest="api_port",
        type=int,
        help="serve the HTTP API on this port (default: api.port, 8190; 0: any)",
    )
    run.add_argument("--no-api", action="store_true", help="do not serve the HTTP API")
    run.add_argument(
        "--role",
        choices=ROLES,
        default="all",
        help="all: ingest + jobs on one file; ingest: one fleet ingester exporting to the "
        "lake; jobs: SLO jobs over the lake (see docs/topology.md)",
    )
    run.add_argument("--instance-id", help="static group membership name (--role ingest)")
    add_quiet_option(run)
    run.set_defaults(handler=run_pipeline)


def add_spec_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--spec FILE``, the same in every command that evaluates SLOs, with the same default:
    the config's ``slo.spec``, else the example spec shipped with llmslo (:func:`load_model`)."""
    parser.add_argument(
        "--spec",
        type=Path,
        metavar="FILE",
        help="SLO spec: llmslo/v1, OpenSLO or Sloth (default: slo.spec of the config, else "
        "the example spec shipped with llmslo, config/slo.example.yaml)",
    )


def load_model(spec: Path | None) -> SloModel:
    """The validated SLO model of ``spec`` (default: the example spec)."""
    path = spec or EXAMPLE_SPEC
    if spec is None:
        log.info("SLO spec: the example shipped with llmslo (%s)", EXAMPLE_SPEC)
    if not path.exists():
        raise ConfigError(f"SLO spec {path} not found: pass --spec FILE or set slo.spec")
    model = build_model(load_spec(path))
    for warning in model.warnings:
        log.warning("%s", warning)
    return model


def broker_dir(config: LlmsloConfig) -> Path:
    """Where the pipeline's embedded broker keeps its log: beside the file it feeds, so a
    restart on the same file finds the records it had not ingested yet."""
    return config.store.path.with_name(config.store.path.name + ".broker")


class Pipeline:
    """Ingester and SLO jobs over one DuckDB file, each on its own thread.

    Flag transitions go to the Kafka ``flags`` topic and the ingester stores them, so the
    ingester stays the only writer of the raw tables. The jobs prune raw rows older than
    ``store.raw_retention_days`` hourly. ``bus``: the (not yet started) bus to use, made
    from ``config.bus`` when not given; its ``registry`` should be ``registry``.
    """

    def __init__(
        self,
        config: LlmsloConfig,
        model: SloModel,
        *,
        registry: CollectorRegistry | None = None,
        bus: Bus | None = None,
    ) -> None:
        self.config = config
        self.registry = registry or CollectorRegistry()
        self._stack = ExitStack()
        self.bus = self._stack.enter_context(
            bus or Bus(config.bus, embedded_data_dir=broker_dir(config), registry=self.registry)
        )
        self.store = self._stack.enter_context(
            Store(config.store.path, memory_limit=config.ingest.duckdb_memory_limit)
        )
        memory_con = self.store.con.cursor()  # scrapes read DuckDB's accounting through it
        self._stack.callback(memory_con.close)
        MemoryCollector(memory_con, registry=self.registry)
        self.bus.ensure_topics()
        self.ingester = Ingester(
            self.bus, self.store, config.ingest, metrics=IngestMetrics(self.registry)
        )
        # SLO jobs read through their own cursor: DuckDB isolates it from the ingest commits.
        jobs_con = self.store.con.cursor()
        self.alerts = self._alert_pusher(jobs_con)
        self.jobs = SloJobs(
            jobs_con,
            model,
            config.section("slo", JobsConfig),
            sink=self._stack.enter_context(
                closing(
                    BusTransitionSink(
                        Publisher(self.bus.producer, component="slo-jobs", registry=self.registry)
                    )
                )
            ),
            metrics=JobMetrics(self.registry),
            raw_pruner=self.store.prune,
            raw_retention_ms=int(config.store.raw_retention_days * DAY_MS),
            on_cycle=self.alerts.on_cycle,
        )
        self._stopping = threading.Event()
        self._threads: dict[str, threading.Thread] = {}
        self.failure: BaseException | None = None

    def _alert_pusher(self, con: Any) -> AlertPusher:
        """Path B: alert changes go to the Kafka ``alerts`` topic (the ingester stores them)
        and, with ``alertmanager.url``, to Alertmanager; resumes from the recorded alerts."""
        publisher = self._stack.enter_context(
            closing(Publisher(self.bus.producer, component="slo-alerts", registry=self.registry))
        )
        pusher = AlertPusher(
            self.config.section("alertmanager", AlertmanagerConfig),
            lambda rows: publisher.put(ALERTS, rows),
            state=restore_state(recorded_alerts(con)),
            registry=self.registry,
        )
        self._stack.callback(pusher.close)
        return pusher

    def start(self) -> Pipeline:
        """Start the ingest and job threads (and the lake export when configured)."""
        workers: dict[str, Callable[[], object]] = {
            "ingest": self.ingester.run,
            "slo-jobs": self.jobs.run,
        }
        lake_dir = self.config.store.lake_dir
        if lake_dir is not None:
            workers["lake-export"] = lambda: self._export_lake(lake_dir)
        receive = self.config.section("receive", ReceiveConfig)
        if receive.enabled:  # remote-write and OTLP into this process's bus (section receive:)
            service = ReceiveService(receive, self.bus.producer, registry=self.registry)
            workers["receive"] = lambda: service.run(self._stopping)
        probes = self.config.section("probe", ProbeSection).targets
        if probes:  # the entry points in front of the taps (section probe:)
            workers["probe"] = lambda: probe_until(self.bus, probes, self._stopping)
        for name, target in workers.items():
            thread = threading.Thread(
                target=self._supervised, args=(target,), name=name, daemon=True
            )
            thread.start()
            self._threads[name] = thread
        return self

    def _supervised(self, target: Callable[[], object]) -> None:
        try:
            target()
        except BaseException as exc:  # a dead worker stops the whole process, loudly
            log.error("%s failed: %s", threading.current_thread().name, exc)
            self.failure = exc
            self._stopping.set()

    def _export_lake(self, lake_dir: Path | str) -> None:
        ingester_id = f"{socket.gethostname()}-{os.getpid()}"
        objects = lake_object_store(lake_dir, self.config.store.s3)
        while not self._stopping.wait(60.0):
            try:
                export_hours(
                    self.store,
                    lake_dir,
                    ingester_id,
                    now_ts_ms=int(time.time() * 1000),
                    objects=objects,
                )
            except LlmsloError as exc:  # keep ingesting; the next round retries the hour
                log.error("lake export failed: %s", exc)

    def request_stop(self) -> None:
        """Ask :meth:`wait` to return (safe from a signal handler)."""
        self._stopping.set()

    def wait(self) -> None:
        """Block until :meth:`stop` is requested or a worker fails."""
        self._stopping.wait()

    def stop(self) -> None:
        """Finish the batch in hand and the job cycle in flight, then close everything."""
        self._stopping.set()
        self.jobs.stop()
        self.ingester.stop()
        for thread in self._threads.values():
            thread.join(timeout=60)
        self._stack.close()

    def final_cycle(self) -> CycleResult | None:
        """Stop the periodic jobs and run one last cycle over everything ingested so far.

        The jobs' cursor serves one call at a time, so the periodic loop must end first.
        """
        self.jobs.stop()
        self._threads["slo-jobs"].join(timeout=60)
        return self.jobs.run_once()


def serve_api(
    pipeline: Pipeline, model: SloModel, args: argparse.Namespace, stack: ExitStack
) -> ApiServer:
    """The HTTP API inside the pipeline process: cursors of the writer's connection, and
    overrides published to the ``flags`` topic through a bounded publisher of its own."""
    settings = api_config(args, pipeline.config)
    sink = stack.enter_context(
        closing(
            BusTransitionSink(
                Publisher(pipeline.bus.producer, component="api", registry=pipeline.registry)
            )
        )
    )
    gpu_pods = pipeline.config.section("slo", JobsConfig).detectors.gpu_pods
    app = create_app(
        pipeline.store.con.cursor,
        settings,
        model=model,
        flag_sink=sink,
        gpu_pods=gpu_pods,
        alert_ttl_s=alert_ttl_s(
            pipeline.config.section("alertmanager", AlertmanagerConfig).resend_s
        ),
        registry=pipeline.registry,
    )
    server = ApiServer(app, settings).start()
    stack.callback(server.stop)
    return server


def _kafka_line(config: LlmsloConfig, bus: Bus) -> str:
    """Where the pipeline's Kafka is: the embedded broker's address is the one every other
    process of this pipeline (collectors, taps, probes) joins: from the address file beside
    the DuckDB file when they share it, else given as ``--bootstrap-servers``."""
    if not bus.embedded:
        return f"Kafka at {bus.bootstrap_servers}"
    joined = (
        f" (written to {bus.address_file}: commands whose store.path is {config.store.path} "
        "join it without flags); elsewhere"
        if bus.address_file is not None
        else ";"
    )
    return (
        f"Kafka: the embedded broker at {bus.bootstrap_servers}{joined} give collectors, taps "
        f"and probes --bootstrap-servers {bus.bootstrap_servers}"
    )


def run_pipeline(args: argparse.Namespace) -> int:
    config = resolve_config(args)
    spec = args.spec or config.section("slo", JobsConfig).spec
    if args.role == "ingest":
        bus = pipeline_bus(config, args, owner=True)
        return run_ingest_role(config, bus, args.instance_id, quiet=args.quiet)
    model = load_model(spec)
    if args.role == "jobs":
        return run_jobs_role(config, pipeline_bus(config, args), model, quiet=args.quiet)
    registry = CollectorRegistry()
    bus = pipeline_bus(
        config, args, owner=True, embedded_data_dir=broker_dir(config), registry=registry
    )
    pipeline = Pipeline(config, model, registry=registry, bus=bus)
    print(_kafka_line(config, pipeline.bus), flush=True)
    if args.metrics_port is not None:
        host = config.ingest.metrics_host  # 0.0.0.0 in a pod, so a ServiceMonitor can scrape it
        port = serve_metrics(args.metrics_port, host, pipeline.registry)
        print(f"serving /metrics on http://{host}:{port}/metrics", flush=True)
    try:
        with ExitStack() as api_stack:  # the API stops first: no request outlives the store
            if not args.no_api:
                api = serve_api(pipeline, model, args, api_stack)
                print(f"serving the API on {api.url} (OpenAPI at {api.url}/docs)", flush=True)
            install_stop_handlers(pipeline.request_stop)
            pipeline.start()
            with status_lines(ingest_status(pipeline.ingester, "llmslo run"), quiet=args.quiet):
                pipeline.wait()
    finally:  # also when the API cannot start: close the bus and the store
        pipeline.stop()
    if pipeline.failure is not None:
        raise LlmsloError(f"the pipeline stopped: {pipeline.failure}") from pipeline.failure
    print_json({"run": "stopped", "rows": pipeline.ingester.stats.rows})
    return 0
