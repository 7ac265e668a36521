"""Failure-signature rules over what Prometheus scrapes (engines, dcgm-exporter, taps).

Every signature is *data*: its PromQL, labels, and the two promtool cases that prove it
(one firing, one silent), so a rule cannot be added without its test. The thresholds are
the SLO jobs' defaults (:class:`slo.signals.config.DetectorConfig`, :class:`slo.flags.FlagPolicy`)
so both paths judge alike. Names per engine version: reference/engine-metrics.md.

Two recording rules normalise the dialects first: ``llmslo:kv_free:ratio`` (1 − KV usage,
max over an instance's engines, never summed) and ``llmslo:engine_running:sum``.
See ``alerts/README.md`` for how to add a signature.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slo.flags import FlagPolicy
from slo.signals.catalog import FLAG, NOTICES, RUNBOOK_BASE_URL, SIGNALS, runbook_url
from slo.signals.config import DetectorConfig
from slo.signals.xid import XID_CLASSES, XID_CODES
from slo.windows import format_duration

__all__ = ["SIGNATURES", "Case", "Signature", "signature_groups", "signature_recordings"]

_D = DetectorConfig()
_F = FlagPolicy()
_BY = "pool, instance"
_STALL_FOR = format_duration(int(_D.stall_for_s * 1000))


@dataclass(frozen=True)
class Case:
    """A promtool case: input series (``{series: values}``), when to look, what should fire.

    ``alerts`` lists the label sets expected at ``eval_time`` beyond the rule's own labels
    (empty for the silent case).
    """

    series: Mapping[str, str]
    eval_time: str
    alerts: tuple[Mapping[str, str], ...] = ()


@dataclass(frozen=True)
class Signature:
    """One alerting rule and the cases that prove it.

    ``alert`` and the ``signal``/``severity`` labels come from the signal catalog
    (:func:`_named`); ``runbook`` is the file stem of its ``runbook_url``.
    """

    alert: str
    expr: str
    labels: Mapping[str, str]
    summary: str
    firing: Case
    silent: Case
    runbook: str
    for_: str = "0s"
    description: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """Unique id of the rule (alert name plus its distinguishing labels)."""
        labels = ("dialect", "level", "severity")
        parts = [self.alert, *(self.labels.get(k, "") for k in labels)]
        return "-".join(p for p in parts if p)


def _named(signal: str, **labels: str) -> dict[str, Any]:
    """A signature's ``alert``, ``labels`` and ``runbook`` from the catalog row of ``signal``."""
    row = SIGNALS[signal]
    return {
        "alert": row.alert,
        "labels": {"severity": row.severity, "signal": signal, **labels},
        "runbook": row.runbook,
    }


def _kv_free_expr() -> str:
    usage = [
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",  # ≤ 0.10; the `or` prefers the current name
        "sglang:token_usage",
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}',
        "trtllm_kv_cache_utilization",
    ]
    return "\nor\n".join(f"1 - max by ({_BY}) ({name})" for name in usage) + "\n"


def _running_expr() -> str:
    running = [
        "vllm:num_requests_running",
        "sglang:num_running_reqs",
        'nv_trt_llm_request_metrics{request_type="active"}',
        "trtllm_num_requests_running",
    ]
    return "\nor\n".join(f"sum by ({_BY}) ({name})" for name in running) + "\n"


def signature_recordings() -> list[dict[str, Any]]:
    """The dialect-normalising recording rules the signatures build on."""
    return [
        {"record": "llmslo:kv_free:ratio", "expr": _kv_free_expr()},
        {"record": "llmslo:engine_running:sum", "expr": _running_expr()},
    ]


_POD = {"pool": "llama", "instance": "pod-0:8000"}
_LABELS = 'pool="llama",instance="pod-0:8000"'


def _stall(dialect: str, expr: str, firing: dict[str, str], silent: dict[str, str]) -> Signature:
    return Signature(
        **_named("stall", dialect=dialect),
        expr=expr,
        summary="{{ $labels.instance }}: requests running but no token generated",
        description=f"Running > 0 and the token counter flat for {_STALL_FOR} "
        "(NCCL hang and kin). Check GPU activity and XIDs on the node.",
        # The counters last move at minute 3: detected within stall_for + one scrape.
        firing=Case(firing, "5m", (_POD,)),
        silent=Case(silent, "10m"),
    )


