"""History generator: days of synthetic engine, GPU and request rows with simulated timestamps.

For dashboards, 30-day burn-rate windows and benchmarks. Rows follow the spine schemas:
ENGINE_SAMPLES as a collector would write them after canonicalisation (vLLM V1 metric
names, canonical ``signal`` names from :mod:`pipeline.signals`, cumulative counters and
histogram buckets), GPU_SAMPLES as dcgm-exporter scrapes, REQUEST_RECORDS per DESIGN §3
(a sample of requests per pod and interval). Load follows a diurnal curve; optional
incidents (one hour, TTFT × 6 and 5 % errors) give burn-rate windows something to find.
Output goes through a :class:`HistorySink`: straight into DuckDB or through Kafka.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa
from scipy.stats import lognorm

from pipeline.errors import BusError
from pipeline.publisher import Publisher
from pipeline.schema import ENGINE_SAMPLES, GPU_SAMPLES, REQUEST_RECORDS, RecordSchema
from pipeline.store import Store
from pipeline.units import DAY_MS, HOUR_MS
from simulator.dialects.vllm import ITL_BUCKETS, TTFT_BUCKETS

__all__ = ["BusSink", "HistoryConfig", "HistoryGenerator", "HistorySink", "StoreSink"]

_GAUGES = (
    ("vllm:num_requests_running", "running"),
    ("vllm:num_requests_waiting", "waiting"),
    ("vllm:kv_cache_usage_perc", "kv_usage"),
)
_COUNTERS = (
    ("vllm:num_preemptions_total", "preemptions"),
    ("vllm:prompt_tokens_total", "prompt_tokens"),
    ("vllm:generation_tokens_total", "generation_tokens"),
)
_HISTOGRAMS = (
    ("vllm:time_to_first_token_seconds", "ttft", TTFT_BUCKETS),
    ("vllm:request_time_per_output_token_seconds", "tpot", ITL_BUCKETS),
)
_GPU = (
    ("DCGM_FI_DEV_GPU_UTIL", "gpu_util"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "engine_active"),
    ("DCGM_FI_DEV_FB_USED", "fb_used_mib"),
    ("DCGM_FI_DEV_FB_FREE", "fb_free_mib"),
    ("DCGM_FI_DEV_XID_ERRORS", "xid"),
    ("DCGM_FI_DEV_GPU_TEMP", "temperature_c"),
    ("DCGM_FI_DEV_POWER_USAGE", "power_w"),
)


class HistorySink(Protocol):
    """Where generated rows go."""

    def write(self, schema: RecordSchema, table: pa.Table) -> None: ...


class StoreSink:
    """Straight into DuckDB via ``Store.commit_batch`` (one transaction per chunk).

    Passes the tables exactly as the ingester does (schema-shaped Arrow, a list per table).
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    def write(self, schema: RecordSchema, table: pa.Table) -> None:
        ts_ms = int(table.column(0)[0].as_py()) if schema is not REQUEST_RECORDS else 0
        self.store.commit_batch(
            {schema.table: [table]}, group_id="llmslo-sim-history", offsets={}, now_ts_ms=ts_ms
        )


class BusSink:
    """Through Kafka with the one bounded, retrying :class:`~pipeline.publisher.Publisher`
    (the ingester stores the rows). Each chunk waits for its acks before the next is
    generated, so a slow or absent broker slows the generator down instead of dropping."""

    def __init__(self, publisher: Publisher, ack_timeout_s: float = 120.0) -> None:
        self.publisher = publisher
        self.ack_timeout_s = ack_timeout_s

    def write(self, schema: RecordSchema, table: pa.Table) -> None:
        self.publisher.put(schema, table)
        if not self.publisher.flush(self.ack_timeout_s):
            raise BusError(
                f"history rows not acknowledged by Kafka within {self.ack_timeout_s:.0f} s"
            )


