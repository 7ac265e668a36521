"""Engine and DCGM collectors: scrape exporter endpoints, understand every dialect, publish.

This package owns everything between an exporter's ``/metrics`` text and the ``engine`` /
``gpu`` Kafka topics:

* :mod:`collectors.exposition` — a fast Prometheus 0.0.4 / OpenMetrics parser;
* :mod:`collectors.dialects` — one YAML map per engine (vLLM, SGLang, TensorRT-LLM,
  llama.cpp, dcgm-exporter) from exposed names to canonical signals, with detection;
* :mod:`collectors.canonical` — rows of ``ENGINE_SAMPLES`` / ``GPU_SAMPLES``, counter
  reset and frozen-gauge detection, DCGM blank sentinels;
* :mod:`collectors.semantics` — which values cannot be true (``+Inf``, negative counters,
  broken histograms, duplicates): those series are rejected with a counted reason;
* :mod:`collectors.collector` / :mod:`collectors.discovery` — the scrape loop over static
  and file_sd targets, with per-target health;
* ``llmslo collect`` and ``llmslo scrape`` are wired in ``llmslo/commands/collect.py``;
* :mod:`collectors.tap` — the sidecar stream tap (its own subpackage and README);
* :mod:`collectors.receive` — Prometheus remote-write into the same records
  (``llmslo receive``, ``docs/receivers.md``).

See ``collectors/README.md`` for the dialect map format and how to add an engine.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CanonicalBatch": "canonical",
    "TargetCanonicalizer": "canonical",
    "Collector": "collector",
    "RoundReport": "collector",
    "TargetHealth": "collector",
    "CollectConfig": "config",
    "TargetConfig": "config",
    "DIALECT_NAMES": "dialects",
    "Detection": "dialects",
    "DialectMap": "dialects",
    "detect_dialect": "dialects",
    "load_dialects": "dialects",
    "TargetDiscovery": "discovery",
    "parse_file_sd": "discovery",
    "Exposition": "exposition",
    "ExpositionParser": "exposition",
    "Family": "exposition",
    "Series": "exposition",
    "parse_exposition": "exposition",
    "inspect_exposition": "inspect",
    "inspect_url": "inspect",
    "CollectorMetrics": "metrics",
}


def __getattr__(name: str) -> Any:
    """Import public names lazily, so ``collectors.tap`` does not pay for the scrape stack."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'collectors' has no attribute {name!r}")
    return getattr(importlib.import_module(f"collectors.{module}"), name)


__all__ = [
    "DIALECT_NAMES",
    "CanonicalBatch",
    "CollectConfig",
    "Collector",
    "CollectorMetrics",
    "Detection",
    "DialectMap",
    "Exposition",
    "ExpositionParser",
    "Family",
    "RoundReport",
    "Series",
    "TargetCanonicalizer",
    "TargetConfig",
    "TargetDiscovery",
    "TargetHealth",
    "detect_dialect",
    "inspect_exposition",
    "inspect_url",
    "load_dialects",
    "parse_exposition",
    "parse_file_sd",
]