def _stalls() -> list[Signature]:
    # increase()/delta() need two samples in the window, so a slow scrape cannot fake a
    # flat counter; no `for:` on top, so detection takes stall_for + one scrape interval.
    w = _STALL_FOR
    vllm = (
        f"max by ({_BY}) (vllm:num_requests_running) > 0\n"
        f"and on ({_BY})\n"
        f"sum by ({_BY}) (increase(vllm:generation_tokens_total[{w}])) == 0\n"
    )
    # SGLang's scheduler gauges freeze when it hangs: trust the decode token counter when
    # the version has one, otherwise a gen_throughput gauge that has not changed at all.
    sglang_tokens = 'sglang:realtime_tokens_total{mode="decode"}'
    sglang = (
        f"max by ({_BY}) (sglang:num_running_reqs) > 0\n"
        f"and on ({_BY})\n(\n"
        f"  sum by ({_BY}) (increase({sglang_tokens}[{w}])) == 0\n"
        f"  or\n"
        f"  (max by ({_BY}) (changes(sglang:gen_throughput[{w}])) == 0\n"
        f"   and on ({_BY}) min by ({_BY}) (count_over_time(sglang:gen_throughput[{w}])) > 1\n"
        f"   unless on ({_BY}) sum by ({_BY}) (increase({sglang_tokens}[{w}])) > 0)\n"
        ")\n"
    )
    triton = (
        f'max by ({_BY}) (nv_trt_llm_request_metrics{{request_type="active"}}) > 0\n'
        f"and on ({_BY})\n"
        f'max by ({_BY}) (delta(nv_trt_llm_general_metrics{{general_type="iteration_counter"}}[{w}])) == 0\n'
    )
    serve = (
        f"max by ({_BY}) (trtllm_num_requests_running) > 0\n"
        f"and on ({_BY})\n"
        f"sum by ({_BY}) (increase(trtllm_generation_tokens_total[{w}])) == 0\n"
    )
    return [
        _stall(
            "vllm",
            vllm,
            {
                f"vllm:num_requests_running{{{_LABELS}}}": "4x15",
                f"vllm:generation_tokens_total{{{_LABELS}}}": "0+500x3 1500x12",
            },
            {
                f"vllm:num_requests_running{{{_LABELS}}}": "4x15",
                f"vllm:generation_tokens_total{{{_LABELS}}}": "0+500x15",
            },
        ),
        _stall(
            "sglang",
            sglang,
            {  # an old SGLang without realtime_tokens: every gauge frozen
                f"sglang:num_running_reqs{{{_LABELS}}}": "3x15",
                f"sglang:gen_throughput{{{_LABELS}}}": "10 20 30 121.5x12",
            },
            {
                f"sglang:num_running_reqs{{{_LABELS}}}": "3x15",
                f"sglang:gen_throughput{{{_LABELS}}}": "100+1x15",
            },
        ),
        _stall(
            "trtllm",
            triton,
            {
                f'nv_trt_llm_request_metrics{{{_LABELS},request_type="active"}}': "2x15",
                f'nv_trt_llm_general_metrics{{{_LABELS},general_type="iteration_counter"}}': "0+50x3 150x12",
            },
            {
                f'nv_trt_llm_request_metrics{{{_LABELS},request_type="active"}}': "2x15",
                f'nv_trt_llm_general_metrics{{{_LABELS},general_type="iteration_counter"}}': "0+50x15",
            },
        ),
        _stall(
            "trtllm-serve",
            serve,
            {
                f"trtllm_num_requests_running{{{_LABELS}}}": "2x15",
                f"trtllm_generation_tokens_total{{{_LABELS}}}": "0+80x3 240x12",
            },
            {
                f"trtllm_num_requests_running{{{_LABELS}}}": "2x15",
                f"trtllm_generation_tokens_total{{{_LABELS}}}": "0+80x15",
            },
        ),
    ]


