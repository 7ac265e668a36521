"""Kafka → DuckDB ingest with an exactly-once effect.

The ingester is one member of a Kafka consumer group. It decodes each message
(:mod:`pipeline.codec`), gathers rows per table, and every ``batch_max_rows`` rows or
``batch_max_ms`` milliseconds commits rows, dead letters and the next offsets to DuckDB
in one transaction (:meth:`pipeline.store.Store.commit_batch`). When partitions are
assigned it seeks to the offsets stored in DuckDB, so a crash at any point neither loses
nor repeats a row. Kafka's own committed offsets are written after DuckDB's, for lag
monitoring and for handing a partition to another group member.

Offsets know their log (:mod:`pipeline._offsets`): each stored offset carries the cluster
and topic id the broker reported for the partition's log. A new log (the embedded broker's
log lost, a topic deleted and re-created, another cluster) is read from its beginning,
logged and counted in ``llmslo_ingest_log_resets_total``, whether it is found on assignment
or while consuming. An offset whose log the broker cannot confirm (no topic ids, or a file
written before offsets carried them, or a broker that drops commit metadata, as Tansu does)
is checked against the partition's end instead: the high watermark of the consumer's own
fetch answers (the embedded broker's ListOffsets answer is the last record batch's base
offset + 1, short of the end), and only an offset still beyond it after
:data:`BEYOND_END_RECHECK_S` counts as a new log.

Undecodable messages never stop the consumer: they go to the ``deadletter`` table and
topic with the reason. SIGTERM finishes the batch in hand, commits it and returns.

Memory. What the ingester holds is bounded by its config, in bytes, not only in rows
(a row of a request record can be 1,000 times larger than an engine sample's). One
setting, ``ingest.memory_mb`` (default 512), sets the budget; the byte settings default to
shares of it (:func:`pipeline.config.ingest_memory_defaults`):

* the Kafka fetch: ``fetch_max_bytes`` (half of it per partition), an eighth of the budget
  above the baseline (42 MiB at 512);
* the batch in hand: due at ``batch_max_rows`` rows or ``batch_max_bytes`` bytes (decoded
  Arrow plus dead-letter payloads, of which only the first 1 MiB is kept), checked after
  every message; while a commit is in flight it may grow to twice that before reading
  stops (backpressure); so ≤ 4 × ``batch_max_bytes``, a quarter of the spare budget;
* one decoded message: at most ``max_decoded_bytes``, checked from the Arrow IPC headers
  before anything is decompressed (:mod:`pipeline._ipc_size`), so a decompression bomb
  costs its wire size, not its decoded size;
* DuckDB's buffer pool: ``duckdb_memory_limit``, half of the spare budget (176 MB at 512);
* the series indexes of the sample tables: the series ids stored (8 B each) plus caches
  of value hashes and of known message shapes, at most ~12 MB per table
  (:data:`pipeline.series.MAX_CACHED_VALUES`, :data:`pipeline.series.MAX_COMPLETE_MESSAGES`);
* the interpreter and libraries (pyarrow, DuckDB, kafka-python) with the store open: about
  175 MB (:data:`pipeline.config.INGEST_BASELINE_MB`).

The last eighth is margin: DuckDB's limit covers its buffer pool, not every allocation,
and Arrow's allocator keeps freed memory for reuse. Measured with ``bench/ingest.py``
(2 shared cores, three quick runs): peak RSS 455–487 MB at the default 512. A message
larger than the fetch is still returned whole by Kafka (and copied a few times by the
client): the broker's ``message.max.bytes`` is what keeps such messages out of topics.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pyarrow as pa
from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.subscription_state import AsyncConsumerRebalanceListener
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pipeline._offsets import LogIdentity, StoredOffset, choose_start, log_identity
from pipeline.bus import DEADLETTER_TOPIC, Bus, BusProducer
from pipeline.codec import decode_message
from pipeline.config import IngestConfig
from pipeline.errors import DecodeError, StoreError
from pipeline.iceberg.lake import IcebergLake
from pipeline.schema import iter_schemas
from pipeline.store import DEADLETTER_PAYLOAD_LIMIT, DeadLetter, Store, read_peer_offsets

__all__ = ["IngestMetrics", "IngestStats", "Ingester", "choose_start"]

log = logging.getLogger(__name__)

#: An offset that identity cannot confirm and that lies beyond its partition's end is
#: checked again this much later before the partition counts as a new log: one fetch
#: answer's high watermark may predate records produced since (DESIGN §6).
BEYOND_END_RECHECK_S = 3.0
#: A due batch waits at most this long for the metadata that confirms its partitions' logs
#: (then it commits unconfirmed, logged): a broker that does not answer must not stop ingest.
LOG_CONFIRM_TIMEOUT_S = 5.0


class IngestMetrics:
    """The ingester's own Prometheus metrics (served on ``/metrics``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.rows = Counter("llmslo_ingest_rows", "Rows committed to DuckDB", ["table"], registry=r)
        self.messages = Counter(
            "llmslo_ingest_messages", "Kafka messages consumed", ["topic"], registry=r
        )
        self.deadletters = Counter(
            "llmslo_ingest_deadletters", "Messages dead-lettered, by reason", ["reason"], registry=r
        )
        self.commit_seconds = Histogram(
            "llmslo_ingest_commit_seconds",
            "Time to commit one batch to DuckDB",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.batch_rows = Histogram(
            "llmslo_ingest_batch_rows",
            "Rows per committed batch",
            buckets=(100, 1_000, 10_000, 50_000, 100_000, 250_000, 500_000, 1_000_000),
            registry=r,
        )
        self.lag = Gauge(
            "llmslo_ingest_lag_messages",
            "High-water mark minus position (approximate on the "
            "embedded broker, whose high-water marks can lag)",
            ["topic", "partition"],
            registry=r,
        )
        self.log_resets = Counter(
            "llmslo_ingest_log_resets",
            "Partitions read from their beginning because their stored offset indexed "
            "another log (broker restarted in memory, topic re-created, another cluster)",
            ["topic", "partition"],
            registry=r,
        )
        self.lake_commit_seconds = Histogram(
            "llmslo_ingest_lake_commit_seconds",
            "Time to append one batch to the Iceberg lake (retries included)",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.lake_conflicts = Counter(
            "llmslo_ingest_lake_conflicts",
            "Iceberg commits retried because another ingester committed first",
            registry=r,
        )
        self.lake_retries = Counter(
            "llmslo_ingest_lake_retries",
            "Iceberg commits retried because the object store or catalog failed or did not "
            "answer (backing off up to 5 s, for store.iceberg.retry_for_s)",
            registry=r,
        )
        self.last_commit = Gauge(
            "llmslo_ingest_last_commit_timestamp_seconds",
            "Wall time of the last DuckDB commit",
            registry=r,
        )


@dataclass
class IngestStats:
    """What one :meth:`Ingester.run` did."""

    messages: int = 0
    rows: int = 0
    deadletters: int = 0
    commits: int = 0
    rows_by_table: dict[str, int] = field(default_factory=lambda: defaultdict(int))


class _Batch:
    """Rows, dead letters and offsets consumed since the last commit."""

    def __init__(self) -> None:
        self.tables: dict[str, list[pa.Table]] = defaultdict(list)
        self.deadletters: list[DeadLetter] = []
        self.offsets: dict[tuple[str, int], StoredOffset] = {}
        self.rows = 0
        self.bytes = 0  # decoded Arrow buffers plus dead-letter payloads
        self.started_s: float | None = None
        # Metadata requested once the batch was due: it commits when the answer shows each
        # partition still on the log its records were read from.
        self.metadata: Any = None  # a kafka.future.Future
        self.metadata_requested_s = 0.0
        self.seq = 0  # its place among the batches submitted to commit

    def __bool__(self) -> bool:
        return bool(self.offsets)


class _InFlight(NamedTuple):
    """A batch whose commit runs: its lake append (with the lake) and its whole commit."""

    batch: _Batch
    in_lake: Future[float] | None
    done: Future[float]


class _HandOverAtRebalance(AsyncConsumerRebalanceListener):
    """Commits before giving partitions away and seeks to stored offsets on receiving them.

    kafka-python runs these hooks on its IO thread, where blocking Kafka calls are not
    allowed, so the Kafka round trips await the coordinator's async variants (kafka-python
    3.x API, hence the version pin in pyproject.toml). The DuckDB commit in the revoke hook
    does block that thread (heartbeats pause for its length, well under a second for a
    default batch), which ``ingest.session_timeout_ms`` must absorb.
    """

    def __init__(self, ingester: Ingester, consumer: KafkaConsumer) -> None:
        self.ingester = ingester
        self.coordinator = consumer._coordinator

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        # Hand partitions over with everything read so far committed, in DuckDB and then in
        # Kafka, so the next owner starts exactly where we stopped. Kafka gets DuckDB's
        # offsets for every revoked partition, not only this flush's: an earlier
        # asynchronous commit may have failed.
        self.ingester.rebalancing()
        self.ingester.flush(commit_to_kafka=False)
        stored = self.ingester.store.read_offsets(self.ingester.config.group_id)
        handed_over = {
            (tp.topic, tp.partition): stored[(tp.topic, tp.partition)]
            for tp in revoked
            if (tp.topic, tp.partition) in stored
        }
        if not handed_over:
            return
        try:
            await self.coordinator._commit_offsets_sync_async(
                _kafka_offsets(handed_over), timeout_ms=10_000
            )
        except KafkaError as exc:
            # E.g. another member left at the same moment (RebalanceInProgress). DuckDB
            # holds the offsets; the next owner finds them in this file once we are gone
            # (ingest.peer_stores), so failing here would only turn a clean exit into an error.
            log.warning(
                "could not hand offsets of %d partitions over to Kafka (%s); the next owner "
                "reads them from %s through ingest.peer_stores",
                len(handed_over),
                exc,
                self.ingester.store.path,
            )

    async def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        # Our session expired: another member may already read these partitions, so what
        # we hold must not be committed. Partitions we get back are re-read from DuckDB's
        # offsets on assignment, so dropping the batch in hand loses nothing.
        self.ingester.rebalancing()
        self.ingester.discard_uncommitted()

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        committed = await self.coordinator.fetch_committed_offsets_async(
            assigned, timeout_ms=10_000
        )
        self.ingester.seek_to_stored(
            assigned,
            {
                tp: StoredOffset(meta.offset, LogIdentity.from_metadata(meta.metadata))
                for tp, meta in committed.items()
            },
        )


def _kafka_offsets(
    offsets: dict[tuple[str, int], StoredOffset],
) -> dict[TopicPartition, OffsetAndMetadata]:
    """Kafka's copy of stored offsets, the log's identity in the commit's metadata."""
    return {
        TopicPartition(t, p): OffsetAndMetadata(o.next_offset, o.log.to_metadata(), -1)
        for (t, p), o in offsets.items()
    }


class Ingester:
    """Consumes llmslo's topics as one member of ``config.group_id`` into ``store``."""

    def __init__(
        self,
        bus: Bus,
        store: Store,
        config: IngestConfig,
        *,
        metrics: IngestMetrics | None = None,
        clock: Callable[[], float] = time.time,
        instance_id: str | None = None,
        after_commit: Callable[[int], None] | None = None,
        lake: IcebergLake | None = None,
    ) -> None:
        self.bus = bus
        self.store = store
        self.config = config
        self.metrics = metrics or IngestMetrics()
        self.clock = clock
        self.instance_id = instance_id
        # Called on the commit thread with the count of DuckDB commits so far, after a batch
        # is in the file and before Kafka hears of it: where the exactly-once tests crash.
        self.after_commit = after_commit
        # The Iceberg lake (store.lake: iceberg): each batch is appended there, with its
        # offsets, before DuckDB's commit; a partition resumes at the table's offset too.
        self.lake = lake
        self._duckdb_commits = 0
        self.stats = IngestStats()
        self._stop = threading.Event()
        self._batch = _Batch()
        # DuckDB commits run on their own thread (DuckDB releases the GIL), so fetching and
        # decoding the next batch overlaps the commit of this one. With the Iceberg lake, its
        # appends run on a second thread, in batch order, each before its batch's DuckDB
        # commit: batch N+1's append overlaps batch N's DuckDB commit (the lake may be one
        # batch ahead of DuckDB, as after a SIGKILL between the two; the next owner resumes
        # from the lake). At most two batches are in flight, the newer one only once the
        # older one is in the lake.
        self._committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="duckdb-commit")
        self._lake_committer = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="lake-commit")
            if lake is not None
            else None
        )
        self._in_flight: deque[_InFlight] = deque()
        # The first batch (by seq) whose commit stage failed: no later batch reaches the lake
        # or DuckDB after it; an earlier one still commits (its append is already in the lake).
        self._failed_seq: int | None = None
        self._failed_lock = threading.Lock()
        self._submitted = 0
        self._consumer: KafkaConsumer | None = None
        self._deadletter_producer: BusProducer | None = None
        self._failure: StoreError | None = None
        self._reasons_logged: set[str] = set()
        self._last_activity_s = time.monotonic()
        self._joined = False  # idle time counts only once the group has assigned us partitions
        # Per assigned partition: the log it is read from, and the next offset DuckDB holds
        # for it (None: the log's beginning), where it rewinds to when another's log changes.
        self._logs: dict[tuple[str, int], LogIdentity] = {}
        self._positions: dict[tuple[str, int], int | None] = {}
        # Offsets identity could not confirm, to check against the end; written by the
        # rebalance hook on kafka-python's IO thread, read by the consuming thread.
        self._unconfirmed: dict[TopicPartition, int] = {}
        self._beyond_end: set[TopicPartition] = set()
        self._offsets_lock = threading.Lock()
        self._next_log_check_s = 0.0

    @property
    def topics(self) -> list[str]:
        """The topics consumed: every record schema's (never the dead-letter topic)."""
        return sorted({self.bus.prefix + schema.topic for schema in iter_schemas()})

    def stop(self) -> None:
        """Ask :meth:`run` to commit what it holds and return (safe from a signal handler)."""
        self._stop.set()

    def rebalancing(self) -> None:
        """The group is reassigning partitions: until it assigns ours, this is no idleness
        (a member that left mid-rebalance on the embedded broker stalled the others)."""
        self._joined = False

    def run(self, *, max_idle_s: float | None = None) -> IngestStats:
        """Consume until :meth:`stop` (or ``max_idle_s`` without a message); returns stats."""
        extra = {"group_instance_id": self.instance_id} if self.instance_id else {}
        consumer = self.bus.consumer(
            self.config.group_id,
            session_timeout_ms=self.config.session_timeout_ms,
            fetch_max_bytes=self.config.fetch_max_bytes,
            max_partition_fetch_bytes=self.config.fetch_max_bytes // 2,
            heartbeat_interval_ms=max(500, self.config.session_timeout_ms // 10),
            **extra,
        )
        self._consumer = consumer
        consumer.subscribe(self.topics, listener=_HandOverAtRebalance(self, consumer))
        # Idle time counts from the last message or partition assignment: joining a group
        # takes seconds (about 5 s on the embedded broker) and is not idleness.
        try:
            while not self._stop.is_set():
                polled = consumer.poll(timeout_ms=100)
                for tp, messages in polled.items():
                    for message in messages:
                        self._take(tp, message)
                        self._advance_commits()  # one poll can hold thousands of messages
                    self._last_activity_s = time.monotonic()
                self._advance_commits()
                self._check_unconfirmed()
                idle_s = time.monotonic() - self._last_activity_s
                if max_idle_s is not None and self._joined and idle_s > max_idle_s:
                    break
            self.flush()
        finally:
            # Closing runs the revoke hook (hand-over commits), so the committer lives on
            # until the consumer is closed.
            try:
                consumer.close(autocommit=False)
            finally:
                self._consumer = None
                self._committer.shutdown(wait=True)
                if self._lake_committer is not None:
                    self._lake_committer.shutdown(wait=True)
                if self._deadletter_producer is not None:
                    self._deadletter_producer.close()
        if self._failure is not None:
            raise self._failure
        return self.stats

    def _take(self, tp: TopicPartition, message: Any) -> None:  # a kafka ConsumerRecord
        batch = self._batch
        if batch.started_s is None:
            batch.started_s = time.monotonic()
        value: bytes | None = message.value
        headers = message.headers or []
        self.stats.messages += 1
        self.metrics.messages.labels(tp.topic).inc()
        try:
            decoded = decode_message(
                value,
                headers,
                max_bytes=self.config.max_message_bytes,
                max_decoded_bytes=self.config.max_decoded_bytes,
            )
        except Exception as exc:  # never raise into the stream: dead-letter and count
            reason = exc.reason if isinstance(exc, DecodeError) else "decode_crash"
            self._log_deadletter(reason, tp, message.offset, exc)
            # Keep only what the table and the topic take: a 64 MiB message must not be
            # held until its batch commits.
            kept = value[:DEADLETTER_PAYLOAD_LIMIT] if value is not None else None
            batch.bytes += len(kept or b"")
            batch.deadletters.append(
                DeadLetter(
                    received_ts_ms=int(self.clock() * 1000),
                    topic=tp.topic,
                    partition=tp.partition,
                    offset=message.offset,
                    key=message.key,
                    reason=reason,
                    error=str(exc) or type(exc).__name__,
                    headers=headers,
                    payload=kept,
                    payload_bytes=len(value or b""),
                )
            )
        else:
            if decoded.table.num_rows:
                batch.tables[decoded.schema.table].append(decoded.table)
                batch.rows += decoded.table.num_rows
                batch.bytes += decoded.table.nbytes
        key = (tp.topic, tp.partition)
        batch.offsets[key] = StoredOffset(message.offset + 1, self._logs.get(key, LogIdentity()))

    def _log_deadletter(self, reason: str, tp: TopicPartition, offset: int, exc: Exception) -> None:
        """Log the first dead letter of each reason loudly, the rest quietly (all are counted)."""
        first = reason not in self._reasons_logged
        self._reasons_logged.add(reason)
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "dead-lettering %s[%d]@%d (%s): %s%s",
            tp.topic,
            tp.partition,
            offset,
            reason,
            exc,
            "; further dead letters of this reason are logged at DEBUG" if first else "",
        )

    def _batch_due(self) -> bool:
        batch = self._batch
        if not batch:
            return False
        age_ms = (time.monotonic() - (batch.started_s or 0.0)) * 1000
        return (
            batch.rows >= self.config.batch_max_rows
            or batch.bytes >= self.config.batch_max_bytes
            or age_ms >= self.config.batch_max_ms
        )

    def _advance_commits(self) -> None:
        """Collect a finished commit; start the next one when the batch in hand is due."""
        while self._in_flight and self._in_flight[0].done.done():
            self._collect()
        if not self._batch_due():
            return
        if not self._logs_confirmed():
            if not self._over_bound():
                return
            # Backpressure: the confirming metadata arrives on kafka-python's IO thread,
            # while one poll's messages are taken in microseconds; read no further than the
            # bound until it is here (or its timeout lets the batch commit unconfirmed).
            self._await_metadata()
            if not self._logs_confirmed():
                return
        if not self._can_submit() and self._over_bound():
            # Backpressure: the commits are behind, so stop reading ahead.
            newest = self._in_flight[-1].in_lake
            if len(self._in_flight) == 1 and newest is not None:
                wait([newest])
            else:
                self._collect()
        if self._can_submit():
            self._submit()

    def _can_submit(self) -> bool:
        """Whether the batch in hand may start committing: nothing in flight, or one batch
        whose lake append succeeded (its DuckDB commit may still run)."""
        if not self._in_flight:
            return True
        newest = self._in_flight[-1].in_lake
        return (
            len(self._in_flight) == 1
            and newest is not None
            and newest.done()
            and newest.exception() is None
        )

    def _over_bound(self) -> bool:
        """The batch in hand holds twice what makes it due: read no further until it goes."""
        batch, config = self._batch, self.config
        return batch.rows >= 2 * config.batch_max_rows or batch.bytes >= 2 * config.batch_max_bytes

    def _await_metadata(self) -> None:
        """Wait for the metadata update :meth:`_logs_confirmed` asked for, within its timeout."""
        batch = self._batch
        if batch.metadata is None or batch.metadata.is_done:
            return
        arrived = threading.Event()
        batch.metadata.add_both(lambda _: arrived.set())
        waited_s = time.monotonic() - batch.metadata_requested_s
        arrived.wait(max(0.0, LOG_CONFIRM_TIMEOUT_S - waited_s))

    def _submit(self) -> None:
        if self._failure is not None:
            return  # never commit past a batch that failed: its rows would be lost
        batch, self._batch = self._batch, _Batch()
        if not batch:
            return
        batch.seq, self._submitted = self._submitted, self._submitted + 1
        in_lake = (
            self._lake_committer.submit(self._stage, self._append_to_lake, batch)
            if self._lake_committer is not None
            else None
        )
        done = self._committer.submit(self._stage, self._commit, batch, in_lake)
        self._in_flight.append(_InFlight(batch, in_lake, done))

    def _stage(self, stage: Callable[..., float], batch: _Batch, *args: Any) -> float:
        """Run one commit stage of ``batch``; a failure stops every later batch's stages."""
        try:
            return stage(batch, *args)
        except BaseException:
            with self._failed_lock:
                if self._failed_seq is None or batch.seq < self._failed_seq:
                    self._failed_seq = batch.seq
            raise

    def _refuse_after_a_failure(self, batch: _Batch) -> None:
        """Refuse a stage of ``batch`` once an earlier batch's stage has failed (a later
        batch's failure does not stop it: the lake may already hold ``batch``)."""
        with self._failed_lock:
            failed = self._failed_seq
        if failed is not None and failed < batch.seq:
            raise StoreError("not committed: the commit of an earlier batch failed")

    def _append_to_lake(self, batch: _Batch) -> float:
        assert self.lake is not None
        self._refuse_after_a_failure(batch)
        report = self.lake.append_batch(batch.tables, batch.offsets, should_stop=self._stop.is_set)
        self.metrics.lake_commit_seconds.observe(report.seconds)
        self.metrics.lake_conflicts.inc(report.conflicts)
        self.metrics.lake_retries.inc(report.retries)
        return report.seconds

    def _commit(self, batch: _Batch, in_lake: Future[float] | None) -> float:
        started = time.perf_counter()
        if in_lake is not None:
            in_lake.result()  # the lake first: a failed append raises here
        self._refuse_after_a_failure(batch)
        self.store.commit_batch(
            batch.tables,
            group_id=self.config.group_id,
            offsets=batch.offsets,
            deadletters=batch.deadletters,
            now_ts_ms=int(self.clock() * 1000),
        )
        self._duckdb_commits += 1
        if self.after_commit is not None:
            self.after_commit(self._duckdb_commits)
        return time.perf_counter() - started

    def _collect(self, *, commit_to_kafka: bool = True) -> dict[tuple[str, int], StoredOffset]:
        """Wait for the oldest commit in flight; then count it, dead-letter and tell Kafka."""
        if not self._in_flight:
            return {}
        batch, _, future = self._in_flight.popleft()
        try:
            seconds = future.result()
        except StoreError as exc:
            # Stop without committing anything after this batch (offsets would skip its
            # rows); run() re-raises once the consumer is closed. A restart re-reads it.
            if self._failure is None:  # a later batch's error only repeats it
                log.error("stopping: %s", exc)
                self._failure = exc
            self._stop.set()
            return {}
        self.metrics.commit_seconds.observe(seconds)
        self.metrics.last_commit.set(self.clock())
        self.metrics.batch_rows.observe(batch.rows)
        for name, parts in batch.tables.items():
            rows = sum(part.num_rows for part in parts)
            self.metrics.rows.labels(name).inc(rows)
            self.stats.rows_by_table[name] += rows
        for letter in batch.deadletters:
            self.metrics.deadletters.labels(letter.reason).inc()
        self.stats.rows += batch.rows
        self.stats.deadletters += len(batch.deadletters)
        self.stats.commits += 1
        for key, stored in batch.offsets.items():
            if key in self._positions:
                self._positions[key] = stored.next_offset
        self._publish_deadletters(batch.deadletters)
        if commit_to_kafka:
            self._commit_to_kafka(batch.offsets)
        return batch.offsets

    def discard_uncommitted(self) -> None:
        """Drop the batch in hand (after the commits in flight end): its partitions are lost."""
        self._collect_all(commit_to_kafka=False)
        self._batch = _Batch()

    def flush(self, *, commit_to_kafka: bool = True) -> dict[tuple[str, int], StoredOffset]:
        """Make everything read so far durable: rows + dead letters + offsets, in DuckDB.

        Returns the offsets committed. Kafka's copy of them is committed afterwards, without
        waiting, unless ``commit_to_kafka`` is false (the rebalance hook commits it itself).
        """
        offsets = self._collect_all(commit_to_kafka=commit_to_kafka)
        self._submit()
        return offsets | self._collect_all(commit_to_kafka=commit_to_kafka)

    def _collect_all(self, *, commit_to_kafka: bool) -> dict[tuple[str, int], StoredOffset]:
        """Collect every commit in flight, oldest first; their offsets, newest winning."""
        offsets: dict[tuple[str, int], StoredOffset] = {}
        while self._in_flight:
            offsets |= self._collect(commit_to_kafka=commit_to_kafka)
        return offsets

    def _publish_deadletters(self, letters: list[DeadLetter]) -> None:
        """Re-publish dead letters to their topic for inspection and replay (best effort)."""
        if not letters:
            return
        if self._deadletter_producer is None:
            self._deadletter_producer = self.bus.producer(linger_ms=0)
        for letter in letters:
            payload = letter.payload or b""
            headers = [(k, v or b"") for k, v in letter.headers]
            headers += [
                ("llmslo-deadletter-reason", letter.reason.encode()),
                ("llmslo-source", f"{letter.topic}/{letter.partition}/{letter.offset}".encode()),
            ]
            received_bytes = max(len(payload), letter.payload_bytes or 0)
            payload = payload[:DEADLETTER_PAYLOAD_LIMIT]  # the topic refuses what the source let in
            if received_bytes > len(payload):
                headers.append(("llmslo-payload-bytes", str(received_bytes).encode()))
            try:
                self._deadletter_producer.send_raw(
                    DEADLETTER_TOPIC, payload, key=letter.key, headers=headers
                )
            except KafkaError as exc:  # the table already holds it; the topic copy is a courtesy
                log.warning("could not re-publish a dead letter to %s: %s", DEADLETTER_TOPIC, exc)

    def _commit_to_kafka(self, offsets: dict[tuple[str, int], StoredOffset]) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        assigned = consumer.assignment()
        owned = {tp: meta for tp, meta in _kafka_offsets(offsets).items() if tp in assigned}
        if owned:
            # Best effort: DuckDB already holds the truth; Kafka's copy serves lag and hand-over.
            consumer.commit_async(owned)
        for tp, meta in owned.items():
            highwater = consumer.highwater(tp)
            if highwater is not None:
                self.metrics.lag.labels(tp.topic, str(tp.partition)).set(
                    max(0, highwater - meta.offset)
                )

    def seek_to_stored(
        self, assigned: set[TopicPartition], committed: dict[TopicPartition, StoredOffset]
    ) -> None:
        """Position each newly assigned partition at the greatest offset known for its log.

        DuckDB's offset is ours and exact; Kafka's is newer when another group member owned
        the partition since (it commits to Kafka on hand-over); a dead member's file
        (``ingest.peer_stores``) is newer than Kafka when it crashed between its DuckDB and
        Kafka commits; the Iceberg lake's (``lake``) is the newest of all when a member
        crashed after its Iceberg commit. Offsets are the source of truth in each file, so
        the union of the files holds every record once, and so does the lake. Offsets of another log than the broker's are
        discarded (:func:`pipeline._offsets.choose_start`).
        """
        self._last_activity_s = time.monotonic()
        self._joined = True
        consumer = self._consumer
        if consumer is None or not assigned:
            return
        stored = self.store.read_offsets(self.config.group_id)
        peers = read_peer_offsets(
            self.config.peer_stores, self.config.group_id, own_path=self.store.path
        )
        try:
            in_lake = self.lake.read_offsets() if self.lake is not None else {}
        except StoreError as exc:
            # Without the lake's offsets a partition could start before what the lake holds:
            # commit nothing and stop (run() re-raises); a restart asks the lake again.
            log.error("stopping: %s", exc)
            self._failure = exc
            self._stop.set()
            return
        for tp in assigned:
            key = (tp.topic, tp.partition)
            current = log_identity(consumer._client.cluster, tp.topic)
            candidates = [stored.get(key), committed.get(tp), in_lake.get(key), *peers.get(key, [])]
            decision = choose_start(candidates, current)
            self._logs[key] = current
            self._positions[key] = decision.offset
            with self._offsets_lock:
                self._beyond_end.discard(tp)
                self._unconfirmed.pop(tp, None)
                if decision.unconfirmed and decision.offset is not None:
                    self._unconfirmed[tp] = decision.offset
            if decision.offset is None:
                consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, decision.offset)
            if decision.reset:
                self._count_reset(tp, f"stored offsets index another log than {current}")
            log.info(
                "partition %s[%d] starts at offset %s",
                tp.topic,
                tp.partition,
                "the beginning" if decision.offset is None else decision.offset,
            )

    def _count_reset(self, tp: TopicPartition, why: str) -> None:
        self.metrics.log_resets.labels(tp.topic, str(tp.partition)).inc()
        log.warning(
            "partition %s[%d] is a new log (%s): reading it from its beginning",
            tp.topic,
            tp.partition,
            why,
        )

    def _logs_confirmed(self) -> bool:
        """True once metadata asked for after the batch was due shows every partition still
        on the log its records came from; a changed log restarts instead (False).

        Fetches name topics, not topic ids, so a topic re-created under the consumer is read
        at the old log's positions until the metadata shows its new id: checking before each
        commit keeps such records out of DuckDB (the embedded broker raises no error there).
        """
        consumer, batch = self._consumer, self._batch
        if consumer is None:
            return True
        cluster = consumer._client.cluster
        if batch.metadata is None:
            batch.metadata, batch.metadata_requested_s = cluster.request_update(), time.monotonic()
            return False
        if not batch.metadata.is_done:
            if time.monotonic() - batch.metadata_requested_s < LOG_CONFIRM_TIMEOUT_S:
                return False
            log.warning("no metadata within %.0f s: committing unconfirmed", LOG_CONFIRM_TIMEOUT_S)
            return True
        changed = {
            tp: current
            for tp in consumer.assignment()
            if self._logs.get((tp.topic, tp.partition), LogIdentity()).is_other(
                current := log_identity(cluster, tp.topic)
            )
        }
        if changed:
            self._restart_logs(consumer, changed)
            return False
        return True

    def _restart_logs(
        self, consumer: KafkaConsumer, changed: dict[TopicPartition, LogIdentity]
    ) -> None:
        """Read ``changed`` partitions from their new log's beginning.

        The batch in hand may hold records read from a new log at the old log's positions,
        so it is dropped and every assigned partition rewinds to what DuckDB holds. (A batch
        committed without confirmation, by a flush at hand-over or shutdown, can hold such
        records: they are then stored twice.)
        """
        self.discard_uncommitted()
        for tp in consumer.assignment():
            key = (tp.topic, tp.partition)
            position = self._positions.get(key)
            if tp in changed:
                was = self._logs.get(key)
                self._logs[key], self._positions[key] = changed[tp], None
                with self._offsets_lock:
                    self._unconfirmed.pop(tp, None)
                consumer.seek_to_beginning(tp)
                self._count_reset(tp, f"its log changed from {was} to {changed[tp]}")
            elif position is None:
                consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, position)

    def _check_unconfirmed(self) -> None:
        """Offsets identity could not confirm: beyond the end twice, BEYOND_END_RECHECK_S
        apart, means a new log; within it, the offset is the log's.

        The end is the greater of ListOffsets' answer and the high-water mark of the last
        fetch: the embedded broker on its durable log answers ListOffsets with a stale end
        (its first batch's), while its fetches report the true one. Kafka's copy of an
        offset is unconfirmed there (the broker keeps no commit metadata), so a hand-over
        would otherwise be taken for a new log and read again from the beginning."""
        consumer, now_s = self._consumer, time.monotonic()
        if consumer is None or now_s < self._next_log_check_s:
            return
        with self._offsets_lock:
            assigned = consumer.assignment()
            pending = {tp: o for tp, o in self._unconfirmed.items() if tp in assigned}
        if not pending:
            return
        # The end is the high watermark of the consumer's own fetch answers, not ListOffsets:
        # the embedded broker (Tansu 0.6) answers ListOffsets with its last record batch's
        # base offset + 1, so an offset at the true end looked beyond it and its records
        # were read twice. No fetch answer yet: checked again.
        ends = {tp: consumer.highwater(tp) for tp in pending}
        with self._offsets_lock:
            for tp, offset in pending.items():
                end = ends[tp]
                if self._unconfirmed.get(tp) != offset or end is None:
                    continue  # re-assigned meanwhile, or not fetched yet
                if offset <= end:
                    del self._unconfirmed[tp]
                elif tp in self._beyond_end:
                    del self._unconfirmed[tp]
                    self._positions[(tp.topic, tp.partition)] = None
                    consumer.seek_to_beginning(tp)
                    self._count_reset(tp, f"its stored offset {offset} is beyond its end {end}")
                else:
                    self._beyond_end.add(tp)
        self._next_log_check_s = now_s + BEYOND_END_RECHECK_S
