"""SseFramer: whole events out, every byte preserved, whatever the chunking."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectors.tap.sse import SseEvent, SseFramer
from tests.collectors.tap.fakes import chat_events


def feed_all(framer: SseFramer, pieces: list[bytes]) -> list[SseEvent]:
    events: list[SseEvent] = []
    for piece in pieces:
        events += framer.feed(piece)
    return events + framer.close()


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


STREAM = b"".join(chat_events(6)) + b": keep-alive\n\n"


def test_events_are_framed_and_data_parsed() -> None:
    events = feed_all(SseFramer(), [STREAM])
    datas = [e.data for e in events]
    assert datas[-2] == b"[DONE]" and datas[-1] is None  # the comment-only event
    assert len(events) == len(chat_events(6)) + 1
    assert b"".join(e.raw for e in events) == STREAM


@pytest.mark.parametrize(
    "terminator", [b"\n", b"\r\n", b"\r"], ids=["LF lines", "CRLF lines", "CR lines"]
)
def test_every_line_terminator_of_the_spec_is_understood(terminator: bytes) -> None:
    text = (
        b"event: msg" + terminator + b"data: a" + terminator + b"data: b" + terminator + terminator
    )
    events = feed_all(SseFramer(), [bytes([b]) for b in text])  # one byte at a time
    assert [(e.data, e.name) for e in events] == [(b"a\nb", b"msg")]
    assert b"".join(e.raw for e in events) == text


def test_a_cr_split_from_its_lf_across_chunks_is_not_a_blank_line() -> None:
    events = feed_all(SseFramer(), [b"data: x\r", b"\ndata: y\r", b"\n\r\n"])
    assert [e.data for e in events] == [b"x\ny"]


def test_an_oversized_event_is_forwarded_in_pieces_without_being_held() -> None:
    framer = SseFramer(max_event_bytes=1024)
    big = b"data: " + b"x" * 100_000 + b"\n\n"
    pieces = split_at(big + b"data: [DONE]\n\n", list(range(0, 120_000, 4096)))
    events = []
    for piece in pieces:
        events += framer.feed(piece)
        assert framer.pending_bytes <= 1024 + 4096
    assert framer.close() == []
    assert b"".join(e.raw for e in events) == big + b"data: [DONE]\n\n"
    assert all(e.oversized for e in events[:-1])
    assert events[-1].data == b"[DONE]" and framer.oversized_events == 1


def test_unterminated_tail_is_returned_undispatched() -> None:
    framer = SseFramer()
    assert framer.feed(b'data: {"a":') == []
    [tail] = framer.close()
    assert tail.raw == b'data: {"a":' and tail.data is None


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=40))
def test_any_rechunking_gives_the_same_events_and_bytes(cuts: list[int]) -> None:
    reference = feed_all(SseFramer(), [STREAM])
    events = feed_all(SseFramer(), split_at(STREAM, cuts))
    assert [(e.data, e.name) for e in events] == [(e.data, e.name) for e in reference]
    assert b"".join(e.raw for e in events) == STREAM


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=2000)
    | st.lists(
        st.sampled_from(
            [
                b"data: ",
                b"data:",
                b"\n",
                b"\r",
                b"\r\n",
                b": c",
                b"event: e",
                b"{}",
                b"[DONE]",
                b"x" * 50,
            ]
        ),
        max_size=60,
    ).map(b"".join),
    cuts=st.lists(st.integers(min_value=0, max_value=3000), max_size=20),
)
def test_hostile_bytes_never_raise_and_are_preserved(data: bytes, cuts: list[int]) -> None:
    framer = SseFramer(max_event_bytes=1024)
    events = feed_all(framer, split_at(data, cuts))
    assert b"".join(e.raw for e in events) == data
    reference = feed_all(SseFramer(max_event_bytes=1024), [data])
    assert [e.data for e in events if not e.oversized] == [
        e.data for e in reference if not e.oversized
    ]
