"""Incoming record batches: check a request's batches whole, then stamp them with offsets.

Theory of operation
-------------------
Every append (``PartitionLog.append``, ``stage``, ``append_as_follower``) first checks every
batch of the request with ``check_batches`` (framing, size against ``max.message.bytes``,
magic, counts, CRC; ``records/header.py`` ``validate``): one bad batch rejects the whole
request before anything is written. A leader's batches must be dense (their offsets are the
log's to assign); a follower's keep the offsets their leader gave them. ``place_batches``
then gives a leader's batches their offsets as ``(stamp, batch[16:])`` buffer pairs for one
``pwritev``: only the 16-byte stamp (base offset, length, leader epoch, all outside the CRC)
is new; the batch bytes are not copied. Both are pure functions over a ``memoryview``: no
I/O, no state; no Python object is built per record.
"""

from __future__ import annotations

from rivven_broker.protocol import limits
from rivven_broker.records.header import (
    HEADER_BYTES,
    LOG_OVERHEAD_BYTES,
    BatchHeader,
    InvalidBatchError,
    batch_length_at,
    stamp,
    validate,
)
from rivven_broker.storage.errors import RecordTooLargeError

__all__ = ["check_batches", "place_batches", "CheckedBatch"]

STAMP_BYTES = 16  # base_offset, batch_length, partition_leader_epoch
#: One checked batch: its position in the request, its size in bytes, its header.
CheckedBatch = tuple[int, int, BatchHeader]


def check_batches(
    records: bytes | bytearray | memoryview, max_message_bytes: int, *, dense: bool = True
) -> tuple[memoryview, list[CheckedBatch], int, int]:
    """The request's bytes as a flat byte view, every batch's ``(position, size, header)``,
    their total bytes and the offsets they span. ``dense``: each batch's offsets must be
    dense from its base (a producer's; a follower's copy may be compacted). Never blocks.

    Raises:
        InvalidBatchError, CorruptBatchError: a batch is malformed, or there is none.
        RecordTooLargeError: a batch exceeds ``max_message_bytes``.
    """
    view = memoryview(records)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    batches = []
    total = span = 0
    position, end = 0, len(view)
    while position < end:
        if end - position < HEADER_BYTES:
            raise InvalidBatchError(f"{end - position} trailing bytes are not a batch")
        size = batch_length_at(view, position) + LOG_OVERHEAD_BYTES
        if size > end - position:
            raise InvalidBatchError(f"batch of {size} bytes runs past the request's end")
        if size > max_message_bytes:
            raise RecordTooLargeError(size, max_message_bytes)
        header = validate(view, position, size, dense=dense)
        if header.last_offset_delta >= limits.batch_records_max:
            raise InvalidBatchError(f"batch spans {header.last_offset_delta + 1} offsets")
        batches.append((position, size, header))
        total += size
        span += header.last_offset_delta + 1
        position += size
    if not batches:
        raise InvalidBatchError("no record batch to append")
    return view, batches, total, span


def place_batches(view: memoryview, batches: list[CheckedBatch], offset: int,
                  leader_epoch: int, parts: list[bytes | memoryview],
                  placed: list[tuple[int, int, int]]) -> int:
    """Stamp ``batches`` from ``offset`` on into ``parts`` (buffers for one ``pwritev``) and
    ``placed`` (``(base offset, size, max timestamp)`` for the indexes); the next offset."""
    for position, size, header in batches:
        parts.append(stamp(offset, header.batch_length, leader_epoch))
        parts.append(view[position + STAMP_BYTES : position + size])
        placed.append((offset, size, header.max_timestamp))
        offset += header.last_offset_delta + 1
    return offset
