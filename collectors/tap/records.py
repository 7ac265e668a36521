"""One ``REQUEST_RECORDS`` row per attempt, from what the exchange measured (no text).

The grouping keys of a row (``pool``, ``tenant``, ``route``, ``instance``) come from the
tap's configuration or the engine, never from what a client sends: SLOs are evaluated per
group, so a client string as a key would create SLO groups (and pages) at will. The raw
requested model stays in its own column, ``model``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from collectors.config import check_label_value
from collectors.tap.labels import OTHER_MODEL
from collectors.tap.targets import met_own_targets

if TYPE_CHECKING:
    from collectors.tap.exchange import Exchange, RequestContext

__all__ = ["header_label", "record_row", "tenant_label"]


def header_label(
    headers: Mapping[str, str], header: str | None, name: str, default: str | None
) -> tuple[str | None, str | None]:
    """The ``revision``/``cohort`` (``name``) a request is stamped with, and a drop reason.

    The value of ``header`` when configured and present, else ``default`` (the tap's
    static setting). A header value that is no usable label (empty, over 253 characters,
    control characters) is not stamped: ``default`` is used and the reason
    ``bad_<name>_header`` returned, for the caller to count. Never raises (hot path).
    """
    value = headers.get(header) if header else None
    if value is None:
        return default, None
    try:
        return check_label_value(name, value), None
    except ValueError:
        return default, f"bad_{name}_header"


def tenant_label(value: str | None, allowed: frozenset[str]) -> str | None:
    """The ``tenant`` of a request whose tenant header said ``value``: itself when the
    operator listed it (``tap.tenants``), else ``other``; ``None`` without the header."""
    if not value:
        return None
    return value if value in allowed else OTHER_MODEL


def _ms(wall_s: float | None) -> int | None:
    return None if wall_s is None else int(wall_s * 1000)


def record_row(
    ctx: RequestContext,
    ex: Exchange,
    *,
    tap_id: str,
    pool: str,
    max_gaps: int = 256,
    gap_error_max_s: float = 0.005,
) -> dict[str, Any]:
    """The row for attempt ``ex`` of request ``ctx`` (plain Python values, schema column names).

    ``pool`` is the tap's (configured, or the bounded label of the requested model).
    The ITL summary columns (count, mean, percentiles, jitter, histogram) are over the gaps
    the tap can vouch for: those whose own error bound is within ``gap_error_max_s`` (a
    chunk read late spoils the two gaps beside it, not the request), and ``itl_error_s`` is
    the largest bound among them. ``itl_uncertain`` is set when dropping the others leaves
    fewer gaps than a jitter needs (null without gaps or without a bound): the summary is
    then of every gap as read, with the largest bound, and ITL SLIs leave the request out.
    ``itl_gaps_s`` keeps every gap as read.

    Its size is bounded whatever the stream's length: exact ITL summaries and a fixed-size
    histogram, and only the first ``max_gaps`` gaps (and ``max_gaps`` + 1 chunk token counts).
    """
    m = ex.finish()
    itl, itl_error_s, uncertain = m.vouched_itl(gap_error_max_s)
    return {
        "request_id": ex.request_id,
        "original_request_id": ctx.original_id,
        "attempt": ex.attempt,
        "tap_id": tap_id,
        "instance": ex.upstream.instance,
        "pool": pool,
        "model": ctx.model,
        "tenant": ctx.tenant,
        "route": ctx.route,
        "streamed": ctx.streamed,
        "received_ts_ms": int(ctx.received_wall_s * 1000),
        "deadline_ts_ms": _ms(ctx.deadline_wall_s),
        "http_status": ex.http_status,
        "upstream_status": ex.upstream_status,
        "outcome": ex.outcome or "error_before_first_token",
        "error_kind": ex.error_kind if ex.outcome != "ok" else None,
        "finish_reason": m.finish_reason,
        "ttfb_s": m.ttfb_s,
        "ttft_s": m.ttft_s,
        "tpot_s": m.tpot_s,
        "e2e_s": m.e2e_s if ex.http_status is not None else None,
        "prompt_tokens": m.prompt_tokens,
        "completion_tokens": m.completion_tokens,
        "token_chunks": m.token_chunks,
        "itl_count": itl.count,
        "itl_mean_s": itl.mean_s,
        "itl_p50_s": itl.p50_s,
        "itl_p90_s": itl.p90_s,
        "itl_p99_s": itl.p99_s,
        "itl_max_s": itl.max_s,
        "itl_jitter_s": itl.jitter_s,
        "itl_histogram": list(itl.histogram),
        "itl_gaps_s": m.itl_gaps_s[:max_gaps].tolist(),
        "chunk_tokens": m.chunk_tokens[: max_gaps + 1] if max_gaps else [],
        "client_disconnected": ex.disconnect_wall_s is not None,
        "disconnect_ts_ms": _ms(ex.disconnect_wall_s),
        "upstream_closed_ts_ms": _ms(ex.upstream_closed_wall_s),
        "tokens_after_disconnect": ex.tokens_after_disconnect,
        "address": ex.upstream.address,
        "revision": ctx.revision,
        "cohort": ctx.cohort,
        "tokens_source": m.tokens_source,
        "degradation_level": ctx.degradation_level,
        "enforced_action": ctx.enforced_action,
        "source": None,  # measured on the SSE path by a tap (the prober says "probe")
        "slo_ttft_s": ctx.own_targets.ttft_s,
        "slo_tpot_s": ctx.own_targets.tpot_s,
        "slo_met": met_own_targets(ctx.own_targets, m.ttft_s, m.tpot_s),
        "itl_error_s": itl_error_s,
        "itl_uncertain": uncertain,
    }
