"""The scrape loop: rounds over every target, one Arrow batch per topic per round.

:class:`Collector` scrapes all targets of a round concurrently (aiohttp, at most
``concurrency`` in flight, each within ``timeout_s`` and started after a random jitter so
a fleet is not hit in lockstep), parses and canonicalises each response, and hands the
round to ``sink(schema, table)`` — usually :meth:`pipeline.publisher.PublishBuffer.put`.
A target that hangs costs only its own timeout: the others are fetched in parallel and
their rows carry their own scrape time. Per-target health (up, last error, duration,
samples, bad lines, dialect) is kept in :attr:`Collector.health` and in the metrics, and
every scrape's outcome (with the periodic readiness probe) is handed to the sink as a
``target_health`` table (:mod:`collectors.health`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import pyarrow as pa

from collectors.canonical import CanonicalBatch, TargetCanonicalizer
from collectors.config import CollectConfig, TargetConfig
from collectors.discovery import TargetDiscovery
from collectors.exposition import Exposition, ExpositionParser
from collectors.health import HealthRow, health_table, probe_readiness, process_start_of, status_of
from collectors.metrics import CollectorMetrics
from collectors.semantics import REASONS
from pipeline.codec import join_tables
from pipeline.errors import DecodeError
from pipeline.schema import TARGET_HEALTH, RecordSchema

__all__ = [
    "ACCEPT",
    "Collector",
    "Fetched",
    "RoundReport",
    "TargetHealth",
    "client_error_text",
    "fetch_exposition",
]

log = logging.getLogger(__name__)

#: Prefer the classic text format (what every engine serves); OpenMetrics is understood too.
ACCEPT = "text/plain;version=0.0.4;q=1,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"
#: What we can decode incrementally against the size limit (no brotli/zstd: no bounded API).
ACCEPT_ENCODING = "gzip, deflate"
# Read and inflate in steps of this many bytes (bounds the memory of one step).
_READ_BYTES = 64 * 1024


@dataclass
class TargetHealth:
    """What the last scrape of one target looked like, and how many scrapes succeeded
    (``scrapes_ok``) and failed (``scrapes_failed``) since the collector started."""

    url: str
    instance: str
    address: str | None = None
    up: bool = False
    last_error: str | None = None
    last_scrape_ts_ms: int | None = None
    duration_s: float | None = None
    samples: int = 0
    bad_lines: int = 0
    dialect: str | None = None
    version_family: str | None = None
    resets: int = 0
    scrapes_ok: int = 0
    scrapes_failed: int = 0

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


@dataclass
class RoundReport:
    """One scrape round: rows handed to the sink per topic, and target counts."""

    started_ts_ms: int
    duration_s: float = 0.0
    targets: int = 0
    up: int = 0
    rows: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Fetched:
    """One HTTP response: the exposition text and what the headers said about it.

    ``process_start_s`` is llama.cpp's ``Process-Start-Time-Unix`` header (a restart marker).
    """

    text: str
    openmetrics: bool
    process_start_s: float | None = None


async def fetch_exposition(
    session: aiohttp.ClientSession, url: str, *, timeout_s: float, max_body_bytes: int
) -> Fetched:
    """GET ``url`` and read its whole body; returns the text and its format.

    The body is read to its end (``Content-Length``, the last chunk, or close), decoded
    incrementally (gzip, deflate) and bounded by ``max_body_bytes`` *decoded* bytes, all
    within one deadline of ``timeout_s`` seconds for the whole exchange.

    Raises :class:`DecodeError` with a reason: ``http_status``; ``oversized`` (more than
    ``max_body_bytes`` on the wire or decoded); ``truncated`` (the connection closed before
    the framing or the gzip stream ended); ``encoding`` (a content encoding we cannot
    decode, or a corrupt one); ``timeout``; ``connect``.
    """
    try:
        async with asyncio.timeout(timeout_s):
            async with session.get(
                url,
                headers={"Accept": ACCEPT, "Accept-Encoding": ACCEPT_ENCODING},
                auto_decompress=False,
            ) as response:
                if response.status != 200:
                    raise DecodeError("http_status", f"HTTP {response.status} from {url}")
                if response.content_length is not None and response.content_length > max_body_bytes:
                    raise DecodeError("oversized", f"body of {response.content_length} bytes")
                decoder = _BodyDecoder(response.headers.get("Content-Encoding", ""), max_body_bytes)
                async for piece in response.content.iter_chunked(_READ_BYTES):
                    decoder.feed(piece)
                body = decoder.finish()
                openmetrics = "openmetrics" in response.headers.get("Content-Type", "")
                start = _header_number(response.headers.get("Process-Start-Time-Unix"))
    except TimeoutError as exc:
        raise DecodeError("timeout", f"no complete response within {timeout_s:g} s") from exc
    except aiohttp.ClientPayloadError as exc:
        # the connection closed before Content-Length or the last chunk
        raise DecodeError("truncated", f"body cut short: {exc}"[:200]) from exc
    except aiohttp.ClientError as exc:
        raise DecodeError("connect", client_error_text(exc, url)[:200]) from exc
    return Fetched(body.decode("utf-8", "replace"), openmetrics, start)


def client_error_text(exc: aiohttp.ClientError, url: str) -> str:
    """What went wrong reaching ``url``, for a person: ``cannot connect to URL: connection
    refused`` rather than aiohttp's ``Cannot connect to host … ssl:default [...]`` (which
    names TLS settings even for plain HTTP)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        os_error = exc.os_error
        if isinstance(os_error, ConnectionRefusedError):
            why = "connection refused (is anything listening there?)"
        else:
            why = getattr(os_error, "strerror", None) or str(os_error) or type(os_error).__name__
        return f"cannot connect to {url}: {why}"
    return f"{url}: {type(exc).__name__}: {exc}"


