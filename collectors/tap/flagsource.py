"""The Kafka ``flags`` topic as a :class:`collectors.tap.degradation.FlagSource`.

Reads the whole topic from the beginning (it is small: one row per level change, kept
forever), without a consumer group (every tap needs every transition; no offsets to
store). Liveness is probed with a bounded offsets request each poll, because kafka-python's
``poll`` returns nothing, silently, while the broker is gone.

The SLO jobs publish the topic in the wire format's JSON form, and a JSON message is read
here in plain Python: decoding it through :func:`pipeline.codec.decode_message` builds an
Arrow table, and loading pyarrow, numpy and pandas for the first heartbeat took a tap from
56 to 179 MiB of RSS. The reader checks what it takes and nothing else: the columns the
follower reads (types, required) and the schema's value rules on every column present;
other columns are not type-checked (the ingester, which stores the rows, decodes them
strictly). Another kind of record is skipped from its headers, never decoded. An Arrow
flags message (an older jobs process) is still decoded by ``decode_message``, loading
pyarrow then.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

from kafka.errors import KafkaError
from kafka.structs import TopicPartition

from collectors.tap.degradation import FlagPoll, FlagSourceError
from pipeline.bus import Bus
from pipeline.codec import (
    DEFAULT_MAX_MESSAGE_BYTES,
    JSON_CONTENT_TYPE,
    DecodeError,
    decode_message,
    message_kind,
)
from pipeline.schema import FLAG_TRANSITIONS, JOBS_HEARTBEATS, RecordSchema, value_rules

__all__ = ["KafkaFlagSource", "read_json_rows"]

log = logging.getLogger(__name__)

#: The columns the follower reads, by schema name: column → (required, accepted types).
_READ: dict[str, dict[str, tuple[bool, tuple[type, ...]]]] = {
    FLAG_TRANSITIONS.name: {
        "ts_ms": (True, (int,)),
        "scope": (True, (str,)),
        "scope_id": (True, (str,)),
        "to_level": (True, (int,)),
    },
    JOBS_HEARTBEATS.name: {"ts_ms": (True, (int,)), "interval_s": (False, (int, float))},
}


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _check(schema: RecordSchema, row: Mapping[str, Any]) -> None:
    """Raise :class:`DecodeError` unless ``row`` has the columns the follower reads, typed
    right (``missing_required``, ``schema_mismatch``), and keeps the schema's value rules
    on every column present (``invalid_value``)."""
    where = f"{schema.name}.v{schema.version}"
    for column, (required, types) in _READ[schema.name].items():
        value = row.get(column)
        if value is None:
            if required:
                raise DecodeError("missing_required", f"{where}: column {column!r} is missing")
        elif isinstance(value, bool) or not isinstance(value, types):
            kind = type(value).__name__
            raise DecodeError("schema_mismatch", f"{where}: column {column!r} is {kind}")
    for rule in value_rules(schema):
        value = row.get(rule.column)
        if value is None:
            continue
        if rule.allowed is not None:
            broken = value not in rule.allowed
        else:
            broken = (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or math.isnan(value)
                or (rule.minimum is not None and value < rule.minimum)
                or (rule.maximum is not None and value > rule.maximum)
            )
        if broken:
            raise DecodeError("invalid_value", f"{where}: {rule.column} {rule.describe()}")


def read_json_rows(schema: RecordSchema, value: bytes | None) -> list[dict[str, Any]]:
    """The rows of a JSON flags message, without Arrow; :class:`DecodeError` if malformed."""
    if value is None:
        raise DecodeError("empty", "message has no value (tombstone)")
    if len(value) > DEFAULT_MAX_MESSAGE_BYTES:
        raise DecodeError("oversized", f"message of {len(value)} bytes")
    try:
        parsed = json.loads(value, parse_constant=_reject_constant)
    except (RecursionError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise DecodeError("not_json", f"payload is not valid JSON: {str(exc)[:200]}") from exc
    rows = [parsed] if isinstance(parsed, dict) else parsed
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise DecodeError("not_json", "JSON payload must be an object or an array of objects")
    for row in rows:
        _check(schema, row)
    return rows


def _decode(value: bytes | None, headers: Any) -> tuple[str, list[dict[str, Any]]]:
    """A flags message's schema name and rows; :class:`DecodeError` if it cannot be read."""
    schema, media_type = message_kind(headers)
    if schema.name not in _READ:
        return schema.name, []  # another kind of record: skipped (counted), never decoded
    if media_type == JSON_CONTENT_TYPE:
        return schema.name, read_json_rows(schema, value)
    decoded = decode_message(value, headers)
    return decoded.schema.name, decoded.table.to_pylist()


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
                    name, rows = _decode(message.value, message.headers)
                except DecodeError as exc:
                    self._undecodable += 1
                    if self._undecodable == 1:
                        log.warning("flags message at offset %s skipped: %s", message.offset, exc)
                    if self._on_drop is not None:
                        self._on_drop("undecodable_flag")
                    continue
                if name == FLAG_TRANSITIONS.name:
                    poll.transitions.extend(rows)
                elif name == JOBS_HEARTBEATS.name:
                    poll.heartbeats.extend(rows)
                elif self._on_drop is not None:
                    self._on_drop("unexpected_flag_schema")
        return poll

    def close(self) -> None:
        self.consumer.close()
