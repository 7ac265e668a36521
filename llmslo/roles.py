"""``llmslo run --role ingest|jobs``: the same binary as one fleet ingester or as the SLO jobs.

``--role all`` (the default, :class:`llmslo.run.Pipeline`) keeps ingest and jobs in one process
on one DuckDB file. In a fleet (docs/topology.md) the parts run apart:

* ``ingest``: one member of the consumer group, its own DuckDB file, exporting to the lake
  every ``store.lake_export_interval_s``: frozen hours once, and the open hours rewritten
  in place (:func:`pipeline.lake.export_hours` with ``include_open``);
* ``jobs``: the SLO jobs over the lake (:func:`pipeline.lake.create_lake_views`), writing
  rollups and statuses to their own DuckDB file (``--db``) and flag transitions to Kafka.
  DuckDB lets one process open a file, so the jobs never open an ingester's file: they
  see rows at most one export interval (plus one ingest batch) old. Over the Iceberg lake
  (``store.lake: iceberg``) they mirror it instead, and maintain it every
  ``store.iceberg.maintain_interval_s`` (:func:`maintain_lake_until`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from llmslo.commands.spine import ingest_status
from llmslo.options import install_stop_handlers, print_json
from llmslo.progress import status_lines
from pipeline.bus import Bus
from pipeline.config import LlmsloConfig
from pipeline.errors import ConfigError, LlmsloError
from pipeline.iceberg.lake import open_iceberg_lake
from pipeline.ingest import Ingester
from pipeline.lake import create_lake_views, export_hours, lake_object_store
from pipeline.processes import freeze_startup_heap
from pipeline.publisher import Publisher
from pipeline.s3 import ObjectStore
from pipeline.store import Store
from pipeline.units import DAY_MS
from slo.jobs import JobsConfig, SloJobs
from slo.sinks import BusTransitionSink, StoreTransitionSink, TeeTransitionSink
from slo.spec.model import SloModel

if TYPE_CHECKING:
    from pipeline.iceberg.mirror import IcebergMirror

__all__ = ["ROLES", "maintain_lake_until", "run_ingest_role", "run_jobs_role"]

log = logging.getLogger(__name__)

ROLES = ("all", "ingest", "jobs")


def _lake_dir(config: LlmsloConfig) -> Path | str:
    if config.store.lake_dir is None:
        raise ConfigError("--role ingest and --role jobs need store.lake_dir (the shared lake)")
    return config.store.lake_dir


def export_lake_until(
    store: Store,
    lake_dir: Path | str,
    ingester_id: str,
    interval_s: float,
    stop: threading.Event,
    retention_ms: int | None = None,
    objects: ObjectStore | None = None,
) -> None:
    """Export to the lake every ``interval_s`` (open hours included) until ``stop``, and once more.

    With ``retention_ms``, raw rows older than that are pruned hourly (an ingest role has
    no jobs thread to do it; the lake keeps them). ``objects``: the store of an ``s3://``
    lake (its uploads retry while the ingester goes on committing).
    """
    last_prune_s = float("-inf")
    while True:
        stopping = stop.wait(interval_s)
        now_ms = int(time.time() * 1000)
        try:
            export_hours(
                store,
                lake_dir,
                ingester_id,
                now_ts_ms=now_ms,
                include_open=True,
                objects=objects,
            )
            if retention_ms is not None and time.monotonic() - last_prune_s >= 3600:
                store.prune(now_ms - retention_ms)
                last_prune_s = time.monotonic()
        except LlmsloError as exc:  # keep ingesting; the next round retries
            log.error("lake export or pruning failed: %s", exc)
        if stopping:
            return


def maintain_lake_until(config: LlmsloConfig, topic_prefix: str, stop: threading.Event) -> None:
    """A lake maintenance pass (:mod:`pipeline.iceberg.maintenance`) every
    ``store.iceberg.maintain_interval_s`` until ``stop``; the first after one interval.

    Its own lake (catalog connection and table objects), so the jobs' mirror never sees a
    table object change under it. A failed pass is logged; the next one retries.
    """
    from pipeline.iceberg.maintenance import LakeMaintainer, maintenance_policy

    assert config.store.iceberg is not None  # store.lake is iceberg
    interval_s = config.store.iceberg.maintain_interval_s
    maintainer: LakeMaintainer | None = None
    while not stop.wait(interval_s):
        try:
            if maintainer is None:
                lake = open_iceberg_lake(config.store, config.ingest.group_id, topic_prefix)
                assert lake is not None
                maintainer = LakeMaintainer(
                    lake, maintenance_policy(config.store), should_stop=stop.is_set
                )
            reports = maintainer.run(int(time.time() * 1000))
        except LlmsloError as exc:
            log.error("lake maintenance failed: %s", exc)
            continue
        for report in reports:
            for skipped in report.skipped:
                log.warning("lake maintenance of %s left %s", report.table, skipped)


def run_ingest_role(
    config: LlmsloConfig, bus: Bus, instance_id: str | None, *, quiet: bool = False
) -> int:
    """One ingester of the group on ``bus`` (not started), exporting to the lake; returns
    the exit code."""
    iceberg = config.store.lake == "iceberg"
    lake_dir = config.store.lake_dir if iceberg else _lake_dir(config)
    ingester_id = instance_id or f"{socket.gethostname()}-{os.getpid()}"
    with (
        bus,
        Store(config.store.path, memory_limit=config.ingest.duckdb_memory_limit) as store,
    ):
        bus.ensure_topics()
        lake = open_iceberg_lake(config.store, config.ingest.group_id, bus.prefix)
        ingester = Ingester(bus, store, config.ingest, instance_id=instance_id, lake=lake)
        install_stop_handlers(ingester.stop)
        stop = threading.Event()
        # The Parquet export, unless the Iceberg lake alone is configured (it is written
        # batch by batch, in the commit path). Pruning old raw rows rides on the export.
        exporter = threading.Thread(
            target=export_lake_until,
            args=(store, lake_dir, ingester_id, config.store.lake_export_interval_s, stop),
            kwargs={
                "retention_ms": int(config.store.raw_retention_days * DAY_MS),
                "objects": lake_object_store(lake_dir, config.store.s3)
                if lake_dir is not None
                else None,
            },
            name="lake-export",
        )
        if lake_dir is not None:
            exporter.start()
        try:
            with status_lines(ingest_status(ingester, "llmslo run --role ingest"), quiet=quiet):
                stats = ingester.run()
        finally:
            stop.set()
            if lake_dir is not None:
                exporter.join()
    print_json({"run": "stopped", "role": "ingest", "rows": stats.rows})
    return 0


def run_jobs_role(config: LlmsloConfig, bus: Bus, model: SloModel, *, quiet: bool = False) -> int:
    """The SLO jobs over the lake until SIGTERM, flag transitions to ``bus`` (not started);
    returns the exit code."""
    if config.store.lake == "iceberg":
        return _run_jobs_over_iceberg(config, bus, model, quiet=quiet)
    lake_dir = _lake_dir(config)
    jobs_config = config.section("slo", JobsConfig)
    stop = threading.Event()
    install_stop_handlers(stop.set)
    cycles = 0
    with (
        bus,
        duckdb.connect(str(config.store.path)) as con,
        closing(BusTransitionSink(Publisher(bus.producer, component="slo-jobs"))) as sink,
        status_lines(lambda: f"llmslo run --role jobs: {cycles:,} SLO cycles", quiet=quiet),
    ):
        objects = lake_object_store(lake_dir, config.store.s3)
        create_lake_views(con, lake_dir, objects=objects)
        jobs = SloJobs(con, model, jobs_config, sink=sink)
        started = time.monotonic()
        while not stop.is_set():
            create_lake_views(con, lake_dir, objects=objects)  # picks up a table's first file
            jobs.run_once()
            cycles += 1
            if cycles == 1:  # the role is up: its views and store answer
                freeze_startup_heap()  # a cycle's objects no longer rescan the startup's
                log.info(
                    "first SLO cycle over %s done %.1f s after start",
                    lake_dir,
                    time.monotonic() - started,
                )
            stop.wait(jobs_config.interval_s)
    print_json({"run": "stopped", "role": "jobs", "cycles": cycles})
    return 0


#: How often the jobs over the Iceberg lake fetch new commits between two cycles.
FOLLOW_EVERY_S = 1.0
#: The jobs over the Iceberg lake checkpoint their file after each cycle (a cycle writes
#: ~9 MB of log at 4,096 instances, so DuckDB's 16 MiB default would checkpoint inside
#: every other cycle); this bound is only for a checkpoint that failed.
JOBS_CHECKPOINT_THRESHOLD = "256MB"


def _follow_lake(mirror: IcebergMirror, stop: threading.Event, interval_s: float) -> None:
    """Wait ``interval_s`` (or until ``stop``), loading the lake's new commits into the
    jobs' file every FOLLOW_EVERY_S meanwhile, so the next cycle's refresh reads and stores
    only the last second's commits. A fetch that fails is left to the next one or that
    refresh."""
    deadline = time.monotonic() + interval_s
    while not stop.wait(min(FOLLOW_EVERY_S, max(0.0, deadline - time.monotonic()))):
        if time.monotonic() >= deadline:
            return
        try:
            mirror.fetch(int(time.time() * 1000))
        except LlmsloError as exc:
            log.debug("fetching the lake's new commits between cycles: %s", exc)


def _checkpoint(store: Store) -> None:
    """Checkpoint the jobs' file; a failure is logged (the threshold still bounds the log)."""
    try:
        store.checkpoint()
    except LlmsloError as exc:
        log.warning("checkpointing the jobs' file after a cycle: %s", exc)


