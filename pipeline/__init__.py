"""The spine of llmslo: schemas, the Kafka bus, the DuckDB store, ingest, config and errors.

The ground floor: it imports no other package of ours (the command line is ``app``).

Every other package builds on these public names and nothing else of this package:

* :mod:`pipeline.schema`: versioned Arrow record schemas (``ENGINE_SAMPLES`` …) and the
  value rules checked at decode (``VALUE_RULES``);
* :mod:`pipeline.codec`: Arrow IPC / JSON encoding with schema headers;
* :mod:`pipeline.bus`: topics, keyed producers and consumers (``Bus``);
* :mod:`pipeline.publisher`: the one bounded, retrying way to publish (``Publisher``);
* :mod:`pipeline.broker`: the embedded Kafka-protocol broker (``EmbeddedBroker``);
* :mod:`pipeline.store`: the DuckDB file (``Store``);
* :mod:`pipeline.lake`: the hourly Parquet export to a directory or ``s3://`` (``export_hours``);
* :mod:`pipeline.s3`: object storage for the lake: credentials from the environment or a
  file, uploads retried with back-off (``ObjectStore``, ``ObjectStoreError``);
* :mod:`pipeline.ingest`: the exactly-once Kafka → DuckDB ingester (``Ingester``);
* :mod:`pipeline.memory`: where a process's memory is (``MemoryCollector``: DuckDB's own
  accounting, glibc's heap, pyarrow's pool, as ``llmslo_memory_bytes{part}``);
* :mod:`pipeline.config`: the validated YAML config (``load_config``, ``format_validation_error``)
  and the strict YAML loader every package uses (``load_yaml``);
* :mod:`pipeline.errors`: the exception tree rooted at ``LlmsloError``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "EmbeddedBroker": "broker",
    "Bus": "bus",
    "BusProducer": "bus",
    "decode_message": "codec",
    "encode_arrow": "codec",
    "encode_json": "codec",
    "headers_for": "codec",
    "LlmsloConfig": "config",
    "format_validation_error": "config",
    "load_config": "config",
    "BusError": "errors",
    "ConfigError": "errors",
    "DecodeError": "errors",
    "LlmsloError": "errors",
    "StoreError": "errors",
    "UnknownSchemaError": "errors",
    "Ingester": "ingest",
    "ALERTS": "schema",
    "ENGINE_SAMPLES": "schema",
    "FLAG_TRANSITIONS": "schema",
    "GPU_SAMPLES": "schema",
    "REQUEST_RECORDS": "schema",
    "RecordSchema": "schema",
    "Store": "store",
}


def __getattr__(name: str) -> Any:
    """Import public names lazily: a process that only publishes (a tap, a collector) must not
    load DuckDB and the ingester because it imported :mod:`pipeline.errors`."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
    return getattr(importlib.import_module(f"pipeline.{module}"), name)


__all__ = [
    "ALERTS",
    "ENGINE_SAMPLES",
    "FLAG_TRANSITIONS",
    "GPU_SAMPLES",
    "REQUEST_RECORDS",
    "Bus",
    "BusError",
    "BusProducer",
    "ConfigError",
    "DecodeError",
    "EmbeddedBroker",
    "Ingester",
    "LlmsloConfig",
    "LlmsloError",
    "RecordSchema",
    "Store",
    "StoreError",
    "UnknownSchemaError",
    "decode_message",
    "encode_arrow",
    "encode_json",
    "format_validation_error",
    "headers_for",
    "load_config",
]
