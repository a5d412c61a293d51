"""``BatchBuilder``: turn records into one record batch (the bytes the broker stores as they are).

Theory of operation
-------------------
The producer appends records to a builder until ``append`` says the batch is full, then calls
``build`` once. ``append`` packs each record straight into its final bytes (one ``struct`` call
for the common case of records of one shape, see ``batch.py``) and keeps them in a list; ``build``
joins the list once, compresses it if asked, and writes the 61-byte header with the CRC. No
record object outlives ``append``.

Size accounting is exact and uncompressed: ``size_bytes`` is the header plus every record as
packed. A record is refused (``append`` returns ``False``) when it would take the batch past
``batch_bytes_max`` or ``limits.batch_records_max`` records, unless the batch is still empty:
the first record is always accepted as long as the batch fits ``limits.batch_bytes_max``, so a
record bigger than the producer's batch size still travels alone. zstd output that is not
smaller than its input is discarded and the batch goes uncompressed, so a built batch is never
larger than ``size_bytes``.

Compression objects from ``zstandard`` must not be used by two threads at once, and the blocking
client builds batches on several threads. So a builder creates its own compressor lazily in
``build`` (about 10 us, against ~1-2 ms to compress a 1 MiB batch), or takes one through
``compressor=`` from a caller that owns one per thread.

Pure: no I/O, no clocks (timestamps are arguments), no threads.
"""

from __future__ import annotations

import struct
from typing import Literal

import crc32c as _crc32c
import zstandard

from rivven_broker.protocol import limits
from rivven_broker.records import codecs
from rivven_broker.records.batch import (
    I32,
    RECORD_OVERHEAD_BYTES,
    RECORD_PREFIX,
    ZSTD_LEVEL,
    RecordHeaders,
    RecordTooLargeError,
    encode_headers,
    record_struct,
)
from rivven_broker.records.header import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    CRC_START,
    HEADER,
    HEADER_BYTES,
    LOG_OVERHEAD_BYTES,
    MAGIC,
)

__all__ = ["BatchBuilder", "Compression"]

Compression = Literal["none", "gzip", "snappy", "lz4", "zstd"]
_COMPRESSION_CODES = {"none": COMPRESSION_NONE, "gzip": codecs.GZIP, "snappy": codecs.SNAPPY,
                      "lz4": codecs.LZ4, "zstd": COMPRESSION_ZSTD}
#: The names ``compression`` takes, for the clients' and tools' option checks.
COMPRESSIONS = tuple(_COMPRESSION_CODES)
_NO_HEADERS = I32.pack(0)
_PACK_PREFIX = RECORD_PREFIX.pack
_PACK_NULL_KEY = struct.Struct(">ibqiii").pack  # the prefix and value_length of a null-key record
_PACK_I32 = I32.pack
_TIMESTAMP_MS_MAX = 2**63 - 1


