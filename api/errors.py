"""The API's errors, leaves of :class:`pipeline.errors.LlmsloError`::

LlmsloError
└── QueryError              a verdict or history request is invalid (HTTP 400)
    └── UnknownCohortError  a cohort matches no request record at all (HTTP 404)
"""

from __future__ import annotations

from pipeline.errors import LlmsloError

__all__ = ["QueryError", "UnknownCohortError"]


class QueryError(LlmsloError):
    """A request parameter is invalid; the message names the parameter and the rule."""


class UnknownCohortError(QueryError):
    """A cohort's instances and labels match no request record in the store."""
