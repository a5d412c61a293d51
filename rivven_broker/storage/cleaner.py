"""Log compaction, the doing half: rewrite sealed segments and swap them in crash-safely.

Theory of operation
-------------------
``compaction.plan_compaction`` (pure) says which offsets of a compacted partition to keep; this
module reads the sealed segments, asks for a plan, writes the kept records and swaps the new
segment files in. It is background work, so reading every record is fine here (the produce
and fetch paths never decode records). Two steps:

1. ``prepare_steps(log, now_ms, delete_retention_ms)`` is a generator, so a driver can run it
   cooperatively on its event loop: it reads the sealed segments through its *own* read
   handles (a segment removed meanwhile by retention stays readable), plans, and for every
   segment the plan changes writes ``<base>.log.cleaned`` plus ``<base>.index.cleaned`` and
   ``<base>.timeindex.cleaned``, fsyncs them and the directory. It yields ``None`` every
   256 KiB of work (a pause point) and each fsync as a callable to run off the loop. It never
   touches the log object's state (sealed segments never change in place), so appends go on
   meanwhile. ``prepare_clean`` runs it inline.
2. ``commit_clean(log, prepared)`` (on the log's owner thread) swaps each prepared segment in,
   oldest first, and hands the new ``Segment`` to ``PartitionLog.replace_sealed_segment``.

Memory: a run keeps one small tuple per record of the sealed segments it plans over (the
planner needs them twice); ``limits.compaction_keys_max`` bounds the keys, not the records.

Rewriting keeps offsets: every original batch becomes one batch with the same base offset,
``last_offset_delta``, timestamps and producer fields, holding only the kept records (their
bytes unchanged; a zstd section is recompressed, or stored plain when that is not smaller),
so a compacted segment has gaps between records but its batches stay offset-dense, which is
what recovery and ``find_batch`` rely on. A batch that loses every record stays as an empty
batch (``record_count`` 0); runs of such empty plain batches (no producer id, not
transactional) are merged into one. Records of transactional and control batches are never
removed (passed to the planner as keyless): whether a transactional record counts depends on
its transaction's outcome, which the cleaner does not track.

The swap of each prepared segment, and the repair of a swap a crash interrupted
(``recover_swaps``, run when a log opens), are ``segment_swap.py``'s.
Segments are committed oldest first, so a tombstone is never dropped while an older value of
its key is still on disk.

Errors: ``OSError`` from the store propagates from both steps (prepare removes what it wrote).
"""

from __future__ import annotations

import posixpath
from array import array
from bisect import bisect_left
import functools
from typing import TYPE_CHECKING, Callable, Generator, Iterator, Sequence

import attrs
import crc32c as _crc32c
import zstandard

from rivven_broker.protocol import limits
from rivven_broker.records import codecs
from rivven_broker.records.batch import I32, ZSTD_LEVEL
from rivven_broker.records.header import (
    CorruptBatchError,
    COMPRESSION_MASK,
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    CRC_START,
    HEADER,
    HEADER_BYTES,
    LOG_OVERHEAD_BYTES,
    BatchHeader,
    parse_header,
)
from rivven_broker.records.reader import iter_records
from rivven_broker.storage import offset_index, time_index
from rivven_broker.storage.compaction import (
    CompactionPlan,
    RecordInfo,
    SegmentPlan,
    SegmentRecords,
    plan_compaction,
)
from rivven_broker.storage.file_store import FileStore
from rivven_broker.storage.segment import IndexCursor, Segment
from rivven_broker.storage.segment_swap import (
    CLEANED_SUFFIX,
    SEGMENT_SUFFIXES,
    swap_file_name,
    swap_in,
)

if TYPE_CHECKING:
    from rivven_broker.storage.partition_log import PartitionLog

__all__ = [
    "PreparedSegment",
    "PreparedClean",
    "CleanResult",
    "Step",
    "prepare_steps",
    "prepare_clean",
    "commit_clean",
    "discard_clean",
    "clean_log",
    "rewrite_batch",
]

#: What ``prepare_steps`` yields: a pause point (None) or a blocking call (an fsync).
Step = Callable[[], None] | None

