"""The API's errors, leaves of :class:`pipeline.errors.LlmsloError`, each answered with its
HTTP status by :func:`api.app.create_app`::

    LlmsloError
    ├── QueryError                  (pipeline.errors) a request parameter is invalid (400)
    │   └── UnknownCohortError      a cohort matches no request record at all (404)
    ├── AuthError                   the bearer token is missing (401) or wrong (403)
    ├── ReadOnlyStoreError          a change was asked of a store opened read-only (503)
    ├── OverloadedError             the route's lane is full: shed with Retry-After (503)
    └── UnknownVerdictError         no stored verdict has that id (404)
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from pipeline.errors import LlmsloError, QueryError

__all__ = [
    "AuthError",
    "OverloadedError",
    "ReadOnlyStoreError",
    "UnknownCohortError",
    "UnknownVerdictError",
    "error_response",
]


def error_response(
    status: int, message: str, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    """The API's error answer ``{"error": message, ...extra}``; a 401 says ``Bearer``."""
    headers = dict(headers or {})
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)


class UnknownCohortError(QueryError):
    """A cohort's instances and labels match no request record in the store."""

    def __init__(self, message: str) -> None:
        super().__init__(None, message)


class AuthError(LlmsloError):
    """Missing (401) or wrong (403) token; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ReadOnlyStoreError(LlmsloError):
    """The store is open read-only, so a change (an override) cannot be stored."""


class UnknownVerdictError(LlmsloError):
    """No stored verdict has that id."""


class OverloadedError(LlmsloError):
    """A lane of the API is full; the client should retry after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
