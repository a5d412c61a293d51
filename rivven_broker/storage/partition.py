"""``Partition``: one replica of a partition (Kafka's Partition + UnifiedLog) — its log, its
producer state, its aborted-transaction index, and its high watermark.

Theory of operation
-------------------
``Partition`` pairs one ``PartitionLog`` (which keeps the leader-epoch cache) with its pure
``ProducerStateManager`` (``storage/producer_state.py``) and its persisted
``AbortedTxnIndex`` (``storage/txn_index.py``). Every append to a partition goes through it,
so the manager's ``end_offset`` always equals the log end offset:

- ``append_as_leader`` (the produce path, in the connection reader, no checkpoint inside):
  offsets are assigned here. The batch
  headers are parsed once. When no batch carries a producer id, the transactional bit or the
  control bit, the records go straight to ``PartitionLog.append`` and each header is recorded
  with ``update`` (about a microsecond per batch, nothing per record). Otherwise the partition must
  hold exactly one batch (as in Kafka); a transactional batch is first checked against the
  transaction coordinator (``txn_check``), then ``check`` decides: a duplicate is answered with
  the original offsets and nothing is written, a refusal is answered with its code and
  nothing is written, anything else is appended and ``update``\\ d. While an ``AppendPass`` is
  open (the produce lane's pass) the partition stages instead of appending
  (``PartitionLog.stage``, the producer state ``hold``\\ ing its updates) and writes once
  when the pass closes (``write_staged``: ``storage/staged_appends.py``).
- ``append_as_follower`` keeps the leader's offsets and epochs and rebuilds the producer
  state from the copied headers, as recovery does: a follower answers a retried batch with its
  original offsets once it leads.
- ``append_marker`` writes a COMMIT/ABORT control batch for the transaction coordinator's
  driver and appends the aborted-transaction entry it produces to the index (page cache).
- ``truncate_to`` cuts the log (a follower diverging from its new leader) and rebuilds the
  producer state and index from the snapshots and the log, in place.
- ``last_stable_offset`` and ``aborted_in`` serve ``read_committed`` fetches.

Every append marks the log dirty for the group commit (``SyncWorker.mark_dirty``) and tells
``PartitionEvents.appended`` (replica fetches long-polling at a leader wake).

High watermark and waits
------------------------
Offsets below the high watermark are committed: visible to consumers, acknowledged to
``acks=all`` producers. A partition nobody replicates — a single node, or a follower — has
its *local durable end* as high watermark: the durable offset under ``sync=always``, else the
log end offset. A leader of a replicated partition is given a ``CommitRule`` (``lead``;
``rivven_cluster.replication.LeaderState``: the smallest durable offset over the ISR), fed
with the local durable end as it moves, and told (``high_watermark_moved``) when a follower's
report moved it. The local durable end moves when the sync worker completes a group commit
of the log (it calls the partition back: ``SyncWorker.listen``) and, when the policy is not
``always``, at every append. Whenever the high watermark moves, ``PartitionEvents.
high_watermark_moved`` wakes consumer long-polls: they wake on commitment, not on appends.

``wait_committed(offset)`` (an ``acks=all`` produce, the group and transaction coordinators'
writes) and ``wait_durable(offset)`` (``acks=1``, a follower's report) return True once
the offset is covered, and False as soon as it never will be under the leadership the wait
began in: the rule changed (deposed, or led again at a new epoch), the log was cut at or
below the offset, the log failed, or the partition closed. A failed fsync raises
``SyncFailedError`` (the broker stops). Callers answer from the result; they never wait on
the fsync directly.

Snapshots (``<end offset, 20 digits>.snapshot`` in the partition directory, written ``.tmp`` +
fsync + rename + fsync of the directory, the newest ``limits.producer_snapshots_kept`` kept)
are taken when the log rolls a segment and at a graceful close, always after an fsync of the
aborted-transaction index so every entry a snapshot covers is durable. ``open`` rebuilds the
state: snapshots past the recovered log end are deleted first (their data was lost in a
crash); the newest readable one is restored (a damaged one is deleted and the next tried);
then the batch *headers* from its end offset to the log end are replayed (bodies are skipped;
a control batch's single record is read for its type). Without a usable snapshot, or when the
index file was damaged, the index is rebuilt from the log start. The log always wins.

The index file (``aborted-txns.index``) is created at a partition's first aborted transaction
(``LazyTxnIndex``), so partitions that never saw one hold no extra file handle.

``Partitions`` holds one ``Partition`` per partition, opened eagerly at broker
start (``load_all``, off the event loop) and lazily for partitions created later. A partition
keeps its identity for its log's life (truncations included); a topic deleted and created
again gets new ones.
"""