_READ_CHUNK_BYTES = 1024 * 1024
_WRITE_CHUNK_BYTES = 1024 * 1024
#: Bytes of segment read or written between two pause points of ``prepare_steps``.
_PAUSE_BYTES = 256 * 1024
_OFFSET_DELTA_AT = 4 + 1 + 8  # length, attributes, timestamp_delta


@attrs.frozen(eq=False)
class PreparedSegment:
    """A rewritten segment waiting in ``<base>.*.cleaned`` files to replace ``old``."""

    old: Segment
    size: int
    relative_offsets: array
    positions: array
    timestamps: array
    time_offsets: array
    cursor: IndexCursor
    records_removed: int


@attrs.frozen(eq=False)
class PreparedClean:
    """The outcome of ``prepare_clean``: the plan and the rewritten segments, oldest first."""

    directory: str
    plan: CompactionPlan
    segments: tuple[PreparedSegment, ...]


@attrs.frozen
class CleanResult:
    """What one cleaning run did to a partition."""

    segments_cleaned: int
    records_removed: int
    bytes_before: int
    bytes_after: int
    cleaned_up_to_offset: int


# --- reading -------------------------------------------------------------------------------


def _iter_batches(store: FileStore, handle: int, size: int) -> Iterator[tuple[BatchHeader, bytes]]:
    """Every stored batch of a ``.log`` of ``size`` bytes, as (header, whole batch bytes)."""
    buffer, buffer_position, position = b"", 0, 0
    while position < size:
        if position + HEADER_BYTES > buffer_position + len(buffer):
            buffer = store.pread(handle, min(_READ_CHUNK_BYTES, size - position), position)
            buffer_position = position
        header = parse_header(buffer, position - buffer_position)
        batch_size = header.batch_length + LOG_OVERHEAD_BYTES
        assert HEADER_BYTES <= batch_size and position + batch_size <= size, (position, size)
        start = position - buffer_position
        if start + batch_size <= len(buffer):
            batch = buffer[start : start + batch_size]
        else:
            batch = store.pread(handle, batch_size, position)
        yield header, batch
        position += batch_size


def _read_records(
    store: FileStore, handle: int, size: int, out: list[RecordInfo]
) -> Iterator[None]:
    """Append what the planner needs of every record of a segment to ``out``; yield (a
    pause point) every ``_PAUSE_BYTES`` read."""
    since_pause = 0
    for header, batch in _iter_batches(store, handle, size):
        opaque = header.is_control or header.is_transactional
        for record in iter_records(batch):
            key = None if opaque else record.key
            out.append(RecordInfo(record.offset, key, record.value is None, record.timestamp_ms))
        since_pause += len(batch)
        if since_pause >= _PAUSE_BYTES:
            since_pause = 0
            yield None


# --- rewriting one batch (pure) ----------------------------------------------------------------


def _records_section(batch: bytes, header: BatchHeader) -> bytes:
    section = batch[HEADER_BYTES:]
    if header.compression == COMPRESSION_ZSTD:
        return zstandard.ZstdDecompressor().decompress(
            section, max_output_size=limits.batch_bytes_max
        )
    if header.compression != COMPRESSION_NONE:  # gzip, snappy, lz4 (bounded)
        try:
            return codecs.decompress(header.compression, section, limits.batch_bytes_max)
        except codecs.CodecError as error:
            raise CorruptBatchError(str(error)) from None
    return section


def _header_bytes(header: BatchHeader, attributes: int, section_bytes: int, count: int,
                  last_offset_delta: int, max_timestamp: int) -> bytes:
    return HEADER.pack(
        header.base_offset,
        HEADER_BYTES - LOG_OVERHEAD_BYTES + section_bytes,
        header.partition_leader_epoch,
        header.magic,
        0,
        attributes,
        last_offset_delta,
        header.first_timestamp,
        max_timestamp,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        count,
    )


def _seal(draft: bytes, section: bytes) -> bytes:
    """Put the CRC into a header draft and append the section."""
    crc = _crc32c.crc32c(section, _crc32c.crc32c(draft[CRC_START:]))
    fields = list(HEADER.unpack(draft))
    fields[4] = crc
    return HEADER.pack(*fields) + section


