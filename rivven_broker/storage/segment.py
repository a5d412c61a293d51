"""One segment of a partition log: a ``.log`` of whole batches plus its two sparse indexes.

Theory of operation
-------------------
A segment covers the offsets ``[base_offset, next_offset)``; its three files are named after
the base offset, 20 digits wide: ``00000000000000001234.log``, ``.index``, ``.timeindex``.
The ``.log`` holds stored record batches back to back, exactly as ``header.py`` lays them out,
with dense offsets: each batch's base offset is the previous batch's next offset.

``size`` is the logical length of the log: the bytes of whole, appended batches. The file may
be longer when space is preallocated ahead of the writer (zero bytes), or after a failed write;
``trim`` cuts it back to ``size`` when the segment is rolled or closed. Reads never look past
``size``.

Appending never builds a Python object per record: the caller hands over the already validated
batches as ``(stamp, rest-of-batch)`` buffer pairs and one small tuple per batch; the segment
writes them with one ``pwritev`` (or one per ``IOV_MAX`` parts) and then feeds each batch to its
``IndexCursor``, which decides where the sparse index entries go. The same cursor rebuilds the
indexes during recovery, so a rebuilt index is byte for byte what appending would have written.

The segment does file I/O only through its ``FileStore`` and knows nothing of durability rules;
``partition_log.py`` decides when to fsync what.
"""

from __future__ import annotations

import errno
import operator
import posixpath
from typing import Iterator, Sequence

import attrs

from rivven_broker.file_region import FileRegion
from rivven_broker.records.header import (
    HEADER_BYTES,
    LOG_OVERHEAD_BYTES,
    MAGIC,
    BatchHeader,
    iter_batches,
    parse_header,
    validate,
)
from rivven_broker.storage.errors import CorruptRecordsError
from rivven_broker.storage.file_store import Buffer, FileStore
from rivven_broker.storage.offset_index import ENTRY_BYTES as OFFSET_ENTRY_BYTES
from rivven_broker.storage.offset_index import OffsetIndex
from rivven_broker.storage.time_index import ENTRY_BYTES as TIME_ENTRY_BYTES
from rivven_broker.storage.time_index import TimeIndex

_size_of = operator.itemgetter(1)  # of a ``(base_offset, size, max_timestamp)``

__all__ = [
    "Segment",
    "IndexCursor",
    "LOG_SUFFIX",
    "INDEX_SUFFIX",
    "TIME_INDEX_SUFFIX",
    "DELETED_SUFFIX",
    "IOV_MAX",
    "segment_file_name",
    "parse_segment_file_name",
]

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)
#: Appended to a segment file's name when retention deletes it (its unlink comes later, off
#: the event loop). Recovery deletes such a file and every segment at or below its base.
DELETED_SUFFIX = ".deleted"
_DIGITS = 20
#: An append this large (a follower's fetched batches, a group commit of large batches) does
#: not run the preallocation ahead: the zeros would be written only to be overwritten (each
#: byte reaching the disk twice), and an fdatasync of such an append costs the file's growth
#: little beside its data. Smaller appends still get zeros ahead, where they cut append +
#: fdatasync latency (docs/storage-format.md "Preallocation").
PREALLOCATE_APPEND_BYTES_MAX = 64 * 1024
#: The zeros ahead are topped up in steps of about this size (once fewer than
#: ``preallocate_bytes`` minus a step are left), not all at once: the next fdatasync writes
#: the new zeros back with the group's data, and 4 MiB of them at once held that group commit
#: for milliseconds (docs/storage-format.md "Preallocation").
PREALLOCATE_STEP_BYTES = 1 << 20
#: Most buffers one ``pwritev`` may carry (Linux ``IOV_MAX``).
IOV_MAX = 1024
#: Bytes read at a time when walking batch headers.
WALK_CHUNK_BYTES = 16 * 1024
_MIN_BATCH_LENGTH = HEADER_BYTES - LOG_OVERHEAD_BYTES


def disk_full(exc: OSError) -> bool:
    """The store is out of space (or quota): the operation did nothing durable to undo, and may
    succeed once space returns."""
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


def segment_file_name(base_offset: int, suffix: str) -> str:
    """``00000000000000001234.log`` and friends. Pure."""
    assert 0 <= base_offset < 10**_DIGITS and suffix in _SUFFIXES
    return f"{base_offset:0{_DIGITS}d}{suffix}"


