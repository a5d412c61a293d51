"""Recovery on real files: damage a log the way crashes and disks do, reopen, and check that
the report says exactly what was cut and that no fsynced batch is lost.

Method: ``OsFileStore`` in ``tmp_path``. A log of 1 KiB segments gets 25 batches of 100 bytes
(2 offsets each), fsynced after every append like the ``always`` sync policy, so segments 0,
20 and 40 exist and the recovery point is 20 (segment 0 is trusted, the others are scanned).
The process "dies" (``abandon``), a test damages files with plain ``os`` calls, and the log is
reopened.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rivven_broker.storage.errors import CorruptLogError
from rivven_broker.storage.file_store import OsFileStore
from rivven_broker.storage.log_config import LogConfig
from rivven_broker.storage.partition_log import PartitionLog
from rivven_broker.storage.recovery import Cut

from .log_batches import make_batch

CONFIG = LogConfig(segment_bytes=1024, index_interval_bytes=128)
DIRECTORY = "t-0"
BATCH_BYTES = 100


def segment(base: int, suffix: str = ".log") -> str:
    return f"{DIRECTORY}/{base:020d}{suffix}"


@pytest.fixture
def store(tmp_path: Path) -> OsFileStore:
    return OsFileStore(str(tmp_path))


def build(store: OsFileStore, count: int = 25, config: LogConfig = CONFIG) -> dict[int, bytes]:
    """Append ``count`` fsynced batches and die; returns the stored bytes by base offset."""
    log, _ = PartitionLog.open(store, DIRECTORY, config, 0)
    for i in range(count):
        log.append(make_batch(2, bytes([i]) * 39, max_timestamp=1000 + i), 0)
        log.flush()
    batches = {}
    offset = 0
    while offset < log.log_end_offset:
        result = log.read(offset, 0)
        batches[offset] = result.records
        offset = result.next_offset
    assert all(len(b) == BATCH_BYTES for b in batches.values())
    log.abandon()
    return batches


def reopen(store: OsFileStore, config: LogConfig = CONFIG):
    log, report = PartitionLog.open(store, DIRECTORY, config, 0)
    log.check_invariants(deep=True)
    return log, report


def assert_batches(log: PartitionLog, batches: dict[int, bytes], end: int) -> None:
    assert log.log_end_offset == end
    for base, data in batches.items():
        if base < end:
            assert log.read(base + 1, 0).records == data


def path(store: OsFileStore, name: str) -> str:
    return os.path.join(store.root, name)


def flip(store: OsFileStore, name: str, position: int) -> None:
    with open(path(store, name), "r+b") as file:
        file.seek(position)
        byte = file.read(1)
        file.seek(position)
        file.write(bytes([byte[0] ^ 0x40]))


def test_an_undamaged_log_needs_only_the_scan_above_the_recovery_point(store: OsFileStore) -> None:
    batches = build(store)
    log, report = reopen(store)
    assert report.cuts == () and report.rebuilt_indexes == ()
    assert report.recovery_point == 20 and report.scanned_segments == 2
    assert report.batches_kept == 15 and report.segments == 3
    assert_batches(log, batches, 50)
    log.close()
    log, report = reopen(store)  # a clean close: nothing to scan
    assert report.clean and report.recovery_point == 50


def test_a_last_segment_cut_mid_batch(store: OsFileStore) -> None:
    batches = build(store)
    os.truncate(path(store, segment(40)), 470)  # the fifth batch of segment 40 is torn
    log, report = reopen(store)
    assert report.cuts == (Cut(segment(40), 400, 70, "torn batch"),)
    assert report.batches_kept == 10 + 4
    assert_batches(log, batches, 48)
    assert os.path.getsize(path(store, segment(40))) == 400


def test_a_flipped_byte_in_the_last_batch(store: OsFileStore) -> None:
    batches = build(store)
    flip(store, segment(40), 470)
    log, report = reopen(store)
    assert report.cuts == (Cut(segment(40), 400, 100, "crc mismatch"),)
    assert_batches(log, batches, 48)


def test_a_torn_batch_in_a_middle_segment_takes_the_later_segments(store: OsFileStore) -> None:
    batches = build(store)
    os.truncate(path(store, segment(20)), 990)
    log, report = reopen(store)
    assert report.cuts == (
        Cut(segment(20), 900, 90, "torn batch"),
        Cut(segment(40), 0, 500, "segment follows a cut"),
    )
    assert not os.path.exists(path(store, segment(40)))
    assert_batches(log, batches, 38)


def test_a_zero_filled_preallocated_tail_is_not_corruption(store: OsFileStore) -> None:
    config = LogConfig(segment_bytes=8192, index_interval_bytes=128, preallocate_bytes=4096)
    batches = build(store, count=5, config=config)
    size = os.path.getsize(path(store, segment(0)))
    assert size == 100 + 4096
    log, report = reopen(store, config)
    assert report.cuts == (Cut(segment(0), 500, size - 500, "preallocated tail"),)
    assert_batches(log, batches, 10)


def test_zeros_followed_by_data_are_a_cut_gap(store: OsFileStore) -> None:
    batches = build(store)
    with open(path(store, segment(40)), "r+b") as file:
        file.seek(300)
        file.write(bytes(100))  # batch 46 zeroed, batch 48 intact after it
    log, report = reopen(store)
    assert report.cuts == (Cut(segment(40), 300, 200, "zero-filled gap"),)
    assert_batches(log, batches, 46)


def test_missing_indexes_are_rebuilt_identically(store: OsFileStore) -> None:
    batches = build(store)
    saved = {}
    for name in (segment(0, ".index"), segment(0, ".timeindex"), segment(40, ".index")):
        saved[name] = Path(path(store, name)).read_bytes()
        os.remove(path(store, name))
    log, report = reopen(store)
    assert report.cuts == ()
    assert sorted(report.rebuilt_indexes) == sorted(saved)
    for name, data in saved.items():
        assert Path(path(store, name)).read_bytes() == data
    assert_batches(log, batches, 50)


def test_a_damaged_index_of_a_trusted_segment_is_rebuilt(store: OsFileStore) -> None:
    batches = build(store)
    index = path(store, segment(0, ".index"))
    good = Path(index).read_bytes()
    Path(index).write_bytes(good[:-3])  # not a whole number of entries
    log, report = reopen(store)
    assert report.rebuilt_indexes == (segment(0, ".index"),)
    assert Path(index).read_bytes() == good
    assert_batches(log, batches, 50)


def test_reads_by_offset_and_timestamp_after_recovery(store: OsFileStore) -> None:
    batches = build(store)
    os.truncate(path(store, segment(40)), 350)
    log, report = reopen(store)
    assert report.cuts == (Cut(segment(40), 300, 50, "torn header"),)
    assert log.offset_for_timestamp(1000) == 0
    assert log.offset_for_timestamp(1012) == 24
    assert log.offset_for_timestamp(1022) == 44
    assert log.offset_for_timestamp(1023) is None  # batches 46 and 48 were cut
    assert log.read(33, 250).records == batches[32] + batches[34]


def test_data_missing_below_the_recovery_point_is_refused(store: OsFileStore) -> None:
    build(store)
    os.truncate(path(store, segment(0)), 950)  # segment 0 is trusted (recovery point 20)
    with pytest.raises(CorruptLogError) as info:
        reopen(store)
    assert info.value.file == segment(0) and info.value.position == 900
    assert os.path.getsize(path(store, segment(0))) == 950  # nothing was cut


def test_a_bad_crc_below_the_recovery_point_is_refused(store: OsFileStore) -> None:
    build(store)
    log, _ = reopen(store)
    log.close()  # recovery point 50
    log, _ = reopen(store)
    log.append(make_batch(2, b"new"), 0)  # segment 40 now reaches past the recovery point
    log.abandon()
    flip(store, segment(40), 180)
    with pytest.raises(CorruptLogError) as info:
        reopen(store)
    assert (info.value.file, info.value.position) == (segment(40), 100)
    assert "crc mismatch" in str(info.value)
