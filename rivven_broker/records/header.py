"""The record batch header: the fixed-width 61 bytes every layer agrees on.

Theory of operation
-------------------
A record batch is the unit the producer builds, the broker stores and the consumer decodes. Its
header is fixed-width and big-endian, Kafka's v2 layout byte for byte::

    offset size field
         0    8 base_offset             i64  assigned by the broker
         8    4 batch_length            i32  bytes after this field (total size - 12)
        12    4 partition_leader_epoch  i32  set by the broker
        16    1 magic                   i8   always 2
        17    4 crc                     u32  CRC32C of bytes [21, end)
        21    2 attributes              i16  bits 0-2 compression, bit 4 transactional,
                                             bit 5 control
        23    4 last_offset_delta       i32  offset of the last record minus base_offset
        27    8 first_timestamp         i64  ms
        35    8 max_timestamp           i64  ms
        43    8 producer_id             i64  -1 when not idempotent
        51    2 producer_epoch          i16  -1 when not idempotent
        53    4 base_sequence           i32  -1 when not idempotent
        57    4 record_count            i32
        61      records section (possibly zstd-compressed)

The CRC covers everything after the CRC field, so the broker can rewrite ``base_offset`` and
``partition_leader_epoch`` without recomputing it. The broker never looks past the header: it
checks sizes, magic, counts and the CRC, assigns the base offset and stores the bytes.

This module is pure: no I/O, no clocks. ``validate`` raises ``InvalidBatchError`` (malformed
header or sizes) or ``CorruptBatchError`` (CRC mismatch), both ``BatchError``.
"""

from __future__ import annotations

import struct
from typing import Iterator, NamedTuple

import crc32c as _crc32c

__all__ = [
    "HEADER",
    "HEADER_BYTES",
    "LOG_OVERHEAD_BYTES",
    "MAGIC",
    "CRC_START",
    "COMPRESSION_MASK",
    "COMPRESSION_NONE",
    "COMPRESSION_ZSTD",
    "ATTR_TRANSACTIONAL",
    "ATTR_CONTROL",
    "BatchHeader",
    "BatchError",
    "InvalidBatchError",
    "CorruptBatchError",
    "parse_header",
    "batch_length_at",
    "validate",
    "compute_crc",
    "stamp",
    "iter_batches",
]

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_BYTES = HEADER.size
#: base_offset + batch_length: the bytes not counted in batch_length.
LOG_OVERHEAD_BYTES = 12
MAGIC = 2
CRC_START = 21
_CRC_OFFSET = 17
_STAMP = struct.Struct(">qii")  # base_offset, batch_length, partition_leader_epoch
_BATCH_LENGTH = struct.Struct(">i")  # at byte 8, after base_offset

COMPRESSION_MASK = 0x07
COMPRESSION_NONE = 0
COMPRESSION_ZSTD = 4  # Kafka's code for zstd
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20

assert HEADER_BYTES == 61


class BatchHeader(NamedTuple):
    """The decoded header of one batch. A NamedTuple: cheap to build on the hot path."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Total bytes of the batch, header included."""
        return self.batch_length + LOG_OVERHEAD_BYTES

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)


class BatchError(ValueError):
    """A record batch is not acceptable."""


class InvalidBatchError(BatchError):
    """Sizes, magic, counts or attributes are wrong."""


class CorruptBatchError(BatchError):
    """The CRC does not match the bytes."""


def parse_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Decode the header at ``pos`` without any check. Needs ``HEADER_BYTES`` bytes there."""
    return _new_header(BatchHeader, HEADER.unpack_from(buf, pos))


#: ``BatchHeader._make`` without its Python frame (the struct gives exactly its fields).
_new_header = tuple.__new__
assert len(HEADER.unpack(bytes(HEADER.size))) == len(BatchHeader._fields)


def batch_length_at(buf: bytes | bytearray | memoryview, pos: int = 0) -> int:
    """The ``batch_length`` field of the header at ``pos``, unchecked (needs 12 bytes there)."""
    return _BATCH_LENGTH.unpack_from(buf, pos + 8)[0]


def compute_crc(buf: bytes | bytearray | memoryview, pos: int = 0, size: int | None = None) -> int:
    """CRC32C of a batch's covered bytes (``[pos + 21, pos + size)``)."""
    end = len(buf) if size is None else pos + size
    return _crc32c.crc32c(memoryview(buf)[pos + CRC_START : end])


def validate(
    buf: bytes | bytearray | memoryview,
    pos: int = 0,
    size: int | None = None,
    *,
    dense: bool = True,
) -> BatchHeader:
    """Check one batch at ``buf[pos:pos+size]`` (default: to the end) and return its header.

    Checks the header size, that ``batch_length`` matches ``size``, magic, counts and the CRC.
    ``dense`` (true for batches from producers) requires ``record_count == last_offset_delta +
    1``; stored batches may be sparser after compaction. Never decodes the records.

    Raises:
        InvalidBatchError: sizes, magic or counts are wrong.
        CorruptBatchError: the CRC does not match.
    """
    available = len(buf) - pos if size is None else size
    if available < HEADER_BYTES:
        raise InvalidBatchError(f"batch of {available} bytes is shorter than its header")
    header = parse_header(buf, pos)
    if header.batch_length + LOG_OVERHEAD_BYTES != available:
        raise InvalidBatchError(
            f"batch_length {header.batch_length} does not match {available} bytes"
        )
    if header.magic != MAGIC:
        raise InvalidBatchError(f"unsupported magic {header.magic}")
    if header.record_count < 0 or header.last_offset_delta < 0:
        raise InvalidBatchError("negative record count or offset delta")
    if dense and header.record_count != header.last_offset_delta + 1:
        raise InvalidBatchError(
            f"record_count {header.record_count} != last_offset_delta + 1 "
            f"({header.last_offset_delta + 1})"
        )
    if header.record_count > header.last_offset_delta + 1:
        raise InvalidBatchError("more records than offsets")
    compression = header.attributes & COMPRESSION_MASK  # (the properties, inline: every
    if compression > COMPRESSION_ZSTD:  # produce) none, gzip, snappy, lz4, zstd: ids 0-4
        raise InvalidBatchError(f"unsupported compression {compression}")
    if _crc32c.crc32c(memoryview(buf)[pos + CRC_START : pos + available]) != header.crc:
        raise CorruptBatchError("record batch CRC mismatch")  # (``compute_crc``, inline)
    return header


def stamp(base_offset: int, batch_length: int, partition_leader_epoch: int) -> bytes:
    """The first 16 bytes of a stored batch: what the broker rewrites (outside the CRC)."""
    assert base_offset >= 0
    assert batch_length >= HEADER_BYTES - LOG_OVERHEAD_BYTES
    return _STAMP.pack(base_offset, batch_length, partition_leader_epoch)


def iter_batches(
    buf: bytes | bytearray | memoryview, pos: int = 0, end: int | None = None
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield ``(position, header)`` for each whole batch in ``buf[pos:end]``.

    Stops at the first incomplete batch (a partial tail is normal at the end of a fetch).
    Does not verify CRCs; callers that need integrity call ``validate``.
    """
    limit = len(buf) if end is None else end
    while pos + HEADER_BYTES <= limit:
        header = parse_header(buf, pos)
        size = header.batch_length + LOG_OVERHEAD_BYTES
        if header.batch_length < HEADER_BYTES - LOG_OVERHEAD_BYTES or pos + size > limit:
            return
        yield pos, header
        pos += size
