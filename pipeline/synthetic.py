"""Synthetic engine scrapes as Arrow batches, for the spine's demo, tests and benchmark.

Each scrape is what a vLLM pod's ``/metrics`` turns into after canonicalisation: the
scheduler gauges, the token counters and the TTFT histogram with vLLM's default bounds.
Values move plausibly over time but carry no meaning; the fleet simulator
(``simulator/``) is the realistic source.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from pipeline.schema import ENGINE_SAMPLES

__all__ = ["SyntheticScrapes"]

_TTFT_BOUNDS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
    float("inf"),
)
_SERIES: list[tuple[str, str, str, float | None]] = [
    ("vllm:num_requests_running", "running", "gauge", None),
    ("vllm:num_requests_waiting", "waiting", "gauge", None),
    ("vllm:kv_cache_usage_perc", "kv_usage", "gauge", None),
    ("vllm:num_preemptions_total", "preemptions", "counter", None),
    ("vllm:prompt_tokens_total", "prompt_tokens", "counter", None),
    ("vllm:generation_tokens_total", "generation_tokens", "counter", None),
    ("vllm:time_to_first_token_seconds_sum", "ttft", "sum", None),
    ("vllm:time_to_first_token_seconds_count", "ttft", "count", None),
] + [("vllm:time_to_first_token_seconds_bucket", "ttft", "bucket", le) for le in _TTFT_BOUNDS]


@dataclass
class SyntheticScrapes:
    """Scrape rounds of ``instances`` fake vLLM pods; :meth:`scrape` returns one pod's samples."""

    instances: int = 4
    model: str = "llama-3-8b"
    seed: int = 0

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)
        self.samples_per_scrape = len(_SERIES)
        labels = json.dumps({"engine": "0", "model_name": self.model}, sort_keys=True)
        self._template = {
            "metric": pa.array([s[0] for s in _SERIES]).dictionary_encode(),
            "signal": pa.array([s[1] for s in _SERIES]).dictionary_encode(),
            "kind": pa.array([s[2] for s in _SERIES]).dictionary_encode(),
            "le": pa.array([s[3] for s in _SERIES], pa.float64()),
            "labels_json": pa.array([labels] * len(_SERIES)).dictionary_encode(),
        }
        self._counters = np.zeros((self.instances, len(_SERIES)))

    def instance_name(self, index: int) -> str:
        return f"10.0.{index // 250}.{index % 250 + 1}:8000"

    def scrape(self, index: int, ts_ms: int) -> pa.Table:
        """One scrape of pod ``index`` at ``ts_ms``: cumulative counters, moving gauges."""
        n = self.samples_per_scrape
        step = self._rng.poisson(5.0, n).astype(np.float64)
        counters = self._counters[index]
        counters += step
        values = counters.copy()
        values[0] = self._rng.integers(0, 64)  # running
        values[1] = self._rng.integers(0, 8)  # waiting
        values[2] = self._rng.uniform(0.2, 0.8)  # kv usage
        values[8:] = np.cumsum(values[8:])  # buckets are cumulative in le
        values[7] = values[-1]  # _count equals the +Inf bucket
        one = lambda value: pa.DictionaryArray.from_arrays(np.zeros(n, np.int32), [value])  # noqa: E731
        return pa.Table.from_arrays(
            [
                pa.array(np.full(n, ts_ms, np.int64)),
                one(self.instance_name(index)),
                one(self.model),
                one("vllm"),
                one(self.model),
                one("0"),
                self._template["metric"],
                self._template["signal"],
                self._template["kind"],
                self._template["le"],
                self._template["labels_json"],
                pa.array(values),
            ],
            schema=ENGINE_SAMPLES.arrow,
        )

    def round(self, ts_ms: int) -> pa.Table:
        """One scrape of every pod at ``ts_ms``, concatenated."""
        return pa.concat_tables([self.scrape(i, ts_ms) for i in range(self.instances)])
