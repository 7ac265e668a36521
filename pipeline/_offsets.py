"""Stored offsets and the identity of the log they index.

An offset means something only in one log: a restarted in-memory broker, a topic deleted
and re-created, or a move to another cluster starts a new log whose offsets restart at 0.
Each stored offset therefore carries the log's identity as the broker reports it in its
metadata: the cluster id and the topic id (Kafka ≥ 2.8 and the embedded broker give every
topic a UUID, new at each creation). :func:`choose_start` decides where an assigned
partition resumes: a stored offset from another log is discarded, and the partition is
read from its beginning (a log reset).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["LogIdentity", "StartDecision", "StoredOffset", "choose_start", "log_identity"]


@dataclass(frozen=True)
class LogIdentity:
    """Which log a partition's offsets index; ``None`` fields are not known."""

    cluster_id: str | None = None
    topic_id: str | None = None

    @property
    def fields(self) -> tuple[str | None, str | None]:
        """``(cluster_id, topic_id)``, as the offsets table stores them."""
        return (self.cluster_id, self.topic_id)

    def is_other(self, current: LogIdentity) -> bool:
        """True when a field known on both sides differs: the offsets index another log."""
        return any(
            mine is not None and theirs is not None and mine != theirs
            for mine, theirs in zip(self.fields, current.fields, strict=True)
        )

    def is_same(self, current: LogIdentity) -> bool:
        """True when the topic ids are known and equal (and no known field differs)."""
        return (
            self.topic_id is not None
            and self.topic_id == current.topic_id
            and not self.is_other(current)
        )

    def to_metadata(self) -> str:
        """The identity as the metadata string of a Kafka offset commit."""
        return json.dumps({"cluster_id": self.cluster_id, "topic_id": self.topic_id})

    @classmethod
    def from_metadata(cls, text: str | None) -> LogIdentity:
        """The identity in a committed offset's metadata; unknown when absent or foreign."""
        try:
            fields = json.loads(text or "")
        except ValueError:
            return cls()
        if not isinstance(fields, dict):
            return cls()
        return cls(*(_text(fields.get(name)) for name in ("cluster_id", "topic_id")))


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def log_identity(cluster: Any, topic: str) -> LogIdentity:
    """The identity of ``topic``'s log in kafka-python's cached cluster metadata.

    The all-zero UUID is Kafka's "no id" (brokers before 2.8, unknown topics)."""
    topic_id = cluster.topic_id(topic)
    if topic_id is not None and topic_id == uuid.UUID(int=0):
        topic_id = None
    return LogIdentity(
        cluster_id=_text(cluster.cluster_id),
        topic_id=None if topic_id is None else str(topic_id),
    )


@dataclass(frozen=True)
class StoredOffset:
    """The next offset to read in one partition, and the log it indexes."""

    next_offset: int
    log: LogIdentity = LogIdentity()


@dataclass(frozen=True)
class StartDecision:
    """Where an assigned partition resumes.

    ``offset`` is ``None`` to read the log from its beginning; ``reset`` says stored
    offsets were discarded as another log's; ``unconfirmed`` says the chosen offset's log
    could not be confirmed by identity, so it is checked against the partition's end.
    """

    offset: int | None
    reset: bool = False
    unconfirmed: bool = False


def choose_start(candidates: Iterable[StoredOffset | None], current: LogIdentity) -> StartDecision:
    """The greatest stored offset of ``current``'s log among ``candidates`` (DuckDB's,
    Kafka's, the peers'); the log's beginning when every candidate is another log's."""
    known = [c for c in candidates if c is not None and c.next_offset >= 0]
    usable = [c for c in known if not c.log.is_other(current)]
    if not usable:
        return StartDecision(None, reset=bool(known))
    best = max(usable, key=lambda c: c.next_offset)
    confirmed = any(c.next_offset == best.next_offset and c.log.is_same(current) for c in usable)
    return StartDecision(best.next_offset, unconfirmed=not confirmed)
