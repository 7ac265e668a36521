"""The Kafka ``flags`` topic as a :class:`collectors.tap.degradation.FlagSource`.

Reads the whole topic from the beginning (it is small: one row per level change, kept
forever), without a consumer group (every tap needs every transition; no offsets to
store). Liveness is probed with a bounded offsets request each poll, because kafka-python's
``poll`` returns nothing, silently, while the broker is gone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kafka.errors import KafkaError
from kafka.structs import TopicPartition

from collectors.tap.degradation import FlagPoll, FlagSourceError
from pipeline.bus import Bus
from pipeline.codec import DecodeError, decode_message
from pipeline.schema import FLAG_TRANSITIONS, JOBS_HEARTBEATS

__all__ = ["KafkaFlagSource"]

log = logging.getLogger(__name__)


class KafkaFlagSource:
    """Transition and jobs heartbeat rows from ``<prefix>flags``; raises ``FlagSourceError``
    while unreachable. Other record kinds on the topic are skipped (counted)."""

    def __init__(
        self,
        bus: Bus,
        *,
        probe_timeout_s: float = 2.0,
        on_drop: Callable[[str], None] | None = None,
    ) -> None:
        """``on_drop(reason)`` counts each message skipped (undecodable, another schema)."""
        self.topic = bus.prefix + FLAG_TRANSITIONS.topic
        self.consumer = bus.consumer(None, request_timeout_ms=int(probe_timeout_s * 1000) + 500)
        self._probe_ms = int(probe_timeout_s * 1000)
        self._partitions: list[TopicPartition] = []
        self._undecodable = 0
        self._on_drop = on_drop

    def _assign(self) -> None:
        ids = self.consumer.partitions_for_topic(self.topic)
        if not ids:
            return  # not created yet: nothing published, which is level 0 everywhere
        self._partitions = [TopicPartition(self.topic, p) for p in sorted(ids)]
        self.consumer.assign(self._partitions)
        self.consumer.seek_to_beginning(*self._partitions)

    def poll(self, timeout_s: float) -> FlagPoll:
        try:
            if not self._partitions:
                self._assign()
                if not self._partitions:
                    # Reachable (the metadata request answered) but no topic yet.
                    self.consumer.topics()
                    return FlagPoll()
            batches = self.consumer.poll(timeout_ms=int(timeout_s * 1000))
            self.consumer.end_offsets(self._partitions, timeout_ms=self._probe_ms)
        except KafkaError as exc:
            raise FlagSourceError(f"{self.topic}: {type(exc).__name__}: {exc}") from exc
        poll = FlagPoll()
        for messages in batches.values():
            for message in messages:
                try:
                    decoded = decode_message(message.value, message.headers)
                except DecodeError as exc:
                    self._undecodable += 1
                    if self._undecodable == 1:
                        log.warning("flags message at offset %s skipped: %s", message.offset, exc)
                    if self._on_drop is not None:
                        self._on_drop("undecodable_flag")
                    continue
                if decoded.schema.name == FLAG_TRANSITIONS.name:
                    poll.transitions.extend(decoded.table.to_pylist())
                elif decoded.schema.name == JOBS_HEARTBEATS.name:
                    poll.heartbeats.extend(decoded.table.to_pylist())
                elif self._on_drop is not None:
                    self._on_drop("unexpected_flag_schema")
        return poll

    def close(self) -> None:
        self.consumer.close()
