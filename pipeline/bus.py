"""The Kafka bus: topic names, topic creation, a keyed Arrow producer and consumer settings.

A thin layer on kafka-python. Every component takes ``--bootstrap-servers HOST:PORT`` or
``embedded``; :class:`Bus` resolves ``embedded`` by starting the bundled broker and owns
it for its lifetime.

Messages are keyed by instance (``RecordSchema.key_field``) so that one instance's records
stay on one partition, in order, and ingesters can scale as one consumer group.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import KafkaError, KafkaTimeoutError, TopicAlreadyExistsError
from prometheus_client import CollectorRegistry

from pipeline._lazy import on_first_use
from pipeline.broker import BrokerMetrics, EmbeddedBroker
from pipeline.broker_address import published_address
from pipeline.codec import encode_arrow, headers_for
from pipeline.config import BusConfig, secret_from_env
from pipeline.errors import BusError
from pipeline.schema import RecordSchema, iter_schemas

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
else:
    np = on_first_use("numpy")
    pa = on_first_use("pyarrow")
    pc = on_first_use("pyarrow.compute")

__all__ = [
    "DEADLETTER_TOPIC",
    "Bus",
    "BusProducer",
    "split_by_key",
    "topic_names",
]

log = logging.getLogger(__name__)

#: Topic (without prefix) for undecodable input, with the reason in a header.
DEADLETTER_TOPIC = "deadletter"
#: Largest message our producers send and our consumers fetch (Arrow batches can be big).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def topic_names(config: BusConfig) -> list[str]:
    """Every topic llmslo uses, prefixed: one per schema plus the dead-letter topic."""
    short = [schema.topic for schema in iter_schemas()] + [DEADLETTER_TOPIC]
    return [config.topic_prefix + name for name in short]


def split_by_key(schema: RecordSchema, table: pa.Table) -> Iterator[tuple[bytes, pa.Table]]:
    """Split rows by the schema's key column, keeping row order within each key."""
    if table.num_rows == 0:
        return
    column = table.column(schema.key_field).combine_chunks()
    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
    indices = column.indices.to_numpy(zero_copy_only=False)
    if (indices == indices[0]).all():
        yield str(column.dictionary[int(indices[0])]).encode(), table
        return
    order = np.argsort(indices, kind="stable")
    sorted_keys = indices[order]
    starts = np.flatnonzero(np.diff(sorted_keys)) + 1
    for rows in np.split(order, starts):
        key = column.dictionary[int(indices[rows[0]])].as_py()
        yield str(key).encode(), table.take(pa.array(rows))