from __future__ import annotations

import logging
import posixpath
from typing import Callable, Iterable, NamedTuple, Protocol

import attrs
import trio

from rivven_broker.storage.producer_state import (
    BatchMetadata,
    CorruptSnapshotError,
    ProducerStateManager,
)
from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.records.control import ControlType, build_control_batch, read_control_batch
from rivven_broker.records.header import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    HEADER_BYTES,
    LOG_OVERHEAD_BYTES,
    BatchHeader,
    iter_batches,
    parse_header,
    validate,
)
from rivven_broker.storage.file_store import FileStore
from rivven_broker.storage.errors import StorageError, SyncFailedError
from rivven_broker.storage.partition_log import AppendInfo, PartitionLog
from rivven_broker.storage.staged_appends import AppendPass, StagedWrite
from rivven_broker.storage.sync_worker import SyncMode, SyncWorker
from rivven_broker.storage.txn_index import (
    TXN_INDEX_FILE,
    AbortedTxn,
    AbortedTxnIndex,
    TxnIndexFile,
)

__all__ = [
    "SNAPSHOT_SUFFIX",
    "CommitRule",
    "PartitionEvents",
    "ProduceOutcome",
    "StateLoadReport",
    "Partition",
    "Partitions",
    "LazyTxnIndex",
    "TxnCheck",
    "snapshot_file_name",
]

log = logging.getLogger(__name__)

SNAPSHOT_SUFFIX = ".snapshot"
_TMP_SUFFIX = ".tmp"
_DIGITS = 20
_SPECIAL_BITS = ATTR_TRANSACTIONAL | ATTR_CONTROL
_CONTROL_READ_BYTES = 512
#: ``txn_check(header) -> ErrorCode``: may this transactional batch be written now?
TxnCheck = Callable[[BatchHeader], ErrorCode]
Key = tuple[str, int]


class CommitRule(Protocol):
    """How a leader's high watermark moves (``rivven_cluster.replication.LeaderState``)."""

    high_watermark: int

    def on_local_durable(self, durable_offset: int) -> bool:
        """The leader's own durable end moved to ``durable_offset``; True when that moved
        the high watermark."""


def _nobody(key: Key) -> None:
    return None


@attrs.frozen
class PartitionEvents:
    """What the partitions tell the server (see the module docstring)."""

    #: Records were appended (replica fetches waiting at a leader wake).
    appended: Callable[[Key], None] = _nobody
    #: The high watermark moved (consumer fetches wake).
    high_watermark_moved: Callable[[Key], None] = _nobody
    #: Waits on the partition must look again (a commit, a failure, a change of leader):
    #: the produce lane answers then (``server/produce_lane.py``).
    progressed: Callable[[Key], None] = _nobody


def snapshot_file_name(end_offset: int) -> str:
    """``00000000000000001234.snapshot``. Pure."""
    assert 0 <= end_offset < 10**_DIGITS
    return f"{end_offset:0{_DIGITS}d}{SNAPSHOT_SUFFIX}"


