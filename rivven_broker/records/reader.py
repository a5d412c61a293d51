"""Decoding record batches into ``Record`` tuples: the consumer's side of ``builder.py``.

Theory of operation
-------------------
The broker never calls this module: it moves batches as bytes. Consumers do, once per fetch
response, so the loop here is the one place where Rivven builds a Python object per record.

``decode_records`` walks a fetch body (whole batches back to back, maybe a partial batch at the
end, which is normal and ignored), checks each batch's header and CRC, decompresses a zstd
section once, and turns every record into a ``Record``. Records below ``min_offset`` are dropped
(a fetch returns whole batches, so the first one may start before the fetch offset) and control
batches are skipped. ``iter_records`` is the lazy, one-batch form, which also yields control
records (see ``control.py`` to interpret them).

Speed: a batch whose records all have one shape (same key and value lengths, a value, no
headers; what a producer usually sends) is decoded in one ``Struct.iter_unpack`` over its
section, after strided slices have checked every record's length, key length, value length
and header count at once. Otherwise records of one shape are unpacked with one precompiled
``Struct`` each, learned from the first two records of that shape in a batch. A
shape guess is only accepted when the unpacked length, key length, value length and header
count all agree with it, so a wrong guess costs one extra unpack and falls back to the generic
path, which reads the fields one by one and checks every bound. Either way a record that runs
past its batch raises ``CorruptBatchError`` and nothing is read outside the batch.

The reader trusts offset and timestamp deltas of a batch whose CRC matched (as Kafka does); it
checks framing and the record count against the header.

Pure: no I/O, no clocks, no threads. ``zstandard`` decompressors are not shared across calls
unless the caller passes one in (and then it must not be used by two threads at once).
"""

from __future__ import annotations

import functools
import struct
from typing import Callable, Iterator

import zstandard

from rivven_broker.protocol import limits
from rivven_broker.records import codecs
from rivven_broker.records.batch import (
    I32,
    RECORD_OVERHEAD_BYTES,
    RECORD_PREFIX,
    RECORD_PREFIX_BYTES,
    SECTION_BYTES_MAX,
    Record,
    record_struct,
)
from rivven_broker.records.header import (
    ATTR_CONTROL,
    COMPRESSION_MASK,
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    HEADER_BYTES,
    LOG_OVERHEAD_BYTES,
    MAGIC,
    BatchError,
    BatchHeader,
    CorruptBatchError,
    InvalidBatchError,
    iter_batches,
    parse_header,
    validate,
)

__all__ = ["iter_records", "decode_records", "batch_headers", "BatchFilter"]

Buffer = bytes | bytearray | memoryview
#: Called with each whole batch's header, in order, control batches included; a batch whose
#: records should be skipped (for example an aborted transaction's) gets ``False``.
BatchFilter = Callable[[BatchHeader], bool]

_NO_HEADERS: tuple[tuple[str, bytes | None], ...] = ()
_unpack_prefix = RECORD_PREFIX.unpack_from
#: The prefix and value_length of a record with a null key.
_unpack_head = struct.Struct(">ibqiii").unpack_from
_ZERO_I32 = I32.pack(0)
_NO_FIELDS = (-1, 0, 0, 0, 0, b"", 0, b"", 0)
_unpack_i32 = I32.unpack_from


def batch_headers(buf: Buffer, pos: int = 0, end: int | None = None) -> Iterator[BatchHeader]:
    """Yield the header of each whole batch in ``buf[pos:end]``; stop at a partial one.

    Never decodes records and does not check CRCs (``validate`` does). Never blocks.
    """
    for _, header in iter_batches(buf, pos, end):
        yield header


