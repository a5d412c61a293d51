"""Recovery: turn whatever a crash left in a partition directory into a consistent log.

Theory of operation
-------------------
First, an interrupted compaction swap is completed or undone (``segment_swap.recover_swaps``).
Two checkpoints steer recovery (``checkpoint.py``): the *log start offset* and the *recovery
point*. Every segment that ends at or below the recovery point had its log and both indexes
fsynced before that checkpoint was written, so it is *trusted*: recovery only sanity-checks its
indexes (sizes, monotonic entries, the header at the last offset index entry, time index against
offset index), rebuilds them from batch headers if they fail, and walks the batch headers after
the last index entry to learn where the segment ends and its max timestamp. Every other segment
(normally just the active one, or the last two after a crash right after a roll) is *scanned*:
every batch is read and its size, magic, offset continuity and CRC are checked, and both indexes
are rebuilt; an index file that differs from the rebuilt one is rewritten and reported.

The scan stops at the first bad batch. What follows is cut (``store.truncate``) and every later
segment deleted, and each cut is reported exactly: ``Cut(file, position, bytes_cut, reason)``.
A header whose ``batch_length`` is zero marks the end of data: when only zero bytes follow, the
cut is a harmless ``preallocated tail``; zeros followed by data are a ``zero-filled gap``.

The rule that protects acknowledged data: **recovery never cuts below the recovery point.**
If a cut would remove an offset below it (a bad batch inside trusted data, a trusted segment
that ends early, a gap between trusted segments) recovery raises ``CorruptLogError`` with the
file and byte position and changes nothing more; the partition stays offline until an operator
acts. Cuts at or above the recovery point are the normal cost of a crash.

Segments retention deleted are deleted again: a ``*.deleted`` file, and every segment at or
below the base of one (``PartitionLog.plan_retention``). Then: segments wholly below the log
start offset are deleted; if the log ends below the log
start offset (``delete_records`` persisted a start beyond data the crash took away), the log is
emptied and restarted at the log start offset. Finally every scanned segment and rebuilt index
is fsynced, the directory is fsynced if names changed, and the recovery point is moved to the
log end offset, so the next open trusts everything.
"""

from __future__ import annotations

import posixpath
from array import array
from typing import Callable

import attrs

from rivven_broker.protocol import limits
from rivven_broker.records.header import (
    HEADER_BYTES,
    LOG_OVERHEAD_BYTES,
    MAGIC,
    BatchError,
    BatchHeader,
    CorruptBatchError,
    parse_header,
    validate,
)
from rivven_broker.storage import offset_index, time_index
from rivven_broker.storage.checkpoint import (
    LOG_START_OFFSET_FILE,
    RECOVERY_POINT_FILE,
    TMP_SUFFIX,
    read_checkpoint,
    write_checkpoint,
)
from rivven_broker.storage.errors import CorruptLogError
from rivven_broker.storage.file_store import FileStore
from rivven_broker.storage.log_config import LogConfig
from rivven_broker.storage.segment import (
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    IndexCursor,
    Segment,
    parse_segment_file_name,
)
from rivven_broker.storage.segment_swap import recover_swaps

__all__ = [
    "Cut",
    "RecoveryReport",
    "RecoveredLog",
    "recover",
    "walk_batches",
    "PREALLOCATED_TAIL",
    "TORN_HEADER",
    "TORN_BATCH",
    "ZERO_FILLED_GAP",
    "INVALID_HEADER",
    "INVALID_BATCH",
    "CRC_MISMATCH",
    "OFFSET_DISCONTINUITY",
    "FOLLOWS_CUT",
]

# Reasons a cut names.
PREALLOCATED_TAIL = "preallocated tail"
TORN_HEADER = "torn header"
TORN_BATCH = "torn batch"
ZERO_FILLED_GAP = "zero-filled gap"
INVALID_HEADER = "invalid header"
INVALID_BATCH = "invalid batch"
CRC_MISMATCH = "crc mismatch"
OFFSET_DISCONTINUITY = "offset discontinuity"
FOLLOWS_CUT = "segment follows a cut"

_SCAN_CHUNK_BYTES = 1024 * 1024
_ZERO_CHUNK = bytes(_SCAN_CHUNK_BYTES)  # a chunk is zero when this starts with it (a memcmp)
_WALK_CHUNK_BYTES = 64 * 1024
_MIN_BATCH_LENGTH = HEADER_BYTES - LOG_OVERHEAD_BYTES