def _run_jobs_over_iceberg(
    config: LlmsloConfig, bus: Bus, model: SloModel, *, quiet: bool = False
) -> int:
    """The jobs over the Iceberg lake: each cycle first loads the data files committed
    since the last (:class:`pipeline.iceberg.mirror.IcebergMirror`) into the jobs' own file,
    which also keeps the flag transitions they resume from (the lake holds only the
    one-topic tables; flags share their topic with heartbeats)."""
    from pipeline.iceberg.mirror import IcebergMirror

    jobs_config = config.section("slo", JobsConfig)
    stop = threading.Event()
    install_stop_handlers(stop.set)
    cycles = 0
    window_ms = int(config.store.raw_retention_days * DAY_MS)
    with (
        bus,
        Store(
            config.store.path,
            memory_limit=config.ingest.duckdb_memory_limit,
            checkpoint_threshold=JOBS_CHECKPOINT_THRESHOLD,
        ) as store,
        closing(BusTransitionSink(Publisher(bus.producer, component="slo-jobs"))) as published,
        status_lines(lambda: f"llmslo run --role jobs: {cycles:,} SLO cycles", quiet=quiet),
    ):
        lake = open_iceberg_lake(config.store, config.ingest.group_id, bus.prefix)
        assert lake is not None  # store.lake is iceberg
        mirror = IcebergMirror(lake, store, window_ms=window_ms)
        sink = TeeTransitionSink(published, StoreTransitionSink(store.con))
        jobs = SloJobs(store.con, model, jobs_config, sink=sink)
        maintenance = threading.Thread(
            target=maintain_lake_until, args=(config, bus.prefix, stop), name="lake-maintain"
        )
        assert config.store.iceberg is not None
        if config.store.iceberg.maintain_interval_s > 0:
            maintenance.start()
        started = time.monotonic()
        try:
            while not stop.is_set():
                now_ms = int(time.time() * 1000)
                try:
                    report = mirror.refresh(now_ms)
                except LlmsloError as exc:  # no cycle over a lake that cannot be read
                    log.error("skipping an SLO cycle: %s", exc)
                else:
                    log.debug(
                        "mirrored %d rows of %d files in %.2f s",
                        report.rows,
                        report.files,
                        report.seconds,
                    )
                    jobs.note_written(report.changed_from_ms)
                    jobs.run_once()
                    _checkpoint(store)  # between cycles, not in the next one's commits
                    cycles += 1
                    if cycles == 1:
                        # ~250k objects (pyiceberg, catalog, model): every full collection
                        # rescanned them, ~0.1 s of a 4,096-instance cycle's evaluation.
                        freeze_startup_heap()
                        log.info(
                            "first SLO cycle over the Iceberg lake done %.1f s after start",
                            time.monotonic() - started,
                        )
                _follow_lake(mirror, stop, jobs_config.interval_s)
        finally:  # a pass in progress stops after its current commit
            stop.set()
            if maintenance.is_alive():
                maintenance.join()
    print_json({"run": "stopped", "role": "jobs", "cycles": cycles})
    return 0