def parse_segment_file_name(name: str) -> tuple[int, str] | None:
    """``(base_offset, suffix)`` of a segment file name, or None for any other name. Pure."""
    stem, dot, extension = name.partition(".")
    if len(stem) != _DIGITS or not stem.isdigit() or not dot or "." + extension not in _SUFFIXES:
        return None
    return int(stem), "." + extension


@attrs.define
class IndexCursor:
    """Where the next sparse index entries go: the state appending and rebuilding share."""

    interval_bytes: int
    bytes_since_entry: int = 0
    max_timestamp: int | None = None  # running max of batch max_timestamp in the segment
    relative_offset_of_max: int = 0  # first batch that reached max_timestamp
    last_time_entry: int | None = None  # timestamp of the last time index entry

    def step(
        self, position: int, relative_offset: int, size: int, max_timestamp: int
    ) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
        """Account one batch; return the ``(offset entry, time entry)`` due for it, if any."""
        if self.max_timestamp is None or max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
            self.relative_offset_of_max = relative_offset
        offset_entry = time_entry = None
        if self.bytes_since_entry >= self.interval_bytes:
            offset_entry = (relative_offset, position)
            self.bytes_since_entry = 0
            if self.last_time_entry is None or self.max_timestamp > self.last_time_entry:
                time_entry = (self.max_timestamp, self.relative_offset_of_max)
                self.last_time_entry = self.max_timestamp
        self.bytes_since_entry += size
        return offset_entry, time_entry


#: Read hints a segment keeps (see ``Segment.remember``).
_READ_HINTS_MAX = 8


