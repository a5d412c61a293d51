"""Recovery rules that need a precise file layout: checkpoints, leftovers, gaps between
segments, a log that ends below its start.

Method: build logs on MemoryFileStore, rearrange or damage their files directly through the
store, reopen, and compare the report and the log with what ``recovery.py`` promises.
"""

from __future__ import annotations

import pytest

from rivven_broker.storage.checkpoint import (
    LOG_START_OFFSET_FILE,
    RECOVERY_POINT_FILE,
    encode_checkpoint,
    read_checkpoint,
)
from rivven_broker.storage.errors import CorruptLogError
from rivven_broker.storage.log_config import LogConfig
from rivven_broker.storage.memory_store import MemoryFileStore
from rivven_broker.storage.partition_log import PartitionLog
from rivven_broker.storage.recovery import Cut

from .log_batches import make_batch

CONFIG = LogConfig(segment_bytes=1024, index_interval_bytes=128)
DIRECTORY = "t-0"


def segment(base: int, suffix: str = ".log") -> str:
    return f"{DIRECTORY}/{base:020d}{suffix}"


def build(store: MemoryFileStore, count: int) -> PartitionLog:
    log, _ = PartitionLog.open(store, DIRECTORY, CONFIG, 0)
    for _ in range(count):
        log.append(make_batch(2, b"r" * 39), 0)  # 100 bytes
    return log


def write_file(store: MemoryFileStore, name: str, data: bytes) -> None:
    handle = store.open(name)
    store.truncate(handle, 0)
    store.pwrite(handle, data, 0)
    store.fsync(handle)
    store.close(handle)
    store.fsync_dir(DIRECTORY)


def test_a_new_directory_is_created_durably() -> None:
    store = MemoryFileStore()
    log, report = PartitionLog.open(store, "data/t-0", CONFIG, 0)
    assert report.segments == 1 and log.log_end_offset == 0
    store.fsync_dir("")  # the test's own: "data" itself
    store.crash()
    assert store.listdir("data/t-0") == [
        "00000000000000000000.index", "00000000000000000000.log", "00000000000000000000.timeindex"
    ]


def test_checkpoints_round_trip_and_damage_is_refused() -> None:
    store = MemoryFileStore()
    build(store, 3).close()
    assert read_checkpoint(store, DIRECTORY, RECOVERY_POINT_FILE) == 6
    assert read_checkpoint(store, DIRECTORY, LOG_START_OFFSET_FILE) is None
    damaged = bytearray(encode_checkpoint(6))
    damaged[10] ^= 1
    write_file(store, f"{DIRECTORY}/{RECOVERY_POINT_FILE}", bytes(damaged))
    with pytest.raises(CorruptLogError) as info:
        PartitionLog.open(store, DIRECTORY, CONFIG, 0)
    assert info.value.file == f"{DIRECTORY}/{RECOVERY_POINT_FILE}"
    assert store.open_handles() == 0


def test_leftovers_are_removed_and_reported() -> None:
    store = MemoryFileStore()
    build(store, 3).close()
    for name in (f"{RECOVERY_POINT_FILE}.tmp", "00000000000000000099.index",
                 "00000000000000000099.timeindex"):
        write_file(store, f"{DIRECTORY}/{name}", b"junk")
    write_file(store, f"{DIRECTORY}/notes.txt", b"left alone")
    log, report = PartitionLog.open(store, DIRECTORY, CONFIG, 0)
    assert sorted(report.removed_files) == [
        segment(99, ".index"), segment(99, ".timeindex"), f"{DIRECTORY}/{RECOVERY_POINT_FILE}.tmp"
    ]
    assert store.exists(f"{DIRECTORY}/notes.txt") and log.log_end_offset == 6


def test_a_gap_between_segments_above_the_recovery_point_is_cut() -> None:
    store = MemoryFileStore()
    log = build(store, 25)  # segments 0, 20, 40; recovery point 0
    log.flush()
    log.abandon()
    for suffix in (".log", ".index", ".timeindex"):
        store.remove(segment(20, suffix))
    store.fsync_dir(DIRECTORY)
    log, report = PartitionLog.open(store, DIRECTORY, CONFIG, 0)
    assert report.cuts == (Cut(segment(40), 0, 500, "offset discontinuity"),)
    assert log.log_end_offset == 20 and log.segment_base_offsets == (0,)
    log.check_invariants(deep=True)


def test_a_gap_below_the_recovery_point_is_refused() -> None:
    store = MemoryFileStore()
    build(store, 25).close()  # recovery point 50
    for suffix in (".log", ".index", ".timeindex"):
        store.remove(segment(20, suffix))
    store.fsync_dir(DIRECTORY)
    with pytest.raises(CorruptLogError) as info:
        PartitionLog.open(store, DIRECTORY, CONFIG, 0)
    # segment 0 is trusted and ends at offset 20, below its successor's base 40
    assert info.value.file == segment(0) and info.value.position == 1000


def test_a_log_that_ends_below_its_start_restarts_at_the_start() -> None:
    store = MemoryFileStore()
    log = build(store, 5)  # offsets 0..9, never synced
    log.delete_records(8)  # the checkpoint is durable
    store.crash()
    log, report = PartitionLog.open(store, DIRECTORY, CONFIG, 0)
    assert (log.log_start_offset, log.log_end_offset, log.segment_base_offsets) == (8, 8, (8,))
    assert segment(0) in report.removed_files
    log.append(make_batch(1), 0)
    assert log.log_end_offset == 9
    log.check_invariants(deep=True)


def test_segments_below_the_log_start_are_deleted_on_open() -> None:
    store = MemoryFileStore()
    log = build(store, 25)
    log.flush()
    log.delete_records(41)
    store.crash()  # the removal of segments 0 and 20 was never dir-synced
    assert store.exists(segment(0))
    log, report = PartitionLog.open(store, DIRECTORY, CONFIG, 0)
    assert log.segment_base_offsets == (40,) and log.log_start_offset == 41
    assert segment(0) in report.removed_files and segment(20, ".index") in report.removed_files
