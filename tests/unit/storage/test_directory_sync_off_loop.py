"""Directory fsyncs leave the event loop: a roll's rides the next group commit, retention's runs
in ``SegmentRemoval.run`` (issue 19).

Method: a log on ``MemoryFileStore`` with 1 KiB segments (100-byte batches of 2 offsets, so
segments start at 0, 20, 40); a store subclass records the thread of every ``fsync_dir``.
Durability claims are checked by crashing the store and reopening.
"""

from __future__ import annotations

import threading

import trio

from rivven_broker.server.sync_thread import SyncThread
from rivven_broker.storage.checkpoint import RECOVERY_POINT_FILE, read_checkpoint
from rivven_broker.storage.memory_store import MemoryFileStore
from rivven_broker.storage.partition_log import PartitionLog
from rivven_broker.storage.sync_worker import SyncPolicy, SyncWorker

from .test_log_segments import DIRECTORY, append_100, open_log


class RecordingStore(MemoryFileStore):
    """Records the thread of each ``fsync_dir``, and every mutating call while ``watching``."""

    def __init__(self) -> None:
        super().__init__()
        self.dir_fsync_threads: list[threading.Thread] = []
        self.calls: list[str] = []
        self.fault_hook = lambda op, path: self.calls.append(op)

    def fsync_dir(self, path: str) -> None:
        self.dir_fsync_threads.append(threading.current_thread())
        super().fsync_dir(path)


def test_a_roll_leaves_its_directory_fsync_to_the_group_commit_thread() -> None:
    store = RecordingStore()
    log = open_log(store)

    async def main() -> None:
        worker = SyncWorker(SyncPolicy.parse("always"), SyncThread().run_sync)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            for _ in range(25):  # two rolls
                info = log.append(b"".join([_batch()]), 0)
                worker.mark_dirty(log)
                await worker.wait_durable(log, info.last_offset)
            await worker.aclose()

    store.dir_fsync_threads.clear()
    trio.run(main)
    assert log.segment_base_offsets == (0, 20, 40) and log.durable_offset == 50
    assert store.dir_fsync_threads  # the new segments' names were synced ...
    assert threading.main_thread() not in store.dir_fsync_threads  # ... never on the loop


def _batch() -> bytes:
    from .log_batches import make_batch

    return make_batch(2, b"r" * 39)


def test_durable_offset_stops_at_the_new_segment_until_the_directory_is_synced() -> None:
    store = MemoryFileStore()
    log = open_log(store)
    append_100(log, 10)
    early = log.begin_sync()  # covers 0..19, begun before the roll
    append_100(log, 2)  # rolls; 20..23 in the new segment
    late = log.begin_sync()
    assert early is not None and early.directory is None
    assert late is not None and late.directory == DIRECTORY
    for handle in (*early.handles, *late.handles):
        store.fsync(handle)
    log.complete_sync(early)
    assert log.durable_offset == 20
    assert log.dirty  # the directory still has to be synced
    store.crash()  # power lost between the roll and the group commit's fsync_dir
    log, report = PartitionLog.open(store, DIRECTORY, log.config, 0)
    assert log.log_end_offset == 20  # the new segment's name was lost with its records
    assert report.segments == 1 and report.cuts == ()
    log.check_invariants(deep=True)


def test_a_crash_after_the_group_commit_keeps_the_rolled_segment() -> None:
    store = MemoryFileStore()
    log = open_log(store)
    append_100(log, 12)
    log.flush()  # handles, then the directory
    assert log.durable_offset == 24 and not log.dirty
    store.crash()
    log, report = PartitionLog.open(store, DIRECTORY, log.config, 0)
    assert log.log_end_offset == 24 and log.segment_base_offsets == (0, 20)
    log.check_invariants(deep=True)


def test_the_recovery_point_rides_a_ticket_and_a_truncation_cancels_it() -> None:
    store = MemoryFileStore()
    log = open_log(store)
    append_100(log, 21)  # rolls at 20 and 40
    log.flush()  # segment 0 and 20 synced
    append_100(log, 10)  # rolls at 60: the synced prefix (0..40) is due
    ticket = log.begin_sync()
    assert ticket is not None
    log.truncate_to(30)  # lowers the recovery point while the staged value is out
    for handle in ticket.handles:
        store.fsync(handle)
    store.fsync_dir(DIRECTORY)
    log.complete_sync(ticket)
    assert log.recovery_point <= 30
    assert read_checkpoint(store, DIRECTORY, RECOVERY_POINT_FILE) in (None, 0)
    assert not [name for name in store.listdir(DIRECTORY) if name.endswith(".tmp")]
    store.crash()
    log, _ = PartitionLog.open(store, DIRECTORY, log.config, 0)
    assert log.log_end_offset == 30
    log.check_invariants(deep=True)