def _kv_levels() -> list[Signature]:
    flag = NOTICES[FLAG]
    levels = [("L1", _F.l1_free), ("L2", _F.l2_free), ("L3", _F.l3_free)]
    out = []
    for level, free in levels:
        usage_firing = round(1 - free / 2, 6)
        severity = flag.severities[level]
        out.append(
            Signature(
                alert=flag.alert,
                expr=f"llmslo:kv_free:ratio < {free:g}\n",
                labels={"severity": severity, "signal": flag.signal, "level": level},
                runbook=flag.runbook,
                summary=f"{{{{ $labels.instance }}}}: KV free ratio below {free:.0%} ({level})",
                description="Degradation level "
                f"{level}: L1 disables speculative decoding, L2 rejects long prompts, L3 "
                "switches to the small-model replica.",
                firing=Case(
                    {f"vllm:kv_cache_usage_perc{{{_LABELS}}}": f"0.5 0.8 {usage_firing}x5"},
                    "5m",
                    (_POD,),
                ),
                silent=Case({f"sglang:token_usage{{{_LABELS}}}": "0.5 0.7 0.8x5"}, "5m"),
            )
        )
    return out


def _preemption() -> list[Signature]:
    per_min, kv = _D.preemptions_per_min, _D.preemption_kv_usage

    def expr(preemptions: str, waiting: str) -> str:
        return (
            f"sum by ({_BY}) (rate({preemptions}[5m])) * 60 > {per_min:g}\n"
            f"and on ({_BY}) (1 - llmslo:kv_free:ratio) >= {kv:g}\n"
            f"and on ({_BY}) max by ({_BY}) (deriv({waiting}[5m])) > 0\n"
        )

    def sig(dialect: str, preemptions: str, waiting: str, kv_name: str) -> Signature:
        return Signature(
            **_named("preemption_cascade", dialect=dialect),
            expr=expr(preemptions, waiting),
            summary="{{ $labels.instance }}: preemptions while KV is full and the queue grows",
            description=f"More than {per_min:g} preemptions/min with KV usage ≥ {kv:g} and "
            "waiting requests growing.",
            for_="2m",
            firing=Case(
                {
                    f"{preemptions}{{{_LABELS}}}": "0+20x12",
                    f"{kv_name}{{{_LABELS}}}": "0.95x12",
                    f"{waiting}{{{_LABELS}}}": "0+2x12",
                },
                "10m",
                (_POD,),
            ),
            silent=Case(
                {
                    f"{preemptions}{{{_LABELS}}}": "0+20x12",
                    f"{kv_name}{{{_LABELS}}}": "0.5x12",
                    f"{waiting}{{{_LABELS}}}": "0+2x12",
                },
                "10m",
            ),
        )

    return [
        sig(
            "vllm",
            "vllm:num_preemptions_total",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
        ),
        sig(
            "sglang",
            "sglang:num_retracted_requests_total",
            "sglang:num_queue_reqs",
            "sglang:token_usage",
        ),
    ]


_GPU = 'gpu="0",UUID="GPU-0",Hostname="node-0",pod="pod-0"'
_GPU_ALERT = {"gpu": "0", "UUID": "GPU-0", "Hostname": "node-0", "pod": "pod-0"}


_XID = "max by (Hostname, gpu, UUID, pod) (DCGM_FI_DEV_XID_ERRORS)"


def _xid_codes() -> dict[tuple[str, str], list[int]]:
    """(XID class, severity) → its codes, in table order: one rule each, so a rule's severity
    is the code's (xid.py), as on the pushed finding."""
    groups: dict[tuple[str, str], list[int]] = {}
    for code in XID_CODES.values():
        groups.setdefault((code.xid_class, code.severity), []).append(code.code)
    return groups


def _xid(signal: str, severity: str, expr: str, meaning: str, fires: int, quiet: int) -> Signature:
    named = _named(signal)
    return Signature(
        alert=named["alert"],
        expr=expr,
        labels={"severity": severity, "signal": signal},
        runbook=named["runbook"],
        summary="GPU {{ $labels.gpu }} on {{ $labels.Hostname }}: XID {{ $value }} "
        f"({meaning})",
        description="DCGM_FI_DEV_XID_ERRORS holds the last XID code of the GPU.",
        firing=Case({f"DCGM_FI_DEV_XID_ERRORS{{{_GPU}}}": f"0 0 {fires}x5"}, "5m", (_GPU_ALERT,)),
        silent=Case({f"DCGM_FI_DEV_XID_ERRORS{{{_GPU}}}": f"0 0 {quiet}x5"}, "5m"),
    )


