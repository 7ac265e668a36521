"""The remote-write decoder: label sets parsed once, in a bounded LRU cache that cannot lie."""

from __future__ import annotations

import pytest
import snappy

from collectors.receive._prompb import KeyedWriteRequest, Label
from collectors.receive.config import ReceiveLimits
from collectors.receive.remote_write import MAX_CACHED_LABEL_SET_BYTES, RemoteWriteDecoder
from collectors.receive.series import RefusedWrite
from tests.collectors.receive.running import write_request

T0 = 1_764_000_000_000


def series(pod: int, *, name: str = "vllm:num_requests_running") -> dict[str, str]:
    return {"__name__": name, "job": "vllm", "instance": "10.0.0.7:8000", "pod": f"vllm-{pod}"}


def body(*pods: int, ts_ms: int = T0) -> bytes:
    return snappy.compress(write_request([(series(p), [(ts_ms, float(p))]) for p in pods]))


def test_the_cache_holds_at_most_its_bound_and_every_series_is_still_decoded() -> None:
    decoder = RemoteWriteDecoder(ReceiveLimits(max_cached_label_sets=10))
    batch = decoder.decode(body(*range(50)))
    assert [dict(s.labels)["pod"] for s in batch.series] == [f"vllm-{p}" for p in range(50)]
    assert [s.samples for s in batch.series] == [[(T0, float(p))] for p in range(50)]
    assert decoder.cache_info().currsize == 10


def test_the_least_recently_used_label_set_is_evicted_and_parsed_again_the_same() -> None:
    decoder = RemoteWriteDecoder(ReceiveLimits(max_cached_label_sets=2))
    first = decoder.decode(body(0)).series[0]
    decoder.decode(body(1))
    decoder.decode(body(0))  # 0 is now more recent than 1
    decoder.decode(body(2))  # evicts 1, the least recently used
    misses = decoder.cache_info().misses
    again = decoder.decode(body(0, ts_ms=T0 + 5000)).series[0]
    assert decoder.cache_info().misses == misses, "the recently used label set was evicted"
    decoder.decode(body(1))
    assert decoder.cache_info().misses == misses + 1, "the least recently used one was kept"
    assert (again.name, again.labels, again.target) == (first.name, first.labels, first.target)
    assert again.target == ("vllm", "10.0.0.7:8000")
    assert again.samples == [(T0 + 5000, 0.0)]


def test_a_refused_or_long_label_set_is_never_cached() -> None:
    limits = ReceiveLimits(max_label_value_bytes=4096)
    decoder = RemoteWriteDecoder(limits)
    long = series(0) | {"note": "x" * (MAX_CACHED_LABEL_SET_BYTES + 1)}
    too_long = series(1) | {"note": "x" * 5000}
    batch = decoder.decode(
        snappy.compress(write_request([(long, [(T0, 1.0)]), (too_long, [(T0, 1.0)])]))
    )
    assert [dict(s.labels)["pod"] for s in batch.series] == ["vllm-0"]
    assert batch.refused == {"label_too_long": 1}
    assert decoder.cache_info().currsize == 0
    # the refusal is not remembered as an answer: the same set is refused again
    assert decoder.decode(snappy.compress(write_request([(too_long, [(T0, 1.0)])]))).refused == {
        "label_too_long": 1
    }


@pytest.mark.parametrize(
    "label",
    [
        pytest.param(b"\x0a\x05vll", id="a truncated label"),
        pytest.param(Label(value="x").SerializeToString()[:1] + b"\x02\xff\xfe", id="bad utf-8"),
    ],
)
def test_an_unreadable_label_refuses_the_write_though_the_request_parses(label: bytes) -> None:
    request = KeyedWriteRequest()
    request.timeseries.add(labels=[label]).samples.add(value=1.0, timestamp=T0)
    with pytest.raises(RefusedWrite) as refused:
        RemoteWriteDecoder(ReceiveLimits()).decode(snappy.compress(request.SerializeToString()))
    assert (refused.value.status, refused.value.reason) == (400, "protobuf")