def rewrite_batch(batch: bytes, kept_offsets: Sequence[int] | set[int]) -> bytes:
    """``batch`` holding only the records whose offsets are in ``kept_offsets``: same base
    offset, offset delta, timestamps and producer fields, record bytes unchanged, a fresh CRC.
    A compressed section is recompressed with its codec (stored plain when that is not
    smaller; an empty section is always plain). Pure; never blocks.

    Raises:
        CorruptBatchError, InvalidBatchError: the batch's records do not decode.
    """
    header = parse_header(batch)
    kept = kept_offsets if isinstance(kept_offsets, (set, frozenset)) else set(kept_offsets)
    section = _records_section(batch, header)
    parts: list[bytes] = []
    position, count = 0, 0
    while position < len(section):
        (length,) = I32.unpack_from(section, position)
        end = position + 4 + length
        (delta,) = I32.unpack_from(section, position + _OFFSET_DELTA_AT)
        if header.base_offset + delta in kept:
            parts.append(section[position:end])
            count += 1
        position = end
    plain = b"".join(parts)
    attributes = header.attributes & ~COMPRESSION_MASK
    body = plain
    if plain and header.compression == COMPRESSION_ZSTD:
        compressed = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(plain)
        if len(compressed) < len(plain):
            body, attributes = compressed, attributes | COMPRESSION_ZSTD
    elif plain and header.compression != COMPRESSION_NONE:  # kept in its own codec
        compressed = codecs.compress(header.compression, plain)
        if len(compressed) < len(plain):
            body, attributes = compressed, attributes | header.compression
    draft = _header_bytes(
        header, attributes, len(body), count, header.last_offset_delta, header.max_timestamp
    )
    return _seal(draft, body)


def _empty_batch(first: BatchHeader, last_offset_delta: int, max_timestamp: int) -> bytes:
    attributes = first.attributes & ~COMPRESSION_MASK
    draft = _header_bytes(first, attributes, 0, 0, last_offset_delta, max_timestamp)
    return _seal(draft, b"")


def _mergeable(header: BatchHeader) -> bool:
    """An empty batch that carries nothing but its offsets (no producer, no transaction)."""
    return header.producer_id < 0 and not header.is_transactional and not header.is_control


# --- writing one segment -----------------------------------------------------------------------


class _Writer:
    """Appends output batches to a ``.cleaned`` log and computes its index entries."""

    def __init__(self, store: FileStore, handle: int, base_offset: int, interval: int) -> None:
        self.store, self.handle, self.base_offset = store, handle, base_offset
        self.cursor = IndexCursor(interval)
        self.size = 0
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self.entries = (array("I"), array("I"), array("q"), array("I"))
        self.empty: tuple[BatchHeader, int, int] | None = None  # run of empties: first, end, ts

    def add(self, header: BatchHeader, data: bytes) -> None:
        self.flush_empty()
        self._emit(header.base_offset, data, header.max_timestamp)

    def add_empty(self, header: BatchHeader) -> None:
        if self.empty is not None and _mergeable(header) and _mergeable(self.empty[0]):
            first, _, timestamp = self.empty
            self.empty = (first, header.next_offset, max(timestamp, header.max_timestamp))
            return
        self.flush_empty()
        self.empty = (header, header.next_offset, header.max_timestamp)

    def flush_empty(self) -> None:
        if self.empty is None:
            return
        first, end, timestamp = self.empty
        self.empty = None
        data = _empty_batch(first, end - first.base_offset - 1, timestamp)
        self._emit(first.base_offset, data, timestamp)

    def _emit(self, base_offset: int, data: bytes, max_timestamp: int) -> None:
        relative = base_offset - self.base_offset
        offset_entry, time_entry = self.cursor.step(self.size, relative, len(data), max_timestamp)
        if offset_entry is not None:
            self.entries[0].append(offset_entry[0])
            self.entries[1].append(offset_entry[1])
        if time_entry is not None:
            self.entries[2].append(time_entry[0])
            self.entries[3].append(time_entry[1])
        self.pending.append(data)
        self.pending_bytes += len(data)
        self.size += len(data)
        if self.pending_bytes >= _WRITE_CHUNK_BYTES:
            self.write_out()

    def write_out(self) -> None:
        if self.pending:
            position = self.size - self.pending_bytes
            self.store.pwritev(self.handle, self.pending, position)
            self.pending, self.pending_bytes = [], 0