@attrs.frozen
class Cut:
    """Bytes recovery removed: ``bytes_cut`` bytes of ``file`` from ``position`` on."""

    file: str
    position: int
    bytes_cut: int
    reason: str


@attrs.frozen
class RecoveryReport:
    """What ``PartitionLog.open`` found and changed.

    ``batches_kept`` counts the batches the CRC scan validated and kept (in the segments at or
    above the recovery point); trusted segments are not counted batch by batch.
    """

    cuts: tuple[Cut, ...]
    batches_kept: int
    segments: int
    rebuilt_indexes: tuple[str, ...]
    removed_files: tuple[str, ...] = ()  # below the log start offset, orphans, leftovers
    scanned_segments: int = 0
    recovery_point: int = 0  # as found on disk (0 when missing)
    log_start_offset: int = 0
    log_end_offset: int = 0

    @property
    def bytes_cut(self) -> int:
        return sum(cut.bytes_cut for cut in self.cuts)

    @property
    def clean(self) -> bool:
        """True when nothing was cut, rebuilt or scanned (a clean shutdown)."""
        return not self.cuts and not self.rebuilt_indexes and not self.scanned_segments


@attrs.define
class RecoveredLog:
    """The state ``PartitionLog`` is built from: open segments and the two checkpoints."""

    segments: list[Segment]
    log_start_offset: int
    recovery_point: int


@attrs.define
class _End:
    """Where a walk over a segment's batches stopped."""

    position: int
    next_offset: int
    reason: str | None  # None: it reached the end of the file cleanly
    batches: int = 0


def _all_zero(store: FileStore, handle: int, start: int, end: int) -> bool:
    position = start
    while position < end:
        chunk = store.pread(handle, min(_SCAN_CHUNK_BYTES, end - position), position)
        if not chunk or not _ZERO_CHUNK.startswith(chunk):
            return False
        position += len(chunk)
    return True


def walk_batches(
    store: FileStore,
    handle: int,
    start: int,
    file_size: int,
    expected_offset: int,
    *,
    verify_crc: bool,
    on_batch: Callable[[int, BatchHeader], None],
) -> _End:
    """Walk the batches of a ``.log`` from ``start`` until the end or the first bad one.

    With ``verify_crc`` every batch is read whole and validated; otherwise only headers are
    read (sizes, magic and offset continuity are still checked). Blocks on reads.
    """
    buffer, buffer_position = b"", start
    position, expected, batches = start, expected_offset, 0
    chunk_bytes = _SCAN_CHUNK_BYTES if verify_crc else _WALK_CHUNK_BYTES
    while position < file_size:
        remaining = file_size - position
        if remaining < HEADER_BYTES:
            zero = _all_zero(store, handle, position, file_size)
            return _End(position, expected, PREALLOCATED_TAIL if zero else TORN_HEADER, batches)
        if position + HEADER_BYTES > buffer_position + len(buffer):
            buffer = store.pread(handle, min(chunk_bytes, remaining), position)
            buffer_position = position
        header = parse_header(buffer, position - buffer_position)
        size = header.batch_length + LOG_OVERHEAD_BYTES
        reason = None
        if header.batch_length == 0:
            zero = _all_zero(store, handle, position, file_size)
            reason = PREALLOCATED_TAIL if zero else ZERO_FILLED_GAP
        elif not _MIN_BATCH_LENGTH <= header.batch_length <= limits.batch_bytes_max:
            reason = INVALID_HEADER
        elif header.magic != MAGIC:
            reason = INVALID_HEADER
        elif size > remaining:
            reason = TORN_BATCH
        elif header.base_offset != expected:
            reason = OFFSET_DISCONTINUITY
        elif verify_crc:
            if position + size > buffer_position + len(buffer):
                buffer = store.pread(handle, min(max(chunk_bytes, size), remaining), position)
                buffer_position = position
            try:
                validate(buffer, position - buffer_position, size, dense=False)
            except CorruptBatchError:
                reason = CRC_MISMATCH
            except BatchError:
                reason = INVALID_BATCH
        if reason is not None:
            return _End(position, expected, reason, batches)
        on_batch(position, header)
        batches += 1
        expected = header.next_offset
        position += size
    return _End(position, expected, None, batches)


