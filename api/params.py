"""Verdict request parameters, identical for Argo's query string / JSON body and Flagger's
``metadata`` (reference/canary-and-peers.md §2.2). Every value may arrive as a string.

:func:`parse_params` validates once and turns them into cohorts and a time range; any
failure is a :class:`~pipeline.errors.QueryError` whose message names the parameter. A
canary is never judged against itself: cohorts whose definitions overlap (a shared instance
with compatible labels, or the same definition) are refused here, and cohorts that can only
be told apart by the data (label selectors) are marked for :func:`~api.cohorts.shared_requests`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from api.cohorts import MAX_RANGE_MS, Cohort, TimeRange
from pipeline.errors import QueryError
from pipeline.units import DAY_MS
from slo import windows

__all__ = ["ParsedRequest", "VerdictParams", "parse_duration_ms", "parse_params"]

_NAME = Field(default=None, max_length=253)


def parse_duration_ms(text: str) -> int:
    """A duration in the one grammar (``slo.windows.parse_duration_ms``), at most 31 days."""
    duration_ms = windows.parse_duration_ms(text)
    if duration_ms > MAX_RANGE_MS:
        raise ValueError(f"{text!r} is longer than {MAX_RANGE_MS // DAY_MS} days")
    return duration_ms


def _parse_time_ms(text: str) -> int:
    """RFC 3339 (``2026-08-20T10:05:00Z``) or integer Unix epoch ms → epoch ms."""
    text = text.strip()
    if text.isdigit() and len(text) <= 15:
        return int(text)
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not an RFC 3339 time or epoch milliseconds") from None
    if parsed.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone (add Z)")
    return int(parsed.timestamp() * 1000)


def _split(text: str | list[str] | None) -> tuple[str, ...]:
    if text is None:
        return ()
    items = text if isinstance(text, list) else text.split(",")
    return tuple(item.strip() for item in items if item.strip())


def _selector(text: str | None, name: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    for part in _split(text):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{name}: {part!r} is not label=value")
        labels[key.strip()] = value.strip()
    return labels


class VerdictParams(BaseModel):
    """The parameters of one verdict request (unknown names are refused)."""

    model_config = ConfigDict(extra="forbid", str_max_length=65_536)

    namespace: str | None = _NAME
    service: str | None = _NAME
    canary_instances: str | list[str] | None = None
    baseline_instances: str | list[str] | None = None
    #: ``label=value[,label=value]`` on request-record labels, e.g. ``revision=r2``.
    canary_selector: str | None = None
    baseline_selector: str | None = None
    #: Look-back ending at ``at`` (or now), e.g. ``10m``; ignored when ``start`` is given.
    window: str | None = None
    at: str | None = None
    start: str | None = None
    end: str | None = None
    min_requests: int | None = Field(default=None, ge=1, le=1_000_000_000)
    on_inconclusive: Literal["fail", "pass", "inconclusive"] = "inconclusive"

    @field_validator("window")
    @classmethod
    def _window(cls, value: str | None) -> str | None:
        if value is not None:
            parse_duration_ms(value)
        return value


@dataclass(frozen=True)
class ParsedRequest:
    """Validated parameters: the two cohorts and the judged range. ``disjoint``: no
    request can fall in both cohorts whatever the data (else the caller checks the data)."""

    params: VerdictParams
    canary: Cohort
    baseline: Cohort
    time_range: TimeRange
    disjoint: bool


def _cohort(instances: str | list[str] | None, selector: str | None, side: str) -> Cohort:
    labels = _selector(selector, f"{side}_selector")
    if not _split(instances) and not labels:
        raise ValueError(f"{side}: give {side}_instances or {side}_selector")
    try:
        return Cohort(instances=_split(instances), labels=labels)
    except ValidationError as exc:
        raise ValueError(f"{side} cohort: {_describe(exc)}") from exc


def parse_params(raw: Mapping[str, object], now_ms: int, default_window: str) -> ParsedRequest:
    """Validate ``raw`` (query string, JSON body or Flagger metadata) at time ``now_ms``.

    Raises:
        QueryError: a parameter is missing, malformed or out of bounds (message names it).
    """
    try:
        params = VerdictParams.model_validate(dict(raw))
        canary = _cohort(params.canary_instances, params.canary_selector, "canary")
        baseline = _cohort(params.baseline_instances, params.baseline_selector, "baseline")
        if params.start is not None:
            start = _parse_time_ms(params.start)
            end = _parse_time_ms(params.end) if params.end is not None else now_ms
        else:
            end = _parse_time_ms(params.at) if params.at is not None else now_ms
            start = end - parse_duration_ms(params.window or default_window)
        time_range = TimeRange(start_ms=start, end_ms=end)
    except ValidationError as exc:
        raise QueryError(None, _describe(exc)) from exc
    except ValueError as exc:
        raise QueryError(None, str(exc)) from exc
    return ParsedRequest(params, canary, baseline, time_range, _disjoint(canary, baseline))


def _disjoint(canary: Cohort, baseline: Cohort) -> bool:
    """True when no request can be in both cohorts; False when the data must tell.

    Raises:
        QueryError: the definitions overlap (the message names the overlap).
    """
    if canary == baseline:
        raise QueryError(
            None, f"canary and baseline select the same requests ({canary.describe()})"
        )
    conflicting = any(
        baseline.labels.get(key, value) != value for key, value in canary.labels.items()
    )
    if conflicting:  # a label with two different values: a record carries one
        return True
    if canary.instances and baseline.instances:
        shared = sorted(set(canary.instances) & set(baseline.instances))
        if shared:
            names = ", ".join(shared[:10]) + (" …" if len(shared) > 10 else "")
            raise QueryError(
                None,
                f"canary and baseline select the same requests: instance(s) {names} "
                "in both cohorts",
            )
        return True  # a record has one instance
    return False


def _describe(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in error['loc']) or 'parameters'}: {error['msg']}"
        for error in exc.errors()
    )
