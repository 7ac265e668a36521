"""Fetching a scrape: whole bodies however they arrive, bounded in size, time and memory."""

from __future__ import annotations

import asyncio
import gzip
import math
import tracemalloc
import zlib
from collections.abc import Iterator

import aiohttp
import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors.collector import Collector, Fetched, fetch_exposition
from collectors.config import CollectConfig, TargetConfig
from collectors.exposition import parse_exposition, to_metric_families
from pipeline.errors import DecodeError
from pipeline.schema import TARGET_HEALTH
from tests.collectors.examples import dcgm_exposition, sglang_exposition, vllm_exposition
from tests.collectors.piecewise import MODES, Page, PiecewiseServer

MiB = 1024 * 1024


@pytest.fixture
def server() -> Iterator[PiecewiseServer]:
    with PiecewiseServer(seed=7) as running:
        yield running


def fetch(url: str, *, max_body_bytes: int = 64 * MiB, timeout_s: float = 10.0) -> Fetched:
    async def go() -> Fetched:
        async with aiohttp.ClientSession() as session:
            return await fetch_exposition(
                session, url, timeout_s=timeout_s, max_body_bytes=max_body_bytes
            )

    return asyncio.run(go())


def scrape_once(url: str, **config: object) -> tuple[Collector, list[pa.Table]]:
    """One collector round against ``url``; returns the collector and the sample tables it
    emitted (engine and GPU samples; the round's target_health row is not a sample)."""
    tables: list[pa.Table] = []
    collector = Collector(
        CollectConfig(  # a short interval: run() waits one interval after its last round
            targets=[TargetConfig(url=url)], jitter_s=0, interval_s=0.1, **config
        ),
        lambda schema, table: None if schema is TARGET_HEALTH else tables.append(table),
    )
    asyncio.run(collector.run(rounds=1))
    return collector, tables


def scrape_errors(collector: Collector, url: str, reason: str) -> float | None:
    return collector.metrics.registry.get_sample_value(
        "llmslo_collect_scrape_errors_total", {"target": url, "reason": reason}
    )


# -- finding 1: the whole body, however it is framed and cut into pieces ----------------------
def _value(value: float) -> float | str:
    return "NaN" if math.isnan(value) else float(value)


