"""PartitionLog segments over time: rolls, retention, delete_records, truncate_to, group
commit, preallocation and store failures.

Method: a log on MemoryFileStore with 1 KiB segments; every scenario ends with
``check_invariants(deep=True)``, and durability claims are checked the hard way: crash the store
and reopen.
"""

from __future__ import annotations

import errno

import pytest

from rivven_broker.storage.errors import LogFailedError, OffsetOutOfRangeError, StorageError
from rivven_broker.storage.log_config import LogConfig
from rivven_broker.storage.memory_store import MemoryFileStore
from rivven_broker.storage.partition_log import PartitionLog
from rivven_broker.storage.segment import PREALLOCATE_APPEND_BYTES_MAX, PREALLOCATE_STEP_BYTES

from .log_batches import make_batch, stored

DIRECTORY = "t-0"


def open_log(store: MemoryFileStore, **settings: int) -> PartitionLog:
    config = LogConfig(**{"segment_bytes": 1024, "index_interval_bytes": 128, **settings})
    log, _ = PartitionLog.open(store, DIRECTORY, config, 0)
    return log


def append_100(log: PartitionLog, count: int = 1, now_ms: int = 0, timestamp: int = 0) -> None:
    """Append ``count`` batches of 100 bytes, 2 offsets each."""
    for _ in range(count):
        log.append(make_batch(2, b"r" * 39, max_timestamp=timestamp), now_ms)


# --- rolling ---------------------------------------------------------------------------------


def test_roll_by_bytes_before_the_segment_would_overflow() -> None:
    log = open_log(MemoryFileStore())
    append_100(log, 10)
    assert log.segment_base_offsets == (0,)
    append_100(log)  # 1100 > 1024: roll first
    assert log.segment_base_offsets == (0, 20)
    log.check_invariants(deep=True)


def test_roll_by_age_of_the_first_batch() -> None:
    log = open_log(MemoryFileStore(), segment_ms=1000)
    append_100(log, now_ms=5000)
    append_100(log, now_ms=5999)
    assert log.segment_base_offsets == (0,)
    append_100(log, now_ms=6000)
    assert log.segment_base_offsets == (0, 4)
    append_100(log, now_ms=6999)  # the new segment's clock started at its first batch
    assert log.segment_base_offsets == (0, 4)
    append_100(log, now_ms=7000)
    assert log.segment_base_offsets == (0, 4, 8)
    log.check_invariants(deep=True)


def test_explicit_roll_of_an_empty_segment_does_nothing() -> None:
    store = MemoryFileStore()
    log = open_log(store)
    log.roll(0)
    assert log.segment_base_offsets == (0,)
    append_100(log)
    log.roll(0)
    log.roll(0)
    assert log.segment_base_offsets == (0, 2)
    assert sorted(store.listdir(DIRECTORY)) == [
        "00000000000000000000.index", "00000000000000000000.log",
        "00000000000000000000.timeindex", "00000000000000000002.index",
        "00000000000000000002.log", "00000000000000000002.timeindex",
    ]


def test_a_rolled_segment_is_durable_only_with_its_directory_entry() -> None:
    store = MemoryFileStore()
    log = open_log(store)
    append_100(log, 10)
    log.flush()
    dir_syncs = store.stats.dir_fsyncs
    append_100(log)  # rolls: the new file's name must be synced before it can hold durable data
    assert store.stats.dir_fsyncs == dir_syncs  # not by the append: by the next group commit
    ticket = log.begin_sync()
    assert ticket is not None and ticket.directory == DIRECTORY
    for handle in ticket.handles:
        store.fsync(handle)
    assert log.durable_offset == 20  # the data is synced, its name is not
    store.fsync_dir(ticket.directory)
    log.complete_sync(ticket)
    assert log.durable_offset == 22
    store.crash()
    log = open_log(store)
    assert log.log_end_offset == 22


# --- retention and delete_records ----------------------------------------------------------------


