"""The records section of a batch: fixed-width record layout, ``Record`` and record errors.

Theory of operation
-------------------
``header.py`` pins the 61-byte batch header; this module pins what follows it. Every field is
fixed-width big-endian, so one ``struct`` call packs or unpacks a whole record whose key and
value sizes are known (no varints to walk byte by byte in Python)::

    record := i32 length             bytes after this field
              i8  attributes         0 (reserved)
              i64 timestamp_delta    ms, relative to the batch's first_timestamp
              i32 offset_delta       relative to the batch's base_offset
              i32 key_length         -1 = null key
              key bytes
              i32 value_length       -1 = null value (a tombstone)
              value bytes
              i32 header_count
              header_count x (i32 key_length, utf-8 key, i32 value_length (-1 = null), value)

A record with a null key, a null value and no headers is ``RECORD_OVERHEAD_BYTES`` (29) bytes.
With zstd (``attributes & 7 == 4`` in the batch header) the records section, all records
concatenated, is one zstd frame; the header stays uncompressed, so the broker reads it without
decompressing anything.

Both the builder and the reader keep a per-batch "shape" (key length, value length) and, when
consecutive records share it, pack or unpack a whole record with one precompiled ``Struct``:
producers very often send many records of one size. Records of other shapes take a generic path
that handles the fields one by one. The shape caches live in the builder or in one decoding call,
never in module state.

This module is pure: no I/O, no clocks, no threads.
"""

from __future__ import annotations

import struct
from collections import abc
from typing import Iterable, Mapping, NamedTuple, Sequence, Union

from rivven_broker.protocol import limits
from rivven_broker.records.header import HEADER_BYTES

__all__ = [
    "Record",
    "RecordHeaders",
    "RecordTooLargeError",
    "InvalidRecordError",
    "RECORD_PREFIX",
    "RECORD_PREFIX_BYTES",
    "RECORD_OVERHEAD_BYTES",
    "I32",
    "SECTION_BYTES_MAX",
    "ZSTD_LEVEL",
    "record_struct",
    "EncodedHeaders",
    "encode_headers",
]

#: length, attributes, timestamp_delta, offset_delta, key_length.
RECORD_PREFIX = struct.Struct(">ibqii")
RECORD_PREFIX_BYTES = RECORD_PREFIX.size
#: Size of a record with a null key, a null value and no headers (length field included).
RECORD_OVERHEAD_BYTES = RECORD_PREFIX_BYTES + 4 + 4
I32 = struct.Struct(">i")
#: Largest records section, uncompressed or decompressed: a batch is at most
#: ``limits.batch_bytes_max`` before compression, so its section never decompresses to more.
SECTION_BYTES_MAX = limits.batch_bytes_max - HEADER_BYTES
#: zstd level used by the builder. Measured on JSON-like 100-200 B records (docs/storage-format.md):
#: level 1 compresses at ~550 MB/s with a ratio of ~5.1; levels 2 and 3 were slower (450 and
#: 400 MB/s) and did not compress better on record batches, so 1 it is.
ZSTD_LEVEL = 1

assert RECORD_PREFIX_BYTES == 21
assert RECORD_OVERHEAD_BYTES == 29

class EncodedHeaders(NamedTuple):
    """A record's headers already in their wire form: ``data`` is what follows
    ``header_count`` (``encode_headers``' answer for the same pairs), ``count`` the number of
    headers. A producer that makes the same headers for many records (a CDC envelope) builds
    these from pieces it keeps, instead of pairs encoded per record; ``encode_headers``
    passes them through after checking the count against the limit."""

    data: bytes
    count: int


#: What ``headers=`` accepts: a mapping or a sequence of ``(str, bytes | None)`` pairs, or
#: ``EncodedHeaders``.
RecordHeaders = Union[Mapping[str, Union[bytes, None]], Sequence[tuple[str, Union[bytes, None]]],
                      EncodedHeaders]


class Record(NamedTuple):
    """One decoded record. ``key``/``value`` are ``None`` when null; ``headers`` are pairs."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


class RecordTooLargeError(ValueError):
    """A single record cannot fit in any batch (more than ``limits.batch_bytes_max``)."""


class InvalidRecordError(ValueError):
    """A record's headers break a limit (too many headers)."""


def record_struct(key_length: int, value_length: int) -> struct.Struct:
    """The ``Struct`` of a whole header-less record with these key/value lengths (-1 = null).

    Fields: length, attributes, timestamp_delta, offset_delta, key_length, key, value_length,
    value, header_count. A null key or value is a zero-width ``0s`` field (packs ``b""``).
    """
    key_bytes = key_length if key_length > 0 else 0
    value_bytes = value_length if value_length > 0 else 0
    return struct.Struct(f">ibqii{key_bytes}si{value_bytes}si")


def encode_headers(headers: RecordHeaders) -> tuple[bytes, int]:
    """Encode record headers to ``(bytes after header_count, header_count)``. Does not block.

    Raises:
        InvalidRecordError: more than ``limits.headers_per_record_max`` headers.
        TypeError: a key is not ``str`` or a value is not bytes-like or ``None``.
    """
    if type(headers) is EncodedHeaders:  # (before the tuple test: it is a tuple too)
        if not 0 <= headers.count <= limits.headers_per_record_max:
            raise InvalidRecordError(
                f"{headers.count} record headers exceed the limit of "
                f"{limits.headers_per_record_max}")
        return headers.data, headers.count
    pairs: Iterable[tuple[str, bytes | None]]
    # A tuple or list first: isinstance against typing.Mapping (a generic alias) costs
    # ~1 us a record on the producer's hot path.
    pairs = (headers if isinstance(headers, (tuple, list))
             else headers.items() if isinstance(headers, abc.Mapping) else headers)
    parts: list[bytes] = []
    count = 0
    pack = I32.pack
    for key, value in pairs:
        if not isinstance(key, str):
            raise TypeError(f"record header key must be str, not {type(key).__name__}")
        key_utf8 = key.encode("utf-8")
        if value is None:
            parts += (pack(len(key_utf8)), key_utf8, pack(-1))
        elif isinstance(value, (bytes, bytearray)):
            parts += (pack(len(key_utf8)), key_utf8, pack(len(value)), bytes(value))
        else:
            kind = type(value).__name__
            raise TypeError(f"record header value must be bytes or None, not {kind}")
        count += 1
    if count > limits.headers_per_record_max:
        raise InvalidRecordError(
            f"{count} record headers exceed the limit of {limits.headers_per_record_max}"
        )
    return b"".join(parts), count