class _BodyDecoder:
    """Collects a body piece by piece, decoding it and refusing it past ``max_bytes``.

    Decompression is bounded per step (``max_length``), so a gzip bomb costs at most
    ``max_bytes`` plus one step of memory before it is refused.
    """

    def __init__(self, content_encoding: str, max_bytes: int) -> None:
        encoding = content_encoding.strip().lower()
        if encoding in ("", "identity"):
            self._inflate = None
        elif encoding in ("gzip", "x-gzip", "deflate"):
            # wbits 47 = gzip or zlib header, auto-detected (servers label deflate loosely)
            self._inflate = zlib.decompressobj(wbits=47)
        else:
            raise DecodeError("encoding", f"unsupported Content-Encoding {content_encoding!r}")
        self.encoding = encoding
        self.max_bytes = max_bytes
        self._parts: list[bytes] = []
        self._size = 0
        self._wire = 0

    def _keep(self, data: bytes) -> None:
        self._size += len(data)
        if self._size > self.max_bytes:
            raise DecodeError("oversized", f"body larger than {self.max_bytes} decoded bytes")
        self._parts.append(data)

    def feed(self, piece: bytes) -> None:
        self._wire += len(piece)
        if self._wire > self.max_bytes:
            raise DecodeError("oversized", f"body larger than {self.max_bytes} bytes on the wire")
        if self._inflate is None:
            self._keep(piece)
            return
        data = piece
        while data and not self._inflate.eof:
            room = self.max_bytes - self._size + 1  # one byte more proves it is over
            try:
                out = self._inflate.decompress(data, min(room, _READ_BYTES))
            except zlib.error as exc:
                raise DecodeError("encoding", f"corrupt {self.encoding} body: {exc}") from exc
            self._keep(out)
            data = self._inflate.unconsumed_tail

    def finish(self) -> bytes:
        """The whole decoded body; raises ``truncated`` if a gzip stream did not end."""
        if self._inflate is not None:
            while not self._inflate.eof:  # output still held inside zlib, in bounded steps
                room = self.max_bytes - self._size + 1
                out = self._inflate.decompress(
                    self._inflate.unconsumed_tail, min(room, _READ_BYTES)
                )
                if not out:
                    raise DecodeError("truncated", f"{self.encoding} stream ends before its end")
                self._keep(out)
        return b"".join(self._parts)


