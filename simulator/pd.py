"""A prefill/decode (P/D) pair with a KV transfer between them, and ``kv_transfer_timeout``.

:class:`PdPair` is the endpoint of a disaggregated deployment: it runs the prompt on the
prefill pod (a one-token request: the prefill), moves the prompt's KV blocks to the
decode pod (``transfer_base_s`` + ``transfer_per_block_s`` per block, modelled), then
streams the decode pod's answer back. Under ``kv_transfer_timeout`` a share of transfers
hangs until ``timeout_s`` and fails: the client gets **504** ``kv_transfer_timeout``
before any token, and the transfer's blocks are cleaned up — or, for a
``cleanup_fail_fraction`` of them, not (they stay pinned: ``leaked_blocks``).

``/metrics`` speaks vLLM's NIXL KV-connector names (the decode side's, reference §1), with
``model_name`` and ``engine`` labels like the engine's own families:
``vllm:nixl_xfer_time_seconds`` (transfer time histogram), ``vllm:nixl_num_failed_transfers``
(timeouts) and ``vllm:nixl_num_kv_expired_reqs`` (a failed transfer whose blocks the
producer freed: the cleanup completed). What no engine exports stays ``llmslo_sim_pd_*``:
``cleanup_failures`` and the ``leaked_blocks`` gauge (failed transfers never freed), and
the pair's answers by code.
"""

from __future__ import annotations

import asyncio
import json
import math
import random

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, Field

from pipeline.config import STRICT
from pipeline.errors import ConfigError

__all__ = ["KvTransferTimeoutParams", "PdPair"]

_HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive"}


class KvTransferTimeoutParams(BaseModel):
    """The ``kv_transfer_timeout`` fault."""

    model_config = STRICT

    fraction: float = Field(default=1.0, ge=0, le=1, description="share of transfers that hang")
    timeout_s: float = Field(default=2.0, gt=0, le=600, description="when a hung transfer fails")
    cleanup_fail_fraction: float = Field(
        default=0.0, ge=0, le=1, description="share of failed transfers whose blocks leak"
    )


class PdPair:
    """Serves ``/v1/chat/completions`` by prefill on ``prefill_url``, KV transfer, decode on
    ``decode_url`` (pod base URLs); see the module docstring."""

    def __init__(
        self,
        prefill_url: str,
        decode_url: str,
        *,
        host: str = "127.0.0.1",
        block_size: int = 16,
        transfer_base_s: float = 0.002,
        transfer_per_block_s: float = 0.0002,
        model: str = "llama-3-8b",
        seed: int = 0,
    ) -> None:
        self.prefill_url, self.decode_url = prefill_url.rstrip("/"), decode_url.rstrip("/")
        self.host, self.port = host, 0
        self.block_size = block_size
        self.transfer_base_s, self.transfer_per_block_s = transfer_base_s, transfer_per_block_s
        self.fault: KvTransferTimeoutParams | None = None
        self.leaked_blocks = 0
        self._rng = random.Random(seed)
        r = self.registry = CollectorRegistry()
        names = ["model_name", "engine"]
        labels = {"model_name": model, "engine": "0"}
        self._latency = Histogram(
            "vllm:nixl_xfer_time_seconds",
            "Histogram of transfer duration for NIXL KV Cache transfers.",
            names,
            registry=r,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10),
        ).labels(**labels)
        self._failed = Counter(
            "vllm:nixl_num_failed_transfers",
            "Number of failed NIXL KV Cache transfers.",
            names,
            registry=r,
        ).labels(**labels)
        self._expired = Counter(
            "vllm:nixl_num_kv_expired_reqs",
            "Number of requests that had their KV expire.",
            names,
            registry=r,
        ).labels(**labels)
        self._cleanup_failures = Counter(
            "llmslo_sim_pd_kv_transfer_cleanup_failures",
            "Failed transfers whose blocks were never freed",
            registry=r,
        )
        self._leaked = Gauge(
            "llmslo_sim_pd_kv_transfer_leaked_blocks", "Blocks never cleaned up", registry=r
        )
        self._requests = Counter(
            "llmslo_sim_pd_requests", "Requests answered", ["code"], registry=r
        )
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        self._session = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._serve)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(
            app, handle_signals=False, handler_cancellation=True, shutdown_timeout=0.1
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def set_fault(self, name: str, params: dict[str, float] | None = None) -> None:
        """Switch on ``kv_transfer_timeout``; ConfigError for another name or bad params."""
        if name != "kv_transfer_timeout":
            raise ConfigError(f"P/D fault: unknown {name!r}; known: ['kv_transfer_timeout']")
        try:
            self.fault = KvTransferTimeoutParams.model_validate(params or {})
        except ValueError as exc:
            raise ConfigError(f"kv_transfer_timeout: {exc}") from exc

    def clear_fault(self, name: str) -> bool:
        was = self.fault is not None and name == "kv_transfer_timeout"
        self.fault = None
        return was

    async def _prefill(self, body: dict[str, object]) -> tuple[int, int]:
        """Run the prompt on the prefill pod; returns (HTTP status, prompt tokens)."""
        assert self._session is not None
        one = dict(body, max_tokens=1, stream=False)
        one.pop("stream_options", None)
        async with self._session.post(f"{self.prefill_url}/v1/chat/completions", json=one) as resp:
            data = await resp.json(content_type=None) if resp.status == 200 else {}
            usage = data.get("usage") if isinstance(data, dict) else None
            tokens = usage.get("prompt_tokens", 0) if isinstance(usage, dict) else 0
            return resp.status, int(tokens)

    async def transfer(self, blocks: int) -> bool:
        """Move ``blocks`` KV blocks; returns False when the transfer timed out (fault)."""
        fault = self.fault
        if fault is not None and self._rng.random() < fault.fraction:
            await asyncio.sleep(fault.timeout_s)
            self._latency.observe(fault.timeout_s)
            self._failed.inc()
            if self._rng.random() < fault.cleanup_fail_fraction:
                self._cleanup_failures.inc()
                self.leaked_blocks += blocks
                self._leaked.set(self.leaked_blocks)
            else:
                self._expired.inc()
            return False
        seconds = self.transfer_base_s + self.transfer_per_block_s * blocks
        await asyncio.sleep(seconds)
        self._latency.observe(seconds)
        return True

    def _answer(self, code: int, reason: str) -> web.Response:
        self._requests.labels(str(code)).inc()
        return web.json_response(
            {"error": {"message": reason, "type": reason, "code": code}}, status=code
        )

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            return self._answer(400, "invalid_json")
        if not isinstance(body, dict):
            return self._answer(400, "invalid_json")
        status, prompt_tokens = await self._prefill(body)
        if status != 200:
            return self._answer(status, "prefill_failed")
        if not await self.transfer(max(1, math.ceil(prompt_tokens / self.block_size))):
            return self._answer(504, "kv_transfer_timeout")
        async with self._session.post(f"{self.decode_url}/v1/chat/completions", data=raw) as up:
            response = web.StreamResponse(
                status=up.status,
                headers={k: v for k, v in up.headers.items() if k.lower() not in _HOP_HEADERS},
            )
            await response.prepare(request)
            try:
                async for piece in up.content.iter_any():
                    await response.write(piece)
                await response.write_eof()
            except (ConnectionError, aiohttp.ClientError):
                # the client left mid-stream: closing the upstream aborts the decode request
                self._requests.labels("client_gone").inc()
                return response
            self._requests.labels(str(up.status)).inc()
            return response

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), content_type="text/plain")
