"""``PartitionLog``: the durable, segmented log of one partition (a synchronous core).

Theory of operation
-------------------
A partition log is a list of segments (``segment.py``; the list and its base offsets are a
``SegmentList``, ``segment_list.py``) covering dense offsets ``[log_start_offset,
log_end_offset)``; only the last one, the *active* segment, grows. The log
does all I/O through its ``FileStore`` and takes ``now_ms`` as an argument: no clocks, threads
or trio here. It is not thread-safe: one owner calls it, and only ``store.fsync`` on the handles
of a ``SyncTicket`` (and ``fsync_dir`` of its directory) and ``SegmentRemoval.run`` may run
elsewhere meanwhile.

Appending: every batch of the request is validated first (size, magic, counts, CRC;
``incoming_batches.py``); one bad batch rejects the whole request. The log then rolls if the
active segment is full (``segment.bytes``) or old (``segment.ms`` since its first batch),
assigns offsets, and writes ``(stamp, batch[16:])`` buffer pairs with one ``pwritev``: only the
16-byte stamp (base offset, length, leader epoch, all outside the CRC) is new; the batch bytes
are not copied. ``stage`` does the same up to the write and keeps the pairs
(``StagedBatches``), so that ``write_staged`` writes many requests' batches with one
``pwritev`` (``storage/staged_appends.py``); until then the log end offset does not move.

Reading: bisect the segment by base offset (``SegmentList``), then, in that one segment
(``segment_reads.py``), bisect the sparse offset index, scan batch headers forward to the batch
holding the offset, and return whole batches (never a partial one, at least one if any). A
fetch asks for ``zero_copy``: when the batches are large it then gets a ``FileRegion`` (found
by their headers alone) that the connection sends with ``os.sendfile``, instead of the bytes.
``offset_for_timestamp`` uses the time index the same way.

Durability (group commit): appends dirty the active segment. ``begin_sync`` hands out a
``SyncTicket`` listing the handles to fsync (the active ``.log``; for a segment rolled since
its last sync, its ``.log`` and both indexes) and the offset it covers; a worker thread fsyncs
them; ``complete_sync`` then raises ``durable_offset``. What must be remembered between the two
(tickets out, directory changes, the staged recovery point, segments whose handles wait for the
tickets) is a ``SyncLedger`` (``sync_ledger.py``). The active segment's indexes are never
fsynced with the data: recovery rebuilds them. Index entries are buffered in memory and written
in one write per index file at each ``begin_sync``, roll, truncation and close.

Directory changes ride the group commit: nothing on the append path fsyncs. A roll records a
*directory change* whose floor is the new segment's base; ``begin_sync`` then names the
directory in the ticket (``SyncTicket.directory``), the worker fsyncs it after the ticket's
handles in the same off-loop call, and ``complete_sync`` drops the changes that fsync covered.
Until then ``durable_offset`` never passes the floor: a power loss between the roll and the
group commit may lose the new segment's name, and with it only offsets never reported durable
(recovery ends the log at the old segment, as for any unsynced tail). Tickets begun before the
roll end at or below the floor anyway. Under ``interval``/``none`` the change waits for the
next group (or ``close``/``flush``). While a ticket is out, segments removed by
``delete_records`` or ``truncate_to`` keep their handles open (a closed fd could be reused
under the worker) until the last ticket completes; retention closes a removed segment's
handles at once unless a ticket out names it.

Retention (``plan_retention``, on the owner's thread) only decides (``retention.py``) and
renames: the deleted segments leave the list, the log start moves up to the first remaining
one, their files become ``*.deleted``; ``SegmentRemoval.run`` (off the loop) unlinks them and
fsyncs the directory. ``retention.py`` says why no checkpoint is needed and when a removal is
a directory change with a floor.

Recovery point: after each roll, the next ticket carries the end of the prefix of segments
whose log and indexes a completed sync covered, written to a staged checkpoint file whose
handle the ticket fsyncs; ``complete_sync`` renames it over ``recovery-point.checkpoint`` on
the owner's thread (ordered against truncations, which cancel a staged value) and the next
directory fsync makes it durable: either value is true meanwhile. ``close`` records the log
end offset. Recovery trusts segments below it (``recovery.py``). ``truncate_to`` lowers it
first.

Failures: if the store fails after the log started to change, the log marks itself failed and
every later change raises ``LogFailedError`` (reads still work); reopening recovers it. Store
failures surface as ``StorageError`` subclasses, except in ``open`` (``OSError``).
"""

from __future__ import annotations

import contextlib
import posixpath
from typing import Iterator

from rivven_broker.records.header import BatchHeader, InvalidBatchError
from rivven_broker.storage.checkpoint import (
    LOG_START_OFFSET_FILE,
    RECOVERY_POINT_FILE,
    stage_checkpoint,
    write_checkpoint,
)
from rivven_broker.storage.errors import LogFailedError, OffsetOutOfRangeError, StorageError
from rivven_broker.storage.file_store import FileStore
from rivven_broker.storage.incoming_batches import check_batches, place_batches
from rivven_broker.storage.leader_epochs import LeaderEpochCache
from rivven_broker.storage.log_config import LogConfig
from rivven_broker.storage.log_results import AppendInfo, LogStatistics, ReadResult, SyncTicket
from rivven_broker.storage.recovery import RecoveryReport, recover
from rivven_broker.storage.retention import SegmentRemoval, segments_past_retention
from rivven_broker.storage.segment import DELETED_SUFFIX, Segment, disk_full
from rivven_broker.storage.segment_list import SegmentList
from rivven_broker.storage.segment_reads import (
    REGION_BATCH_BYTES_MIN,
    read_batches,
    scrub_batches,
)
from rivven_broker.storage.sync_ledger import StagedCheckpoint, SyncLedger
from rivven_broker.storage.staged_appends import StagedBatches