def iter_records(
    batch: Buffer,
    pos: int = 0,
    *,
    check_crc: bool = True,
    decompressor: zstandard.ZstdDecompressor | None = None,
) -> Iterator[Record]:
    """Lazily yield the records of the one batch at ``batch[pos:]``; control records included.

    The batch is checked (and decompressed) on the first ``next()``. Never blocks.

    Raises:
        InvalidBatchError: the batch is truncated, or its header is malformed.
        CorruptBatchError: CRC mismatch (when ``check_crc``), a record runs past the records
            section, a bad length or utf-8 header key, or the record count disagrees.
    """
    available = len(batch) - pos
    if available < HEADER_BYTES:
        raise InvalidBatchError(f"truncated batch: {available} bytes at {pos}")
    header = parse_header(batch, pos)
    size = header.batch_length + LOG_OVERHEAD_BYTES
    if header.batch_length < HEADER_BYTES - LOG_OVERHEAD_BYTES or size > available:
        raise InvalidBatchError(f"truncated batch: {available} of {size} bytes at {pos}")
    if type(batch) is not bytes:
        batch, pos = bytes(batch[pos : pos + size]), 0
    _check_batch(batch, pos, header, check_crc)
    data, start, end = _records_section(batch, pos, header, decompressor)
    base_offset = header.base_offset
    first_timestamp = header.first_timestamp
    count = 0
    while start < end:
        record, start = _decode_record(data, start, end, base_offset, first_timestamp)
        count += 1
        yield record
    if count != header.record_count:
        raise CorruptBatchError(
            f"batch at {pos} holds {count} records, header says {header.record_count}"
        )


def decode_records(
    buf: Buffer,
    *,
    min_offset: int = 0,
    check_crc: bool = True,
    batch_filter: BatchFilter | None = None,
    decompressor: zstandard.ZstdDecompressor | None = None,
    record_type: type = Record,
    prefix: tuple[str, int] | tuple[()] = (),
) -> list[Record]:
    """Decode every record of every whole data batch in ``buf`` (a fetch response body).

    Records are ``record_type`` tuples of ``prefix`` followed by ``Record``'s five fields: the
    client passes its own ``Record`` and ``(topic, partition)`` and so builds one object per
    record instead of two (the decode loop is the consumer's hot path).

    Checks every whole batch first (CRC included when ``check_crc``), then skips control
    batches, batches ``batch_filter`` rejects, and records below ``min_offset``; ignores a
    partial batch at the end. A ``bytearray`` or ``memoryview`` is copied to ``bytes`` once
    (keys and values are slices of it). Never blocks.

    Raises:
        InvalidBatchError: a batch header is malformed (bad magic, compression, counts).
        CorruptBatchError: a CRC mismatch (when ``check_crc``) or a malformed records section.
            A batch failing its checks carries ``records_before`` (the records of the batches
            before it) and ``batch_offset`` (its base offset).
    """
    if type(buf) is not bytes:
        buf = bytes(buf)
    assert len(prefix) in (0, 2)
    out: list[Record] = []
    for pos, header in iter_batches(buf):
        kept = len(out)
        try:
            decompressor = _decode_batch(
                buf, pos, header, out, min_offset, check_crc, batch_filter, decompressor,
                record_type, prefix,
            )
        except BatchError as error:  # the caller may keep what came before it
            del out[kept:]  # nothing of the failing batch
            error.records_before = out  # type: ignore[attr-defined]
            error.batch_offset = header.base_offset  # type: ignore[attr-defined]
            raise
    return out


def _decode_batch(
    buf: bytes,
    pos: int,
    header: BatchHeader,
    out: list[Record],
    min_offset: int,
    check_crc: bool,
    batch_filter: BatchFilter | None,
    decompressor: zstandard.ZstdDecompressor | None,
    record_type: type,
    prefix: tuple[str, int] | tuple[()],
) -> zstandard.ZstdDecompressor | None:
    """Check one whole batch and append its records to ``out`` (see ``decode_records``);
    returns the decompressor, made on the first compressed batch."""
    _check_batch(buf, pos, header, check_crc)  # before trusting any header bit
    if batch_filter is not None and not batch_filter(header):
        return decompressor
    if header.attributes & ATTR_CONTROL:
        return decompressor
    base_offset = header.base_offset
    if base_offset + header.last_offset_delta < min_offset:
        return decompressor
    if decompressor is None and header.attributes & COMPRESSION_MASK:
        decompressor = zstandard.ZstdDecompressor()
    data, start, end = _records_section(buf, pos, header, decompressor)
    first_timestamp = header.first_timestamp
    if base_offset >= min_offset:
        before = len(out)
        if not _decode_uniform(
            data, start, end, header.record_count, base_offset, first_timestamp, out,
            record_type, prefix,
        ):
            _decode_section(
                data, start, end, base_offset, first_timestamp, out, record_type, prefix
            )
        count = len(out) - before
    else:
        partial: list[Record] = []
        _decode_section(
            data, start, end, base_offset, first_timestamp, partial, record_type, prefix
        )
        count = len(partial)
        out += [record for record in partial if record.offset >= min_offset]
    if count != header.record_count:
        raise CorruptBatchError(
            f"batch at {pos} holds {count} records, header says {header.record_count}"
        )
    return decompressor


