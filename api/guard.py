"""The request-body guard: authentication before the body, and a size cap per route.

:class:`BodyGuard` is an ASGI middleware in front of the routes. For a route of
:data:`BODY_RULES` whose token comes in the ``Authorization`` header it checks the token
before a single body byte is read (401/403). It then reads the body itself, counting the
bytes as they stream in (``Content-Length`` or chunked): past the route's cap it answers
413, past ``body_timeout_s`` 408, without reading further. Refusals close the connection,
so the rest of an oversized body is never read. The route then gets the buffered body.

Flagger cannot send headers, so its token travels in the body (``metadata.token``): its
route reads at most :data:`FLAGGER_MAX_BODY_BYTES` before the handler checks the token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import AuthError, error_response
from pipeline.errors import LlmsloError

__all__ = [
    "BODY_RULES",
    "DEFAULT_MAX_BODY_BYTES",
    "FLAGGER_MAX_BODY_BYTES",
    "BodyGuard",
    "BodyRule",
]

#: Cap of any request body a rule does not name (no other route reads one).
DEFAULT_MAX_BODY_BYTES = 64 * 1024
#: A Flagger ``CanaryWebhookPayload`` is a few KB.
FLAGGER_MAX_BODY_BYTES = 16 * 1024


@dataclass(frozen=True)
class BodyRule:
    """Requests ``method path`` (``path`` ending in ``/`` is a prefix) may carry at most
    ``max_bytes`` of body; ``header_token``: the bearer token comes in the header and is
    checked before the body is read."""

    method: str
    path: str
    max_bytes: int
    header_token: bool

    def matches(self, method: str, path: str) -> bool:
        """Whether this rule governs ``method path``."""
        if method != self.method:
            return False
        return path.startswith(self.path) if self.path.endswith("/") else path == self.path


BODY_RULES = (
    BodyRule("POST", "/api/v1/verdict", DEFAULT_MAX_BODY_BYTES, header_token=True),
    BodyRule("POST", "/api/v1/silences", DEFAULT_MAX_BODY_BYTES, header_token=True),
    BodyRule("POST", "/api/v1/flags/overrides", 8 * 1024, header_token=True),
    BodyRule("POST", "/api/v1/flagger/", FLAGGER_MAX_BODY_BYTES, header_token=False),
)
_ANY = BodyRule("*", "", DEFAULT_MAX_BODY_BYTES, header_token=False)


class _BodyRefused(LlmsloError):
    """The body is refused with ``status`` (internal to the guard)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class BodyGuard:
    """ASGI middleware: ``authorize(authorization_header)`` raises
    :class:`~api.errors.AuthError` to refuse; refusals are counted in
    ``llmslo_api_refused_bodies_total{reason}``."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        authorize: Callable[[str | None], None],
        body_timeout_s: float,
        registry: CollectorRegistry,
        rules: tuple[BodyRule, ...] = BODY_RULES,
    ) -> None:
        self.app = app
        self.authorize = authorize
        self.body_timeout_s = body_timeout_s
        self.rules = rules
        self.refused = Counter(
            "llmslo_api_refused_bodies",
            "Requests refused before their body was used, by reason",
            ["reason"],
            registry=registry,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        rule = next((r for r in self.rules if r.matches(scope["method"], scope["path"])), _ANY)
        try:
            if rule.header_token:
                self._authorize(headers.get("authorization"))
            if not _has_body(headers):
                await self.app(scope, receive, send)
                return
            body = await self._read(receive, headers, rule.max_bytes)
        except _BodyRefused as refused:
            response = error_response(refused.status, str(refused), headers={"Connection": "close"})
            await response(scope, receive, send)
            return
        if body is None:  # the client went away
            return
        await self.app(scope, _replay(body, receive), send)

    def _authorize(self, authorization: str | None) -> None:
        try:
            self.authorize(authorization)
        except AuthError as exc:
            self.refused.labels(reason="token").inc()
            raise _BodyRefused(exc.status, str(exc)) from exc

    async def _read(self, receive: Receive, headers: dict[str, str], cap: int) -> bytes | None:
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:
            self.refused.labels(reason="too_large").inc()
            raise _BodyRefused(413, f"the body is larger than this route's {cap} bytes")
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > cap:
                        self.refused.labels(reason="too_large").inc()
                        raise _BodyRefused(413, f"the body is larger than this route's {cap} bytes")
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        return b"".join(chunks)
        except TimeoutError:
            self.refused.labels(reason="slow").inc()
            raise _BodyRefused(
                408, f"the body did not arrive within {self.body_timeout_s:g} s"
            ) from None


def _has_body(headers: dict[str, str]) -> bool:
    length = headers.get("content-length", "")
    return (length != "" and length != "0") or "transfer-encoding" in headers


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` that yields ``body`` once, then the server's next events (disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