class _Recovery:
    """One run of recovery over one directory (state shared by the steps)."""

    def __init__(self, store: FileStore, directory: str, config: LogConfig, now_ms: int) -> None:
        self.store = store
        self.directory = directory
        self.config = config
        self.now_ms = now_ms
        self.cuts: list[Cut] = []
        self.rebuilt: list[str] = []
        self.removed: list[str] = []
        self.batches_kept = 0
        self.scanned = 0
        self.names_changed = False
        self.to_sync: list[int] = []  # handles to fsync before returning
        self.segments: list[Segment] = []
        self.missing_indexes: set[int] = set()  # bases whose index files did not exist

    def path(self, name: str) -> str:
        return posixpath.join(self.directory, name)

    def remove(self, path: str) -> None:
        self.store.remove(path)
        self.removed.append(path)
        self.names_changed = True

    # --- the steps ---------------------------------------------------------------------------

    def run(self) -> tuple[RecoveredLog, RecoveryReport]:
        store, directory = self.store, self.directory
        if not store.exists(directory):
            store.makedirs(directory)
            store.fsync_dir(posixpath.dirname(directory.rstrip("/")))
        # An interrupted compaction swap: completed or rolled back (cleaner.py), then listed.
        self.removed.extend(posixpath.join(directory, n) for n in recover_swaps(store, directory))
        bases = self.list_segments()
        log_start = read_checkpoint(store, directory, LOG_START_OFFSET_FILE)
        found_recovery_point = read_checkpoint(store, directory, RECOVERY_POINT_FILE)
        recovery_point = found_recovery_point or 0
        if log_start is not None:
            while len(bases) > 1 and bases[1] <= log_start:
                for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                    path = Segment.path_for(directory, bases[0], suffix)
                    if store.exists(path):
                        self.remove(path)
                bases.pop(0)
        try:
            self.recover_segments(bases, recovery_point)
            start = max(log_start or 0, self.segments[0].base_offset if self.segments else 0)
            if not self.segments or self.segments[-1].next_offset < start:
                self.restart_at(start)
            self.finish()
            log_end = self.segments[-1].next_offset
            if self.scanned or self.rebuilt or self.cuts or recovery_point != log_end:
                write_checkpoint(store, directory, RECOVERY_POINT_FILE, log_end)
                recovery_point = log_end
        except BaseException:
            for segment in self.segments:
                segment.close()
            raise
        report = RecoveryReport(
            cuts=tuple(self.cuts),
            batches_kept=self.batches_kept,
            segments=len(self.segments),
            rebuilt_indexes=tuple(self.rebuilt),
            removed_files=tuple(self.removed),
            scanned_segments=self.scanned,
            recovery_point=found_recovery_point or 0,
            log_start_offset=start,
            log_end_offset=log_end,
        )
        return RecoveredLog(self.segments, start, recovery_point), report

    def list_segments(self) -> list[int]:
        """Base offsets of the ``.log`` files; removes leftovers and orphan index files, and
        the segments retention deleted (``*.deleted`` files, and every segment at or below
        the base of one: retention deletes a prefix, whose renames may reach the disk in any
        order)."""
        names = self.store.listdir(self.directory)
        deleted = [
            parsed[0]
            for parsed in (parse_segment_file_name(name[: -len(DELETED_SUFFIX)])
                           for name in names if name.endswith(DELETED_SUFFIX))
            if parsed is not None
        ]
        floor = max(deleted, default=-1)
        bases = sorted(
            parsed[0]
            for parsed in map(parse_segment_file_name, names)
            if parsed is not None and parsed[1] == LOG_SUFFIX and parsed[0] > floor
        )
        known = set(bases)
        for name in names:
            parsed = parse_segment_file_name(name)
            if (name.endswith(TMP_SUFFIX) or name.endswith(DELETED_SUFFIX)
                    or (parsed is not None and parsed[0] not in known)):
                self.remove(self.path(name))
        return bases

    def recover_segments(self, bases: list[int], recovery_point: int) -> None:
        expected: int | None = None
        for i, base in enumerate(bases):
            successor = bases[i + 1] if i + 1 < len(bases) else None
            if expected is not None and base != expected:
                if expected < recovery_point:
                    raise CorruptLogError(
                        Segment.path_for(self.directory, base, LOG_SUFFIX), 0,
                        f"segment starts at {base}, expected {expected}",
                    )
                self.delete_segments(bases[i:], OFFSET_DISCONTINUITY)
                return
            segment = self.open_segment(base)
            self.segments.append(segment)
            trusted = (successor is not None and successor <= recovery_point) or (
                successor is None and base <= recovery_point
            )
            if not (trusted and self.check_trusted(segment, successor, recovery_point)):
                end = self.scan(segment, recovery_point)
                if end.reason not in (None, PREALLOCATED_TAIL) and successor is not None:
                    self.delete_segments(bases[i + 1 :], FOLLOWS_CUT)
                    return
            expected = segment.next_offset

    def open_segment(self, base: int) -> Segment:
        for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            if not self.store.exists(Segment.path_for(self.directory, base, suffix)):
                self.missing_indexes.add(base)
                self.names_changed = True
        return Segment.open(
            self.store, self.directory, base, self.config.index_interval_bytes, fresh=False
        )

    def delete_segments(self, bases: list[int], reason: str) -> None:
        """Delete these (not yet opened) segments after a cut, reporting each whole."""
        store = self.store
        for base in bases:
            log_path = Segment.path_for(self.directory, base, LOG_SUFFIX)
            handle = store.open(log_path, create=False)
            try:
                size = store.size(handle)
            finally:
                store.close(handle)
            self.cuts.append(Cut(log_path, 0, size, reason))
            for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                path = Segment.path_for(self.directory, base, suffix)
                if store.exists(path):
                    store.remove(path)
            self.names_changed = True

    # --- trusted segments ----------------------------------------------------------------------

    def load_indexes(self, segment: Segment, file_size: int) -> bool:
        """Load both index files into ``segment`` if they pass the cheap checks."""
        if segment.base_offset in self.missing_indexes:
            return False
        store = self.store
        index_handle, time_handle = segment.offset_index.handle, segment.time_index.handle
        offsets = offset_index.decode_entries(
            store.pread(index_handle, store.size(index_handle), 0)
        )
        times = time_index.decode_entries(store.pread(time_handle, store.size(time_handle), 0))
        if isinstance(offsets, str) or isinstance(times, str):
            return False
        (relative_offsets, positions), (timestamps, time_offsets) = offsets, times
        if positions:
            if positions[-1] + HEADER_BYTES > file_size:
                return False
            header = parse_header(store.pread(segment.log_handle, HEADER_BYTES, positions[-1]))
            expected = _base_plus(segment, relative_offsets[-1])
            if header.magic != MAGIC or header.base_offset != expected:
                return False
            if not timestamps or len(timestamps) > len(positions):
                return False
            if time_offsets[0] > relative_offsets[0] or time_offsets[-1] > relative_offsets[-1]:
                return False
        elif timestamps:
            return False
        segment.offset_index.load(relative_offsets, positions)
        segment.time_index.load(timestamps, time_offsets)
        return True

    def check_trusted(self, segment: Segment, successor: int | None, recovery_point: int) -> bool:
        """Cheap checks of a segment below the recovery point. False: scan it instead.

        Raises ``CorruptLogError`` when data below the recovery point is missing or damaged.
        """
        store = self.store
        file_size = store.size(segment.log_handle)
        if self.load_indexes(segment, file_size):
            start = segment.offset_index.last()[1]
            expected = _base_plus(segment, segment.offset_index.last()[0])
            rebuilding = False
        else:
            start, expected, rebuilding = 0, segment.base_offset, True
            segment.cursor = IndexCursor(self.config.index_interval_bytes)
        entries = _Entries()
        end = walk_batches(
            store, segment.log_handle, start, file_size, expected, verify_crc=False,
            on_batch=entries.collector(segment) if rebuilding else lambda position, header: None,
        )
        bound = recovery_point if successor is None else successor
        if end.next_offset < bound:
            raise CorruptLogError(
                segment.log_path, end.position,
                f"{end.reason or 'end of file'} at offset {end.next_offset}, below the "
                f"{'recovery point' if successor is None else 'next segment'} {bound}",
            )
        if end.next_offset > bound:
            if successor is not None:
                raise CorruptLogError(
                    segment.log_path, end.position, f"overlaps the next segment at {successor}"
                )
            return False  # data past the recovery point: scan the whole segment
        self.apply_end(segment, end, file_size)
        if rebuilding:
            self.install_indexes(segment, entries)
        else:
            segment.restore_cursor()
        return True

    # --- scanned segments ----------------------------------------------------------------------

    def scan(self, segment: Segment, recovery_point: int) -> _End:
        """CRC-scan a whole segment, cut a bad tail, rebuild its indexes."""
        store = self.store
        self.scanned += 1
        file_size = store.size(segment.log_handle)
        segment.cursor = IndexCursor(self.config.index_interval_bytes)
        entries = _Entries()
        end = walk_batches(
            store, segment.log_handle, 0, file_size, segment.base_offset, verify_crc=True,
            on_batch=entries.collector(segment),
        )
        if end.reason is not None and end.next_offset < recovery_point:
            raise CorruptLogError(
                segment.log_path, end.position,
                f"{end.reason} at offset {end.next_offset}, below the recovery point "
                f"{recovery_point}",
            )
        self.batches_kept += end.batches
        self.apply_end(segment, end, file_size)
        self.install_indexes(segment, entries)
        self.to_sync.extend(segment.handles)
        return end

    def apply_end(self, segment: Segment, end: _End, file_size: int) -> None:
        """Set the segment's extent from a walk; cut (and report) whatever follows."""
        if end.position < file_size:
            self.store.truncate(segment.log_handle, end.position)
            self.cuts.append(
                Cut(segment.log_path, end.position, file_size - end.position, end.reason or "")
            )
            self.to_sync.append(segment.log_handle)
        segment.size = segment.allocated = end.position
        segment.next_offset = end.next_offset
        segment.synced = True
        if segment.size:
            segment.first_append_ms = self.now_ms

    def install_indexes(self, segment: Segment, entries: _Entries) -> None:
        """Put rebuilt entries in memory; rewrite (and report) files that differ."""
        store = self.store
        offset_bytes = offset_index.encode_entries(entries.relative_offsets, entries.positions)
        time_bytes = time_index.encode_entries(entries.timestamps, entries.time_offsets)
        for index, built in ((segment.offset_index, offset_bytes), (segment.time_index, time_bytes)):
            on_disk = store.pread(index.handle, store.size(index.handle) + 1, 0)
            if on_disk != built:
                store.truncate(index.handle, 0)
                if built:
                    store.pwrite(index.handle, built, 0)
                self.rebuilt.append(index.path)
                self.to_sync.append(index.handle)
        segment.offset_index.load(entries.relative_offsets, entries.positions)
        segment.time_index.load(entries.timestamps, entries.time_offsets)

    # --- endings -------------------------------------------------------------------------------

    def restart_at(self, start: int) -> None:
        """Empty the log and start it again at ``start`` (the log ends below its start)."""
        for segment in self.segments:
            segment.close()
            for path in segment.paths:
                self.remove(path)
        self.segments = [
            Segment.open(
                self.store, self.directory, start, self.config.index_interval_bytes, fresh=True
            )
        ]
        self.segments[0].synced = True
        self.names_changed = True

    def finish(self) -> None:
        """Make every change of this recovery durable."""
        open_handles = {handle for segment in self.segments for handle in segment.handles}
        for handle in dict.fromkeys(self.to_sync):
            if handle in open_handles:  # a segment dropped by restart_at is gone
                self.store.fsync(handle)
        if self.names_changed:
            self.store.fsync_dir(self.directory)


