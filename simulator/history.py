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

import inspect
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
from scipy.stats import lognorm

from pipeline.schema import ENGINE_SAMPLES, GPU_SAMPLES, REQUEST_RECORDS, RecordSchema
from pipeline.store import Store
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

    Passes the tables exactly as the ingester does (schema-shaped Arrow, a list per
    table). Stores whose ``commit_batch`` still takes one storage-shaped table per name
    (the spine before series normalisation) are detected and fed that shape.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        annotation = str(inspect.signature(type(store).commit_batch).parameters["rows"].annotation)
        self._tables_as_lists = "Sequence" in annotation

    def write(self, schema: RecordSchema, table: pa.Table) -> None:
        ts_ms = int(table.column(0)[0].as_py()) if schema is not REQUEST_RECORDS else 0
        rows: Any = [table] if self._tables_as_lists else table.cast(schema.storage_arrow)
        self.store.commit_batch(
            {schema.table: rows}, group_id="llmslo-sim-history", offsets={}, now_ts_ms=ts_ms
        )


class BusSink:
    """Through Kafka with ``bus.producer().publish`` (the ingester stores them)."""

    def __init__(self, producer: object) -> None:
        self.producer = producer

    def write(self, schema: RecordSchema, table: pa.Table) -> None:
        self.producer.publish(schema, table)  # type: ignore[attr-defined]


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


def _dict(values: list[str]) -> pa.DictionaryArray:
    return pa.array(values).dictionary_encode()