class Segment:
    """The files and in-memory state of one segment. See the module docstring."""

    def __init__(
        self,
        store: FileStore,
        directory: str,
        base_offset: int,
        log_handle: int,
        offset_index: OffsetIndex,
        time_index: TimeIndex,
        index_interval_bytes: int,
    ) -> None:
        self.store = store
        self.directory = directory
        self.base_offset = base_offset
        self.log_handle = log_handle
        self.offset_index = offset_index
        self.time_index = time_index
        self.size = 0
        self.next_offset = base_offset
        self.allocated = 0  # bytes the file is known to have (>= size when preallocated)
        self.cursor = IndexCursor(index_interval_bytes)
        self.first_append_ms: int | None = None  # when the active segment got its first batch
        self.synced = False  # log and indexes fsynced since the segment stopped growing
        self.version = 0  # bumped by every change, so a sync ticket can tell it is stale
        #: Where reads ended: offset -> the position of the first batch holding it or after
        #: it (``remember``), so the next read from there skips the index walk. A few only
        #: (one per reader that reads on: followers, tailing consumers); cleared on truncation.
        self._read_hints: dict[int, int] = {}

    # --- files -------------------------------------------------------------------------------

    @classmethod
    def open(
        cls, store: FileStore, directory: str, base_offset: int, index_interval_bytes: int,
        *, fresh: bool
    ) -> Segment:
        """Open (creating if missing) the three files of a segment. Blocks on file I/O.

        ``fresh`` empties them (a new segment). Otherwise the caller (recovery) must load the
        state. Raises ``OSError`` if the store fails; no handle leaks.
        """
        handles: list[int] = []
        try:
            for suffix in _SUFFIXES:
                path = posixpath.join(directory, segment_file_name(base_offset, suffix))
                handles.append(store.open(path))
                if fresh:
                    store.truncate(handles[-1], 0)
        except BaseException:
            for handle in handles:
                store.close(handle)
            raise
        log_handle, index_handle, time_handle = handles
        return cls(
            store,
            directory,
            base_offset,
            log_handle,
            OffsetIndex(store, index_handle, cls.path_for(directory, base_offset, INDEX_SUFFIX)),
            TimeIndex(store, time_handle, cls.path_for(directory, base_offset, TIME_INDEX_SUFFIX)),
            index_interval_bytes,
        )

    @staticmethod
    def path_for(directory: str, base_offset: int, suffix: str) -> str:
        return posixpath.join(directory, segment_file_name(base_offset, suffix))

    @property
    def log_path(self) -> str:
        return self.path_for(self.directory, self.base_offset, LOG_SUFFIX)

    @property
    def paths(self) -> tuple[str, str, str]:
        return (self.log_path, self.offset_index.path, self.time_index.path)

    @property
    def handles(self) -> tuple[int, int, int]:
        return (self.log_handle, self.offset_index.handle, self.time_index.handle)

    @property
    def max_timestamp(self) -> int | None:
        return self.cursor.max_timestamp

    def close(self) -> None:
        """Close the three handles. Raises ``OSError`` if the store fails."""
        for handle in self.handles:
            self.store.close(handle)

    def remove_files(self) -> None:
        """Remove the three names (handles stay usable until closed). Blocks on file I/O."""
        for path in self.paths:
            if self.store.exists(path):
                self.store.remove(path)

    def trim(self) -> None:
        """Cut the log file back to ``size`` (drops preallocated space) and write the pending
        index entries. Blocks on file I/O. Raises ``OSError`` if the store fails."""
        self.write_indexes()
        if self.store.size(self.log_handle) != self.size:
            self.store.truncate(self.log_handle, self.size)
            self.version += 1
        self.allocated = self.size

    def write_indexes(self) -> None:
        """Write the index entries buffered since the last write, one write per index file.
        Blocks on file I/O. Raises ``OSError`` if the store fails."""
        self.offset_index.write_pending()
        self.time_index.write_pending()

    # --- appending ---------------------------------------------------------------------------

    def append(
        self,
        parts: Sequence[Buffer],
        batches: Sequence[tuple[int, int, int]],
        next_offset: int,
        *,
        preallocate_bytes: int,
        preallocate_limit: int,
    ) -> None:
        """Write ``parts`` at the end and index ``batches`` = ``(base_offset, size, max_ts)``;
        ``next_offset`` follows the last batch.

        ``parts`` are the stored batches as buffers, in order. Keeps up to
        ``preallocate_bytes`` of zeros ahead (not past ``preallocate_limit``), topped up in
        steps of ``PREALLOCATE_STEP_BYTES``, unless the append is
        ``PREALLOCATE_APPEND_BYTES_MAX`` or larger. Blocks on file I/O.

        Raises:
            OSError: the store failed; nothing changed (bytes past ``size`` are junk the
                next write overwrites). Index entries are only buffered here: ``trim``,
                ``truncate`` and ``write_indexes`` write them.
        """
        total = sum(map(_size_of, batches))
        position = self.size
        end = position + total
        target = min(end + preallocate_bytes, preallocate_limit)  # zeros up to here
        step_bytes = min(PREALLOCATE_STEP_BYTES, preallocate_bytes)
        if preallocate_bytes and total < PREALLOCATE_APPEND_BYTES_MAX \
                and target > max(end, self.allocated) \
                and end + preallocate_bytes - step_bytes > self.allocated:  # a step is used
            try:
                self.store.allocate(self.log_handle, target)
                self.allocated = target
            except OSError as exc:
                if not disk_full(exc):
                    raise
                # No room to run ahead: write without it (the write itself may still fit).
        if len(parts) <= IOV_MAX:  # the common case: one system call
            self.store.pwritev(self.log_handle, parts, position)
        else:
            write_at = position
            for start in range(0, len(parts), IOV_MAX):
                chunk = parts[start : start + IOV_MAX]
                self.store.pwritev(self.log_handle, chunk, write_at)
                write_at += sum(len(part) for part in chunk)
            assert write_at == end, (write_at, end)
        self.size = end
        assert next_offset > batches[-1][0]
        self.next_offset = next_offset
        self.allocated = max(self.allocated, end)
        self.synced = False
        self.version += 1
        for base_offset, size, max_timestamp in batches:
            self._index(position, base_offset, size, max_timestamp)
            position += size

    def _index(self, position: int, base_offset: int, size: int, max_timestamp: int) -> None:
        relative = base_offset - self.base_offset
        offset_entry, time_entry = self.cursor.step(position, relative, size, max_timestamp)
        if offset_entry is not None:
            self.offset_index.append(*offset_entry)
        if time_entry is not None:
            self.time_index.append(*time_entry)

    # --- reading -----------------------------------------------------------------------------

    def read(self, position: int, size: int) -> bytes:
        """``size`` bytes of the log from ``position`` (within ``self.size``). Blocks."""
        assert 0 <= position and position + size <= self.size
        return self.store.pread(self.log_handle, size, position)

    def region(self, position: int, size: int) -> bytes | FileRegion:
        """``read``'s bytes, or a ``FileRegion`` naming them (see ``FileStore.region``)."""
        assert 0 <= position and position + size <= self.size
        return self.store.region(self.log_handle, size, position)

    def whole_batches(
        self, position: int, first: BatchHeader, limit: int, max_offset: int | None
    ) -> tuple[int, int, int]:
        """``(end, next_offset, count)`` of the whole batches from ``position`` (where the
        batch ``first`` starts) that end at or before ``limit``, stopping before a batch whose
        base offset is ``>= max_offset``. Reads one header per batch after the first, so it
        suits large batches (``PartitionLog.read`` decides). Blocks.
        """
        end, next_offset, count = position, first.base_offset, 0
        header = first
        limit = min(limit, self.size)
        while True:
            if end + header.size > limit:
                break
            if max_offset is not None and header.base_offset >= max_offset:
                break
            end += header.size
            next_offset = header.next_offset
            count += 1
            if end + HEADER_BYTES > limit:
                break
            header = parse_header(self.store.pread(self.log_handle, HEADER_BYTES, end))
            if self.damage(end, header, next_offset) is not None:
                break  # served up to the damage; a read starting there reports it
        return end, next_offset, count

    def damage(self, position: int, header: BatchHeader, expected_offset: int) -> str | None:
        """Why the batch header at ``position`` cannot be this log's own, or None: a length
        below a header's or running past the segment, a wrong magic, or a base offset before
        ``expected_offset`` (the previous batch's end; later is fine: compaction leaves gaps)."""
        if header.batch_length < _MIN_BATCH_LENGTH:
            return f"batch length {header.batch_length} is below a header's"
        if position + header.size > self.size:
            return f"a batch of {header.size} bytes runs past the segment's {self.size}"
        if header.magic != MAGIC:
            return f"magic {header.magic}, not {MAGIC}"
        if header.base_offset < expected_offset:
            return f"base offset {header.base_offset} is before {expected_offset}"
        return None

    def iter_headers(
        self, start: int, end: int | None = None
    ) -> Iterator[tuple[int, BatchHeader]]:
        """``(position, header)`` of each batch from ``start`` (a batch boundary) to ``end``.

        Reads the log in chunks and skips over the bodies of large batches. Blocks.

        Raises:
            CorruptRecordsError: a header that cannot be the log's own (the segment was
                damaged on disk after it was written), with the file, position and the
                offset expected there.
        """
        end = self.size if end is None else end
        buffer, buffer_position = b"", start
        position = start
        expected = self.base_offset
        while position < end:
            if position + HEADER_BYTES > buffer_position + len(buffer):
                buffer = self.store.pread(
                    self.log_handle, min(WALK_CHUNK_BYTES, end - position), position
                )
                buffer_position = position
                if len(buffer) < HEADER_BYTES:
                    raise CorruptRecordsError(self.log_path, position, expected,
                                              f"{end - position} bytes, less than a header")
            header = parse_header(buffer, position - buffer_position)
            problem = self.damage(position, header, expected if position > start else 0)
            if problem is not None or position + header.size > end:
                raise CorruptRecordsError(self.log_path, position, expected,
                                          problem or "a batch runs past the end")
            yield position, header
            expected = header.next_offset
            position += header.batch_length + LOG_OVERHEAD_BYTES

    def remember(self, offset: int, position: int) -> None:
        """A read ended at ``position``, before ``offset``: the next read from ``offset`` may
        start there (``find_batch`` checks the header it finds). Never blocks."""
        hints = self._read_hints
        if offset not in hints and len(hints) >= _READ_HINTS_MAX:
            del hints[next(iter(hints))]  # the oldest
        hints[offset] = position

    def find_batch(self, offset: int) -> tuple[int, BatchHeader]:
        """Position and header of the batch holding ``offset`` (``base <= offset < next``),
        or the first one after it when compaction left a gap there."""
        assert self.base_offset <= offset < self.next_offset, (offset, self.next_offset)
        position = self._read_hints.get(offset)
        if position is not None and position + HEADER_BYTES <= self.size:
            header = parse_header(self.store.pread(self.log_handle, HEADER_BYTES, position))
            if header.base_offset + header.last_offset_delta >= offset and self.damage(
                    position, header, 0) is None:
                return position, header
        start = self.offset_index.lookup(offset - self.base_offset)
        for position, header in self.iter_headers(start):
            if header.base_offset + header.last_offset_delta >= offset:
                return position, header
        raise AssertionError(f"offset {offset} not found in {self.log_path}")

    def find_timestamp(self, timestamp_ms: int, from_offset: int) -> int | None:
        """Base offset of the first batch ending at or after ``from_offset`` whose
        max_timestamp >= ``timestamp_ms``, or None. Blocks on reads."""
        relative = self.time_index.lookup(timestamp_ms)
        start = 0 if relative is None else self.offset_index.lookup(relative)
        for _, header in self.iter_headers(start):
            if header.next_offset > from_offset and header.max_timestamp >= timestamp_ms:
                return header.base_offset
        return None

    # --- truncation and restoring state --------------------------------------------------------

    def truncate(self, position: int, next_offset: int) -> None:
        """Drop every batch at ``position`` (a batch boundary) and beyond. Blocks on I/O."""
        assert 0 <= position <= self.size
        self._read_hints.clear()
        self.store.truncate(self.log_handle, position)
        self.size = self.allocated = position
        self.next_offset = next_offset
        self.offset_index.truncate_at_position(position)
        # A time entry belongs to the first offset entry at or after its offset (see
        # time_index.py); keep only those of the remaining offset entries, which is exactly
        # what rebuilding the indexes from the remaining batches would produce.
        if len(self.offset_index):
            self.time_index.truncate_at_offset(self.offset_index.last()[0] + 1)
        else:
            self.time_index.truncate_at_offset(0)
        self.write_indexes()
        self.restore_cursor()
        self.synced = False
        self.version += 1
        if position == 0:
            self.first_append_ms = None

    def restore_cursor(self) -> None:
        """Rebuild the cursor from the loaded indexes and the batches after the last offset
        index entry (see ``time_index.py`` for why that is exact). Blocks on reads."""
        last_relative, last_position = self.offset_index.last()
        cursor = IndexCursor(self.cursor.interval_bytes, self.size - last_position)
        last_time = self.time_index.last()
        if last_time is not None:
            cursor.max_timestamp, cursor.relative_offset_of_max = last_time
            cursor.last_time_entry = last_time[0]
        for _, header in self.iter_headers(last_position):
            if cursor.max_timestamp is None or header.max_timestamp > cursor.max_timestamp:
                cursor.max_timestamp = header.max_timestamp
                cursor.relative_offset_of_max = header.base_offset - self.base_offset
        self.cursor = cursor

    # --- checking --------------------------------------------------------------------------------

    def check_invariants(self, *, deep: bool = False) -> None:
        """Assert the segment's invariants; ``deep`` reads every batch, checks its CRC and
        offset, and checks both indexes (memory and file) against a rebuild. Blocks on reads."""
        assert self.allocated >= self.size
        assert self.store.size(self.log_handle) >= self.size
        index, times = self.offset_index, self.time_index
        span = self.next_offset - self.base_offset
        assert len(index.positions) == len(index.relative_offsets)
        assert not index.positions or index.positions[-1] < self.size
        assert not index.positions or index.last()[0] < span
        assert len(times) <= len(index), "a time entry is only made with an offset entry"
        assert not times or times.last()[1] <= index.last()[0]
        assert (self.max_timestamp is not None) == (self.size > 0)
        if not deep:
            return
        cursor = IndexCursor(self.cursor.interval_bytes)
        rebuilt: tuple[list[tuple[int, int]], list[tuple[int, int]]] = ([], [])
        expected, seen = self.base_offset, 0
        data = self.read(0, self.size)
        for position, header in iter_batches(data):
            assert header.base_offset == expected, (self.log_path, position)
            validate(data, position, header.size, dense=False)
            relative = header.base_offset - self.base_offset
            for entries, entry in zip(
                rebuilt, cursor.step(position, relative, header.size, header.max_timestamp)
            ):
                if entry is not None:
                    entries.append(entry)
            expected = header.next_offset
            seen = position + header.size
        assert seen == self.size and expected == self.next_offset, self.log_path
        assert cursor == self.cursor, (cursor, self.cursor)
        assert rebuilt[0] == list(zip(index.relative_offsets, index.positions)), self.log_path
        assert rebuilt[1] == list(zip(times.timestamps, times.relative_offsets)), self.log_path
        for mirrored, entry_bytes in ((index, OFFSET_ENTRY_BYTES), (times, TIME_ENTRY_BYTES)):
            size = self.store.size(mirrored.handle)
            assert size == mirrored.written * entry_bytes, (mirrored.path, size, mirrored.written)
            on_file = self.store.pread(mirrored.handle, size, 0)
            assert on_file == mirrored.to_bytes()[:size], mirrored.path