def _check_batch(buf: bytes, pos: int, header: BatchHeader, check_crc: bool) -> None:
    """Header checks (all of ``validate`` when ``check_crc``). The batch is known to be whole."""
    if check_crc:
        validate(buf, pos, header.batch_length + LOG_OVERHEAD_BYTES, dense=False)
        return
    if header.magic != MAGIC:
        raise InvalidBatchError(f"unsupported magic {header.magic} in batch at {pos}")
    if header.record_count < 0 or header.record_count > header.last_offset_delta + 1:
        raise InvalidBatchError(f"bad record count {header.record_count} in batch at {pos}")


def _records_section(
    buf: bytes, pos: int, header: BatchHeader, decompressor: zstandard.ZstdDecompressor | None
) -> tuple[bytes, int, int]:
    """``(data, start, end)`` of the batch's uncompressed records section."""
    start = pos + HEADER_BYTES
    end = pos + header.batch_length + LOG_OVERHEAD_BYTES
    compression = header.attributes & COMPRESSION_MASK
    if compression == COMPRESSION_NONE:
        return buf, start, end
    if compression != COMPRESSION_ZSTD:
        try:
            data = codecs.decompress(compression, memoryview(buf)[start:end], SECTION_BYTES_MAX)
        except codecs.CodecError as error:
            if compression not in codecs.CODES:
                raise InvalidBatchError(f"{error} in batch at {pos}") from None
            raise CorruptBatchError(f"{error} in batch at {pos}") from None
        return data, 0, len(data)
    frame = buf[start:end]
    try:
        content_bytes = zstandard.frame_content_size(frame)
        if content_bytes > SECTION_BYTES_MAX:
            raise CorruptBatchError(
                f"zstd section of batch at {pos} claims {content_bytes} bytes, "
                f"more than {SECTION_BYTES_MAX}"
            )
        if decompressor is None:
            decompressor = zstandard.ZstdDecompressor()
        data = decompressor.decompress(
            frame, max_output_size=SECTION_BYTES_MAX, allow_extra_data=False
        )
    except zstandard.ZstdError as error:
        raise CorruptBatchError(f"zstd section of batch at {pos}: {error}") from error
    return data, 0, len(data)


#: Plans for batches of up to this many records are kept (64 of them: at most 4 MiB).
_PLAN_CACHE_COUNT_MAX = 4096


def _uniform_plan(
    key_length: int, value_length: int, count: int
) -> tuple[Callable[[Buffer], Iterator[tuple]], tuple[tuple[int, bytes], ...]]:
    """``(iter_unpack, checks)`` for a section of ``count`` header-less records of this shape.

    ``iter_unpack`` yields ``(timestamp_delta, offset_delta, value)`` per record, or
    ``(timestamp_delta, offset_delta, key, value)`` when the key is not null: the other fields
    are padding to it, so no object is built for them. ``checks`` pairs the offset, within a
    record, of every byte of its length, key length, value length and header count fields with
    the ``count`` bytes a strided slice of the section must show there when every record has
    the shape.
    """
    if count <= _PLAN_CACHE_COUNT_MAX:
        return _cached_uniform_plan(key_length, value_length, count)
    return _build_uniform_plan(key_length, value_length, count)


def _build_uniform_plan(
    key_length: int, value_length: int, count: int
) -> tuple[Callable[[Buffer], Iterator[tuple]], tuple[tuple[int, bytes], ...]]:
    # Skipped: length and attributes (5x), key and value lengths, header count (4x each).
    if key_length < 0:
        compiled = struct.Struct(f">5xqi8x{value_length}s4x")
    else:
        compiled = struct.Struct(f">5xqi4x{key_length}s4x{value_length}s4x")
    key_bytes = max(key_length, 0)
    assert compiled.size == RECORD_OVERHEAD_BYTES + key_bytes + value_length
    fields = (
        (0, compiled.size - 4),
        (RECORD_PREFIX_BYTES - 4, key_length),
        (RECORD_PREFIX_BYTES + key_bytes, value_length),
        (compiled.size - 4, 0),
    )
    checks = tuple(
        (at + index, bytes((byte,)) * count)
        for at, field in fields
        for index, byte in enumerate(I32.pack(field))
    )
    return compiled.iter_unpack, checks


_cached_uniform_plan = functools.lru_cache(maxsize=64)(_build_uniform_plan)


