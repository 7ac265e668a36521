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

from api.errors import ReadOnlyStoreError
from api.flags import FlagWatcher, start_transition
from api.overrides import OverrideRequest, OverrideStore

__all__ = ["add_change_routes"]


_ID = Path(max_length=64, pattern=r"^[0-9a-fA-F-]{1,64}$")


def add_change_routes(
    app: FastAPI,
    watcher: FlagWatcher,
    *,
    token: Callable[[str | None], None],
    alertmanager_url: str | None,
    writable: bool = True,
    timeout_s: float = 5.0,
) -> None:
    """Register the override and silence routes; ``token(authorization)`` raises on refusal.

    Without ``writable`` (a read-only store) overrides are refused with 503; silences live
    in Alertmanager and still pass through.
    """
    provider = watcher.connection_provider

    def refuse_read_only() -> None:
        if not writable:
            raise ReadOnlyStoreError("the store is open read-only: overrides cannot be stored")

    @app.post("/api/v1/flags/overrides", tags=["flags"], status_code=201)
    def add_override(
        body: Annotated[OverrideRequest, Body()],
        authorization: Annotated[str | None, Header()] = None,
    ) -> dict[str, Any]:
        """Force a scope to a level until ``expires_in_s`` from now (token required)."""
        token(authorization)
        refuse_read_only()
        before = {(r["scope"], r["scope_id"]): r for r in watcher.current().table.to_pylist()}
        now_ms = int(watcher.clock() * 1000)
        with closing(provider()) as con:
            override = OverrideStore(con).add(body, now_ms)
        row = before.get((body.scope, body.scope_id))
        published = watcher.publish(
            [start_transition(override, 0 if row is None else int(row["to_level"]))]
        )
        watcher.refresh()
        return {"override": override.as_json(), "published": published}

    @app.get("/api/v1/flags/overrides", tags=["flags"])
    def list_overrides() -> dict[str, Any]:
        """Overrides in force now, oldest first."""
        now_ms = int(watcher.clock() * 1000)
        with closing(provider()) as con:
            active = OverrideStore(con).active(now_ms)
        return {"data": [o.as_json() for o in active], "count": len(active)}

    @app.delete("/api/v1/flags/overrides/{override_id}", tags=["flags"])
    def clear_override(
        override_id: Annotated[str, _ID], authorization: Annotated[str | None, Header()] = None
    ) -> dict[str, Any]:
        """End an override now (token required); 404 when none with that id is in force."""
        token(authorization)
        refuse_read_only()
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
