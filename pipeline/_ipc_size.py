"""How many bytes an Arrow IPC stream decodes to, read from its headers alone.

An LZ4-compressed Arrow message is a zip bomb waiting to happen: LZ4 compresses runs of
zeros about 250:1, so a 16 MiB Kafka message can decode to 4 GB. Arrow allocates each
buffer at its declared uncompressed length before decompressing it, so the sum of those
lengths is what reading the message would cost. This module adds them up without
decompressing anything, so that :mod:`pipeline.codec` can refuse the message first.

The layout read here is Arrow's IPC format (``format/Message.fbs``, ``Schema.fbs``):

* each IPC message carries a flatbuffer ``Message`` whose header is a ``Schema``, a
  ``DictionaryBatch`` (which wraps a ``RecordBatch``) or a ``RecordBatch``;
* a ``RecordBatch`` lists its ``buffers`` as (offset, length) pairs into the message body,
  and says in ``compression`` whether they are compressed;
* a compressed buffer starts with its uncompressed length as a little-endian int64
  (``-1`` means "stored uncompressed": the rest of the buffer is the data).

Arrow has verified each flatbuffer before :class:`pyarrow.ipc.MessageReader` hands the
message out, so a parse error here means a layout this module does not know: it is
reported as ``corrupt_arrow`` rather than waved through.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from pipeline._lazy import on_first_use
from pipeline.errors import DecodeError

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = on_first_use("pyarrow")

__all__ = ["check_decoded_size", "decoded_size"]

# Message.header_type values (format/Message.fbs, union MessageHeader).
_DICTIONARY_BATCH = 2
_RECORD_BATCH = 3
_BUFFER_STRUCT_BYTES = 16  # struct Buffer { offset: long; length: long; }


class _Table:
    """One flatbuffer table: scalar and reference fields by their index in the schema."""

    def __init__(self, data: pa.Buffer, position: int) -> None:
        self.data = data
        self.position = position
        self.vtable = position - struct.unpack_from("<i", data, position)[0]
        self.vtable_bytes = struct.unpack_from("<H", data, self.vtable)[0]

    def _field(self, index: int) -> int:
        slot = 4 + 2 * index
        if slot >= self.vtable_bytes:
            return 0
        return int(struct.unpack_from("<H", self.data, self.vtable + slot)[0])

    def scalar(self, index: int, fmt: str, default: int) -> int:
        offset = self._field(index)
        if not offset:
            return default
        return int(struct.unpack_from(fmt, self.data, self.position + offset)[0])

    def reference(self, index: int) -> int | None:
        """Where the table or vector that field ``index`` points to starts (None if absent)."""
        offset = self._field(index)
        if not offset:
            return None
        at = self.position + offset
        return at + int(struct.unpack_from("<I", self.data, at)[0])

    def table(self, index: int) -> _Table | None:
        at = self.reference(index)
        return None if at is None else _Table(self.data, at)


def _record_batch_bytes(batch: _Table, body: pa.Buffer | None) -> int:
    """Bytes the buffers of one RecordBatch take once decompressed."""
    vector = batch.reference(2)  # RecordBatch.buffers
    if vector is None:
        return 0
    count = struct.unpack_from("<I", batch.data, vector)[0]
    compressed = batch.reference(3) is not None  # RecordBatch.compression
    total = 0
    for i in range(count):
        offset, length = struct.unpack_from(
            "<qq", batch.data, vector + 4 + i * _BUFFER_STRUCT_BYTES
        )
        if not compressed or length < 8 or body is None:
            total += max(0, length)
            continue
        if offset < 0 or offset + 8 > body.size:
            raise DecodeError("truncated_arrow", "an Arrow buffer lies outside its message body")
        (uncompressed,) = struct.unpack_from("<q", body, offset)
        if uncompressed < -1:
            raise DecodeError("corrupt_arrow", f"an Arrow buffer declares {uncompressed} bytes")
        total += length - 8 if uncompressed == -1 else uncompressed
    return total


def _message_bytes(message: pa.ipc.Message) -> int:
    root = _Table(message.metadata, struct.unpack_from("<I", message.metadata, 0)[0])
    header_type = root.scalar(1, "<B", 0)  # Message.header_type
    header = root.table(2)  # Message.header
    if header is None:
        return 0
    if header_type == _DICTIONARY_BATCH:
        data = header.table(1)  # DictionaryBatch.data
        return 0 if data is None else _record_batch_bytes(data, message.body)
    if header_type == _RECORD_BATCH:
        return _record_batch_bytes(header, message.body)
    return 0


def decoded_size(value: bytes) -> int | None:
    """Bytes the Arrow IPC stream ``value`` decodes to, or None if Arrow cannot frame it.

    ``None`` leaves the verdict to Arrow's reader (``not_arrow``/``truncated_arrow``).
    Raises :class:`DecodeError` (``corrupt_arrow``, ``truncated_arrow``) when a message
    that Arrow framed has buffers that make no sense.
    """
    try:
        reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(value))
        messages = list(reader)
    except (pa.ArrowException, OSError):
        return None
    try:
        return sum(_message_bytes(message) for message in messages)
    except (struct.error, IndexError, ValueError) as exc:
        raise DecodeError("corrupt_arrow", f"Arrow message headers are invalid: {exc}") from exc


def check_decoded_size(value: bytes, limit_bytes: int) -> None:
    """Refuse (``DecodeError("oversized_decoded")``) a stream decoding to over ``limit_bytes``."""
    size = decoded_size(value)
    if size is not None and size > limit_bytes:
        raise DecodeError(
            "oversized_decoded",
            f"Arrow message of {len(value)} bytes decodes to {size} bytes, over {limit_bytes}",
        )