def _decode_uniform(
    buf: bytes,
    start: int,
    end: int,
    count: int,
    base: int,
    first: int,
    out: list[Record],
    cls: type,
    prefix: tuple,
) -> bool:
    """Append the records of ``buf[start:end]`` to ``out`` as ``_decode_section`` would, when
    all ``count`` of them have the first one's shape (same key and value lengths, a value, no
    headers); return False, having appended nothing, when they do not.

    The common case of a producer's batch, decoded by one ``Struct.iter_unpack`` over the
    whole section: the shape is checked first for every record at once, one strided slice per
    byte of the length, key length, value length and header count fields, so the unpack can
    neither misread a record nor read outside the section.
    """
    if count < 2:
        return False
    try:
        length, _, _, _, key_length, value_length = _unpack_head(buf, start)
        if key_length >= 0:
            (value_length,) = _unpack_i32(buf, start + RECORD_PREFIX_BYTES + key_length)
    except struct.error:
        return False
    size = length + 4
    if (
        value_length < 0
        or key_length < -1
        or size * count != end - start
        or size != RECORD_OVERHEAD_BYTES + max(key_length, 0) + value_length
    ):
        return False
    iter_unpack, checks = _uniform_plan(key_length, value_length, count)
    for at, expected in checks:
        if buf[start + at : end : size] != expected:
            return False
    records = iter_unpack(memoryview(buf)[start:end])
    new = tuple.__new__
    empty = _NO_HEADERS
    if prefix:
        topic, partition = prefix
        if key_length < 0:
            out += [new(cls, (topic, partition, base + offset_delta, first + delta_ms, None,
                              value, empty))
                    for delta_ms, offset_delta, value in records]
        else:
            out += [new(cls, (topic, partition, base + offset_delta, first + delta_ms, key,
                              value, empty))
                    for delta_ms, offset_delta, key, value in records]
    elif key_length < 0:
        out += [new(cls, (base + offset_delta, first + delta_ms, None, value, empty))
                for delta_ms, offset_delta, value in records]
    else:
        out += [new(cls, (base + offset_delta, first + delta_ms, key, value, empty))
                for delta_ms, offset_delta, key, value in records]
    return True


def _decode_section(
    buf: bytes,
    pos: int,
    end: int,
    base: int,
    first: int,
    out: list[Record],
    cls: type = Record,
    prefix: tuple = (),
) -> None:
    """Append the records of ``buf[pos:end]`` to ``out``; offsets from ``base``, times ``first``;
    each a ``cls`` of ``prefix`` (empty or ``(topic, partition)``) and the record's fields.

    The hot loop (see the module docstring), in three tiers: a learned shape (one unpack per
    record), an inline field-by-field path for header-less records, and ``_decode_record`` for
    records with headers and for reporting every error.
    """
    if prefix:
        topic, partition = prefix
        plain = False
    else:
        topic = partition = None
        plain = True
    append = out.append
    new = tuple.__new__
    empty = _NO_HEADERS
    startswith = buf.startswith
    unpack: Callable[[bytes, int], tuple] | None = None
    shape_length = shape_key_length = shape_value_length = 0
    candidate_key_length = candidate_value_length = -2  # no record has these lengths
    while pos < end:
        if unpack is not None:
            try:
                fields = unpack(buf, pos)
            except struct.error:  # the guess runs past the buffer: not this shape
                fields = _NO_FIELDS
            length, _, delta_ms, offset_delta, key_length, key, value_length, value, count = fields
            if (
                length == shape_length
                and key_length == shape_key_length
                and value_length == shape_value_length
                and count == 0
            ):
                if key_length < 0:
                    key = None
                if value_length < 0:
                    value = None
                if plain:
                    append(new(cls, (base + offset_delta, first + delta_ms, key, value, empty)))
                else:
                    append(new(cls, (topic, partition, base + offset_delta, first + delta_ms,
                                     key, value, empty)))
                pos += length + 4
                continue
            unpack = None  # the shape changed: back to the field-by-field path
        try:
            length, _, delta_ms, offset_delta, key_length, value_length = _unpack_head(buf, pos)
            record_end = pos + 4 + length
            if key_length == -1:
                key = None
                p = pos + RECORD_PREFIX_BYTES + 4
            elif key_length >= 0:
                p = pos + RECORD_PREFIX_BYTES
                key = buf[p : p + key_length]
                p += key_length
                (value_length,) = _unpack_i32(buf, p)
                p += 4
            else:
                raise struct.error("bad key length")  # let _decode_record report it
            if value_length >= 0:
                value = buf[p : p + value_length]
                p += value_length
            elif value_length == -1:
                value = None
            else:
                raise struct.error("bad value length")
            simple = p + 4 == record_end <= end and startswith(_ZERO_I32, p)
        except struct.error:
            simple = False
        if not simple:
            record, pos = _decode_record(buf, pos, end, base, first)
            append(record if plain and cls is Record else new(cls, prefix + record))
            candidate_key_length = candidate_value_length = -2
            continue
        if plain:
            append(new(cls, (base + offset_delta, first + delta_ms, key, value, empty)))
        else:
            append(new(cls, (topic, partition, base + offset_delta, first + delta_ms, key, value,
                             empty)))
        pos = record_end
        if key_length == candidate_key_length and value_length == candidate_value_length:
            compiled = record_struct(key_length, value_length)
            unpack = compiled.unpack_from
            shape_length = compiled.size - 4
            shape_key_length, shape_value_length = key_length, value_length
        else:
            candidate_key_length, candidate_value_length = key_length, value_length
    if pos != end:
        raise CorruptBatchError(f"a record runs {pos - end} bytes past its records section")