def _header_number(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class _Target:
    """Per-target state that survives between rounds: parser cache, templates, health."""

    def __init__(self, config: TargetConfig) -> None:
        self.config = config
        self.parser = ExpositionParser()
        self.canonicalizer = TargetCanonicalizer(
            config.instance,
            dialect=config.dialect,
            pool=config.pool,
            model=config.model,
            address=config.address,
        )
        self.health = TargetHealth(url=config.url, instance=config.instance, address=config.address)
        self.row: HealthRow | None = None  # this round's target_health row
        self.next_probe_s = 0.0  # monotonic time of the next readiness probe


class Collector:
    """Scrapes the configured and discovered targets in rounds; see the module docstring."""

    def __init__(
        self,
        config: CollectConfig,
        sink: Callable[[RecordSchema, pa.Table], object],
        *,
        metrics: CollectorMetrics | None = None,
        clock: Callable[[], float] = time.time,
        discovery: TargetDiscovery | None = None,
        seed: int | None = None,
    ) -> None:
        self.config = config
        self.sink = sink
        self.metrics = metrics or CollectorMetrics()
        self.clock = clock
        self.discovery = discovery or TargetDiscovery(config)
        self._targets: dict[str, _Target] = {}
        self._rng = random.Random(seed)
        self._stop = asyncio.Event()

    @property
    def health(self) -> dict[str, TargetHealth]:
        """Health of every current target, by URL."""
        return {url: t.health for url, t in self._targets.items()}

    def stop(self) -> None:
        """Ask :meth:`run` to return after the round in hand (call from the loop's thread)."""
        self._stop.set()

    def _sync_targets(self) -> list[_Target]:
        wanted = {t.url: t for t in self.discovery.targets()}
        for url in set(self._targets) - set(wanted):
            del self._targets[url]
            with contextlib.suppress(KeyError):
                self.metrics.up.remove(url)  # a target that is gone is not "down"
        for url, config in wanted.items():
            known = self._targets.get(url)
            if known is None or known.config != config:
                self._targets[url] = _Target(config)
        self.metrics.targets.set(len(self._targets))
        return list(self._targets.values())

    async def run(self, *, rounds: int | None = None) -> None:
        """Scrape every ``interval_s`` until :meth:`stop` (or ``rounds`` rounds)."""
        done = 0
        connector = aiohttp.TCPConnector(limit=self.config.concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:
            next_s = time.monotonic()
            while not self._stop.is_set() and (rounds is None or done < rounds):
                await self.scrape_round(session)
                done += 1
                next_s = max(next_s + self.config.interval_s, time.monotonic())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), timeout=next_s - time.monotonic())

    async def scrape_round(self, session: aiohttp.ClientSession) -> RoundReport:
        """Scrape every target once and hand one table per topic to the sink."""
        started = time.monotonic()
        report = RoundReport(started_ts_ms=int(self.clock() * 1000))
        targets = self._sync_targets()
        semaphore = asyncio.Semaphore(self.config.concurrency)
        batches = await asyncio.gather(*(self._scrape(session, t, semaphore) for t in targets))
        by_schema: dict[str, tuple[RecordSchema, list[pa.Table]]] = {}
        for batch in batches:
            if batch is not None and batch.table.num_rows:
                by_schema.setdefault(batch.schema.name, (batch.schema, []))[1].append(batch.table)
        for schema, tables in by_schema.values():
            table = join_tables(tables)
            report.rows[schema.topic] = table.num_rows
            self.sink(schema, table)
        rows = [t.row for t in targets if t.row is not None]
        if rows:
            report.rows[TARGET_HEALTH.topic] = len(rows)
            self.sink(TARGET_HEALTH, health_table(rows))
        report.targets = len(targets)
        report.up = sum(1 for t in targets if t.health.up)
        report.duration_s = time.monotonic() - started
        self.metrics.rounds.inc()
        self.metrics.round_seconds.observe(report.duration_s)
        return report

    async def _scrape(
        self, session: aiohttp.ClientSession, target: _Target, semaphore: asyncio.Semaphore
    ) -> CanonicalBatch | None:
        target.row = None
        if self.config.jitter_s:
            await asyncio.sleep(self._rng.uniform(0, self.config.jitter_s))
        async with semaphore:
            name = target.config.url
            ts_ms = int(self.clock() * 1000)
            started = time.monotonic()
            self.metrics.scrapes.labels(name).inc()
            try:
                fetched = await fetch_exposition(
                    session,
                    target.config.url,
                    timeout_s=self.config.timeout_s,
                    max_body_bytes=self.config.max_body_bytes,
                )
                exposition = target.parser.parse(
                    fetched.text, openmetrics=fetched.openmetrics or None
                )
                batch = target.canonicalizer.canonicalize(
                    exposition, ts_ms, process_start_s=fetched.process_start_s
                )
            except DecodeError as exc:
                self._record_failure(target, exc, ts_ms, time.monotonic() - started)
                return None
            self._record_success(target, exposition, batch, ts_ms, time.monotonic() - started)
            start_s = process_start_of(batch.table, fetched.process_start_s)
            await self._note_health(session, target, batch, ts_ms, start_s)
            return batch

    async def _note_health(
        self,
        session: aiohttp.ClientSession,
        target: _Target,
        batch: CanonicalBatch,
        ts_ms: int,
        process_start_s: float | None,
    ) -> None:
        """This scrape's target_health row; probe readiness when it is due (engines only)."""
        health = target.health
        target.row = HealthRow(
            ts_ms,
            target.config.instance,
            target.config.url,
            target.config.pool,
            health.dialect,
            True,
            200,
            health.duration_s or 0.0,
            process_start_s=process_start_s,
            counter_resets=sum(batch.resets.values()),
        )
        interval = self.config.readiness_interval_s
        # dcgm-exporters, gateway routers (epp, dynamo-frontend), KServe's controller and
        # kube-state-metrics serve no model: nothing to be ready for
        not_engines = {"dcgm", "epp", "dynamo-frontend", "kserve", "kube-state-metrics"}
        engine = not not_engines & {health.dialect, target.config.dialect}
        if interval and engine and time.monotonic() >= target.next_probe_s:
            target.next_probe_s = time.monotonic() + interval
            readiness = await probe_readiness(session, target.config.url, self.config.timeout_s)
            target.row.readiness = readiness
            if readiness.ready is not None:
                self.metrics.ready.labels(target.config.url).set(int(readiness.ready))

    def _record_failure(
        self, target: _Target, exc: DecodeError, ts_ms: int, duration_s: float
    ) -> None:
        health = target.health
        health.up, health.last_error = False, f"{exc.reason}: {exc}"
        health.scrapes_failed += 1
        health.last_scrape_ts_ms, health.duration_s = ts_ms, duration_s
        target.row = HealthRow(
            ts_ms,
            target.config.instance,
            target.config.url,
            target.config.pool,
            health.dialect,
            False,
            status_of(exc.reason, str(exc)),
            duration_s,
            exc.reason,
            str(exc),
        )
        self.metrics.up.labels(target.config.url).set(0)
        self.metrics.scrape_errors.labels(target.config.url, exc.reason).inc()
        log.info("scrape %s failed: %s", target.config.url, health.last_error)

    def _record_success(
        self,
        target: _Target,
        exposition: Exposition,
        batch: CanonicalBatch,
        ts_ms: int,
        duration_s: float,
    ) -> None:
        health, name, m = target.health, target.config.url, self.metrics
        detection = target.canonicalizer.detection
        health.up, health.last_error = True, None
        health.scrapes_ok += 1
        health.last_scrape_ts_ms, health.duration_s = ts_ms, duration_s
        rejected = sum(batch.dropped.get(reason, 0) for reason in REASONS)
        health.samples = len(exposition) - rejected
        health.bad_lines = exposition.bad_lines + rejected
        health.dialect = detection.dialect if detection else None
        health.version_family = detection.version_family if detection else None
        health.resets += sum(batch.resets.values())
        m.up.labels(name).set(1)
        m.scrape_seconds.labels(name).observe(duration_s)
        m.samples.labels(name).inc(health.samples)
        if health.bad_lines:
            m.bad_lines.labels(name).inc(health.bad_lines)
            first = (exposition.errors + batch.errors)[:1]
            log.info(
                "%s: %d bad lines or rejected series, first: %s", name, health.bad_lines, first
            )
        for reason, count in batch.resets.items():
            m.resets.labels(name, reason).inc(count)
        for reason, count in batch.dropped.items():
            m.dropped.labels(reason).inc(count)