def _parse_snapshot_name(name: str) -> int | None:
    stem = name[: -len(SNAPSHOT_SUFFIX)]
    if not name.endswith(SNAPSHOT_SUFFIX) or len(stem) != _DIGITS or not stem.isdigit():
        return None
    return int(stem)


class ProduceOutcome(NamedTuple):
    """What ``append`` did: appended (``info``), a duplicate (``duplicate``: the original
    batch), or refused (``error_code`` and ``message``; nothing written). ``staged``: the
    batches (or, for a duplicate, the original) are staged in an ``AppendPass``, not yet
    written; when its ``error`` is set after the pass, the write failed and the request
    answers that error as if ``append`` had raised it."""

    info: AppendInfo | None = None
    duplicate: BatchMetadata | None = None
    error_code: ErrorCode = ErrorCode.NONE
    message: str = ""
    staged: StagedWrite | None = None


#: ``ProduceOutcome(info, staged=staged)`` without the Python frame of its ``__new__`` (one
#: per staged produce).
_new_tuple = tuple.__new__
_NO_ERROR = ErrorCode.NONE
assert ProduceOutcome._fields == ("info", "duplicate", "error_code", "message", "staged")


class StateLoadReport(NamedTuple):
    """How a partition's producer state was rebuilt (for the startup log)."""

    snapshot_offset: int | None  # the snapshot restored (None: replayed from the log start)
    batches_replayed: int
    snapshots_dropped: tuple[str, ...]  # past the log end, or damaged
    index_problem: str | None  # the aborted-transaction index was damaged and rebuilt


