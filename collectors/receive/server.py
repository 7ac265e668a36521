"""The HTTP door: ``POST /api/v1/write`` (remote-write 1.0), ``GET /metrics``, ``GET /-/healthy``.

Response codes follow the remote-write spec: ``204`` stored; ``4xx`` never retried, with the
reason in the body (``401`` token, ``413`` a size bound, ``415`` wrong encoding or type,
``400`` unreadable, or some series refused — the others are stored; ``413`` also for a
write of more samples than the whole publish buffer holds); ``503`` with
``Retry-After`` when the publish buffer cannot take the write (nothing of it was accepted, so
the sender's retry stores it once). Every outcome is counted on ``/metrics``.
"""

from __future__ import annotations

import hmac
import logging

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, generate_latest

from collectors.receive.config import ReceiveConfig
from collectors.receive.receiver import Receiver
from collectors.receive.remote_write import check_headers, decode_remote_write
from collectors.receive.series import PushedBatch, RefusedWrite
from pipeline.publisher import PublishBuffer

__all__ = ["ReceiveMetrics", "receive_app"]

log = logging.getLogger(__name__)

WRITE_PATH = "/api/v1/write"
# Read bodies in steps of this many bytes, counting them against the body bound.
_READ_BYTES = 256 * 1024


class ReceiveMetrics:
    """``llmslo_receive_*`` counters in one registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "llmslo_receive_requests",
            "Write requests, by door and status",
            ["door", "code"],
            registry=r,
        )
        self.refused = Counter(
            "llmslo_receive_refused",
            "Requests or series refused, by reason",
            ["reason"],
            registry=r,
        )
        self.samples = Counter(
            "llmslo_receive_samples", "Samples received, by door", ["door"], registry=r
        )
        self.dropped = Counter(
            "llmslo_receive_dropped",
            "Samples received but not stored, by reason",
            ["reason"],
            registry=r,
        )


def receive_app(
    config: ReceiveConfig,
    receiver: Receiver,
    buffer: PublishBuffer,
    metrics: ReceiveMetrics | None = None,
) -> web.Application:
    """The aiohttp application serving the receiver (see the module docstring)."""
    metrics = metrics or ReceiveMetrics()
    token = config.token()
    limits = config.limits

    def authorised(request: web.Request) -> bool:
        if token is None:
            return True
        sent = request.headers.get("Authorization", "")
        return hmac.compare_digest(sent.encode(), f"Bearer {token}".encode())

    async def read_body(request: web.Request) -> bytes:
        length = request.content_length
        if length is not None and length > limits.max_body_bytes:
            raise RefusedWrite(413, "body_size", f"body of {length} bytes")
        parts: list[bytes] = []
        size = 0
        try:
            async for piece in request.content.iter_chunked(_READ_BYTES):
                size += len(piece)
                if size > limits.max_body_bytes:
                    raise RefusedWrite(413, "body_size", f"body over {limits.max_body_bytes} bytes")
                parts.append(piece)
        except web.HTTPException as exc:
            raise RefusedWrite(400, "body", f"unreadable body: {exc}"[:200]) from exc
        return b"".join(parts)

    def answer(door: str, status: int, reason: str | None, text: str = "") -> web.Response:
        metrics.requests.labels(door, str(status)).inc()
        if reason is not None:
            metrics.refused.labels(reason).inc()
        headers = {"Retry-After": str(config.retry_after_s)} if status == 503 else None
        return web.Response(status=status, text=text or None, headers=headers)

    def store(door: str, batch: PushedBatch) -> web.Response:
        samples = batch.samples
        metrics.samples.labels(door).inc(samples)
        if samples > buffer.max_rows:  # could never fit, even in an empty buffer
            text = f"write_too_large: {samples} samples, more than receive.buffer_max_rows"
            return answer(door, 413, "write_too_large", text)
        if buffer.rows + samples > buffer.max_rows:
            return answer(door, 503, "bus_full", "bus_full: publish buffer full, retry later")
        report = receiver.ingest(batch)
        for reason, count in report.dropped.items():
            metrics.dropped.labels(reason).inc(count)
        if batch.refused:
            for reason, count in batch.refused.items():
                metrics.refused.labels(reason).inc(count)
            text = f"{sum(batch.refused.values())} series refused: " + "; ".join(batch.errors)
            return answer(door, 400, None, text)
        return answer(door, 204, None)

    async def write(request: web.Request) -> web.Response:
        if not authorised(request):
            return answer(
                "remote_write", 401, "unauthorized", "unauthorized: missing or wrong bearer token"
            )
        try:
            check_headers(
                request.headers.get("Content-Encoding", ""),
                request.headers.get("Content-Type", ""),
            )
            body = await read_body(request)
            batch = decode_remote_write(body, limits)
        except RefusedWrite as exc:
            log.info("remote-write from %s refused: %s: %s", request.remote, exc.reason, exc)
            return answer("remote_write", exc.status, exc.reason, f"{exc.reason}: {exc}")
        return store("remote_write", batch)

    async def serve_metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.registry), content_type="text/plain")

    async def healthy(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    # the body limit is ours (a counted 413), not aiohttp's
    app = web.Application(client_max_size=limits.max_body_bytes + 1)
    app.router.add_post(WRITE_PATH, write)
    app.router.add_get("/metrics", serve_metrics)
    app.router.add_get("/-/healthy", healthy)
    return app
