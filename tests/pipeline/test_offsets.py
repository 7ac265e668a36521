"""Where an assigned partition resumes, given the offsets stored for it and its log now."""

from __future__ import annotations

import pytest

from pipeline.ingest import choose_start
from pipeline.store import LogIdentity, StoredOffset

NOW = LogIdentity("tansu_cluster", "topic-b")
OLD_TOPIC = LogIdentity("tansu_cluster", "topic-a")
OTHER_CLUSTER = LogIdentity("prod-eu", None)
UNKNOWN = LogIdentity()

CASES = [
    ("nothing stored: the beginning, no reset", [], (None, False, False)),
    ("the same log: its offset, confirmed", [StoredOffset(40, NOW)], (40, False, False)),
    (
        "a re-created topic: the beginning, a reset",
        [StoredOffset(40, OLD_TOPIC)],
        (None, True, False),
    ),
    (
        "another cluster: the beginning, a reset",
        [StoredOffset(40, OTHER_CLUSTER)],
        (None, True, False),
    ),
    (
        "no identity stored: its offset, checked against the end",
        [StoredOffset(40, UNKNOWN)],
        (40, False, True),
    ),
    (
        "another log's greater offset loses to this log's",
        [StoredOffset(90, OLD_TOPIC), StoredOffset(12, NOW)],
        (12, False, False),
    ),
    (
        "the greatest of this log's offsets wins",
        [StoredOffset(12, NOW), StoredOffset(30, NOW), None],
        (30, False, False),
    ),
]


@pytest.mark.parametrize(("stored", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_choose_start(stored: list[StoredOffset | None], expected: tuple[object, ...]) -> None:
    decision = choose_start(stored, NOW)
    assert (decision.offset, decision.reset, decision.unconfirmed) == expected


@pytest.mark.parametrize("text", ["", "not json", "[1]", '{"topic_id": 5}'])
def test_foreign_commit_metadata_is_an_unknown_log(text: str) -> None:
    assert LogIdentity.from_metadata(text) == UNKNOWN


def test_commit_metadata_round_trips_the_identity() -> None:
    assert LogIdentity.from_metadata(NOW.to_metadata()) == NOW