class BatchBuilder:
    """Accumulates records and builds one record batch. Not thread-safe; never blocks.

    ``base_offset`` of the built batch is 0 and ``partition_leader_epoch`` is -1: the broker
    stamps both. Timestamps are whatever the caller passes (``now_ms`` from its clock).
    """

    __slots__ = (
        "_records_bytes_max",
        "_compression",
        "_producer_id",
        "_producer_epoch",
        "_base_sequence",
        "_attributes",
        "_compressor",
        "_parts",
        "_count",
        "_records_bytes",
        "_first_timestamp",
        "_max_timestamp",
        "_shape",
        "_shape_pack",
        "_shape_candidate",
        "_built",
    )

    def __init__(
        self,
        *,
        batch_bytes_max: int,
        compression: Compression = "none",
        producer_id: int = -1,
        producer_epoch: int = -1,
        base_sequence: int = -1,
        transactional: bool = False,
        control: bool = False,
        compressor: zstandard.ZstdCompressor | None = None,
    ) -> None:
        """Start an empty batch.

        ``batch_bytes_max`` bounds the uncompressed batch (header included); it must not exceed
        ``limits.batch_bytes_max``. ``control`` marks a control batch (use
        ``control.build_control_batch`` rather than setting it by hand). ``compressor`` is an
        optional zstd compressor that the caller guarantees no other thread uses meanwhile.

        Raises:
            ValueError: ``batch_bytes_max`` out of range or an unknown ``compression``.
        """
        if not HEADER_BYTES + RECORD_OVERHEAD_BYTES <= batch_bytes_max <= limits.batch_bytes_max:
            raise ValueError(
                f"batch_bytes_max must be in [{HEADER_BYTES + RECORD_OVERHEAD_BYTES}, "
                f"{limits.batch_bytes_max}], not {batch_bytes_max}"
            )
        if compression not in _COMPRESSION_CODES:
            raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}, "
                             f"not {compression!r}")
        assert producer_id >= -1 and producer_epoch >= -1 and base_sequence >= -1
        assert not transactional or producer_id >= 0, "a transactional batch needs a producer id"
        assert not control or (transactional and compression == "none")
        self._records_bytes_max = batch_bytes_max - HEADER_BYTES
        self._compression = _COMPRESSION_CODES[compression]
        self._producer_id = producer_id
        self._producer_epoch = producer_epoch
        self._base_sequence = base_sequence
        self._attributes = (ATTR_TRANSACTIONAL if transactional else 0) | (
            ATTR_CONTROL if control else 0
        )
        self._compressor = compressor
        self._parts: list[bytes] = []
        self._count = 0
        self._records_bytes = 0
        self._first_timestamp = 0
        self._max_timestamp = 0
        self._shape: tuple[int, int] | None = None
        self._shape_pack = _PACK_I32  # replaced with the shape's pack before first use
        self._shape_candidate: tuple[int, int] | None = None
        self._built: bytes | None = None

    @property
    def record_count(self) -> int:
        return self._count

    @property
    def size_bytes(self) -> int:
        """The uncompressed size of the batch so far; the built batch is never larger."""
        return HEADER_BYTES + self._records_bytes

    @property
    def is_empty(self) -> bool:
        return self._count == 0

    def append(
        self,
        timestamp_ms: int,
        key: bytes | None,
        value: bytes | None,
        headers: RecordHeaders = (),
    ) -> bool:
        """Add one record; ``False`` (and nothing added) when the batch is full. Never blocks.

        Raises:
            RecordTooLargeError: the batch is empty and this record alone would make it larger
                than ``limits.batch_bytes_max``.
            InvalidRecordError: too many headers.
            TypeError: key, value or a header has the wrong type.
            ValueError: the timestamp is outside the int64 range.
        """
        assert self._built is None, "append after build"
        if key is None:
            key_length = -1
            size = RECORD_OVERHEAD_BYTES
        else:
            key_length = len(key)
            size = RECORD_OVERHEAD_BYTES + key_length
        if value is None:
            value_length = -1
        else:
            value_length = len(value)
            size += value_length
        if headers:
            header_bytes, header_count = encode_headers(headers)
            size += len(header_bytes)
        else:
            header_bytes, header_count = b"", 0
        count = self._count
        if count:
            if (
                self._records_bytes + size > self._records_bytes_max
                or count >= limits.batch_records_max
            ):
                return False
            if timestamp_ms > _TIMESTAMP_MS_MAX:  # becomes max_timestamp, an i64
                raise ValueError(f"timestamp {timestamp_ms} is outside the int64 range")
            timestamp_delta_ms = timestamp_ms - self._first_timestamp
        else:
            if not -_TIMESTAMP_MS_MAX - 1 <= timestamp_ms <= _TIMESTAMP_MS_MAX:
                raise ValueError(f"timestamp {timestamp_ms} is outside the int64 range")
            if HEADER_BYTES + size > limits.batch_bytes_max:
                raise RecordTooLargeError(
                    f"a record of {size} bytes does not fit in a batch of at most "
                    f"{limits.batch_bytes_max} bytes"
                )
            self._first_timestamp = self._max_timestamp = timestamp_ms
            timestamp_delta_ms = 0
        shape = (key_length, value_length)
        try:
            if shape == self._shape:
                self._parts.append(
                    self._shape_pack(
                        size - 4,
                        0,
                        timestamp_delta_ms,
                        count,
                        key_length,
                        key or b"",
                        value_length,
                        value or b"",
                        header_count,
                    )
                )
            else:
                self._append_generic(shape, timestamp_delta_ms, key, value, size, header_count)
        except struct.error as error:
            _check_types(key, value)
            raise ValueError(f"record field out of range: {error}") from error
        if header_count:
            self._parts.append(header_bytes)
        if timestamp_ms > self._max_timestamp:
            self._max_timestamp = timestamp_ms
        self._count = count + 1
        self._records_bytes += size
        return True

    def _append_generic(
        self,
        shape: tuple[int, int],
        timestamp_delta_ms: int,
        key: bytes | None,
        value: bytes | None,
        size: int,
        header_count: int,
    ) -> None:
        """Pack a record field by field; on the second record of a shape in a row, learn it."""
        if type(value) is not bytes or (key is not None and type(key) is not bytes):
            _check_types(key, value)
            key = None if key is None else bytes(key)  # copy: the caller may mutate a bytearray
            value = None if value is None else bytes(value)
        tail = _PACK_I32(header_count) if header_count else _NO_HEADERS
        if key is None:
            self._parts += (
                _PACK_NULL_KEY(size - 4, 0, timestamp_delta_ms, self._count, -1, shape[1]),
                value or b"",
                tail,
            )
        else:
            self._parts += (
                _PACK_PREFIX(size - 4, 0, timestamp_delta_ms, self._count, shape[0]),
                key,
                _PACK_I32(shape[1]),
                value or b"",
                tail,
            )
        if shape == self._shape_candidate:
            self._shape = shape
            self._shape_pack = record_struct(*shape).pack
        else:
            self._shape_candidate = shape

    def build(self) -> bytes:
        """The finished batch (``base_offset`` 0, epoch -1, CRC set). Never blocks.

        May be called again (returns the same bytes); ``append`` is not allowed afterwards.
        """
        if self._built is not None:
            return self._built
        assert self._count > 0, "an empty batch cannot be built"
        section = b"".join(self._parts)
        self._parts = []
        attributes = self._attributes
        if self._compression == COMPRESSION_ZSTD:
            if self._compressor is None:
                self._compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
            compressed = self._compressor.compress(section)
            if len(compressed) < len(section):
                section = compressed
                attributes |= COMPRESSION_ZSTD
        elif self._compression != COMPRESSION_NONE:
            compressed = codecs.compress(self._compression, section)
            if len(compressed) < len(section):  # else stored plain (attributes say none)
                section = compressed
                attributes |= self._compression
        fields = [
            0,  # base_offset, stamped by the broker
            HEADER_BYTES - LOG_OVERHEAD_BYTES + len(section),
            -1,  # partition_leader_epoch, stamped by the broker
            MAGIC,
            0,  # crc, computed below
            attributes,
            self._count - 1,
            self._first_timestamp,
            self._max_timestamp,
            self._producer_id,
            self._producer_epoch,
            self._base_sequence,
            self._count,
        ]
        draft = HEADER.pack(*fields)
        fields[4] = _crc32c.crc32c(section, _crc32c.crc32c(draft[CRC_START:]))
        self._built = HEADER.pack(*fields) + section
        assert len(self._built) <= self.size_bytes
        return self._built


def _check_types(key: object, value: object) -> None:
    """Raise ``TypeError`` unless key and value are ``bytes``/``bytearray`` or ``None``."""
    for name, part in (("key", key), ("value", value)):
        if part is not None and not isinstance(part, (bytes, bytearray)):
            kind = type(part).__name__
            raise TypeError(
                f"the record {name} must be bytes or None, not {kind}: encode it (for a str, "
                f"{name}.encode()) or give the producer {name}_serializer= (e.g. str.encode)")