class HistoryGenerator:
    """Generates one hour of rows at a time (:meth:`chunks`), all pods vectorised."""

    def __init__(self, config: HistoryConfig) -> None:
        self.config = config
        self.rng = np.random.default_rng(config.seed)
        n = config.pods
        self.instances = [f"10.42.{i // 250}.{i % 250 + 1}:8000" for i in range(n)]
        self.skew = self.rng.uniform(0.8, 1.2, n)
        self.counters = np.zeros((n, len(_COUNTERS)))
        self.finished = np.zeros((n, 3))  # stop, length, error
        self.hist = [np.zeros((n, len(b) + 2)) for _, _, b in _HISTOGRAMS]  # buckets..., +Inf, sum
        self.start_ts_ms = config.end_ts_ms - int(config.days * 86_400_000)
        span_s = max(0.0, config.days * 86_400 - 3600)
        count = round(config.incidents_per_day * config.days)
        starts = np.sort(self.rng.uniform(0, span_s, count)) if span_s > 0 else np.zeros(0)
        self.incidents = [self.start_ts_ms + int(s * 1000) for s in starts]
        self._req_seq = 0

    def _load(self, ts_ms: np.ndarray) -> np.ndarray:
        hour = (ts_ms / 3_600_000.0) % 24
        return 0.55 + 0.4 * np.sin(2 * math.pi * (hour - 9) / 24)

    def _incident(self, ts_ms: int) -> bool:
        return any(0 <= ts_ms - start < 3_600_000 for start in self.incidents)

    def chunks(self) -> Iterator[tuple[RecordSchema, pa.Table]]:
        """(schema, rows) per simulated hour, engine then GPU then requests."""
        cfg = self.config
        step_ms = cfg.interval_s * 1000
        ts = self.start_ts_ms + step_ms
        while ts <= cfg.end_ts_ms:
            hour_end = min(cfg.end_ts_ms, ts + 3_600_000 - step_ms)
            stamps = np.arange(ts, hour_end + 1, step_ms, dtype=np.int64)
            engine, gpu, requests = self._hour(stamps)
            yield ENGINE_SAMPLES, engine
            yield GPU_SAMPLES, gpu
            if requests.num_rows:
                yield REQUEST_RECORDS, requests
            ts = int(stamps[-1]) + step_ms

    # ---- one hour -----------------------------------------------------------------------
    def _hour(self, stamps: np.ndarray) -> tuple[pa.Table, pa.Table, pa.Table]:
        engine_parts: list[dict[str, list]] = []
        gpu_parts: list[dict[str, list]] = []
        request_rows: list[dict[str, object]] = []
        for ts in stamps.tolist():
            load = float(self._load(np.array([ts]))[0])
            bad = self._incident(ts)
            engine_parts.append(self._engine_scrape(ts, load, bad))
            gpu_parts.append(self._gpu_scrape(ts, load))
            request_rows.extend(self._requests(ts, load, bad))
        engine = pa.concat_tables([self._engine_table(p) for p in engine_parts])
        gpu = pa.concat_tables([self._gpu_table(p) for p in gpu_parts])
        requests = (
            pa.Table.from_pylist(request_rows, schema=REQUEST_RECORDS.arrow)
            if request_rows
            else REQUEST_RECORDS.arrow.empty_table()
        )
        return engine, gpu, requests

    def _engine_scrape(self, ts: int, load: float, bad: bool) -> dict[str, list]:
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
        rows: dict[str, list] = {
            k: [] for k in ("instance", "metric", "signal", "kind", "le", "labels", "value")
        }
        base = json.dumps({"engine": "0", "model_name": cfg.model}, sort_keys=True)

        def add(
            i: int,
            metric: str,
            signal: str,
            kind: str,
            value: float,
            le: float | None = None,
            labels: str = base,
        ) -> None:
            for key, v in (
                ("instance", self.instances[i]),
                ("metric", metric),
                ("signal", signal),
                ("kind", kind),
                ("le", le),
                ("labels", labels),
                ("value", float(value)),
            ):
                rows[key].append(v)

        ttft_median = 0.12 * (6.0 if bad else 1.0) * (1 + load)
        for i in range(n):
            for (metric, signal), value in zip(
                _GAUGES, (running[i], waiting[i], kv[i]), strict=True
            ):
                add(i, metric, signal, "gauge", value)
            for j, (metric, signal) in enumerate(_COUNTERS):
                add(i, metric, signal, "counter", self.counters[i, j])
            for j, reason in enumerate(("stop", "length", "error")):
                labels = json.dumps(
                    {"engine": "0", "finished_reason": reason, "model_name": cfg.model},
                    sort_keys=True,
                )
                add(
                    i,
                    "vllm:request_success_total",
                    "requests_finished",
                    "counter",
                    self.finished[i, j],
                    labels=labels,
                )
        for h, (metric, signal, bounds) in enumerate(_HISTOGRAMS):
            median = ttft_median if signal == "ttft" else 0.035 * (1.5 if bad else 1.0)
            cdf = lognorm.cdf(np.array(bounds), 0.6, scale=median)
            inc = np.floor(np.outer(done, cdf) + 1e-9)
            self.hist[h][:, : len(bounds)] += inc
            self.hist[h][:, len(bounds)] += done
            self.hist[h][:, -1] += done * median * math.exp(0.18)
            for i in range(n):
                for k, le in enumerate(bounds):
                    add(i, f"{metric}_bucket", signal, "bucket", self.hist[h][i, k], le=float(le))
                add(
                    i,
                    f"{metric}_bucket",
                    signal,
                    "bucket",
                    self.hist[h][i, len(bounds)],
                    le=math.inf,
                )
                add(i, f"{metric}_count", signal, "count", self.hist[h][i, len(bounds)])
                add(i, f"{metric}_sum", signal, "sum", self.hist[h][i, -1])
        rows["ts"] = [ts] * len(rows["value"])
        return rows

    def _engine_table(self, rows: dict[str, list]) -> pa.Table:
        cfg = self.config
        count = len(rows["value"])
        return pa.Table.from_arrays(
            [
                pa.array(rows["ts"], pa.int64()),
                _dict(rows["instance"]),
                _dict([cfg.model] * count),
                _dict(["vllm"] * count),
                _dict([cfg.model] * count),
                _dict(["0"] * count),
                _dict(rows["metric"]),
                _dict(rows["signal"]),
                _dict(rows["kind"]),
                pa.array(rows["le"], pa.float64()),
                _dict(rows["labels"]),
                pa.array(rows["value"], pa.float64()),
            ],
            schema=ENGINE_SAMPLES.arrow,
        )

    def _gpu_scrape(self, ts: int, load: float) -> dict[str, list]:
        cfg, rng = self.config, self.rng
        rows: dict[str, list] = {
            k: [] for k in ("instance", "host", "gpu", "pod", "metric", "signal", "value", "labels")
        }
        for i in range(cfg.pods):
            node, gpu = divmod(i, cfg.gpus_per_node)
            active = float(np.clip(load * self.skew[i] + rng.normal(0, 0.05), 0, 1))
            values = (
                round(100 * active),
                active * 0.8,
                73403.0,
                7584.0,
                0.0,
                35 + 40 * active,
                72 + 620 * active,
            )
            for (metric, signal), value in zip(_GPU, values, strict=True):
                labels = '{"err_code": "0", "err_msg": "No Error"}' if signal == "xid" else "{}"
                for key, v in (
                    ("instance", f"10.43.0.{node + 1}:9400"),
                    ("host", f"node-{node}"),
                    ("gpu", gpu),
                    ("pod", f"pod-{i}"),
                    ("metric", metric),
                    ("signal", signal),
                    ("value", float(value)),
                    ("labels", labels),
                ):
                    rows[key].append(v)
        rows["ts"] = [ts] * len(rows["value"])
        return rows

    def _gpu_table(self, rows: dict[str, list]) -> pa.Table:
        count = len(rows["value"])
        uuids = [
            f"GPU-{abs(hash((h, g))) % 16**8:08x}-sim"
            for h, g in zip(rows["host"], rows["gpu"], strict=True)
        ]
        return pa.Table.from_arrays(
            [
                pa.array(rows["ts"], pa.int64()),
                _dict(rows["instance"]),
                _dict(rows["host"]),
                pa.array(rows["gpu"], pa.int32()),
                _dict(uuids),
                _dict([f"nvidia{g}" for g in rows["gpu"]]),
                _dict(["NVIDIA H100 80GB HBM3"] * count),
                pa.nulls(count, pa.dictionary(pa.int32(), pa.string())),
                _dict(rows["pod"]),
                _dict(["default"] * count),
                _dict(["engine"] * count),
                _dict(rows["metric"]),
                _dict(rows["signal"]),
                _dict(rows["labels"]),
                pa.array(rows["value"], pa.float64()),
            ],
            schema=GPU_SAMPLES.arrow,
        )

    def _requests(self, ts: int, load: float, bad: bool) -> list[dict[str, object]]:
        cfg, rng = self.config, self.rng
        out: list[dict[str, object]] = []
        for i in range(cfg.pods):
            expected = (
                cfg.peak_req_per_s * load * self.skew[i] * cfg.interval_s * cfg.request_sample
            )
            for _ in range(int(rng.poisson(expected))):
                out.append(self._request(ts, i, load, bad))
        return out

    def _request(self, ts: int, pod: int, load: float, bad: bool) -> dict[str, object]:
        cfg, rng = self.config, self.rng
        self._req_seq += 1
        rid = f"hist-{cfg.seed}-{self._req_seq}"
        received = ts - int(rng.uniform(0, cfg.interval_s * 1000))
        ttft = float(rng.lognormal(math.log(0.12 * (6.0 if bad else 1.0) * (1 + load)), 0.6))
        tpot = float(rng.lognormal(math.log(0.035 * (1.5 if bad else 1.0)), 0.3))
        tokens = int(rng.integers(20, 400))
        roll = rng.random()
        outcome = "ok"
        if roll < (0.05 if bad else 0.001):
            outcome = "error_before_first_token"
        elif roll < (0.07 if bad else 0.003):
            outcome = "interrupted_after_first_token"
        elif roll < (0.08 if bad else 0.005):
            outcome = "client_cancelled"
        failed = outcome == "error_before_first_token"
        e2e = ttft + tpot * (tokens - 1)
        return {
            "request_id": rid,
            "original_request_id": rid,
            "attempt": 1,
            "tap_id": "history",
            "instance": self.instances[pod],
            "pool": cfg.model,
            "model": cfg.model,
            "tenant": None,
            "route": "/v1/chat/completions",
            "streamed": True,
            "received_ts_ms": received,
            "deadline_ts_ms": None,
            "http_status": 500 if failed else 200,
            "outcome": outcome,
            "error_kind": None if outcome == "ok" else outcome,
            "finish_reason": None if failed else "stop",
            "ttfb_s": None if failed else ttft,
            "ttft_s": None if failed else ttft,
            "tpot_s": None if failed else tpot,
            "e2e_s": 0.05 if failed else e2e,
            "prompt_tokens": int(rng.integers(50, 3000)),
            "completion_tokens": 0 if failed else tokens,
            "token_chunks": 0 if failed else tokens,
            "itl_mean_s": None if failed else tpot,
            "itl_p99_s": None if failed else tpot * 2.2,
            "itl_max_s": None if failed else tpot * 3.5,
            "itl_gaps_s": None,
            "chunk_tokens": None,
            "client_disconnected": outcome == "client_cancelled",
            "disconnect_ts_ms": None,
            "upstream_closed_ts_ms": None,
            "tokens_after_disconnect": None,
        }
