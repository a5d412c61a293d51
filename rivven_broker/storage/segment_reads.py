"""Reading whole batches out of one segment: fetches (bytes or a file region) and scrubbing.

Theory of operation
-------------------
``PartitionLog`` picks the segment (``SegmentList.holding``) and checks the offset against
the log's range; the functions here read within that one segment. ``read_batches`` finds the
batch holding the offset (the sparse offset index, then batch headers forward:
``Segment.find_batch``) and returns whole batches from there, never a partial one and at
least one, stopping before any batch whose header does not agree with the segment
(``Segment.damage``): a damaged batch is never skipped, and a read that starts at one raises.
When the caller can send a file region and the batches are large
(``REGION_BATCH_BYTES_MIN``), it walks their headers and names the bytes in the segment file
instead of reading them. ``scrub_batches`` reads a sealed segment a slice at a time and
checks each batch's framing and CRC. Both block on reads through the segment's store, hold no
state of their own and build no Python object per record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rivven_broker.records.header import (
    HEADER_BYTES,
    BatchError,
    iter_batches,
    parse_header,
    validate,
)
from rivven_broker.storage.errors import CorruptRecordsError, StorageError
from rivven_broker.storage.log_results import ReadResult

if TYPE_CHECKING:
    from rivven_broker.storage.segment import Segment

__all__ = ["read_batches", "scrub_batches", "REGION_BATCH_BYTES_MIN"]

#: The least first-batch size for which a zero-copy read names the bytes instead of reading
#: them: it then reads one header per batch, which beats copying only for large batches.
REGION_BATCH_BYTES_MIN = 64 * 1024


def read_batches(segment: Segment, offset: int, max_bytes: int, max_offset: int | None,
                 zero_copy: bool) -> ReadResult:
    """Whole batches of ``segment`` from the one holding ``offset`` (which it must hold), as
    ``PartitionLog.read`` describes. Blocks on reads.

    Raises:
        CorruptRecordsError: the batch holding ``offset`` (or one the walk to it crosses) is
            damaged; names the file, position and offset.
        StorageError: the store failed.
    """
    try:
        position, first = segment.find_batch(offset)
        if max_offset is not None and first.base_offset >= max_offset:
            return ReadResult(b"", offset)
        want = min(segment.size - position, max(max_bytes, first.size))
        if zero_copy and first.size >= REGION_BATCH_BYTES_MIN:
            # Large batches: walk their headers, name the bytes, never read them.
            end, next_offset, count = segment.whole_batches(
                position, first, position + want, max_offset)
            assert count >= 1
            segment.remember(next_offset, end)
            return ReadResult(segment.region(position, end - position), next_offset, count)
        data = segment.read(position, want)
    except OSError as exc:
        raise StorageError(f"read of {segment.log_path} failed: {exc}") from exc
    end = count = 0
    next_offset = first.base_offset
    for batch_position, header in iter_batches(data):
        if max_offset is not None and header.base_offset >= max_offset:
            break
        if segment.damage(position + batch_position, header, next_offset) is not None:
            break  # served up to the damage; a read starting there reports it
        end = batch_position + header.size
        count += 1
        next_offset = header.next_offset
    if count == 0:  # find_batch found a sound header, but the batch's bytes are not whole
        raise CorruptRecordsError(segment.log_path, position, first.base_offset,
                                  "the batch does not parse where its header says it is")
    segment.remember(next_offset, position + end)
    # A view, not a slice: the tail past the last whole batch is dropped without copying.
    return ReadResult(data if end == len(data) else memoryview(data)[:end], next_offset, count)


def scrub_batches(segment: Segment, position: int, max_bytes: int) -> int | None:
    """Check the sealed ``segment`` from byte ``position`` (a batch boundary below its size),
    as ``PartitionLog.scrub`` describes: where to go on, or None when it is done. Blocks on
    reads.

    Raises:
        CorruptRecordsError: a damaged batch, with its file, position and offset.
        StorageError: the store failed.
    """
    base_offset = segment.base_offset
    try:
        data = segment.read(position, min(segment.size - position, max_bytes))
        if len(data) >= HEADER_BYTES:
            first = parse_header(data)
            if first.size > len(data) and segment.damage(position, first, 0) is None:
                data = segment.read(position, first.size)  # one large batch: read it whole
    except OSError as exc:
        raise StorageError(f"read of {segment.log_path} failed: {exc}") from exc
    done = 0
    expected = 0
    for batch_position, header in iter_batches(data):
        where = position + batch_position
        problem = segment.damage(where, header, expected)
        if problem is not None:  # the header itself is not to be believed
            raise CorruptRecordsError(segment.log_path, where, expected or base_offset,
                                      problem)
        try:
            validate(data, batch_position, header.size, dense=False)
        except BatchError as exc:
            raise CorruptRecordsError(segment.log_path, where, header.base_offset,
                                      str(exc)) from exc
        done = batch_position + header.size
        expected = header.next_offset
    if done == 0:  # not even one whole batch where a batch must start
        raise CorruptRecordsError(segment.log_path, position, expected or base_offset,
                                  "no whole batch starts here")
    return position + done if position + done < segment.size else None