def test_retention_by_time_deletes_old_segments_but_never_the_active_one() -> None:
    log = open_log(MemoryFileStore(), retention_ms=1000)
    append_100(log, 10, timestamp=100)
    append_100(log, 10, timestamp=200)
    append_100(log, 1, timestamp=300)
    assert log.segment_base_offsets == (0, 20, 40)
    assert log.apply_retention(now_ms=1100) == 0  # exactly retention_ms old: kept
    assert log.apply_retention(now_ms=1101) == 1
    assert log.log_start_offset == 20
    assert log.apply_retention(now_ms=10**9) == 1
    assert log.segment_base_offsets == (40,) and log.log_start_offset == 40
    assert log.read(40, 10**6).batch_count == 1  # the old active segment is still there
    log.check_invariants(deep=True)


def test_retention_by_size_keeps_at_least_retention_bytes() -> None:
    log = open_log(MemoryFileStore(), retention_ms=-1, retention_bytes=1500)
    append_100(log, 35)  # segments of 1000, 1000, 1000, 500 bytes
    assert log.size_bytes == 3500
    assert log.apply_retention(now_ms=0) == 2  # 3500 -> 2500 -> 1500, not below
    assert log.size_bytes == 1500 and log.log_start_offset == 40
    assert log.apply_retention(now_ms=0) == 0
    log.check_invariants(deep=True)


def test_retention_of_an_unsynced_segment_cannot_cost_later_durable_data() -> None:
    store = MemoryFileStore()
    log = open_log(store, retention_ms=-1, retention_bytes=1000)
    append_100(log, 21)  # segments 0, 20, 40; nothing synced
    removal = log.plan_retention(0)  # segment 0 goes before its data was ever synced
    assert removal is not None and removal.segments == 1
    assert log.durable_offset == 20  # what is below the start cannot be lost
    log.flush()  # before the removal's own directory fsync: the group commit does it
    assert log.durable_offset == 42
    store.crash()  # segment 0 is renamed *.deleted, durably: recovery deletes it again
    log, report = PartitionLog.open(store, DIRECTORY, log.config, 0)
    assert (log.log_start_offset, log.log_end_offset) == (20, 42) and report.cuts == ()
    assert f"{DIRECTORY}/00000000000000000000.log.deleted" in report.removed_files
    log.check_invariants(deep=True)


def test_delete_records_persists_the_start_and_deletes_whole_segments_below() -> None:
    store = MemoryFileStore()
    log = open_log(store)
    append_100(log, 25)  # segments 0, 20, 40
    log.flush()
    assert log.delete_records(21) == 21
    assert log.segment_base_offsets == (20, 40) and log.log_start_offset == 21
    assert log.delete_records(5) == 21  # never moves back
    with pytest.raises(OffsetOutOfRangeError):
        log.delete_records(51)
    store.crash()  # the segment removal was never dir-synced; the checkpoint was
    log = open_log(store)
    assert log.log_start_offset == 21 and log.segment_base_offsets == (20, 40)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(19, 100)
    log.check_invariants(deep=True)


def test_delete_records_to_the_end_then_roll_leaves_no_segment_below_the_start() -> None:
    log = open_log(MemoryFileStore())
    append_100(log, 3)
    assert log.delete_records(6) == 6
    log.roll(0)
    assert log.segment_base_offsets == (6,) and log.log_start_offset == 6
    log.check_invariants(deep=True)


# --- truncation ------------------------------------------------------------------------------


def test_truncate_to_inside_a_batch_cuts_at_its_base() -> None:
    store = MemoryFileStore()
    log = open_log(store)
    append_100(log, 25)
    kept = log.read(0, 10**6).records
    log.truncate_to(33)  # batch 32..33
    assert log.log_end_offset == 32 and log.segment_base_offsets == (0, 20)
    assert log.read(0, 10**6).records == kept
    store.crash()  # the truncation is durable when it returns (the data was never synced)
    log = open_log(store)
    assert log.log_end_offset <= 32
    log.check_invariants(deep=True)