class Partition:
    """One replica of a partition (see the module docstring). Use ``Partition.open``."""

    def __init__(
        self, key: Key, plog: PartitionLog, loaded: _Loaded, sync: SyncWorker | None,
        events: PartitionEvents, staging: AppendPass | None = None,
    ) -> None:
        self.key = key
        self.log = plog
        self._staging = staging
        self._staged: StagedWrite | None = None  # what this pass staged here
        self._take(loaded)
        self._sync = sync
        self._events = events
        #: Under ``sync=always`` only the durable offset is held for good.
        self._durable_is_synced = sync is not None and sync.policy.mode is SyncMode.ALWAYS
        self._rule: CommitRule | None = None
        self._local_announced = -1  # the local durable end consumers were last told of
        self._progress = trio.Event()
        self._closed = False
        if sync is not None:
            sync.listen(plog, self._local_durable_moved)

    def _take(self, loaded: _Loaded) -> None:
        state = loaded.state
        assert state.end_offset == self.log.log_end_offset, (state.end_offset,
                                                             self.log.log_end_offset)
        self.state = state
        self.index = loaded.index
        self._snapshot_offset = loaded.report.snapshot_offset
        self._active_base = self.log.segment_base_offsets[-1]

    # --- opening ---------------------------------------------------------------------------

    @classmethod
    def open(cls, plog: PartitionLog, key: Key = ("", 0), sync: SyncWorker | None = None,
             events: PartitionEvents = PartitionEvents(), staging: AppendPass | None = None,
             ) -> tuple[Partition, StateLoadReport]:
        """Rebuild the state of ``plog`` from its snapshots, index and log (module
        docstring). Without a sync worker (tests, tools) the log end counts as durable.

        Blocks on file I/O (header reads, snapshot and index files).

        Raises:
            StorageError: reading the log failed.
            OSError: the snapshot or index files could not be read or written.
        """
        loaded = _load(plog)
        return cls(key, plog, loaded, sync, events, staging), loaded.report

    # --- the high watermark ------------------------------------------------------------------

    @property
    def local_durable_end(self) -> int:
        """What this replica holds for good under its sync policy (module docstring)."""
        log = self.log
        return log.durable_offset if self._durable_is_synced else log.log_end_offset

    @property
    def high_watermark(self) -> int:
        """Offsets below this are committed (module docstring)."""
        rule = self._rule
        return self.local_durable_end if rule is None else rule.high_watermark

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def rule(self) -> CommitRule | None:
        """The commit rule of this replica's leadership (None: not a replicated leader)."""
        return self._rule

    def lead(self, rule: CommitRule) -> None:
        """Lead under ``rule`` from now on (a new leadership: waits under the old one end)."""
        self._rule = rule
        rule.on_local_durable(self.local_durable_end)
        self.high_watermark_moved()

    def stop_leading(self) -> None:
        """No longer lead: waits under the leadership end (False)."""
        if self._rule is not None:
            self._rule = None
            self.high_watermark_moved()

    def high_watermark_moved(self) -> None:
        """Wake the waiters and the consumers (the rule's high watermark moved)."""
        self._local_announced = self.local_durable_end
        self._wake()
        self._events.high_watermark_moved(self.key)

    def committed(self, offset: int) -> bool:
        return self.high_watermark > offset

    async def wait_committed(self, offset: int, under: CommitRule | None) -> bool:
        """True once the high watermark passes ``offset``; False as soon as it never will
        under ``under``, the rule (``rule``) the caller appended ``offset`` under (module
        docstring): a leader deposed, or leading again at another epoch, never acknowledges
        what it appended before.

        Raises:
            SyncFailedError: an fsync failed (the node must stop).
        """
        rule = under
        await trio.lowlevel.checkpoint()
        while True:
            if self._sync is not None:
                self._sync.check_healthy()
            if self._rule is not rule or self.lost(offset):
                return False
            if self.high_watermark > offset:
                return True
            await self._wait_for_progress()

    async def wait_durable(self, offset: int) -> bool:
        """True once this replica's own copy of ``offset`` is durable under its sync policy;
        False when it never will be (cut, failed, closed).

        Raises:
            SyncFailedError: an fsync failed (the node must stop).
        """
        await trio.lowlevel.checkpoint()
        while True:
            if self._sync is not None:
                self._sync.check_healthy()
            if self.lost(offset):
                return False
            if self.local_durable_end > offset:
                return True
            await self._wait_for_progress()

    def lost(self, offset: int) -> bool:
        """``offset`` (appended here) can never be covered now: cut, failed or closed."""
        return self._closed or self.log.failed or offset >= self.log.log_end_offset

    async def _wait_for_progress(self) -> None:
        if self._sync is not None and self.log.dirty:  # (marked at every append; cheap)
            self._sync.mark_dirty(self.log)
        await self._progress.wait()

    def _wake(self) -> None:
        self._progress.set()
        self._progress = trio.Event()
        self._events.progressed(self.key)

    def _local_durable_moved(self) -> None:
        """The sync worker completed a group commit of the log (or, unless ``sync=always``,
        the log grew): wake the waiters, and the consumers when the high watermark moved."""
        rule = self._rule
        if rule is not None:
            moved = rule.on_local_durable(self.local_durable_end)
        else:  # (a group may complete without moving it: a roll's directory fsync pending)
            moved = self.local_durable_end != self._local_announced
        if moved:
            self.high_watermark_moved()
        else:
            self._wake()

    def _appended(self) -> None:
        if self._sync is not None:
            self._sync.mark_dirty(self.log)
        self._events.appended(self.key)
        if not self._durable_is_synced:
            self._local_durable_moved()

    # --- the produce path ------------------------------------------------------------------

    def append_as_leader(self, records: bytes, now_ms: int,
                         txn_check: TxnCheck) -> ProduceOutcome:
        """Check and append one partition's records (module docstring); while an
        ``AppendPass`` is open, stage them instead (``storage/staged_appends.py``). Never
        awaits.

        Raises what ``PartitionLog.append`` raises (nothing was appended then).
        """
        header = parse_header(records) if len(records) >= HEADER_BYTES else None
        if header is not None and header.batch_length + LOG_OVERHEAD_BYTES == len(records):
            if header.producer_id < 0 and not header.attributes & _SPECIAL_BITS:
                return self._append(records, now_ms, (header,))  # the common case
        else:  # several batches (or a malformed request, which the log refuses)
            headers = [h for _, h in iter_batches(records)]
            if any(h.producer_id >= 0 or h.attributes & _SPECIAL_BITS for h in headers):
                return ProduceOutcome(
                    error_code=ErrorCode.INVALID_REQUEST,
                    message="an idempotent or transactional batch must travel alone",
                )
            return self._append(records, now_ms, headers)
        if header.is_transactional and not header.is_control and header.producer_id >= 0:
            code = txn_check(header)
            if code != ErrorCode.NONE:
                return ProduceOutcome(error_code=code, message=code.description)
        verdict = self.state.check(header)
        original = verdict.duplicate
        if original is not None:
            validate(records)  # never answer "already written" for a damaged batch
            # A duplicate of a batch staged in this pass shares its fate.
            staged = self._staged if original.last_offset >= self.log.log_end_offset else None
            assert staged is not None or original.last_offset < self.log.log_end_offset
            return ProduceOutcome(duplicate=original, staged=staged)
        if verdict.error_code != ErrorCode.NONE:
            return ProduceOutcome(error_code=verdict.error_code, message=verdict.message)
        return self._append(records, now_ms, (header,))

    def _append(self, records: bytes, now_ms: int,
                headers: Iterable[BatchHeader]) -> ProduceOutcome:
        """Append (or, in an open pass, stage) checked batches and record their headers."""
        staging = self._staging
        if staging is None or not staging.is_open:
            info = self.log.append(records, now_ms)
            self._record(headers, info.base_offset)
            self._after_append()
            return ProduceOutcome(info)
        staged_info = self.log.stage(records, now_ms)
        if staged_info is None:  # a roll is due: what is staged goes first
            self.write_staged()
            staged_info = self.log.stage(records, now_ms)
            assert staged_info is not None
        staged = self._staged
        if staged is None:  # the first staged here in this pass
            staged = self._staged = StagedWrite()
            self.state.hold()
            staging.enrol(self)
        self._record(headers, staged_info.base_offset)
        return _new_tuple(ProduceOutcome, (staged_info, None, _NO_ERROR, "", staged))

    def _record(self, headers: Iterable[BatchHeader], base_offset: int) -> None:
        state = self.state
        for header in headers:
            state.update(header, base_offset)
            base_offset += header.last_offset_delta + 1

    def write_staged(self) -> None:
        """Write what this partition staged in the pass (``AppendPass.close``): one
        ``pwritev``. When the write fails, the producer state returns to where the pass found
        it and the ``StagedWrite`` every staged request holds gets the error. Blocks on the
        write; never raises an operating error."""
        staged, self._staged = self._staged, None
        if staged is None:
            return
        try:
            self.log.write_staged()
        except SyncFailedError:
            raise
        except (StorageError, OSError) as exc:
            self.state.undo()
            staged.error = exc
            staged.done = True
            self._wake()  # a failure is progress: the requests staged answer it now
            return
        staged.written()
        self.state.release()
        try:
            self._after_append()
        except OSError as exc:  # the roll's snapshot: answered as ``append_as_leader`` would
            staged.error = exc

    def append_as_follower(self, records: bytes, now_ms: int) -> AppendInfo:
        """Append batches copied from the leader (their offsets and epochs kept) and record
        every header, as recovery replays them: a follower's producer state is the leader's,
        so it answers a retried batch with its original offsets once it leads. Never awaits.

        Raises what ``PartitionLog.append_as_follower`` raises (nothing was appended then).
        """
        info = self.log.append_as_follower(records, now_ms)
        for position, header in iter_batches(records):
            control = None
            if header.is_control:
                size = header.batch_length + LOG_OVERHEAD_BYTES
                control = read_control_batch(records[position:position + size])[1].kind
            completed = self.state.load_batch(header, control)
            entry = None if completed is None else completed.aborted_entry()
            if entry is not None:
                self.index.append(entry)
        if self.state.end_offset < self.log.log_end_offset:
            self.state.advance_end_offset(self.log.log_end_offset)
        self._after_append()
        return info

    def _after_append(self) -> None:
        assert self.state.end_offset == self.log.log_end_offset
        self._appended()  # first: a snapshot that fails below leaves the data to be synced
        active = self.log.segment_base_offsets[-1]
        if active != self._active_base:  # the log rolled: snapshot at the new segment
            self._active_base = active
            self.write_snapshot()

    def truncate_to(self, offset: int) -> StateLoadReport:
        """Cut the log at ``offset`` (a follower diverging from its leader; past the log end:
        empty it and start over there, as a follower whose leader deleted what it lacks) and
        rebuild the producer state from the snapshots and the log. Waits on offsets cut end
        (False). Blocks on fsyncs and reads.

        Raises what ``PartitionLog.truncate_to`` and ``Partition.open`` raise (the
        partition is closed then).
        """
        assert not self._closed and self._rule is None, "only a follower truncates"
        self._closed = True  # until rebuilt
        self.index.close()
        if offset > self.log.log_end_offset:
            self.log.restart_at(offset)
        else:
            self.log.truncate_to(offset)
        loaded = _load(self.log)
        self._take(loaded)
        self._closed = False
        self.high_watermark_moved()
        return loaded.report

    # --- markers -----------------------------------------------------------------------------

    def append_marker(
        self, kind: ControlType, producer_id: int, producer_epoch: int, now_ms: int,
        batch: bytes | None = None,
    ) -> int | None:
        """Append a COMMIT/ABORT marker for the producer; return its offset, or None when the
        partition already knows a newer epoch (the marker is obsolete). Never awaits.

        ``batch``, if given, is ``build_control_batch(kind, producer_id, producer_epoch,
        now_ms)`` built once for every partition of a transaction: the bytes are the same in
        each (the log writes its own base offset, which the CRC does not cover), and building
        them was ~30 us a partition.

        Raises what ``PartitionLog.append`` raises (nothing was appended then).
        """
        if not self.state.check_marker(producer_id, producer_epoch).should_append:
            return None
        data = batch if batch is not None else build_control_batch(
            kind, producer_id, producer_epoch, now_ms)
        info = self.log.append(data, now_ms)
        completed = self.state.update(parse_header(data), info.base_offset, kind)
        entry = None if completed is None else completed.aborted_entry()
        if entry is not None:
            self.index.append(entry)
        self._after_append()
        return info.last_offset

    # --- reads ---------------------------------------------------------------------------------

    def last_stable_offset(self, high_watermark: int) -> int:
        """read_committed readers see offsets below this. Never blocks."""
        return self.state.last_stable_offset(high_watermark)

    def aborted_in(self, start_offset: int, end_offset: int) -> list[tuple[int, int]]:
        """``(producer_id, first_offset)`` of aborted transactions overlapping the range."""
        return self.index.index.aborted_in(start_offset, end_offset)

    # --- snapshots and closing -----------------------------------------------------------------

    def write_snapshot(self) -> bool:
        """Persist the state (index fsynced first); keep the newest snapshots. Blocks on
        fsyncs. Returns False when the newest snapshot already covers the state.

        Raises:
            OSError: the store failed (the previous snapshots are intact).
        """
        assert not self._closed
        self.state.truncate_head(self.log.log_start_offset)
        end = self.state.end_offset
        if end == self._snapshot_offset:
            return False
        data = self.state.snapshot()
        store, directory = self.log.store, self.log.directory
        self.index.fsync()
        name = snapshot_file_name(end)
        tmp = posixpath.join(directory, name + _TMP_SUFFIX)
        handle = store.open(tmp)
        try:
            store.truncate(handle, 0)
            store.pwrite(handle, data, 0)
            store.fsync(handle)
        finally:
            store.close(handle)
        store.rename(tmp, posixpath.join(directory, name))
        store.fsync_dir(directory)
        self._snapshot_offset = end
        _prune_snapshots(store, directory, limits.producer_snapshots_kept)
        return True

    def close(self, *, snapshot: bool) -> None:
        """Release the index handle, first writing a snapshot when ``snapshot`` (graceful
        stop). Idempotent. Blocks on fsyncs when snapshotting.

        Raises:
            OSError: the snapshot could not be written (the handle is released anyway).
        """
        if self._closed:
            return
        try:
            if snapshot and not self.log.failed:
                self.write_snapshot()
        finally:
            self._closed = True
            self.index.close()
            if self._sync is not None:
                self._sync.unlisten(self.log)
            self._wake()

    def check_invariants(self) -> None:
        """Assert that the state tracks its log (tests and the simulator), and that nothing
        staged outlived its pass."""
        assert self._staged is None and not self.log.staged, "staged appends are unwritten"
        assert self._closed or self.state.end_offset == self.log.log_end_offset
        self.state.check_invariants()
        self.index.index.check_invariants()


