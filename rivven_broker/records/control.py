"""Control batches: the COMMIT and ABORT markers that end a transaction in a partition.

Theory of operation
-------------------
When a transaction ends, the transaction coordinator has a marker written to every partition
the transaction touched. A marker is a batch with the control bit (``ATTR_CONTROL``) and the
transactional bit set, the producer's id and epoch, and exactly one record, shaped as in Kafka::

    key   = i16 version (0) . i16 type (0 ABORT, 1 COMMIT)
    value = i16 version (0) . i32 coordinator_epoch

A ``read_committed`` consumer uses these markers to drop the records of aborted transactions;
``decode_records`` never returns them as data. Control batches are never compressed.

Pure: no I/O, no clocks.
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

from rivven_broker.records.builder import BatchBuilder
from rivven_broker.records.header import (
    HEADER_BYTES,
    BatchHeader,
    InvalidBatchError,
    parse_header,
)
from rivven_broker.records.reader import iter_records

__all__ = [
    "ControlType",
    "ControlRecord",
    "build_control_batch",
    "parse_control_record",
    "read_control_batch",
]

_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")
_VERSION = 0
_CONTROL_BATCH_BYTES_MAX = 256


class ControlType(enum.IntEnum):
    """What a control record marks (numbers as in Kafka)."""

    ABORT = 0
    COMMIT = 1


class ControlRecord(NamedTuple):
    """A decoded control record."""

    kind: ControlType
    coordinator_epoch: int


def build_control_batch(
    kind: ControlType,
    producer_id: int,
    producer_epoch: int,
    timestamp_ms: int,
    coordinator_epoch: int = 0,
) -> bytes:
    """A control batch holding one ``kind`` marker for this producer. Never blocks.

    ``base_offset`` is 0 and the partition leader epoch -1: the broker stamps both on append.
    """
    assert isinstance(kind, ControlType)
    assert producer_id >= 0 and producer_epoch >= 0
    builder = BatchBuilder(
        batch_bytes_max=_CONTROL_BATCH_BYTES_MAX,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        transactional=True,
        control=True,
    )
    accepted = builder.append(
        timestamp_ms,
        _KEY.pack(_VERSION, int(kind)),
        _VALUE.pack(_VERSION, coordinator_epoch),
    )
    assert accepted
    return builder.build()


def parse_control_record(key: bytes | None, value: bytes | None) -> ControlRecord:
    """Interpret a control record's key and value. Never blocks.

    Raises:
        InvalidBatchError: the key or value is malformed, or the version or type is unknown.
    """
    if key is None or len(key) < _KEY.size:
        raise InvalidBatchError("control record key is missing or short")
    version, kind = _KEY.unpack_from(key)
    if version != _VERSION:
        raise InvalidBatchError(f"unsupported control record version {version}")
    try:
        control_type = ControlType(kind)
    except ValueError:
        raise InvalidBatchError(f"unknown control record type {kind}") from None
    if value is None or len(value) < _VALUE.size:
        raise InvalidBatchError("control record value is missing or short")
    _, coordinator_epoch = _VALUE.unpack_from(value)
    return ControlRecord(control_type, coordinator_epoch)


def read_control_batch(batch: bytes | bytearray | memoryview, pos: int = 0) -> tuple[
    BatchHeader, ControlRecord
]:
    """Check and decode the control batch at ``batch[pos:]``. Never blocks.

    Raises:
        InvalidBatchError: not a control batch, malformed, or not exactly one control record.
        CorruptBatchError: CRC mismatch or a malformed records section.
    """
    if len(batch) - pos < HEADER_BYTES:
        raise InvalidBatchError("truncated control batch")
    header = parse_header(batch, pos)
    if not header.is_control:
        raise InvalidBatchError("not a control batch")
    records = list(iter_records(batch, pos))
    if len(records) != 1:
        raise InvalidBatchError(f"control batch holds {len(records)} records, not 1")
    return header, parse_control_record(records[0].key, records[0].value)