def test_the_recovery_point_is_renamed_in_when_its_ticket_completes() -> None:
    store = MemoryFileStore()
    log = open_log(store)
    append_100(log, 21)
    log.flush()
    append_100(log, 20)  # the roll at 60 makes the prefix 0..40 due
    log.flush()  # stages 40, renames it in; the next group makes the rename durable
    assert log.recovery_point == 40 and log.dirty
    log.flush()
    assert not log.dirty
    store.crash()
    assert read_checkpoint(store, DIRECTORY, RECOVERY_POINT_FILE) == 40


# --- retention -------------------------------------------------------------------------------


def test_planning_retention_neither_unlinks_nor_fsyncs() -> None:
    store = RecordingStore()
    log = open_log(store, retention_ms=-1, retention_bytes=1000)
    append_100(log, 25)
    log.flush()
    store.calls.clear()
    removal = log.plan_retention(0)
    assert removal is not None and removal.segments == 1
    assert log.log_start_offset == 20 and log.segment_base_offsets == (20, 40)
    assert "remove" not in store.calls and "fsync_dir" not in store.calls
    assert "fsync" not in store.calls  # no checkpoint either
    store.calls.clear()
    removal.run()
    assert store.calls.count("remove") == 3 and store.calls.count("fsync_dir") == 1
    log.finish_removal(removal)
    assert not log.dirty
    assert sorted(store.listdir(DIRECTORY))[0].startswith("00000000000000000020")
    log.check_invariants(deep=True)


def test_retention_runs_off_the_loop_in_a_broker_like_driver() -> None:
    store = RecordingStore()
    log = open_log(store, retention_ms=-1, retention_bytes=1000)
    append_100(log, 25)
    log.flush()
    thread = SyncThread()

    async def main() -> None:
        removal = log.plan_retention(0)
        assert removal is not None
        try:
            await thread.run_sync(removal.run)
        finally:
            log.finish_removal(removal)

    store.dir_fsync_threads.clear()
    trio.run(main)
    assert store.dir_fsync_threads and threading.main_thread() not in store.dir_fsync_threads


def test_a_crash_before_the_removal_ran_loses_nothing_durable() -> None:
    store = MemoryFileStore()
    log = open_log(store, retention_ms=-1, retention_bytes=1000)
    append_100(log, 25)
    log.flush()
    removal = log.plan_retention(0)
    assert removal is not None
    store.crash()  # the renames never reached the disk: the log as it was
    log, report = PartitionLog.open(store, DIRECTORY, log.config, 0)
    assert (log.log_start_offset, log.log_end_offset) == (0, 50) and report.cuts == ()
    log.check_invariants(deep=True)


def test_recovery_deletes_every_segment_at_or_below_a_deleted_one() -> None:
    store = MemoryFileStore()
    log = open_log(store)
    append_100(log, 25)
    log.close()
    # As if only the second of retention's renames reached the disk.
    for suffix in (".log", ".index", ".timeindex"):
        name = f"{DIRECTORY}/{20:020d}{suffix}"
        store.rename(name, name + ".deleted")
    store.fsync_dir(DIRECTORY)
    store.crash()
    log, report = PartitionLog.open(store, DIRECTORY, log.config, 0)
    assert (log.log_start_offset, log.log_end_offset) == (40, 50) and report.cuts == ()
    assert log.segment_base_offsets == (40,)
    log.check_invariants(deep=True)


def test_a_restart_below_the_start_unlinks_retentions_leftovers_first() -> None:
    store = MemoryFileStore()
    log = open_log(store, retention_ms=-1, retention_bytes=1000)
    append_100(log, 25)
    log.flush()
    removal = log.plan_retention(0)  # its run never comes (cancelled)
    assert removal is not None
    log.finish_removal(removal)
    log.truncate_to(0)  # below the log start: restarts at 0, where a *.deleted name waits
    append_100(log, 3)
    log.flush()
    store.crash()
    log, _ = PartitionLog.open(store, DIRECTORY, log.config, 0)
    assert (log.log_start_offset, log.log_end_offset) == (0, 6)
    log.check_invariants(deep=True)


def test_a_removed_segment_a_ticket_holds_closes_only_when_it_completes() -> None:
    store = MemoryFileStore()
    log = open_log(store, retention_ms=-1, retention_bytes=1000)
    append_100(log, 25)
    log.flush()
    append_100(log)  # dirties the active segment only
    ticket = log.begin_sync()
    assert ticket is not None
    handles = store.open_handles()
    assert log.apply_retention(0) == 1  # segment 0 is not in the ticket: closed at once
    assert store.open_handles() == handles - 3
    for handle in ticket.handles:
        store.fsync(handle)
    log.complete_sync(ticket)
    log.check_invariants(deep=True)