def test_truncate_to_is_durable_even_for_synced_data() -> None:
    store = MemoryFileStore()
    log = open_log(store)
    append_100(log, 25)
    log.flush()
    log.truncate_to(10)
    append_100(log)
    store.crash()  # the new batch was not synced; the truncation was
    log = open_log(store)
    assert log.log_end_offset == 10 and log.segment_base_offsets == (0,)
    log.check_invariants(deep=True)


def test_truncate_below_the_log_start_empties_the_log_and_restarts_it() -> None:
    store = MemoryFileStore()
    log = open_log(store)
    append_100(log, 25)
    log.delete_records(30)
    log.truncate_to(31)  # inside batch 30..31, whose base is the log start: restart there
    assert (log.log_start_offset, log.log_end_offset, log.segment_base_offsets) == (30, 30, (30,))
    log.truncate_to(12)  # below the start
    assert (log.log_start_offset, log.log_end_offset) == (12, 12)
    append_100(log)
    assert log.read(12, 100).records == stored(make_batch(2, b"r" * 39), 12)
    store.crash()
    log = open_log(store)
    assert (log.log_start_offset, log.log_end_offset) == (12, 12)
    log.check_invariants(deep=True)


def test_truncate_past_the_end_does_nothing() -> None:
    log = open_log(MemoryFileStore())
    append_100(log, 2)
    log.truncate_to(4)
    log.truncate_to(100)
    assert log.log_end_offset == 4


# --- group commit ----------------------------------------------------------------------------


def test_a_ticket_covers_what_was_appended_before_it() -> None:
    store = MemoryFileStore()
    log = open_log(store)
    assert log.begin_sync() is None and not log.dirty
    append_100(log, 2)
    assert log.dirty
    ticket = log.begin_sync()
    assert ticket is not None and ticket.end_offset == 4
    for handle in ticket.handles:
        store.fsync(handle)
    append_100(log)  # lands after the fsync, before complete_sync
    log.complete_sync(ticket)
    assert log.durable_offset == 4 and log.dirty
    store.crash()
    log = open_log(store)
    assert log.log_end_offset == 4


def test_a_later_ticket_does_not_lean_on_an_earlier_one() -> None:
    store = MemoryFileStore()
    log = open_log(store)
    append_100(log, 2)
    first = log.begin_sync()
    second = log.begin_sync()  # nothing new, but the first ticket has not finished
    assert first is not None and second is not None
    assert second.handles == first.handles
    for handle in second.handles:
        store.fsync(handle)
    log.complete_sync(second)
    assert log.durable_offset == 4
    log.complete_sync(first)
    assert log.durable_offset == 4


def test_after_a_roll_a_ticket_syncs_the_old_segment_and_its_indexes() -> None:
    store = MemoryFileStore()
    log = open_log(store)
    append_100(log, 11)  # the 11th append rolled
    ticket = log.begin_sync()
    assert ticket is not None and len(ticket.handles) == 4  # old .log/.index/.timeindex + new .log
    for handle in ticket.handles:
        store.fsync(handle)
    store.fsync_dir(ticket.directory)
    log.complete_sync(ticket)
    assert log.durable_offset == 22 and not log.dirty
    append_100(log, 10)  # after the next roll, the next ticket records the synced prefix
    assert log.recovery_point == 0
    log.flush()
    assert log.recovery_point == 20


def test_segments_removed_while_a_ticket_is_out_stay_open_until_it_completes() -> None:
    store = MemoryFileStore()
    log = open_log(store, retention_bytes=1000, retention_ms=-1)
    append_100(log, 25)
    ticket = log.begin_sync()
    assert ticket is not None
    handles_before = store.open_handles()
    assert log.apply_retention(0) == 1  # 2500 bytes -> 1500; one more would leave 500
    assert store.open_handles() == handles_before  # deferred
    for handle in ticket.handles:
        store.fsync(handle)  # must still be valid
    log.complete_sync(ticket)
    assert store.open_handles() == handles_before - 3
    log.check_invariants(deep=True)