def _base_plus(segment: Segment, relative_offset: int) -> int:
    return segment.base_offset + relative_offset


class _Entries:
    """Index entries collected while walking a segment from its start."""

    def __init__(self) -> None:
        self.relative_offsets = array("I")
        self.positions = array("I")
        self.timestamps = array("q")
        self.time_offsets = array("I")

    def collector(self, segment: Segment) -> Callable[[int, BatchHeader], None]:
        cursor, base = segment.cursor, segment.base_offset

        def on_batch(position: int, header: BatchHeader) -> None:
            offset_entry, time_entry = cursor.step(
                position, header.base_offset - base,
                header.batch_length + LOG_OVERHEAD_BYTES, header.max_timestamp,
            )
            if offset_entry is not None:
                self.relative_offsets.append(offset_entry[0])
                self.positions.append(offset_entry[1])
            if time_entry is not None:
                self.timestamps.append(time_entry[0])
                self.time_offsets.append(time_entry[1])

        return on_batch


def recover(
    store: FileStore, directory: str, config: LogConfig, now_ms: int
) -> tuple[RecoveredLog, RecoveryReport]:
    """Recover the partition directory ``directory`` (created if missing).

    Returns the open segments and checkpoints, and the report. Blocks on file I/O (reads every
    segment at or above the recovery point, fsyncs what it changed).

    Raises:
        CorruptLogError: data below the recovery point is damaged or missing, or a checkpoint
            file is damaged. No segment is left open.
        OSError: the store failed. No segment is left open.
    """
    return _Recovery(store, directory, config, now_ms).run()