@dataclass(frozen=True)
class HistoryConfig:
    """What to generate; ``end_ts_ms`` is the last simulated scrape (Unix ms)."""

    days: float
    end_ts_ms: int
    pods: int = 8
    gpus_per_node: int = 8
    interval_s: int = 60
    model: str = "llama-3-8b"
    peak_req_per_s: float = 4.0
    request_sample: float = 0.05
    incidents_per_day: float = 1.0
    seed: int = 0
    #: Incident start times (Unix ms) instead of ``incidents_per_day`` random ones: a test or
    #: a drill that must know when the fault happened.
    incident_starts_ms: tuple[int, ...] | None = None


def _dict(values: list[str]) -> pa.DictionaryArray:
    return pa.array(values).dictionary_encode()


class HistoryGenerator:
    """Generates one hour of rows at a time (:meth:`chunks`), all pods vectorised."""

    def __init__(self, config: HistoryConfig) -> None:
        self.config = config
        self.rng = np.random.default_rng(config.seed)
        n = config.pods
        # Named as a pod-labelled scrape target and its tap name them (the DCGM rows' pod
        # label too, so GPUs join their engine); host:port goes to the address column.
        self.instances = [f"pod-{i}" for i in range(n)]
        self.addresses = [f"10.42.{i // 250}.{i % 250 + 1}:8000" for i in range(n)]
        self.skew = self.rng.uniform(0.8, 1.2, n)
        self.counters = np.zeros((n, len(_COUNTERS)))
        self.finished = np.zeros((n, 3))  # stop, length, error
        self.hist = [np.zeros((n, len(b) + 2)) for _, _, b in _HISTOGRAMS]  # buckets..., +Inf, sum
        self.start_ts_ms = config.end_ts_ms - int(config.days * DAY_MS)
        span_s = max(0.0, config.days * 86_400 - 3600)
        count = round(config.incidents_per_day * config.days)
        starts = np.sort(self.rng.uniform(0, span_s, count)) if span_s > 0 else np.zeros(0)
        self.incidents = [self.start_ts_ms + int(s * 1000) for s in starts]
        if config.incident_starts_ms is not None:
            self.incidents = sorted(config.incident_starts_ms)
        self._req_seq = 0

    def _load(self, ts_ms: np.ndarray) -> np.ndarray:
        hour = (ts_ms / HOUR_MS) % 24
        return 0.55 + 0.4 * np.sin(2 * math.pi * (hour - 9) / 24)

    def _incident(self, ts_ms: int) -> bool:
        return any(0 <= ts_ms - start < HOUR_MS for start in self.incidents)

    @property
    def hours(self) -> int:
        """How many hour chunks :meth:`chunks` yields (an engine chunk each)."""
        step_ms = self.config.interval_s * 1000
        stamps = len(range(self.start_ts_ms + step_ms, self.config.end_ts_ms + 1, step_ms))
        per_hour = len(range(0, HOUR_MS - step_ms + 1, step_ms))
        return -(-stamps // per_hour)

    def chunks(self) -> Iterator[tuple[RecordSchema, pa.Table]]:
        """(schema, rows) per simulated hour, engine then GPU then requests."""
        cfg = self.config
        step_ms = cfg.interval_s * 1000
        ts = self.start_ts_ms + step_ms
        while ts <= cfg.end_ts_ms:
            hour_end = min(cfg.end_ts_ms, ts + HOUR_MS - step_ms)
            stamps = np.arange(ts, hour_end + 1, step_ms, dtype=np.int64)
            yield ENGINE_SAMPLES, self._engine_hour(stamps)
            yield GPU_SAMPLES, self._gpu_hour(stamps)
            requests = self._requests_hour(stamps)
            if requests.num_rows:
                yield REQUEST_RECORDS, requests
            ts = int(stamps[-1]) + step_ms

    # ---- engine samples -------------------------------------------------------------------
    def _engine_template(self) -> list[tuple[str, str, str, float | None, str]]:
        """One pod's scrape layout: (metric, signal, kind, le, labels_json) per row."""
        model = self.config.model
        base = json.dumps({"engine": "0", "model_name": model}, sort_keys=True)
        rows: list[tuple[str, str, str, float | None, str]] = []
        rows += [(metric, signal, "gauge", None, base) for metric, signal in _GAUGES]
        rows += [(metric, signal, "counter", None, base) for metric, signal in _COUNTERS]
        for reason in ("stop", "length", "error"):
            labels = json.dumps(
                {"engine": "0", "finished_reason": reason, "model_name": model}, sort_keys=True
            )
            rows.append(
                ("vllm:request_success_total", "requests_finished", "counter", None, labels)
            )
        for metric, signal, bounds in _HISTOGRAMS:
            rows += [(f"{metric}_bucket", signal, "bucket", float(le), base) for le in bounds]
            rows.append((f"{metric}_bucket", signal, "bucket", math.inf, base))
            rows.append((f"{metric}_count", signal, "count", None, base))
            rows.append((f"{metric}_sum", signal, "sum", None, base))
        return rows

    def _engine_values(self, ts: int, load: float, bad: bool) -> np.ndarray:
        """Advance the counters one interval; returns the (pods, rows) values of one scrape."""
        cfg, n, rng = self.config, self.config.pods, self.rng
        rate = cfg.peak_req_per_s * load * self.skew
        done = rng.poisson(rate * cfg.interval_s)
        running = rng.poisson(rate * 6.0)
        waiting = rng.poisson(np.maximum(0.0, rate * (4.0 if bad else 0.3)))
        kv = np.clip(
            0.15 + 0.6 * load * self.skew + rng.normal(0, 0.03, n) + (0.25 if bad else 0.0), 0, 1
        )
        self.counters[:, 0] += rng.poisson(0.02 * done * (20 if bad else 1))
        self.counters[:, 1] += done * rng.integers(300, 900, n)
        self.counters[:, 2] += done * rng.integers(80, 250, n)
        errors = rng.binomial(done, 0.05 if bad else 0.001)
        length = rng.binomial(done - errors, 0.1)
        self.finished += np.stack([done - errors - length, length, errors], axis=1)
        parts = [np.stack([running, waiting, kv], axis=1), self.counters, self.finished]
        ttft_median = 0.12 * (6.0 if bad else 1.0) * (1 + load)
        for h, (_, signal, bounds) in enumerate(_HISTOGRAMS):
            median = ttft_median if signal == "ttft" else 0.035 * (1.5 if bad else 1.0)
            cdf = lognorm.cdf(np.array(bounds), 0.6, scale=median)
            hist = self.hist[h]
            hist[:, : len(bounds)] += np.floor(np.outer(done, cdf) + 1e-9)
            hist[:, len(bounds)] += done
            hist[:, -1] += done * median * math.exp(0.18)
            inf = hist[:, len(bounds) : len(bounds) + 1]
            parts.append(np.concatenate([hist[:, : len(bounds)], inf, inf, hist[:, -1:]], axis=1))
        return np.concatenate(parts, axis=1)

    def _engine_hour(self, stamps: np.ndarray) -> pa.Table:
        cfg, n = self.config, self.config.pods
        template = self._engine_template()
        r = len(template)
        values = np.stack(
            [
                self._engine_values(int(t), self._load_at(int(t)), self._incident(int(t)))
                for t in stamps
            ]
        )
        total = len(stamps) * n * r
        per_pod = [np.tile(_codes(col), n * len(stamps)) for col in zip(*template, strict=True)]
        metric, signal, kind, labels = (
            _dict_from(per_pod[i], [row[i] for row in template]) for i in (0, 1, 2, 4)
        )
        le_values = np.tile(
            np.array([row[3] if row[3] is not None else np.nan for row in template]),
            n * len(stamps),
        )
        le_mask = np.tile(np.array([row[3] is None for row in template]), n * len(stamps))
        instance = pa.DictionaryArray.from_arrays(
            np.tile(np.repeat(np.arange(n, dtype=np.int32), r), len(stamps)), self.instances
        )
        return pa.Table.from_arrays(
            [
                pa.array(np.repeat(stamps, n * r)),
                instance,
                _const(cfg.model, total),
                _const("vllm", total),
                _const(cfg.model, total),
                _const("0", total),
                metric,
                signal,
                kind,
                pa.array(le_values, pa.float64(), mask=le_mask),
                labels,
                pa.array(values.ravel()),
                pa.DictionaryArray.from_arrays(instance.indices, self.addresses),
            ],
            schema=ENGINE_SAMPLES.arrow,
        )

    # ---- GPU samples ----------------------------------------------------------------------
    def _gpu_hour(self, stamps: np.ndarray) -> pa.Table:
        cfg, n, rng = self.config, self.config.pods, self.rng
        t, g = len(stamps), len(_GPU)
        load = np.array([self._load_at(int(ts)) for ts in stamps])
        active = np.clip(load[:, None] * self.skew[None, :] + rng.normal(0, 0.05, (t, n)), 0, 1)
        values = np.stack(
            [
                np.round(100 * active),
                active * 0.8,
                np.full((t, n), 73403.0),
                np.full((t, n), 7584.0),
                np.zeros((t, n)),
                35 + 40 * active,
                72 + 620 * active,
            ],
            axis=2,
        )
        total = t * n * g
        node, gpu = np.divmod(np.arange(n), cfg.gpus_per_node)
        pod_rows = np.tile(np.repeat(np.arange(n, dtype=np.int32), g), t)
        field_rows = np.tile(np.arange(g, dtype=np.int32), n * t)
        labels = [
            '{"err_code": "0", "err_msg": "No Error"}' if s == "xid" else "{}" for _, s in _GPU
        ]

        def per_pod(values_: list[str]) -> pa.DictionaryArray:
            return pa.DictionaryArray.from_arrays(pod_rows, values_)

        return pa.Table.from_arrays(
            [
                pa.array(np.repeat(stamps, n * g)),
                per_pod([f"node-{k}" for k in node]),  # an exporter goes by its node
                per_pod([f"node-{k}" for k in node]),
                pa.array(gpu[pod_rows].astype(np.int32)),
                per_pod([self._uuid(i) for i in range(n)]),
                per_pod([f"nvidia{k}" for k in gpu]),
                _const("NVIDIA H100 80GB HBM3", total),
                pa.nulls(total, pa.dictionary(pa.int32(), pa.string())),
                per_pod([f"pod-{i}" for i in range(n)]),
                _const("default", total),
                _const("engine", total),
                pa.DictionaryArray.from_arrays(field_rows, [m for m, _ in _GPU]),
                pa.DictionaryArray.from_arrays(field_rows, [s for _, s in _GPU]),
                pa.DictionaryArray.from_arrays(field_rows, labels),
                pa.array(values.ravel()),
                per_pod([f"10.43.{k // 250}.{k % 250 + 1}:9400" for k in node]),
            ],
            schema=GPU_SAMPLES.arrow,
        )

    def _uuid(self, pod: int) -> str:
        digest = hashlib.sha1(f"{self.config.seed}/{pod}".encode()).hexdigest()
        return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"

    # ---- request records ------------------------------------------------------------------
    def _requests_hour(self, stamps: np.ndarray) -> pa.Table:
        cfg, rng, n = self.config, self.rng, self.config.pods
        load = np.array([self._load_at(int(ts)) for ts in stamps])
        bad = np.array([self._incident(int(ts)) for ts in stamps])
        expected = (
            cfg.peak_req_per_s
            * load[:, None]
            * self.skew[None, :]
            * cfg.interval_s
            * cfg.request_sample
        )
        counts = rng.poisson(expected).ravel()  # (scrape, pod) flattened
        m = int(counts.sum())
        if m == 0:
            return REQUEST_RECORDS.arrow.empty_table()
        cell = np.repeat(np.arange(len(counts)), counts)
        scrape, pod = np.divmod(cell, n)
        is_bad, lo = bad[scrape], load[scrape]
        received = stamps[scrape] - rng.integers(0, cfg.interval_s * 1000, m)
        ttft = rng.lognormal(np.log(0.12 * np.where(is_bad, 6.0, 1.0) * (1 + lo)), 0.6)
        tpot = rng.lognormal(np.log(0.035 * np.where(is_bad, 1.5, 1.0)), 0.3)
        tokens = rng.integers(20, 400, m)
        roll = rng.random(m)
        outcome = np.full(m, "ok", dtype=object)
        outcome[roll < np.where(is_bad, 0.08, 0.005)] = "client_cancelled"
        outcome[roll < np.where(is_bad, 0.07, 0.003)] = "interrupted_after_first_token"
        outcome[roll < np.where(is_bad, 0.05, 0.001)] = "error_before_first_token"
        failed = outcome == "error_before_first_token"
        ok_mask = outcome == "ok"
        e2e = np.where(failed, 0.05, ttft + tpot * (tokens - 1))
        first = self._req_seq + 1
        self._req_seq += m
        ids = [f"hist-{cfg.seed}-{i}" for i in range(first, first + m)]
        const = {
            "tap_id": "history",
            "pool": cfg.model,
            "model": cfg.model,
            "route": "/v1/chat/completions",
        }
        columns: dict[str, pa.Array] = {
            "request_id": pa.array(ids),
            "original_request_id": pa.array(ids),
            "attempt": pa.array(np.ones(m, np.int16)),
            "instance": pa.DictionaryArray.from_arrays(pod.astype(np.int32), self.instances),
            "address": pa.DictionaryArray.from_arrays(pod.astype(np.int32), self.addresses),
            "streamed": pa.array(np.ones(m, bool)),
            "received_ts_ms": pa.array(received.astype(np.int64)),
            "http_status": pa.array(np.where(failed, 500, 200).astype(np.int16)),
            "outcome": pa.array(outcome.tolist()).dictionary_encode(),
            "error_kind": pa.array(outcome, pa.string(), mask=ok_mask).dictionary_encode(),
            "finish_reason": pa.array(
                np.full(m, "stop", dtype=object), pa.string(), mask=failed
            ).dictionary_encode(),
            "ttfb_s": pa.array(ttft, mask=failed),
            "ttft_s": pa.array(ttft, mask=failed),
            "tpot_s": pa.array(tpot, mask=failed),
            "e2e_s": pa.array(e2e),
            "prompt_tokens": pa.array(rng.integers(50, 3000, m).astype(np.int32)),
            "completion_tokens": pa.array(np.where(failed, 0, tokens).astype(np.int32)),
            "token_chunks": pa.array(np.where(failed, 0, tokens).astype(np.int32)),
            "itl_count": pa.array(np.where(failed, 0, np.maximum(tokens - 1, 0)).astype(np.int32)),
            "itl_mean_s": pa.array(tpot, mask=failed),
            "itl_p50_s": pa.array(tpot * 0.95, mask=failed),
            "itl_p90_s": pa.array(tpot * 1.6, mask=failed),
            "itl_p99_s": pa.array(tpot * 2.2, mask=failed),
            "itl_max_s": pa.array(tpot * 3.5, mask=failed),
            # p99 − median, for requests of at least 10 token-bearing chunks (as the tap)
            "itl_jitter_s": pa.array(tpot * (2.2 - 0.95), mask=failed | (tokens < 10)),
            "client_disconnected": pa.array(outcome == "client_cancelled"),
        }
        arrays = []
        for field in REQUEST_RECORDS.arrow:
            if field.name in columns:
                arrays.append(columns[field.name].cast(field.type))
            elif field.name in const:
                arrays.append(_const(const[field.name], m))
            else:
                arrays.append(pa.nulls(m, field.type))
        return pa.Table.from_arrays(arrays, schema=REQUEST_RECORDS.arrow)

    def _load_at(self, ts_ms: int) -> float:
        return float(self._load(np.array([ts_ms]))[0])


def _const(value: str, count: int) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(np.zeros(count, np.int32), [value])


def _codes(column: tuple[object, ...]) -> np.ndarray:
    """Dictionary codes of one template column (first occurrence order)."""
    seen: dict[object, int] = {}
    return np.array([seen.setdefault(_key(v), len(seen)) for v in column], dtype=np.int32)


def _key(value: object) -> object:
    return "\x00none" if value is None else value


def _dict_from(codes: np.ndarray, column: list[object]) -> pa.DictionaryArray:
    """A dictionary array of a string template column from its tiled codes."""
    values = list(dict.fromkeys(_key(v) for v in column))
    return pa.DictionaryArray.from_arrays(codes, [str(v) for v in values])