def test_truncate_while_a_ticket_is_out_clamps_it() -> None:
    store = MemoryFileStore()
    log = open_log(store)
    append_100(log, 5)
    ticket = log.begin_sync()
    assert ticket is not None
    log.truncate_to(4)
    append_100(log, 3)  # offsets 4..9 again, never synced
    for handle in ticket.handles:
        store.fsync(handle)
    log.complete_sync(ticket)
    assert log.durable_offset == 4


def test_close_with_a_ticket_out_writes_nothing() -> None:
    store = MemoryFileStore()
    log = open_log(store)
    append_100(log, 3)
    assert log.begin_sync() is not None  # its sync failed and will never complete
    writes = store.stats.writes
    log.close()
    assert store.stats.writes == writes and store.open_handles() == 0


# --- preallocation ---------------------------------------------------------------------------


def test_preallocation_keeps_zeros_ahead_and_is_trimmed_at_roll_and_close() -> None:
    store = MemoryFileStore()
    log = open_log(store, preallocate_bytes=300)
    append_100(log)
    active = store.open(f"{DIRECTORY}/00000000000000000000.log", create=False)
    assert store.size(active) == 400  # 300 bytes of zeros ahead of the data
    append_100(log, 3)
    assert store.size(active) == 400  # written into the zeros
    append_100(log)
    assert store.size(active) == 800  # the next chunk
    append_100(log, 5)
    assert store.size(active) == 1024  # never past segment.bytes
    append_100(log)  # rolls: the old segment is cut back to its data
    assert store.size(active) == 1000
    log.close()
    newest = store.open(f"{DIRECTORY}/00000000000000000020.log", create=False)
    assert store.size(newest) == 100
    store.close(active)
    store.close(newest)