def _load(plog: PartitionLog) -> _Loaded:
    """Rebuild the producer state of ``plog`` (``Partition.open``). Blocks on file I/O."""
    store, directory = plog.store, plog.directory
    log_end, log_start = plog.log_end_offset, plog.log_start_offset
    dropped: list[str] = []
    offsets = []
    for name in store.listdir(directory):
        end = _parse_snapshot_name(name)
        if end is None:
            continue
        if end > log_end:
            store.remove(posixpath.join(directory, name))
            dropped.append(name)
        else:
            offsets.append(end)
    if dropped:
        store.fsync_dir(directory)  # before anything new is appended past those offsets
    state, snapshot_offset = None, None
    for end in sorted(offsets, reverse=True):
        path = posixpath.join(directory, snapshot_file_name(end))
        handle = store.open(path, create=False)
        try:
            data = store.pread(handle, store.size(handle), 0)
        finally:
            store.close(handle)
        try:
            state = ProducerStateManager.restore(data)
        except CorruptSnapshotError as exc:
            log.warning("%s: %s; ignoring it", path, exc)
            store.remove(path)
            dropped.append(posixpath.basename(path))
            continue
        snapshot_offset = end
        break
    index = LazyTxnIndex(store, posixpath.join(directory, TXN_INDEX_FILE))
    index_problem = index.repair
    if state is None or index_problem is not None:
        state, snapshot_offset = ProducerStateManager(log_start), None
        index.truncate_to(0)
    else:
        index.truncate_to(state.end_offset)
        state.truncate_head(log_start)
    replayed = _replay(plog, state, index)
    index.truncate_head(log_start)
    report = StateLoadReport(snapshot_offset, replayed, tuple(dropped), index_problem)
    return _Loaded(state, index, report)


