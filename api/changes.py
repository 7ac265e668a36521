"""The state-changing routes, each behind the bearer token: manual flag overrides and the
alert-silence pass-through to Alertmanager (``/api/v2/silences``).

Missing token → 401, wrong or unconfigured token → 403, and nothing changes. An override is
stored in ``flag_overrides``, applied by the flags watcher at once, and published to the
``flags`` topic (when the process has a bus) so taps follow it; it vanishes at its expiry.
A silence is relayed as-is: Alertmanager validates it and its status and body come back.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import closing
from typing import Annotated, Any

import httpx
from fastapi import Body, FastAPI, Header, Path
from fastapi.responses import JSONResponse, Response

from api.capacity import Lane
from api.errors import ReadOnlyStoreError
from api.flags import FlagWatcher, start_transition
from api.overrides import FlagOverride, OverrideRequest, OverrideStore, check_scope

__all__ = ["add_change_routes"]


_ID = Path(max_length=64, pattern=r"^[0-9a-fA-F-]{1,64}$")


def add_change_routes(
    app: FastAPI,
    watcher: FlagWatcher,
    *,
    token: Callable[[str | None], None],
    alertmanager_url: str | None,
    reads: Lane,
    changes: Lane,
    writable: bool = True,
    timeout_s: float = 5.0,
) -> None:
    """Register the override and silence routes; ``token(authorization)`` raises on refusal.
    Overrides are set and cleared on ``changes``' threads, listed on ``reads``'.

    Without ``writable`` (a read-only store) overrides are refused with 503; silences live
    in Alertmanager and still pass through.
    """
    provider = watcher.connection_provider

    def refuse_read_only() -> None:
        if not writable:
            raise ReadOnlyStoreError("the store is open read-only: overrides cannot be stored")

    @app.post("/api/v1/flags/overrides", tags=["flags"], status_code=201)
    async def add_override(
        body: Annotated[OverrideRequest, Body()],
        authorization: Annotated[str | None, Header()] = None,
    ) -> dict[str, Any]:
        """Force a scope to a level until ``expires_in_s`` from now (token required); the
        scope (and ``pool``) must be one the store knows, else 400 naming it."""
        token(authorization)
        refuse_read_only()
        return await changes.run(lambda: override(body))

    def override(body: OverrideRequest) -> dict[str, Any]:
        before = {(r["scope"], r["scope_id"]): r for r in watcher.current().table.to_pylist()}
        now_ms = int(watcher.clock() * 1000)
        with closing(provider()) as con:
            check_scope(con, body, before)
            stored = OverrideStore(con).add(body, now_ms)
        row = before.get((body.scope, body.scope_id))
        published = watcher.publish(
            [start_transition(stored, 0 if row is None else int(row["to_level"]))]
        )
        watcher.refresh()
        return {"override": stored.as_json(), "published": published}

    @app.get("/api/v1/flags/overrides", tags=["flags"])
    async def list_overrides() -> dict[str, Any]:
        """Overrides in force now, oldest first."""
        now_ms = int(watcher.clock() * 1000)

        def read() -> list[FlagOverride]:
            with closing(provider()) as con:
                return OverrideStore(con).active(now_ms)

        active = await reads.run(read)
        return {"data": [o.as_json() for o in active], "count": len(active)}

    @app.delete("/api/v1/flags/overrides/{override_id}", tags=["flags"])
    async def clear_override(
        override_id: Annotated[str, _ID], authorization: Annotated[str | None, Header()] = None
    ) -> dict[str, Any]:
        """End an override now (token required); 404 when none with that id is in force."""
        token(authorization)
        refuse_read_only()
        return await changes.run(lambda: clear(override_id))

    def clear(override_id: str) -> dict[str, Any]:
        now_ms = int(watcher.clock() * 1000)
        with closing(provider()) as con:
            cleared = OverrideStore(con).clear(override_id, now_ms)
        if cleared is None:
            raise LookupError(f"no override {override_id!r} in force")
        watcher.refresh()  # publishes the transition back to the computed level
        return {"override": cleared.as_json()}

    async def relay(method: str, path: str, body: Any = None) -> Response:
        if not alertmanager_url:
            return JSONResponse(
                {"error": "no Alertmanager configured (api.alertmanager_url)"}, status_code=503
            )
        url = alertmanager_url.rstrip("/") + path
        try:
            async with httpx.AsyncClient(timeout=timeout_s) as client:
                answer = await client.request(method, url, json=body)
        except httpx.HTTPError as exc:
            return JSONResponse({"error": f"Alertmanager unreachable: {exc}"}, status_code=502)
        return Response(
            answer.content,
            status_code=answer.status_code,
            media_type=answer.headers.get("content-type", "application/json"),
        )

    @app.post("/api/v1/silences", tags=["alerts"])
    async def add_silence(
        body: Annotated[dict[str, Any], Body()],
        authorization: Annotated[str | None, Header()] = None,
    ) -> Response:
        """Create (or update, with ``id``) an Alertmanager silence; body as Alertmanager's
        ``PostableSilence`` (token required). Alertmanager's status and body come back."""
        token(authorization)
        return await relay("POST", "/api/v2/silences", body)

    @app.get("/api/v1/silences", tags=["alerts"])
    async def list_silences() -> Response:
        """Alertmanager's silences, as it lists them."""
        return await relay("GET", "/api/v2/silences")

    @app.delete("/api/v1/silences/{silence_id}", tags=["alerts"])
    async def expire_silence(
        silence_id: Annotated[str, _ID], authorization: Annotated[str | None, Header()] = None
    ) -> Response:
        """Expire a silence (token required)."""
        token(authorization)
        return await relay("DELETE", f"/api/v2/silence/{silence_id}")
