"""The HTTP doors: ``POST /api/v1/write`` (remote-write 1.0), ``POST /v1/metrics`` (OTLP/HTTP),
``GET /metrics``, ``GET /-/healthy``.

Response codes follow the remote-write spec: ``204`` stored; ``4xx`` never retried, with the
reason in the body (``401`` token, ``413`` a size bound, ``415`` wrong encoding or type,
``400`` unreadable, or some series refused — the others are stored; ``413`` also for a
write of more samples than the whole publish buffer holds); ``503`` with
``Retry-After`` when the publish buffer cannot take the write (nothing of it was accepted, so
the sender's retry stores it once). Every outcome is counted on ``/metrics``.

OTLP/HTTP answers the same statuses, with OTLP's bodies in the request's encoding: ``200`` and
an ``ExportMetricsServiceResponse`` (its ``partial_success`` counting the refused data points,
the others stored) instead of ``204``/``400``-for-some; a ``google.rpc.Status`` with every
failure. Both doors share the token, the body bounds and the publish buffer.
"""

from __future__ import annotations

import hmac
import logging

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, generate_latest

from collectors.receive import otlp
from collectors.receive.config import ReceiveConfig
from collectors.receive.receiver import Receiver
from collectors.receive.remote_write import RemoteWriteDecoder, check_headers
from collectors.receive.series import PushedBatch, RefusedWrite
from pipeline.publisher import PublishBuffer

__all__ = ["ReceiveMetrics", "receive_app"]

log = logging.getLogger(__name__)

WRITE_PATH = "/api/v1/write"
OTLP_PATH = "/v1/metrics"
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
    remote_write = RemoteWriteDecoder(limits)

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

    def admit(door: str, batch: PushedBatch) -> None:
        """Hand ``batch`` to the receiver, or raise the 413/503 that refuses all of it."""
        samples = batch.samples
        metrics.samples.labels(door).inc(samples)
        if samples > buffer.max_rows:  # could never fit, even in an empty buffer
            text = f"{samples} samples, more than receive.buffer_max_rows"
            raise RefusedWrite(413, "write_too_large", text)
        if buffer.rows + samples > buffer.max_rows:
            raise RefusedWrite(503, "bus_full", "publish buffer full, retry later")
        report = receiver.ingest(batch)
        for reason, count in report.dropped.items():
            metrics.dropped.labels(reason).inc(count)
        for reason, count in batch.refused.items():
            metrics.refused.labels(reason).inc(count)

    def store(door: str, batch: PushedBatch) -> web.Response:
        try:
            admit(door, batch)
        except RefusedWrite as exc:
            return answer(door, exc.status, exc.reason, f"{exc.reason}: {exc}")
        if batch.refused:
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
            batch = remote_write.decode(body, receiver.known_series())
        except RefusedWrite as exc:
            log.info("remote-write from %s refused: %s: %s", request.remote, exc.reason, exc)
            return answer("remote_write", exc.status, exc.reason, f"{exc.reason}: {exc}")
        return store("remote_write", batch)

    async def otlp_metrics(request: web.Request) -> web.Response:
        door, kind = "otlp", otlp.PROTOBUF
        try:
            if not authorised(request):
                raise RefusedWrite(401, "unauthorized", "missing or wrong bearer token")
            kind, gzipped = otlp.check_otlp_headers(
                request.headers.get("Content-Type", ""),
                request.headers.get("Content-Encoding", ""),
            )
            body = await read_body(request)
            batch = otlp.decode_otlp(body, kind, gzipped, limits, peer=request.remote or "")
            admit(door, batch)
        except RefusedWrite as exc:
            log.info("OTLP from %s refused: %s: %s", request.remote, exc.reason, exc)
            response = answer(door, exc.status, exc.reason)
            response.body = otlp.error_body(kind, exc.status, f"{exc.reason}: {exc}")
            response.content_type = kind
            return response
        response = answer(door, 200, None)
        response.body = otlp.success_body(kind, batch)
        response.content_type = kind
        return response

    async def serve_metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.registry), content_type="text/plain")

    async def healthy(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    # the body limit is ours (a counted 413), not aiohttp's
    app = web.Application(client_max_size=limits.max_body_bytes + 1)
    app.router.add_post(WRITE_PATH, write)
    app.router.add_post(OTLP_PATH, otlp_metrics)
    app.router.add_get("/metrics", serve_metrics)
    app.router.add_get("/-/healthy", healthy)
    return app