def _rewrite_segment(
    store: FileStore, directory: str, segment: Segment, read_handle: int, plan: SegmentPlan,
    interval: int,
) -> Generator[Step, None, PreparedSegment]:
    base = segment.base_offset
    handles = [store.open(posixpath.join(directory, swap_file_name(base, s, CLEANED_SUFFIX)))
               for s in SEGMENT_SUFFIXES]
    try:
        for handle in handles:
            store.truncate(handle, 0)
        writer = _Writer(store, handles[0], base, interval)
        kept = plan.kept_offsets
        since_pause = 0
        for header, batch in _iter_batches(store, read_handle, segment.size):
            low = bisect_left(kept, header.base_offset)
            high = bisect_left(kept, header.next_offset)
            if high - low == header.record_count:
                writer.add(header, batch)  # nothing removed here: the bytes as they are
            elif high == low:
                writer.add_empty(header)
            else:
                writer.add(header, rewrite_batch(batch, set(kept[low:high])))
            since_pause += len(batch)
            if since_pause >= _PAUSE_BYTES:
                since_pause = 0
                yield None
        writer.flush_empty()
        writer.write_out()
        relative_offsets, positions, timestamps, time_offsets = writer.entries
        index_bytes = offset_index.encode_entries(relative_offsets, positions)
        time_bytes = time_index.encode_entries(timestamps, time_offsets)
        if index_bytes:
            store.pwrite(handles[1], index_bytes, 0)
        if time_bytes:
            store.pwrite(handles[2], time_bytes, 0)
        yield functools.partial(_fsync_all, store, tuple(handles))
    finally:
        for handle in handles:
            store.close(handle)
    return PreparedSegment(
        segment, writer.size, relative_offsets, positions, timestamps, time_offsets,
        writer.cursor, plan.removed,
    )


def _fsync_all(store: FileStore, handles: tuple[int, ...]) -> None:
    for handle in handles:
        store.fsync(handle)


# --- the two steps -----------------------------------------------------------------------------


def prepare_steps(
    log: PartitionLog,
    now_ms: int,
    delete_retention_ms: int,
    keys_max: int = limits.compaction_keys_max,
) -> Generator[Step, None, PreparedClean]:
    """Plan a cleaning of ``log``'s sealed segments and write the rewritten ones as
    ``.cleaned`` files (fsynced, directory fsynced), cooperatively: the generator yields
    ``None`` at pause points (every 256 KiB read or written) and, for each fsync, a blocking
    callable the driver runs off its event loop; its return value is the ``PreparedClean``.
    Reads only through its own handles and changes nothing in ``log``. Closing the generator
    early removes what it wrote. Blocks on file I/O between pause points.

    Raises:
        OSError: the store failed (files written so far are removed when possible), or a
            segment vanished meanwhile (FileNotFoundError).
        BatchError: a stored batch does not decode.
    """
    store, directory = log.store, log.directory
    segments = log.sealed_segments()  # one atomic snapshot, then the active base (order
    active_base = log.segment_base_offsets[-1]  # matters: a roll in between is harmless)
    interval = log.config.index_interval_bytes
    handles: list[int] = []
    prepared: list[PreparedSegment] = []
    written: list[int] = []  # bases whose .cleaned files may exist
    try:
        described = []
        for segment in segments:
            handles.append(store.open(segment.log_path, create=False))
            records: list[RecordInfo] = []
            yield from _read_records(store, handles[-1], segment.size, records)
            described.append(SegmentRecords(segment.base_offset, segment.next_offset, records))
        plan = plan_compaction(described, active_base, now_ms, delete_retention_ms, keys_max)
        del described
        bases = [s.base_offset for s in segments]
        for segment_plan in plan.segments:
            if segment_plan.unchanged:
                continue
            index = bases.index(segment_plan.base_offset)
            written.append(segment_plan.base_offset)
            prepared.append((yield from _rewrite_segment(
                store, directory, segments[index], handles[index], segment_plan, interval
            )))
        if prepared:
            store.fsync_dir(directory)
    except BaseException:
        _remove_quietly(store, directory, written, CLEANED_SUFFIX)
        raise
    finally:
        for handle in handles:
            store.close(handle)
    return PreparedClean(directory, plan, tuple(prepared))