class _Loaded(NamedTuple):
    state: ProducerStateManager
    index: LazyTxnIndex
    report: StateLoadReport


def _replay(plog: PartitionLog, state: ProducerStateManager, index: LazyTxnIndex) -> int:
    """Feed every batch header from ``state.end_offset`` to the log end; return how many."""
    replayed = 0
    for header in plog.iter_headers(state.end_offset):
        replayed += 1
        if header.base_offset < state.end_offset:
            continue  # a batch below the log start offset's successor (already covered)
        control = None
        if header.is_control:
            data = plog.read(header.base_offset, _CONTROL_READ_BYTES).records
            control = read_control_batch(data)[1].kind
        completed = state.load_batch(header, control)
        entry = None if completed is None else completed.aborted_entry()
        if entry is not None:
            index.append(entry)
    if state.end_offset < plog.log_end_offset:  # the last batches were removed
        state.advance_end_offset(plog.log_end_offset)
    return replayed


class LazyTxnIndex:
    """A partition's ``TxnIndexFile``, opened (and created) only once it has an entry, so a
    partition that never saw an abort holds no extra file handle. Same methods."""

    def __init__(self, store: FileStore, path: str) -> None:
        self._store, self._path = store, path
        self._file: TxnIndexFile | None = None
        self.repair: str | None = None
        if store.exists(path):
            self._file = TxnIndexFile(store, path)
            self.repair = self._file.repair
        self._empty = AbortedTxnIndex()

    @property
    def index(self) -> AbortedTxnIndex:
        return self._empty if self._file is None else self._file.index

    def append(self, entry: AbortedTxn) -> None:
        if self._file is None:
            self._file = TxnIndexFile(self._store, self._path)
        self._file.append(entry)

    def truncate_to(self, offset: int) -> None:
        if self._file is not None:
            self._file.truncate_to(offset)

    def truncate_head(self, log_start_offset: int) -> None:
        if self._file is not None:
            self._file.truncate_head(log_start_offset)

    def fsync(self) -> None:
        if self._file is not None:
            self._file.fsync()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _prune_snapshots(store: FileStore, directory: str, keep: int) -> None:
    ends = sorted(
        end for end in map(_parse_snapshot_name, store.listdir(directory)) if end is not None
    )
    for end in ends[:-keep]:
        store.remove(posixpath.join(directory, snapshot_file_name(end)))