def test_zeros_ahead_are_topped_up_a_step_at_a_time() -> None:
    """With more than a step of zeros ahead, they are topped up once a step of them is used,
    by about a step (the next fdatasync writes them back with the group's data), never by the
    whole amount at once, and never past segment.bytes or over the append's own bytes."""
    step = PREALLOCATE_STEP_BYTES
    store = MemoryFileStore()
    log = open_log(store, preallocate_bytes=4 * step, segment_bytes=10 * step)
    append_100(log)
    active = store.open(f"{DIRECTORY}/00000000000000000000.log", create=False)
    assert store.size(active) == 100 + 4 * step  # the first time: all of it
    batch = make_batch(2, b"r" * (step // 32 - 61))
    assert len(batch) == step // 32 < PREALLOCATE_APPEND_BYTES_MAX
    sizes = [store.size(active)]
    for _ in range(240):
        log.append(batch, 0)
        sizes.append(store.size(active))
    end = 100 + 240 * len(batch)
    grown = [after - before for before, after in zip(sizes, sizes[1:]) if after > before]
    assert len(grown) >= 5  # a step at a time, not 4 steps at once
    assert all(step <= size <= step + len(batch) for size in grown[:-1]), grown
    assert sizes[-1] == 10 * step and end < 10 * step  # the last top-up stops at segment.bytes
    writes = store.stats.writes
    log.append(batch, 0)  # into the last zeros: nothing more to write ahead
    assert store.stats.writes == writes + 1 and store.size(active) == 10 * step
    store.close(active)
    log.close()


def test_a_large_append_does_not_run_the_preallocation_ahead() -> None:
    """Zeros ahead of an append of PREALLOCATE_APPEND_BYTES_MAX or more would only be
    overwritten; the zeros already ahead are used, none are added."""
    store = MemoryFileStore()
    log = open_log(store, preallocate_bytes=200_000, segment_bytes=4 << 20)
    append_100(log)
    active = store.open(f"{DIRECTORY}/00000000000000000000.log", create=False)
    assert store.size(active) == 200_100
    large = make_batch(2, b"r" * (PREALLOCATE_APPEND_BYTES_MAX - 61))  # exactly the bound
    assert len(large) == PREALLOCATE_APPEND_BYTES_MAX
    fitting = 200_000 // len(large)
    assert fitting >= 1
    for _ in range(fitting):
        log.append(large, 0)  # fits in the zeros ahead: written into them
        assert store.size(active) == 200_100
    log.append(large, 0)  # goes past them: the file grows with the data only
    grown = 100 + (fitting + 1) * len(large)
    assert store.size(active) == grown
    append_100(log)  # a small append runs the zeros ahead again
    assert store.size(active) == grown + 100 + 200_000
    store.close(active)
    log.close()


def test_preallocated_zeros_are_not_corruption() -> None:
    store = MemoryFileStore()
    log = open_log(store, preallocate_bytes=300)
    append_100(log, 2)
    log.flush()  # the zeros ahead are on disk too
    store.crash()
    log, report = PartitionLog.open(store, DIRECTORY, LogConfig(segment_bytes=1024), 0)
    assert [(c.position, c.bytes_cut, c.reason) for c in report.cuts] == [
        (200, 200, "preallocated tail")
    ]
    assert log.log_end_offset == 4


# --- failures --------------------------------------------------------------------------------


def test_a_failed_data_write_appends_nothing_and_the_log_goes_on() -> None:
    store = MemoryFileStore()
    log = open_log(store)
    append_100(log)

    def disk_full(op: str, path: str) -> None:
        if op == "pwritev":
            raise OSError(errno.ENOSPC, "no space")

    store.fault_hook = disk_full
    with pytest.raises(StorageError) as info:
        append_100(log)
    assert not isinstance(info.value, LogFailedError)
    store.fault_hook = None
    assert log.log_end_offset == 2 and not log.failed
    append_100(log)
    assert log.log_end_offset == 4
    log.check_invariants(deep=True)


def test_buffered_index_entries_are_written_at_sync_and_a_failure_there_fails_the_log() -> None:
    store = MemoryFileStore()
    log = open_log(store)
    handle = store.open(f"{DIRECTORY}/{0:020d}.index", create=False)
    append_100(log, 3)  # the third append is due an index entry, buffered in memory
    assert store.size(handle) == 0 and log.read(4, 100).batch_count == 1
    ticket = log.begin_sync()
    assert ticket is not None and store.size(handle) == 8  # written once per sync
    log.complete_sync(ticket)
    store.close(handle)
    append_100(log, 2)  # one more entry due

    def broken_index(op: str, path: str) -> None:
        if op == "pwrite" and path.endswith(".index"):
            raise OSError(errno.EIO, "index write failed")

    store.fault_hook = broken_index
    assert log.begin_sync() is None and log.failed
    store.fault_hook = None
    with pytest.raises(LogFailedError):
        log.flush()
    log.close()
    log = open_log(store)
    log.check_invariants(deep=True)


def test_a_store_failure_after_the_data_write_fails_the_log() -> None:
    store = MemoryFileStore()
    log = open_log(store)

    def broken_index(op: str, path: str) -> None:
        if op == "pwrite" and path.endswith(".index"):
            raise OSError(errno.EIO, "index write failed")

    store.fault_hook = broken_index
    append_100(log, 3)  # the third append is due an index entry, buffered in memory
    with pytest.raises(LogFailedError):
        log.roll(0)  # rolling writes the buffered index entries
    store.fault_hook = None
    assert log.failed and log.begin_sync() is None
    with pytest.raises(LogFailedError):
        append_100(log)
    with pytest.raises(LogFailedError):
        log.flush()
    assert log.read(0, 100).batch_count == 1  # reads still work
    log.close()  # writes nothing
    log = open_log(store)
    assert log.log_end_offset == 6  # recovery keeps the appended data and rebuilds the index
    log.check_invariants(deep=True)