def _xids() -> list[Signature]:
    # The silent case shows another class's code: a rule must not fire on it.
    known = list(XID_CODES)
    out = []
    for (name, severity), codes in _xid_codes().items():
        xid_class = XID_CLASSES[name]
        expr = "\nor\n".join(f"{_XID} == {code}" for code in codes) + "\n"
        quiet = next(c for c in known if XID_CODES[c].xid_class != name)
        out.append(_xid(xid_class.signal, severity, expr, xid_class.meaning, codes[0], quiet))
    other = XID_CLASSES["other"]
    listed = "\n  or\n".join(f"  {_XID} == {code}" for code in known)
    expr = f"{_XID} > 0\nunless\n(\n{listed}\n)\n"
    out.append(_xid(other.signal, other.severity, expr, other.meaning, 999, known[0]))
    return out


def _infrastructure() -> list[Signature]:
    restart_counters = [
        "vllm:generation_tokens_total",
        "sglang:num_requests_total",
        "nv_inference_count",
        "trtllm_generation_tokens_total",
    ]
    restart = f"max by ({_BY}) (changes(process_start_time_seconds[10m])) > 0\n" + "".join(
        f"or\nmax by ({_BY}) (resets({name}[10m])) > 0\n" for name in restart_counters
    )
    return [
        *_xids(),
        Signature(
            **_named("crash"),
            expr=restart,
            summary="{{ $labels.instance }}: the engine restarted in the last 10 minutes",
            description="process_start_time_seconds changed or an engine counter reset.",
            firing=Case(
                {f"vllm:generation_tokens_total{{{_LABELS}}}": "0+100x5 0+100x5"}, "8m", (_POD,)
            ),
            silent=Case({f"vllm:generation_tokens_total{{{_LABELS}}}": "0+100x11"}, "8m"),
        ),
        Signature(
            **_named("target_down"),
            expr="up == 0\n",
            for_="1m",
            summary="{{ $labels.instance }} ({{ $labels.job }}) cannot be scraped",
            description="Prometheus got no answer from this target: the engine, exporter or "
            "tap is down or unreachable.",
            firing=Case(
                {'up{job="engines",instance="pod-0:8000"}': "1 1 0x5"},
                "5m",
                ({"job": "engines", "instance": "pod-0:8000"},),
            ),
            silent=Case({'up{job="engines",instance="pod-0:8000"}': "1x7"}, "5m"),
        ),
        Signature(
            **_named("ghost_requests"),
            expr=(
                "llmslo:engine_running:sum\n"
                "- on (instance) group_left\n"
                "max by (instance) (llmslo_tap_in_flight) > 0\n"
            ),
            for_="1m",
            summary="{{ $labels.instance }}: the engine runs requests no client waits for",
            description="Engine running stays above the tap's in-flight streams: clients are "
            "gone but the engine keeps their requests (and KV). Scrape taps with "
            "honor_labels: true so their instance label names the engine.",
            firing=Case(
                {
                    f"vllm:num_requests_running{{{_LABELS}}}": "6x6",
                    'llmslo_tap_in_flight{instance="pod-0:8000"}': "6 2x5",
                },
                "5m",
                (_POD,),
            ),
            silent=Case(
                {
                    f"vllm:num_requests_running{{{_LABELS}}}": "6x6",
                    'llmslo_tap_in_flight{instance="pod-0:8000"}': "6x6",
                },
                "5m",
            ),
        ),
    ]


#: Every signature rule, in output order.
SIGNATURES: tuple[Signature, ...] = (*_stalls(), *_kv_levels(), *_preemption(), *_infrastructure())


def _rule(sig: Signature, runbook_base_url: str) -> dict[str, Any]:
    rule: dict[str, Any] = {"alert": sig.alert, "expr": sig.expr}
    if sig.for_ != "0s":
        rule["for"] = sig.for_
    rule["labels"] = dict(sig.labels)
    rule["annotations"] = {
        "summary": sig.summary,
        "description": sig.description,
        "runbook_url": runbook_url(runbook_base_url, sig.runbook),
    }
    return rule


def signature_groups(runbook_base_url: str = RUNBOOK_BASE_URL) -> list[dict[str, Any]]:
    """The rule groups of the failure signatures (recordings, then alerts)."""
    rules = [_rule(sig, runbook_base_url) for sig in SIGNATURES]
    return [
        {"name": "llmslo-signature-recordings", "rules": signature_recordings()},
        {"name": "llmslo-signature-alerts", "rules": rules},
    ]
