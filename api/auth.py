"""The bearer token that guards every state change (verdicts stored, flag overrides,
silences). The token's value lives in the environment variable named by
``ApiConfig.token_env``; nothing else is accepted and no token is ever logged."""

from __future__ import annotations

import hmac

from api.errors import AuthError

__all__ = ["bearer", "check_token"]


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else None."""
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return None


def check_token(expected: str | None, given: str | None, token_env: str) -> None:
    """Raise :class:`AuthError` unless ``given`` equals ``expected`` (constant time).

    403 when no token is configured (state changes are then refused), 401 when none was
    sent, 403 when it is wrong.
    """
    if not expected:
        raise AuthError(403, f"no API token is configured; set ${token_env} to allow changes")
    if not given:
        raise AuthError(401, "a bearer token is required (Authorization header or metadata.token)")
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise AuthError(403, "wrong token")