class BusProducer:
    """Publishes Arrow batches of a schema to its topic, one message per key."""

    def __init__(self, producer: KafkaProducer, prefix: str) -> None:
        self._producer = producer
        self._prefix = prefix

    def publish(self, schema: RecordSchema, table: pa.Table) -> int:
        """Send ``table`` (any rows of ``schema``); returns the number of messages queued.

        Sending is asynchronous: call :meth:`flush` to wait for the broker's acks.
        """
        messages = 0
        for key, rows in split_by_key(schema, table):
            self.send_raw(
                schema.topic, encode_arrow(schema, rows), key=key, headers=headers_for(schema)
            )
            messages += 1
        return messages

    def send_raw(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> Any:
        """Send an already-encoded payload to ``topic`` (without prefix); returns the future."""
        return self._producer.send(
            self._prefix + topic, value=value, key=key, headers=list(headers)
        )

    def flush(self, timeout_s: float | None = None) -> None:
        self._producer.flush(timeout=timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what is queued within ``timeout_s``, then stop the client's thread.

        kafka-python (3.0.12) flushes first in ``close()`` and, when no broker answers,
        raises at the flush's timeout with its network thread still running: that thread
        would log connection errors for the rest of the process's life. What was not
        delivered is dropped (and logged), and the thread stopped anyway.
        """
        try:
            self._producer.close(timeout=timeout_s)
        except KafkaTimeoutError:
            log.warning(
                "producer closed with records undelivered after %.1f s (no broker answered): "
                "they are dropped",
                timeout_s,
            )
            sender = self._producer._sender  # what close() itself force-closes after a flush
            sender.force_close()
            sender.join(timeout_s)


class Bus:
    """Connection settings for one Kafka cluster (or the embedded broker), and factories.

    ``Bus(config)`` with ``bootstrap_servers: embedded`` starts a broker when entered and
    stops it when left (its log in ``bus.embedded_data_dir``, else ``embedded_data_dir``,
    else a temporary directory; its ``llmslo_broker_*`` metrics in ``registry``); otherwise
    entering only checks that the cluster answers. With ``address_file``, the embedded
    broker's address is written there while it runs, for the pipeline's other processes to
    join (:mod:`pipeline.broker_address`; ``command`` names the owner in it).
    """

    def __init__(
        self,
        config: BusConfig,
        *,
        embedded_data_dir: Path | None = None,
        registry: CollectorRegistry | None = None,
        address_file: Path | None = None,
        command: str = "llmslo",
        source: str | None = None,
    ) -> None:
        self.config = config
        # The config's directory wins; the caller's default (beside its store) comes next.
        self._embedded_data_dir = config.embedded_data_dir or embedded_data_dir
        self._registry = registry
        self._broker: EmbeddedBroker | None = None
        self._address_file = address_file
        self._command = command
        self._source = source  # where the address came from, for the errors that name it
        self._published = contextlib.ExitStack()
        self._written = False
        self.bootstrap_servers = config.bootstrap_servers

    @property
    def embedded(self) -> bool:
        """Whether this bus runs a broker of its own (started, ``embedded``)."""
        return self._broker is not None

    @property
    def address_file(self) -> Path | None:
        """Where this bus's embedded broker's address is written while it runs (None: not
        written: no embedded broker, or another live owner's file is there)."""
        return self._address_file if self._written else None

    @property
    def where(self) -> str:
        """The address, and where it came from when the caller said so."""
        given = f" ({self._source})" if self._source else ""
        return f"{self.bootstrap_servers}{given}"

    @property
    def prefix(self) -> str:
        return self.config.topic_prefix

    def start(self) -> Bus:
        if self.config.bootstrap_servers == "embedded" and self._broker is None:
            self._broker = EmbeddedBroker(
                data_dir=self._embedded_data_dir,
                max_bytes=self.config.embedded_max_bytes,
                retention_interval_s=self.config.embedded_retention_interval_s,
                metrics=BrokerMetrics(self._registry),
            ).start()
            self.bootstrap_servers = self._broker.bootstrap_servers
            if self._address_file is not None:
                self._written = self._published.enter_context(
                    published_address(self._address_file, self.bootstrap_servers, self._command)
                )
        return self

    def stop(self) -> None:
        self._published.close()  # the address goes before the broker does
        self._written = False
        if self._broker is not None:
            self._broker.stop()
            self._broker = None

    def __enter__(self) -> Bus:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def client_settings(self) -> dict[str, Any]:
        """kafka-python settings shared by producers, consumers and the admin client."""
        if self.bootstrap_servers == "embedded":
            raise BusError("Bus.start() must run before clients are made for the embedded broker")
        settings: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers.split(","),
            "client_id": self.config.client_id,
            "security_protocol": self.config.security_protocol,
        }
        if self.config.sasl_mechanism:
            settings.update(
                sasl_mechanism=self.config.sasl_mechanism,
                sasl_plain_username=self.config.sasl_username,
                sasl_plain_password=secret_from_env(self.config.sasl_password_env),
            )
        return settings

    def ensure_topics(self, partitions: int | None = None) -> None:
        """Create every llmslo topic that does not exist yet."""
        count = partitions or self.config.partitions
        try:
            admin = KafkaAdminClient(
                **self.client_settings(), request_timeout_ms=15_000, bootstrap_timeout_ms=10_000
            )
        except KafkaError as exc:
            raise BusError(
                f"cannot reach Kafka at {self.where}: {exc}. Is it running? "
                "`llmslo run` and `llmslo broker` print the address to pass as "
                "--bootstrap-servers (or pass 'embedded' to start a broker of this process's own)"
            ) from exc
        try:
            existing = set(admin.list_topics())
            wanted = [name for name in topic_names(self.config) if name not in existing]
            for name in wanted:
                try:
                    admin.create_topics([NewTopic(name, count, 1)])
                    log.info("created topic %s with %d partitions", name, count)
                except TopicAlreadyExistsError:
                    pass  # another process won the race
        except KafkaError as exc:
            raise BusError(f"cannot create topics on {self.bootstrap_servers}: {exc}") from exc
        finally:
            admin.close()

    def producer(self, **overrides: Any) -> BusProducer:
        """A producer tuned for batched Arrow payloads (LZ4 inside the payload, acks=all)."""
        settings = self.client_settings() | {
            "acks": "all",
            "linger_ms": 5,
            "batch_size": 1024 * 1024,
            "max_request_size": MAX_MESSAGE_BYTES,
            "retries": 5,
        }
        try:
            return BusProducer(KafkaProducer(**(settings | overrides)), self.prefix)
        except KafkaError as exc:
            raise BusError(f"cannot connect a producer to {self.where}: {exc}") from exc

    def consumer(self, group_id: str | None, **overrides: Any) -> KafkaConsumer:
        """A consumer with manual offsets (llmslo stores offsets itself), not yet subscribed."""
        settings = self.client_settings() | {
            "group_id": group_id,
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
            "fetch_max_wait_ms": 100,
            "max_partition_fetch_bytes": MAX_MESSAGE_BYTES,
            # One fetch holds at most two large messages in memory (the RSS bound counts it).
            "fetch_max_bytes": 2 * MAX_MESSAGE_BYTES,
            "max_poll_records": 2000,
        }
        try:
            return KafkaConsumer(**(settings | overrides))
        except KafkaError as exc:
            raise BusError(f"cannot connect a consumer to {self.where}: {exc}") from exc
