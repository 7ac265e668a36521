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
* :mod:`pipeline.ingest`: the exactly-once Kafka → DuckDB ingester (``Ingester``);
* :mod:`pipeline.config`: the validated YAML config (``load_config``, ``format_validation_error``)
  and the strict YAML loader every package uses (``load_yaml``);
* :mod:`pipeline.errors`: the exception tree rooted at ``LlmsloError``.
"""

from pipeline.broker import EmbeddedBroker
from pipeline.bus import Bus, BusProducer
from pipeline.codec import decode_message, encode_arrow, encode_json, headers_for
from pipeline.config import LlmsloConfig, format_validation_error, load_config
from pipeline.errors import (
    BusError,
    ConfigError,
    DecodeError,
    LlmsloError,
    StoreError,
    UnknownSchemaError,
)
from pipeline.ingest import Ingester
from pipeline.schema import (
    ALERTS,
    ENGINE_SAMPLES,
    FLAG_TRANSITIONS,
    GPU_SAMPLES,
    REQUEST_RECORDS,
    RecordSchema,
)
from pipeline.store import Store

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