def _samples(text: str) -> list[tuple[str, tuple[tuple[str, str], ...], float | str]]:
    return [
        (s.name, tuple(sorted(s.labels.items())), _value(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


@pytest.mark.parametrize("mode", MODES, ids=["-".join(m) for m in MODES])
@pytest.mark.parametrize(
    "text",
    [
        vllm_exposition(engines=4),
        vllm_exposition(legacy=True),
        sglang_exposition(dp_ranks=2),
        dcgm_exposition(gpus=8),
        vllm_exposition(engines=24),  # ~490 KB: far past what one socket read buffers
    ],
    ids=["vllm data-parallel", "vllm legacy", "sglang dp ranks", "dcgm", "vllm 490 KB"],
)
def test_bodies_in_random_pieces_parse_like_prometheus_client_on_the_whole_text(
    server: PiecewiseServer, text: str, mode: tuple[str, str]
) -> None:
    server.pages["/metrics"] = Page(body=text, mode=mode, pieces=(1, 2048))
    fetched = fetch(server.url())
    assert fetched.text == text
    ours = parse_exposition(fetched.text)
    assert ours.bad_lines == 0, ours.errors
    theirs = _samples(text)
    assert len(ours) == len(theirs)
    mine = [
        (s.name, tuple(sorted(s.labels.items())), _value(s.value))
        for family in to_metric_families(ours)
        for s in family.samples  # type: ignore[attr-defined]
    ]
    assert sorted(map(repr, mine)) == sorted(map(repr, _samples(text)))


@pytest.mark.parametrize("mode", MODES, ids=["-".join(m) for m in MODES])
def test_a_value_split_across_two_writes_is_stored_whole(
    server: PiecewiseServer, mode: tuple[str, str]
) -> None:
    text = (
        '# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{model_name="m"} 987654\n'
    )
    cut = text.index("987654") + 2  # "98" | "7654"
    encoding = mode[1]
    page = Page(body=text, mode=mode, split_at=(cut,), pause_s=(0.05, 0.05))
    if encoding == "gzip":  # split the compressed stream in the middle instead
        page.split_at = (len(gzip.compress(text.encode(), compresslevel=5)) // 2,)
    server.pages["/metrics"] = page
    collector, tables = scrape_once(server.url())
    health = collector.health[server.url()]
    assert health.up and health.bad_lines == 0, health
    values = dict(zip(tables[0]["metric"].to_pylist(), tables[0]["value"].to_pylist(), strict=True))
    assert values["vllm:prompt_tokens_total"] == 987654.0


@pytest.mark.parametrize("mode", MODES, ids=["-".join(m) for m in MODES])
def test_a_body_cut_short_is_a_failed_scrape_with_its_reason_never_partial_samples(
    server: PiecewiseServer, mode: tuple[str, str]
) -> None:
    text = vllm_exposition(engines=2)
    wire = gzip.compress(text.encode(), compresslevel=5) if mode[1] == "gzip" else text.encode()
    server.pages["/metrics"] = Page(body=text, mode=mode, cut_at=len(wire) // 3)
    collector, tables = scrape_once(server.url())
    health = collector.health[server.url()]
    assert not health.up
    assert health.last_error is not None and health.last_error.startswith("truncated"), health
    assert tables == []  # nothing published from a partial body
    assert scrape_errors(collector, server.url(), "truncated") == 1.0
    assert collector.metrics.up.labels(server.url())._value.get() == 0


@pytest.mark.parametrize("mode", MODES, ids=["-".join(m) for m in MODES])
def test_a_body_over_the_limit_is_an_error_whatever_the_framing(
    server: PiecewiseServer, mode: tuple[str, str]
) -> None:
    text = vllm_exposition(engines=4)  # ~100 KB decoded
    server.pages["/metrics"] = Page(body=text, mode=mode)
    with pytest.raises(DecodeError) as caught:
        fetch(server.url(), max_body_bytes=len(text) - 1)
    assert caught.value.reason == "oversized"
    assert fetch(server.url(), max_body_bytes=len(text)).text == text  # exactly at the limit


def test_a_trickling_body_is_bounded_by_one_deadline_for_the_whole_scrape(
    server: PiecewiseServer,
) -> None:
    text = vllm_exposition()
    server.pages["/metrics"] = Page(
        body=text, mode=("chunked", "identity"), pieces=(200, 200), pause_s=(0.2, 0.2)
    )
    collector, tables = scrape_once(server.url(), timeout_s=1.0)
    health = collector.health[server.url()]
    assert not health.up and health.last_error is not None
    assert health.last_error.startswith("timeout") and tables == []
    assert health.duration_s is not None and health.duration_s < 2.0


# -- finding 2: a gzip bomb is refused with bounded memory -------------------------------------
def _gzip_bomb(decoded_bytes: int) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b"a" * MiB
    parts = [compressor.compress(block) for _ in range(decoded_bytes // MiB)]
    return b"".join(parts) + compressor.flush()


def test_a_gzip_bomb_is_refused_without_decompressing_it_into_memory(
    server: PiecewiseServer,
) -> None:
    bomb = _gzip_bomb(1024 * MiB)  # ~1 MB on the wire, 1 GiB decoded
    assert len(bomb) < 2 * MiB
    limit = 4 * MiB
    server.pages["/metrics"] = Page(raw_gzip=bomb, mode=("length", "gzip"), pieces=(65536, 65536))
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError) as caught:
            fetch(server.url(), max_body_bytes=limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value.reason == "oversized"
    assert peak < 2 * limit + 2 * MiB, f"peak {peak / MiB:.1f} MiB"


def test_a_truncated_gzip_stream_is_truncated_not_a_short_body(server: PiecewiseServer) -> None:
    text = vllm_exposition()
    packed = gzip.compress(text.encode())
    server.pages["/metrics"] = Page(raw_gzip=packed[: len(packed) // 2], mode=("length", "gzip"))
    with pytest.raises(DecodeError) as caught:
        fetch(server.url())
    assert caught.value.reason == "truncated"