class Partitions:
    """One ``Partition`` per partition of a ``LogManager``. Not thread-safe."""

    def __init__(self, sync: SyncWorker | None = None,
                 events: PartitionEvents = PartitionEvents(),
                 staging: AppendPass | None = None) -> None:
        self._sync = sync
        self._events = events
        self._staging = staging
        self._partitions: dict[Key, Partition] = {}

    def load_all(self, logs: Iterable[tuple[Key, PartitionLog]]) -> dict[Key, StateLoadReport]:
        """Open every given log's partition. Blocks on file I/O (call it off the loop, before
        the sync worker runs).

        Raises what ``Partition.open`` raises.
        """
        reports = {}
        for key, plog in logs:
            self._partitions[key], reports[key] = Partition.open(
                plog, key, self._sync, self._events, self._staging)
        return reports

    def get(self, topic: str, partition: int, plog: PartitionLog) -> Partition:
        """The partition of ``plog`` (opened now if it is new: blocks on its files then).

        Raises what ``Partition.open`` raises.
        """
        key = (topic, partition)
        current = self._partitions.get(key)
        if current is not None and current.log is plog and not current.closed:
            return current
        if current is not None:  # the topic was deleted and created again
            current.close(snapshot=False)
        current, report = Partition.open(plog, key, self._sync, self._events, self._staging)
        if report.batches_replayed or report.snapshots_dropped:
            log.info("producer state of %s-%d rebuilt: %s", topic, partition, report)
        self._partitions[key] = current
        return current

    def find(self, topic: str, partition: int) -> Partition | None:
        """A partition if it is open, without opening anything."""
        return self._partitions.get((topic, partition))

    def forget_topic(self, topic: str) -> None:
        """Close (without a snapshot) every partition of a deleted topic."""
        for key in [key for key in self._partitions if key[0] == topic]:
            self._partitions.pop(key).close(snapshot=False)

    def close_all(self, *, snapshot: bool) -> None:
        """Close every partition (``snapshot``: write snapshots first). Blocks on fsyncs.
        A failed snapshot is logged; the next start replays the log instead."""
        for (topic, partition), state in sorted(self._partitions.items(), key=lambda kv: kv[0]):
            try:
                state.close(snapshot=snapshot)
            except OSError as exc:
                log.error("producer state snapshot of %s-%d failed: %s", topic, partition, exc)
        self._partitions.clear()

    def states(self) -> list[tuple[Key, Partition]]:
        """Every open partition, sorted by key."""
        return sorted(self._partitions.items(), key=lambda kv: kv[0])
