"""Which model names may become metrics labels: bounded, whatever clients send.

The ``model`` of a request is the client's string. As a Prometheus label (or an OTel
attribute) every distinct value is a new series that is never freed, so a client sending
6,000 invented names grew the tap's ``/metrics`` to 98 MB. :class:`ModelLabels` lets a name
through only when the operator configured it (``tap.models``) or an upstream announces it
on ``GET /v1/models`` (vLLM, SGLang and TRT-LLM's OpenAI servers all serve it), and at most
``max_labels`` distinct names in all; everything else is :data:`OTHER_MODEL`. Request
records keep the raw name (bounded in length): they are rows, not series.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable
from typing import Any

from collectors.tap.upstream import UpstreamClient, UpstreamError

__all__ = ["MAX_MODEL_NAME_CHARS", "OTHER_MODEL", "ModelLabels", "fetch_announced_models"]

log = logging.getLogger(__name__)

#: The label of every model name that is neither configured nor announced (or over the cap).
OTHER_MODEL = "other"

#: Model names longer than this are never labels (and are cut to it in records).
MAX_MODEL_NAME_CHARS = 200

#: A model list larger than this is not read (a real one is a few KB).
_MAX_MODEL_LIST_BYTES = 1024 * 1024


class ModelLabels:
    """The model label for a requested name: itself if known and within the cap, else
    :data:`OTHER_MODEL`. Configured names always count first toward ``max_labels``."""

    def __init__(self, configured: Iterable[str] = (), *, max_labels: int = 64) -> None:
        self.configured = frozenset(configured)
        self.max_labels = max_labels
        self.announced: set[str] = set()
        self._by_upstream: dict[str, frozenset[str]] = {}
        self._given: set[str] = set(self.configured)  # labels in use: they stay in use
        self._failing: set[str] = set()  # upstreams whose list could not be read (logged once)

    async def refresh(
        self, client: UpstreamClient, upstreams: Iterable[tuple[str, str]], *, timeout_s: float
    ) -> None:
        """Read each ``(base_url, instance)``'s ``/v1/models``, concurrently, each within
        ``timeout_s``. Never raises: an upstream that fails keeps what it announced before."""
        await asyncio.gather(
            *(self._refresh_one(client, url, instance, timeout_s) for url, instance in upstreams)
        )

    async def _refresh_one(
        self, client: UpstreamClient, url: str, instance: str, timeout_s: float
    ) -> None:
        try:
            async with asyncio.timeout(timeout_s):
                models = await fetch_announced_models(client, url)
        except (UpstreamError, TimeoutError, ValueError) as exc:
            if instance not in self._failing:
                self._failing.add(instance)
                # INFO, not WARNING: engines without /v1/models are legitimate and the tap
                # works on (their models are labelled 'other'); once per failing spell.
                log.info("no model list from %s (labels: configured only): %s", instance, exc)
            return
        self._failing.discard(instance)
        self.announce(instance, models)

    def announce(self, upstream: str, models: Iterable[str]) -> None:
        """``upstream`` serves ``models`` now (replacing what it announced before)."""
        self._by_upstream[upstream] = frozenset(
            m for m in models if 0 < len(m) <= MAX_MODEL_NAME_CHARS and m != OTHER_MODEL
        )
        self.announced = set().union(*self._by_upstream.values())

    def label(self, model: str | None) -> str:
        """The label for ``model`` (O(1); called once per finished attempt)."""
        if model is None:
            return OTHER_MODEL
        if model in self._given:
            return model
        if model in self.announced and len(self._given) < self.max_labels:
            self._given.add(model)
            return model
        return OTHER_MODEL


async def fetch_announced_models(client: UpstreamClient, base_url: str) -> list[str]:
    """The model ids ``base_url`` serves, from its OpenAI-style ``GET /v1/models``.

    Raises :class:`~collectors.tap.upstream.UpstreamError` (unreachable, reset, timeout) or
    :class:`ValueError` (not a 200, over 1 MiB, not a model list). The caller bounds the time.
    """
    resp = await client.request(
        base_url, "GET", "/v1/models", [("Accept", "application/json")], b""
    )
    body = bytearray()
    try:
        while chunk := await resp.readany():
            body += chunk
            if len(body) > _MAX_MODEL_LIST_BYTES:
                raise ValueError(f"model list over {_MAX_MODEL_LIST_BYTES} bytes")
    finally:
        if resp.at_eof():
            resp.release()
        else:
            resp.close()
    if resp.status != 200:
        raise ValueError(f"GET /v1/models answered {resp.status}")
    try:
        listing: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError("GET /v1/models: not JSON") from exc
    data = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(data, list):
        raise ValueError("GET /v1/models: no 'data' list")
    return [
        item["id"] for item in data if isinstance(item, dict) and isinstance(item.get("id"), str)
    ]