__all__ = ["PartitionLog", "AppendInfo", "ReadResult", "SyncTicket", "LogStatistics",
           "SegmentRemoval", "REGION_BATCH_BYTES_MIN"]

#: Offsets and positions in the index are u32; Kafka keeps both below 2**31.
_RELATIVE_MAX = 2**31 - 1


class PartitionLog:
    """The log of one partition. See the module docstring."""

    def __init__(
        self, store: FileStore, directory: str, config: LogConfig, segments: list[Segment],
        log_start_offset: int, recovery_point: int,
    ) -> None:
        """Internal: use ``PartitionLog.open``."""
        assert segments
        self.config = config
        self._store = store
        self._directory = directory
        self._segments = SegmentList(segments)
        self._log_start_offset = log_start_offset
        self._recovery_point = recovery_point
        self._durable_offset = segments[-1].next_offset
        self._size_bytes = sum(segment.size for segment in segments)
        #: Tickets out, directory changes, staged recovery points, doomed segments.
        self._ledger = SyncLedger()
        self._removing: list[str] = []  # ``*.deleted`` names retention has yet to unlink
        self._failed: BaseException | None = None
        self._closed = False
        self._appends = self._appended_batches = self._appended_bytes = 0
        self._rolls = self._syncs = self._segments_deleted = 0
        #: Which leader epoch wrote which offsets (``leader_epochs.py``).
        self.epochs = LeaderEpochCache(None, directory)
        #: The epoch ``append`` stamps on batches (``become_leader`` sets it).
        self.leader_epoch = 0
        #: Batches staged for one write (``stage``; ``storage/staged_appends.py``).
        self._staged_batches: StagedBatches | None = None

    @classmethod
    def open(
        cls, store: FileStore, directory: str, config: LogConfig, now_ms: int
    ) -> tuple[PartitionLog, RecoveryReport]:
        """Open (recovering as needed) the log in ``directory``, creating it if missing.

        Blocks on file I/O (see ``recovery.py`` for what is read and written).

        Raises:
            CorruptLogError: data below the recovery point is damaged.
            OSError: the store failed.
        """
        recovered, report = recover(store, directory, config, now_ms)
        log = cls(
            store, directory, config, recovered.segments,
            recovered.log_start_offset, recovered.recovery_point,
        )
        log.epochs = LeaderEpochCache.open(store, directory, log.log_end_offset)
        log.leader_epoch = max(log.epochs.latest_epoch, 0)
        return log, report

    # --- properties ----------------------------------------------------------------------------

    @property
    def store(self) -> FileStore:
        return self._store

    @property
    def directory(self) -> str:
        return self._directory

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        """The next offset to assign."""
        return self._segments.active.next_offset

    @property
    def durable_offset(self) -> int:
        """Every offset below this survived an fsync (and survives a crash)."""
        return self._durable_offset

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def size_bytes(self) -> int:
        return self._size_bytes

    @property
    def segment_base_offsets(self) -> tuple[int, ...]:
        """Base offset of every segment, oldest first (the last is the active one)."""
        return self._segments.bases

    @property
    def failed(self) -> bool:
        return self._failed is not None

    @property
    def dirty(self) -> bool:
        """True when something is not known durable yet (``begin_sync`` will hand out a
        ticket, unless the only such data is covered by a ticket still out)."""
        return self._failed is None and (
            self._durable_offset < self.log_end_offset
            or self._ledger.directory_dirty
            or bool(self._segments.unsynced_sealed())
        )

    # --- appending -------------------------------------------------------------------------------

    def become_leader(self, epoch: int) -> None:
        """Appends from now on are this leader epoch's, starting at the log end offset
        (recorded in the epoch cache, durably). Blocks on the checkpoint's fsyncs.

        Raises:
            StorageError: the epoch checkpoint could not be written.
        """
        try:
            self.epochs.assign(epoch, self.log_end_offset)
        except OSError as exc:
            raise StorageError(f"leader-epoch checkpoint of {self._directory}: {exc}") from exc
        self.leader_epoch = epoch

    def append(
        self, records: bytes | bytearray | memoryview, now_ms: int, *,
        leader_epoch: int | None = None,
    ) -> AppendInfo:
        """Append one or more concatenated record batches; assign their offsets.

        Blocks on file writes, never on fsync (a roll's directory entry is synced by the
        next group commit).

        Raises:
            InvalidBatchError, CorruptBatchError: a batch is malformed (nothing is appended).
            RecordTooLargeError: a batch exceeds ``max.message.bytes`` (nothing is appended).
            StorageError: the data write failed (nothing is appended).
            LogFailedError: the store failed after the log changed, now or earlier.
        """
        self._check_writable()
        assert self._staged_batches is None, "write what is staged first"
        if leader_epoch is None:
            leader_epoch = self.leader_epoch
        view, batches, total, span = check_batches(records, self.config.max_message_bytes)
        if self._should_roll(total, span, now_ms):
            self.roll(now_ms)
        active = self._segments.active
        parts: list[bytes | memoryview] = []
        placed: list[tuple[int, int, int]] = []
        base_offset = active.next_offset
        offset = place_batches(view, batches, base_offset, leader_epoch, parts, placed)
        self._write(active, parts, placed, offset, total, now_ms)
        return AppendInfo(base_offset, offset - 1, now_ms, len(batches), total)

    def stage(self, records: bytes | bytearray | memoryview, now_ms: int) -> AppendInfo | None:
        """Validate and stage batches as ``append`` would append them, for ``write_staged``
        to write together with the others staged (``storage/staged_appends.py``): offsets are
        assigned now, after what is staged; nothing is visible (the log end offset does not
        move) until written. ``records`` must not change until then. Returns None, staging
        nothing, when a roll is due while batches are staged: write those first.

        Blocks on a roll's file I/O only.

        Raises:
            what ``append`` raises before writing (nothing is staged then).
        """
        if self._closed or self._failed is not None:  # (``_check_writable`` raises then)
            self._check_writable()
        view, batches, total, span = check_batches(records, self.config.max_message_bytes)
        staged = self._staged_batches
        if staged is None:
            if self._should_roll(total, span, now_ms):
                self.roll(now_ms)
            staged = StagedBatches(self._segments.active.next_offset, now_ms)
        elif self._should_roll(total, span, now_ms, staged):
            return None
        base_offset = staged.next_offset
        staged.next_offset = place_batches(view, batches, base_offset, self.leader_epoch,
                                           staged.parts, staged.placed)
        staged.total += total
        staged.span += span
        self._staged_batches = staged
        return AppendInfo(base_offset, staged.next_offset - 1, now_ms, len(batches), total)

    @property
    def staged(self) -> bool:
        """Batches are staged, not yet written."""
        return self._staged_batches is not None

    def write_staged(self) -> None:
        """Write every staged batch with one ``pwritev`` (as one ``append``). Blocks on it.

        Raises:
            StorageError: the write failed (nothing is written; nothing stays staged).
            LogFailedError: the store failed after the log changed, now or earlier.
        """
        staged, self._staged_batches = self._staged_batches, None
        assert staged is not None
        self._check_writable()
        self._write(self._segments.active, staged.parts, staged.placed, staged.next_offset,
                    staged.total, staged.first_now_ms)

    def append_as_follower(
        self, records: bytes | bytearray | memoryview, now_ms: int
    ) -> AppendInfo:
        """Append batches copied from the partition's leader, keeping their offsets and leader
        epochs (the stamps are written as they came). Each batch must start at or past the
        log end offset (a compacted leader log may skip offsets); a batch of an epoch newer
        than the last one known is recorded in the leader-epoch cache first.

        Blocks on file writes (and the epoch checkpoint's fsyncs at a new epoch).

        Raises:
            InvalidBatchError: a batch is malformed or starts below the log end offset.
            CorruptBatchError: a batch fails its CRC (nothing is appended).
            StorageError, LogFailedError: as ``append``.
        """
        self._check_writable()
        assert self._staged_batches is None, "write what is staged first"
        view, batches, total, _ = check_batches(
            records, self.config.max_message_bytes, dense=False)
        next_offset = self.log_end_offset
        for _, _, header in batches:
            if header.base_offset < next_offset:
                raise InvalidBatchError(
                    f"a replicated batch at offset {header.base_offset} is below the log end "
                    f"offset {next_offset}")
            next_offset = header.base_offset + header.last_offset_delta + 1
        span = next_offset - self.log_end_offset
        if self._should_roll(total, span, now_ms):
            self.roll(now_ms)
        for _, _, header in batches:
            if header.partition_leader_epoch > self.epochs.latest_epoch:
                try:
                    self.epochs.assign(header.partition_leader_epoch, header.base_offset)
                except OSError as exc:
                    raise StorageError(f"leader-epoch checkpoint of {self._directory}: "
                                       f"{exc}") from exc
        active = self._segments.active
        placed = [(header.base_offset, size, header.max_timestamp)
                  for _, size, header in batches]
        self._write(active, [view], placed, next_offset, total, now_ms)
        first = batches[0][2].base_offset
        return AppendInfo(first, next_offset - 1, now_ms, len(batches), total)

    def _write(self, active: Segment, parts: list[bytes | memoryview],
               placed: list[tuple[int, int, int]], next_offset: int, total: int,
               now_ms: int) -> None:
        """Write the batches to the active segment and count them (both appends)."""
        size_before = active.size
        try:
            active.append(
                parts, placed, next_offset, preallocate_bytes=self.config.preallocate_bytes,
                preallocate_limit=self.config.segment_bytes,
            )
        except OSError as exc:
            if active.size == size_before:
                raise StorageError(f"append to {active.log_path} failed: {exc}") from exc
            self._fail(exc)
        if size_before == 0:
            active.first_append_ms = now_ms
        self._size_bytes += total
        self._appends += 1
        self._appended_batches += len(placed)
        self._appended_bytes += total

    def _should_roll(self, total: int, span: int, now_ms: int,
                     staged: StagedBatches | None = None) -> bool:
        """Must the active segment roll before ``total`` bytes spanning ``span`` offsets are
        added (after what is ``staged``, counted as written)?"""
        active = self._segments.active
        size, first_append_ms, next_offset = active.size, active.first_append_ms, \
            active.next_offset
        if staged is not None:
            size += staged.total
            next_offset = staged.next_offset
            if first_append_ms is None:
                first_append_ms = staged.first_now_ms
        if size == 0:
            assert span <= _RELATIVE_MAX
            return False
        assert first_append_ms is not None
        return (
            size + total > self.config.segment_bytes
            or now_ms - first_append_ms >= self.config.segment_ms
            or next_offset + span - active.base_offset > _RELATIVE_MAX
            or size + total > _RELATIVE_MAX
        )

    def roll(self, now_ms: int) -> None:
        """Start a new active segment at the log end offset (no-op if the active one is empty).

        Blocks on file I/O, never on fsync: the new segment's directory entry is made durable
        by the next sync ticket (``begin_sync``), and nothing in the segment counts as durable
        before that.

        Raises:
            LogFailedError: the store failed.
        """
        self._check_writable()
        old = self._segments.active
        if old.size == 0:
            return
        try:
            old.trim()
            new = Segment.open(
                self._store, self._directory, old.next_offset, self.config.index_interval_bytes,
                fresh=True,
            )
        except OSError as exc:
            if not disk_full(exc):
                self._fail(exc)
            # Nothing changed that matters: the old segment stays active (its trimmed tail
            # and index entries are what a later roll writes anyway); retry when space returns.
            raise StorageError(f"roll of {self._directory} failed: {exc}") from exc
        with self._mutation():
            old.synced = False  # (its tail and indexes changed; sealed unsynced now)
            self._segments.append(new)
            self._rolls += 1
            start = self._log_start_offset
            while len(self._segments) > 1 and self._segments[0].next_offset <= start:
                self._delete_first_segment()  # delete_records reached the end of it
            self._ledger.directory_changed(new.base_offset)
            self._ledger.recovery_point_due = True

    def _sync_directory_now(self) -> None:
        """Inline ``fsync_dir`` covering every change so far (blocking paths only)."""
        self._store.fsync_dir(self._directory)
        self._ledger.directory_synced(self._ledger.directory_generation)

    def _synced_prefix_end(self) -> int:
        end = self._recovery_point
        for segment in self._segments.sealed():
            if not segment.synced:
                break
            end = max(end, segment.next_offset)
        return end

    # --- reading ---------------------------------------------------------------------------------

    def read(
        self, offset: int, max_bytes: int, *, max_offset: int | None = None,
        zero_copy: bool = False,
    ) -> ReadResult:
        """Whole batches from the one holding ``offset``, up to ``max_bytes`` but at least one,
        none whose base offset is ``>= max_offset``, all from one segment. ``records`` is
        ``bytes`` or a read-only ``memoryview`` of them (never copied twice); with
        ``zero_copy`` and batches of at least ``REGION_BATCH_BYTES_MIN``, it may instead be
        a ``FileRegion`` naming them in the segment file (the caller sends and closes it; see
        ``file_region.py``). Blocks on reads.

        A damaged batch (a sealed segment changed on disk) is never skipped: the read stops
        before it, and a read that starts at it raises.

        Raises:
            OffsetOutOfRangeError: ``offset`` is below the log start or above the log end.
            CorruptRecordsError: the batch holding ``offset`` (or one the walk to it crosses)
                is damaged; names the file, position and offset.
            StorageError: the store failed.
        """
        assert not self._closed and max_bytes >= 0
        end_offset = self.log_end_offset
        if not self._log_start_offset <= offset <= end_offset:
            raise OffsetOutOfRangeError(offset, self._log_start_offset, end_offset)
        if offset == end_offset:
            return ReadResult(b"", offset)
        return read_batches(self._segments.holding(offset), offset, max_bytes, max_offset,
                            zero_copy)

    def sealed_segment_bases(self) -> list[int]:
        """Base offsets of the sealed segments (all but the active one), oldest first."""
        assert not self._closed
        return [segment.base_offset for segment in self._segments.sealed()]

    def scrub(self, base_offset: int, position: int, max_bytes: int) -> int | None:
        """Check the sealed segment ``base_offset`` from byte ``position`` (a batch boundary):
        the whole batches within about ``max_bytes`` (one at least), framing and CRCs. Returns
        where to go on, or None when the segment is done or gone (deleted, compacted). Blocks
        on reads.

        Raises:
            CorruptRecordsError: a damaged batch, with its file, position and offset.
            StorageError: the store failed.
        """
        assert not self._closed and max_bytes > 0
        index = self._segments.index_of(base_offset)
        if index < 0 or index >= len(self._segments) - 1:
            return None  # gone, or now the active segment (never scrubbed)
        segment = self._segments[index]
        if segment.base_offset != base_offset or position >= segment.size:
            return None
        return scrub_batches(segment, position, max_bytes)

    def iter_headers(self, from_offset: int) -> Iterator[BatchHeader]:
        """The stored header of every batch from the one holding ``max(from_offset, log start)``
        to the log end, in order. Reads headers only (batch bodies are skipped), for rebuilding
        state derived from the log (producer state). Do not append while iterating. Blocks.

        Raises:
            StorageError: the store failed.
        """
        assert not self._closed
        start = max(from_offset, self._log_start_offset)
        if start >= self.log_end_offset:
            return
        first = self._segments.index_of(start)
        try:
            for index, segment in enumerate(self._segments.from_index(first)):
                if segment.size == 0:
                    continue
                position = segment.find_batch(start)[0] if index == 0 else 0
                for _, header in segment.iter_headers(position):
                    yield header
        except OSError as exc:
            raise StorageError(f"reading batch headers of {self._directory} failed: {exc}") from exc

    def offset_for_timestamp(self, timestamp_ms: int, from_offset: int = 0) -> int | None:
        """The first offset (at or above the log start and ``from_offset``) whose batch's max
        timestamp is ``>= timestamp_ms``, or None: the batch to look in for the first record
        at that time (the storage layer never decodes records; the data path does). Blocks
        on reads.

        Raises:
            StorageError: the store failed.
        """
        assert not self._closed
        start = max(self._log_start_offset, from_offset)
        for segment in self._segments:
            if segment.next_offset <= start or segment.max_timestamp is None:
                continue
            if segment.max_timestamp < timestamp_ms:
                continue
            try:
                found = segment.find_timestamp(timestamp_ms, start)
            except OSError as exc:
                raise StorageError(f"read of {segment.log_path} failed: {exc}") from exc
            if found is not None:
                return max(found, start)
        return None

    # --- removing data ---------------------------------------------------------------------------

    def delete_records(self, before_offset: int) -> int:
        """Raise the log start offset to ``before_offset`` (persisted before returning) and
        delete the segments wholly below it. Returns the log start offset.

        Blocks on file I/O (a checkpoint write: two fsyncs).

        Raises:
            OffsetOutOfRangeError: ``before_offset`` is above the log end offset.
            LogFailedError: the store failed.
        """
        self._check_writable()
        assert before_offset >= 0
        if before_offset > self.log_end_offset:
            raise OffsetOutOfRangeError(before_offset, self._log_start_offset, self.log_end_offset)
        if before_offset <= self._log_start_offset:
            return self._log_start_offset
        try:
            self._write_checkpoint(LOG_START_OFFSET_FILE, before_offset)
        except OSError as exc:  # the checkpoint is replaced atomically: nothing changed
            if not disk_full(exc):
                self._fail(exc)
            self._delete_on_a_full_disk(before_offset, exc)
        with self._mutation():
            self._raise_log_start(before_offset)
            while len(self._segments) > 1 and self._segments[0].next_offset <= before_offset:
                self._delete_first_segment()
        return self._log_start_offset

    def _delete_on_a_full_disk(self, before_offset: int, exc: OSError) -> None:
        """The log-start checkpoint did not fit: free the space of the whole segments below
        ``before_offset`` first, then write it. (A crash in between brings back, at most, the
        records between the first remaining segment's base and ``before_offset``.)

        Raises:
            StorageError: still no room (nothing was deleted that is not below the new start).
        """
        with self._mutation():
            while len(self._segments) > 1 and self._segments[0].next_offset <= before_offset:
                self._delete_first_segment()
        try:
            self._write_checkpoint(LOG_START_OFFSET_FILE, before_offset)
        except OSError as again:
            if not disk_full(again):
                self._fail(again)
            raise StorageError(f"delete records of {self._directory}: {again}") from exc

    def apply_retention(self, now_ms: int) -> int:
        """``plan_retention``, ``SegmentRemoval.run`` and ``finish_removal`` in one call, for
        callers that may block (tests, tools). Returns how many segments were deleted. Blocks
        on file I/O and one directory fsync when something is deleted.

        Raises:
            LogFailedError: the store failed in the planning step.
            OSError: the store failed removing the files (the log is consistent).
        """
        removal = self.plan_retention(now_ms)
        if removal is None:
            return 0
        try:
            removal.run()
        finally:
            self.finish_removal(removal)
        return removal.segments

    def plan_retention(self, now_ms: int) -> SegmentRemoval | None:
        """Take the oldest segments (never the active one) that are past ``retention.ms`` by
        their max timestamp, or not needed to keep ``retention.bytes``, out of the log; the
        files left to unlink come back as a ``SegmentRemoval`` (None: nothing to delete).

        On the caller's thread and cheap: the log start offset moves up to the first
        remaining segment; each file of the deleted segments is renamed to ``*.deleted``
        (recovery deletes such a name and every segment at or below its base); handles close
        at once unless a sync ticket out names the segment (then at ``complete_sync``). The
        caller runs ``removal.run()`` off the event loop (unlink, directory fsync), then
        ``finish_removal``. No checkpoint is written, and none is needed: recovery starts the
        log at its first segment when that is above the log-start checkpoint, and the
        renames make the deleted segments gone for recovery in any order they reach the disk
        (a crash before any of them did leaves the log as it was before). If a deleted
        segment's data was never synced (it would come back damaged, and a cut there takes
        the later segments with it), nothing past the new start counts as durable until a
        directory fsync covers the renames (``run``'s, or a group commit's).

        Blocks on renames; on an inline ``fsync_dir`` only when the first remaining segment's
        own directory entry is not durable yet (a roll whose group commit has not run).

        Raises:
            LogFailedError: the store failed.
        """
        self._check_writable()
        doomed = segments_past_retention(
            self._segments.sealed(), self._size_bytes, self.config.retention_ms,
            self.config.retention_bytes, now_ms)
        if doomed == 0:
            return None
        start = max(self._log_start_offset, self._segments[doomed].base_offset)
        with self._mutation():
            if self._segments[doomed].base_offset >= self._ledger.durable_floor():
                self._sync_directory_now()  # recovery must find the first remaining segment
            gone = [s for s in self._segments.sealed() if s.next_offset <= start]
            unsynced = any(s.next_offset > self._durable_offset for s in gone)
            for segment in gone:
                for path in segment.paths:
                    if self._store.exists(path):
                        self._store.rename(path, path + DELETED_SUFFIX)
                        self._removing.append(path + DELETED_SUFFIX)
            held = self._ledger.held_bases()
            for segment in gone:
                self._segments.pop_first()
                self._size_bytes -= segment.size
                self._segments_deleted += 1
                if segment.base_offset in held:
                    self._ledger.defer_close(segment)
                else:
                    segment.close()
            self._ledger.directory_changed(start if unsynced else None)
            self._raise_log_start(start)
        return SegmentRemoval(self._store, self._directory, tuple(self._removing), len(gone),
                              self._ledger.directory_generation)

    def finish_removal(self, removal: SegmentRemoval) -> None:
        """After ``removal.run()`` returned, raised or was never called (cancelled): record
        what it made durable. Files it did not unlink stay ``*.deleted`` (the next removal,
        a restart or recovery unlinks them). Never blocks; never raises."""
        if not removal.done:
            return
        self._ledger.directory_synced(removal.generation)
        gone = set(removal.paths)
        self._removing = [path for path in self._removing if path not in gone]

    def _raise_log_start(self, start: int) -> None:
        """Offsets below the new log start are gone for good, synced or not (checkpointed, or
        removed as ``plan_retention`` says)."""
        self._log_start_offset = start
        self._durable_offset = max(self._durable_offset, start)
        self.epochs.truncate_from_start(start)

    def _delete_first_segment(self) -> None:
        segment = self._segments.pop_first()
        self._size_bytes -= segment.size
        self._segments_deleted += 1
        self._retire(segment)

    def _retire(self, segment: Segment) -> None:
        segment.remove_files()
        if self._ledger.outstanding:
            self._ledger.defer_close(segment)
        else:
            segment.close()

    def truncate_to(self, offset: int) -> None:
        """Drop every offset ``>= offset``; durable when it returns. No-op at or past the end.

        Batches are never split: if ``offset`` falls inside a batch, the log is truncated to
        that batch's base offset. If the cut lands at or below the log start offset, the log
        is emptied and restarts at the cut. Blocks on file I/O and fsyncs.

        Raises:
            LogFailedError: the store failed.
        """
        self._check_writable()
        assert self._staged_batches is None, "write what is staged first"
        assert offset >= 0
        if offset >= self.log_end_offset:
            return
        if offset < self._log_start_offset:
            self._truncate_fully(offset)
            return
        index = self._segments.index_of(offset)
        segment = self._segments[index]
        with self._mutation():
            position, header = segment.find_batch(offset)
            cut = header.base_offset
            if cut <= self._log_start_offset:
                self._truncate_fully(cut)
                return
            self._ledger.cancel_staged()
            if self._recovery_point > cut:
                self._write_checkpoint(RECOVERY_POINT_FILE, cut)
                self._recovery_point = cut
            later = self._segments.cut_after(index)
            for removed in later:
                self._size_bytes -= removed.size
                self._retire(removed)
            self._size_bytes -= segment.size - position
            segment.truncate(position, cut)
            for handle in segment.handles:
                self._store.fsync(handle)
            if later or self._ledger.directory_dirty:
                self._sync_directory_now()
        self._after_truncation(cut)

    def restart_at(self, start: int) -> None:
        """Empty the log and go on at ``start`` (a follower whose leader's log starts past this
        one's end); durable when it returns. Blocks on file I/O and fsyncs.

        Raises:
            LogFailedError: the store failed.
        """
        self._check_writable()
        assert self._staged_batches is None, "write what is staged first"
        assert start >= 0
        self._truncate_fully(start)

    def _truncate_fully(self, start: int) -> None:
        """Empty the log and restart it at ``start``; durable when it returns."""
        self._ledger.cancel_staged()
        with self._mutation():
            self._write_checkpoint(LOG_START_OFFSET_FILE, start)
            for path in self._removing:  # retention's leftovers must not outlive the restart
                with contextlib.suppress(FileNotFoundError):
                    self._store.remove(path)
            self._removing = []
            if self._recovery_point != start:
                self._write_checkpoint(RECOVERY_POINT_FILE, start)
                self._recovery_point = start
            self._log_start_offset = start
            for segment in self._segments:
                self._retire(segment)
            self._segments.reset(Segment.open(
                self._store, self._directory, start, self.config.index_interval_bytes,
                fresh=True,
            ))
            self._size_bytes = 0
            self._sync_directory_now()
        self._after_truncation(start)
        self._durable_offset = start

    def _after_truncation(self, cut: int) -> None:
        self.epochs.truncate_from_end(cut)
        if not self._segments.unsynced_sealed():
            self._durable_offset = cut  # the active segment was just fsynced
        else:
            self._durable_offset = min(self._durable_offset, cut)
        self._ledger.clamp(cut)
        self._segments.active.synced = True

    # --- compaction (storage/cleaner.py) ----------------------------------------------------------

    def sealed_segments(self) -> tuple[Segment, ...]:
        """The segments below the active one, oldest first, for the cleaner to read (one
        atomic snapshot; their bytes never change in place). Never blocks."""
        return tuple(self._segments.sealed())

    def replace_sealed_segment(self, old: Segment, new: Segment) -> bool:
        """Put the cleaned segment ``new`` (already durable, same offset range, files already
        swapped in by the cleaner) in place of the sealed segment ``old``. False, changing
        nothing, when ``old`` is not a sealed segment of this log any more. The old segment's
        handles close once no sync ticket can hold them. Never blocks on fsync.

        Raises:
            LogFailedError: the log failed earlier.
        """
        self._check_writable()
        assert (new.base_offset, new.next_offset) == (old.base_offset, old.next_offset)
        assert new.synced and new.size > 0
        if not self._segments.replace_sealed(old, new):
            return False
        self._size_bytes += new.size - old.size
        if self._ledger.outstanding:
            self._ledger.defer_close(old)
        else:
            old.close()
        return True

    # --- group commit ----------------------------------------------------------------------------

    def begin_sync(self) -> SyncTicket | None:
        """The handles to fsync to make everything appended so far durable, or None if there
        is nothing to do (or the log failed). Blocks only on writing the active segment's
        buffered index entries (one small write per index, not fsynced); if that fails, the
        log is failed and the answer is None.

        The caller fsyncs every handle (only that, possibly on another thread), then calls
        ``complete_sync``; the handles stay open until then.
        """
        assert not self._closed
        if self._failed is not None:
            return None
        try:  # once per sync rather than once per entry; keeps the file close to memory
            self._segments.active.write_indexes()
        except OSError as exc:
            if not disk_full(exc):
                self._failed = exc  # every later call raises LogFailedError carrying it
                return None
            # Full: the entries stay pending (indexes are rebuilt by recovery anyway) and the
            # data already written is made durable all the same.
        handles: list[int] = []
        versions = []
        for segment in self._segments.unsynced_sealed():
            handles.extend(segment.handles)
            versions.append((segment.base_offset, segment.version))
        active = self._segments.active
        bases = [base for base, _ in versions]
        if self._durable_offset < self.log_end_offset and active.size:
            # Always the active log when anything in it may be unsynced, even if a ticket
            # still out covers it: this ticket must not rely on that one finishing first.
            handles.append(active.log_handle)
            bases.append(active.base_offset)
        directory = self._directory if self._ledger.directory_dirty else None
        if not handles and directory is None:
            if not self._ledger.outstanding:  # everything is synced (or was deleted unsynced)
                self._durable_offset = self.log_end_offset
            return None
        ticket_id = self._ledger.next_ticket_id()
        if not self._stage_recovery_point(ticket_id, handles):
            return None
        ticket = SyncTicket(
            tuple(handles), self.log_end_offset, ticket_id, tuple(versions),
            directory, self._ledger.directory_generation,
        )
        self._ledger.issue(ticket_id, ticket.end_offset, frozenset(bases))
        return ticket

    def _stage_recovery_point(self, ticket_id: int, handles: list[int]) -> bool:
        """After a roll, if the synced prefix grew past the recovery point, write the new value
        to a file of its own whose handle rides this ticket (``complete_sync`` renames it in).
        One at a time. False when the store failed (the log is failed)."""
        if not self._ledger.recovery_point_due or self._ledger.staging:
            return True
        value = self._synced_prefix_end()
        if value <= self._recovery_point:
            self._ledger.recovery_point_due = False
            return True
        try:
            handle, tmp = stage_checkpoint(
                self._store, self._directory, RECOVERY_POINT_FILE, value, str(ticket_id))
        except OSError as exc:
            if disk_full(exc):
                return True  # a later ticket tries again; recovery only scans more
            self._failed = exc
            return False
        handles.append(handle)
        self._ledger.stage(ticket_id, StagedCheckpoint(handle, tmp, value))
        return True

    def complete_sync(self, ticket: SyncTicket) -> None:
        """Record that every handle of ``ticket`` was fsynced. Never blocks on fsync.

        Raises ``StorageError`` only if closing a segment deferred by the ticket fails.
        """
        end, staged = self._ledger.settle(ticket.ticket_id)
        if ticket.directory is not None:
            self._ledger.directory_synced(ticket.directory_generation)
        if self._failed is None:
            self._durable_offset = max(
                self._durable_offset, min(end, self.log_end_offset, self._ledger.durable_floor()))
            if ticket.segment_versions:
                versions = dict(ticket.segment_versions)
                for segment in self._segments.unsynced_sealed():
                    if versions.get(segment.base_offset) == segment.version:
                        segment.synced = True
        if staged is not None:
            self._install_recovery_point(staged)
        self._syncs += 1
        doomed = self._ledger.release_doomed()
        if doomed:
            try:
                for segment in doomed:
                    segment.close()
            except OSError as exc:
                raise StorageError(f"closing a removed segment failed: {exc}") from exc

    def _install_recovery_point(self, staged: StagedCheckpoint) -> None:
        """Rename a staged (now fsynced) recovery point over the checkpoint, on the owner's
        thread, so it is ordered against truncations; the next directory fsync makes it
        durable (either value is true meanwhile). A failure fails the log."""
        try:
            self._store.close(staged.handle)
            if staged.cancelled or self._failed is not None:
                self._store.remove(staged.tmp_path)
                return
            self._store.rename(staged.tmp_path,
                               posixpath.join(self._directory, RECOVERY_POINT_FILE))
        except OSError as exc:
            self._failed = self._failed or exc
            return
        self._recovery_point = max(self._recovery_point, staged.value)
        self._ledger.directory_changed(None)

    def flush(self) -> None:
        """Make everything appended so far durable, inline. Blocks on fsync.

        Raises:
            LogFailedError: an fsync failed (now or earlier).
        """
        self._check_writable()
        ticket = self.begin_sync()
        if ticket is None:
            return
        with self._mutation():
            for handle in ticket.handles:
                self._store.fsync(handle)
            if ticket.directory is not None:
                self._store.fsync_dir(ticket.directory)
        self.complete_sync(ticket)

    # --- closing ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Flush, persist the recovery point (= log end offset) and close. Idempotent.

        A failed log, or one with a sync ticket still out (its sync failed and will never
        complete), is closed without writing anything. Blocks on fsyncs.

        Raises:
            LogFailedError: the store failed (the handles are closed anyway).
        """
        if self._closed:
            return
        try:
            if self._failed is None and not self._ledger.outstanding:
                active = self._segments.active
                with self._mutation():
                    active.trim()
                self.flush()
                with self._mutation():
                    for handle in active.handles:  # the trim and the indexes
                        self._store.fsync(handle)
                    if self._recovery_point != self.log_end_offset:
                        self._write_checkpoint(RECOVERY_POINT_FILE, self.log_end_offset)
                        self._recovery_point = self.log_end_offset
        finally:
            self._release_handles()

    def abandon(self) -> None:
        """Close every handle without syncing or writing anything, as a process death would
        leave the files. For tests and for giving up on a failed log. Never raises."""
        if not self._closed:
            with contextlib.suppress(OSError):
                self._release_handles()

    def _release_handles(self) -> None:
        self._closed = True
        error: OSError | None = None
        doomed, staged_checkpoints = self._ledger.abandon()  # tickets that never complete
        for segment in [*self._segments, *doomed]:
            try:
                segment.close()
            except OSError as exc:
                error = error or exc
        for staged in staged_checkpoints:
            try:
                self._store.close(staged.handle)
            except OSError as exc:
                error = error or exc
        if error is not None:
            raise error

    # --- helpers ---------------------------------------------------------------------------------

    def _check_writable(self) -> None:
        assert not self._closed, "the log is closed"
        if self._failed is not None:
            raise LogFailedError(f"log {self._directory} failed earlier: {self._failed}")

    @contextlib.contextmanager
    def _mutation(self) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        self._failed = exc
        raise LogFailedError(f"log {self._directory} failed: {exc}") from exc

    def _write_checkpoint(self, name: str, value: int) -> None:
        write_checkpoint(self._store, self._directory, name, value)

    # --- introspection ---------------------------------------------------------------------------

    def statistics(self) -> LogStatistics:
        """Counters and offsets, for metrics. Never blocks."""
        return LogStatistics(
            log_start_offset=self._log_start_offset,
            log_end_offset=self.log_end_offset,
            durable_offset=self._durable_offset,
            recovery_point=self._recovery_point,
            size_bytes=self._size_bytes,
            segments=len(self._segments),
            appends=self._appends,
            appended_batches=self._appended_batches,
            appended_bytes=self._appended_bytes,
            rolls=self._rolls,
            syncs_completed=self._syncs,
            syncs_outstanding=self._ledger.outstanding,
            segments_deleted=self._segments_deleted,
            failed=self._failed is not None,
        )

    def check_invariants(self, *, deep: bool = False) -> None:
        """Assert the log's invariants (docs/invariants.md). ``deep`` also reads every batch
        header and CRC and checks the indexes against them. Blocks on reads when ``deep``."""
        self._segments.check_invariants()
        segments = self._segments.from_index(0)
        for previous, segment in zip(segments, segments[1:]):
            assert previous.next_offset == segment.base_offset, "offsets are dense"
            assert previous.size > 0, "only the active segment may be empty"
        assert segments[0].base_offset <= self._log_start_offset <= self.log_end_offset
        assert len(segments) == 1 or self._log_start_offset < segments[1].base_offset
        assert self._log_start_offset <= self._durable_offset <= self.log_end_offset
        assert self._recovery_point <= self.log_end_offset or self._failed is not None
        assert self._size_bytes == sum(s.size for s in segments)
        self._ledger.check_invariants(self.log_end_offset)
        assert not self._ledger.doomed or self._ledger.outstanding, \
            "removed segments wait only for tickets"
        assert (self._durable_offset <= max(self._ledger.durable_floor(), self._log_start_offset)
                or self._failed is not None), "nothing past an unsynced directory change"
        if self._closed:
            return
        for segment in segments:
            segment.check_invariants(deep=deep)