def _decode_record(
    buf: bytes, pos: int, end: int, base_offset: int, first_timestamp: int
) -> tuple[Record, int]:
    """Decode the record at ``pos``, checking every bound against ``end``; return it and its end.

    Raises ``CorruptBatchError`` naming the position of whatever is wrong.
    """
    if pos + RECORD_OVERHEAD_BYTES > end:
        raise CorruptBatchError(f"record at {pos} runs past its records section")
    length, _, timestamp_delta, offset_delta, key_length = _unpack_prefix(buf, pos)
    record_end = pos + 4 + length
    if length < RECORD_OVERHEAD_BYTES - 4 or record_end > end:
        raise CorruptBatchError(f"record at {pos} has a bad length {length}")
    p = pos + RECORD_PREFIX_BYTES
    key: bytes | None = None
    if key_length >= 0:
        key = buf[p : p + key_length]
        p += key_length
    elif key_length != -1:
        raise CorruptBatchError(f"record at {pos} has a bad key length {key_length}")
    if p + 8 > record_end:
        raise CorruptBatchError(f"record at {pos}: key runs past the record")
    (value_length,) = _unpack_i32(buf, p)
    p += 4
    value: bytes | None = None
    if value_length >= 0:
        value = buf[p : p + value_length]
        p += value_length
    elif value_length != -1:
        raise CorruptBatchError(f"record at {pos} has a bad value length {value_length}")
    if p + 4 > record_end:
        raise CorruptBatchError(f"record at {pos}: value runs past the record")
    (header_count,) = _unpack_i32(buf, p)
    p += 4
    headers = _NO_HEADERS
    if header_count:
        headers, p = _decode_headers(buf, p, record_end, header_count)
    if p != record_end:
        raise CorruptBatchError(f"record at {pos}: {record_end - p} stray bytes after its fields")
    record = Record(
        base_offset + offset_delta, first_timestamp + timestamp_delta, key, value, headers
    )
    return record, record_end


def _decode_headers(
    buf: bytes, p: int, end: int, count: int
) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    """Decode ``count`` record headers at ``p`` (bounded by ``end``); return them and the end."""
    if not 0 < count <= limits.headers_per_record_max:
        raise CorruptBatchError(f"bad record header count {count} at {p}")
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        if p + 4 > end:
            raise CorruptBatchError(f"record header at {p} runs past the record")
        (key_length,) = _unpack_i32(buf, p)
        p += 4
        if key_length < 0 or p + key_length + 4 > end:
            raise CorruptBatchError(f"record header key at {p} has a bad length {key_length}")
        try:
            key = buf[p : p + key_length].decode("utf-8")
        except UnicodeDecodeError as error:
            raise CorruptBatchError(f"record header key at {p} is not utf-8") from error
        p += key_length
        (value_length,) = _unpack_i32(buf, p)
        p += 4
        value: bytes | None = None
        if value_length >= 0:
            if p + value_length > end:
                raise CorruptBatchError(f"record header value at {p} runs past the record")
            value = buf[p : p + value_length]
            p += value_length
        elif value_length != -1:
            raise CorruptBatchError(f"record header value at {p} has a bad length {value_length}")
        headers.append((key, value))
    return tuple(headers), p