def prepare_clean(
    log: PartitionLog,
    now_ms: int,
    delete_retention_ms: int,
    keys_max: int = limits.compaction_keys_max,
) -> PreparedClean:
    """``prepare_steps`` run to the end inline (fsyncs included). Blocks on file I/O.

    Raises:
        OSError, BatchError: as ``prepare_steps``.
    """
    steps = prepare_steps(log, now_ms, delete_retention_ms, keys_max)
    while True:
        try:
            step = next(steps)
        except StopIteration as stop:
            return stop.value
        if step is not None:
            step()


def commit_clean(log: PartitionLog, prepared: PreparedClean) -> CleanResult:
    """Swap the prepared segments into ``log``, oldest first (see the module docstring).

    A prepared segment whose original is no longer a sealed segment of ``log`` (retention
    removed it meanwhile) is discarded. Call on the log's owner thread. Blocks on renames and
    directory fsyncs.

    Raises:
        OSError: the store failed mid-swap; the next recovery completes or rolls back.
    """
    store, directory = log.store, log.directory
    assert prepared.directory == directory
    swapped = removed = before = after = 0
    for index, item in enumerate(prepared.segments):
        if not any(s is item.old for s in log.sealed_segments()):
            rest = [p.old.base_offset for p in prepared.segments[index:]]
            _remove_quietly(store, directory, rest, CLEANED_SUFFIX)
            break
        base = item.old.base_offset
        swap_in(store, directory, base)
        new = _open_cleaned(log, item)
        if not log.replace_sealed_segment(item.old, new):  # cannot happen: checked above
            raise AssertionError(f"segment {base} of {directory} vanished during its swap")
        swapped += 1
        removed += item.records_removed
        before += item.old.size
        after += item.size
    return CleanResult(swapped, removed, before, after, prepared.plan.cleaned_up_to_offset)


def discard_clean(log: PartitionLog, prepared: PreparedClean) -> None:
    """Remove the ``.cleaned`` files of a prepared cleaning that will not be committed."""
    bases = [p.old.base_offset for p in prepared.segments]
    _remove_quietly(log.store, prepared.directory, bases, CLEANED_SUFFIX)


def clean_log(
    log: PartitionLog, now_ms: int, delete_retention_ms: int,
    keys_max: int = limits.compaction_keys_max,
) -> CleanResult:
    """``prepare_clean`` then ``commit_clean``, inline. Blocks on file I/O.

    Raises:
        OSError: as the two steps.
    """
    return commit_clean(log, prepare_clean(log, now_ms, delete_retention_ms, keys_max))


def _open_cleaned(log: PartitionLog, item: PreparedSegment) -> Segment:
    old = item.old
    segment = Segment.open(
        log.store, log.directory, old.base_offset, log.config.index_interval_bytes, fresh=False
    )
    segment.offset_index.load(item.relative_offsets, item.positions)
    segment.time_index.load(item.timestamps, item.time_offsets)
    segment.size = segment.allocated = item.size
    segment.next_offset = old.next_offset
    segment.cursor = item.cursor
    segment.synced = True
    return segment


def _remove_quietly(store: FileStore, directory: str, bases: list[int], extra: str) -> None:
    for base in bases:
        for suffix in SEGMENT_SUFFIXES:
            path = posixpath.join(directory, swap_file_name(base, suffix, extra))
            try:
                if store.exists(path):
                    store.remove(path)
            except OSError:
                pass  # recovery removes leftovers at the next start
