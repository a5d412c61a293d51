"""Zero-copy reads: a ``FileRegion`` names exactly the bytes a plain read returns.

Goal: for any log of small and large batches across segments, any offset, byte budget and
``max_offset``, ``read(..., zero_copy=True)`` answers what ``read(...)`` answers (the same
bytes, next offset and batch count), as a ``FileRegion`` on real files when the first batch is
large and as bytes otherwise; on the memory store always as bytes. Also the region's own
contract: ``read``, ``close`` (idempotent, also on collection), and a file that shrank under it.
Method: ``OsFileStore`` in a temporary directory, batches from ``log_batches``; a Hypothesis
property drives the comparison.
"""

from __future__ import annotations

import errno
import gc
import os
import tempfile

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from rivven_broker.file_region import FileRegion
from rivven_broker.records.header import HEADER_BYTES
from rivven_broker.storage.file_store import OsFileStore
from rivven_broker.storage.log_config import LogConfig
from rivven_broker.storage.memory_store import MemoryFileStore
from rivven_broker.storage.partition_log import REGION_BATCH_BYTES_MIN, PartitionLog

from .log_batches import make_batch

LARGE = REGION_BATCH_BYTES_MIN
CONFIG = LogConfig(segment_bytes=6 * LARGE, index_interval_bytes=4096)


def fill(log: PartitionLog, sizes: list[int]) -> None:
    for i, size in enumerate(sizes):
        log.append(make_batch(1 + i % 3, bytes([i % 251]) * size, max_timestamp=1000 + i), 0)


def records_of(result) -> bytes:
    records = result.records
    if type(records) is FileRegion:
        try:
            return records.read()
        finally:
            records.close()
    return bytes(records)


@settings(max_examples=120, deadline=None)
@given(
    sizes=st.lists(st.sampled_from([100, 3000, LARGE - 61, LARGE + 1, 2 * LARGE]),
                   min_size=1, max_size=14),
    at=st.integers(0, 10**6),
    max_bytes=st.sampled_from([0, 1, 5000, LARGE, 3 * LARGE, 1 << 30]),
    cap_after=st.none() | st.integers(0, 8),
)
def test_a_zero_copy_read_answers_what_a_plain_read_answers(sizes, at, max_bytes, cap_after):
    with tempfile.TemporaryDirectory() as root:
        log, _ = PartitionLog.open(OsFileStore(root), "t-0", CONFIG, 0)
        try:
            fill(log, sizes)
            offset = at % (log.log_end_offset + 1)
            cap = None if cap_after is None else offset + cap_after  # a high watermark
            plain = log.read(offset, max_bytes, max_offset=cap)
            zero = log.read(offset, max_bytes, max_offset=cap, zero_copy=True)
            event("a region" if type(zero.records) is FileRegion else "bytes")
            assert records_of(zero) == records_of(plain)
            assert (zero.next_offset, zero.batch_count) == (plain.next_offset, plain.batch_count)
        finally:
            log.close()


def test_large_batches_come_as_a_region_and_small_ones_as_bytes(tmp_path):
    log, _ = PartitionLog.open(OsFileStore(str(tmp_path)), "t-0", CONFIG, 0)
    fill(log, [LARGE, LARGE, 200, 200])
    large = log.read(0, 1 << 30, zero_copy=True)
    assert type(large.records) is FileRegion
    assert (large.batch_count, large.next_offset) == (4, 7)  # 1 + 2 + 3 + 1 offsets, one segment
    small = log.read(6, 1 << 30, zero_copy=True)  # the first batch decides: a small one
    assert type(small.records) is not FileRegion
    assert type(log.read(0, 1 << 30).records) is not FileRegion  # only when asked
    records_of(large)
    capped = log.read(0, 1 << 30, max_offset=3, zero_copy=True)  # a high watermark at 3
    assert (capped.batch_count, capped.next_offset, len(capped.records)) == (2, 3, 2 * (LARGE + HEADER_BYTES))
    records_of(capped)
    log.close()


def test_out_of_descriptors_a_zero_copy_read_copies_instead(tmp_path, monkeypatch):
    log, _ = PartitionLog.open(OsFileStore(str(tmp_path)), "t-0", CONFIG, 0)
    fill(log, [LARGE, LARGE])
    expected = records_of(log.read(0, 1 << 30))

    def no_descriptors(fd: int) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, "dup", no_descriptors)
    result = log.read(0, 1 << 30, zero_copy=True)
    assert type(result.records) is bytes and result.records == expected
    log.close()


def test_the_memory_store_answers_bytes():
    log, _ = PartitionLog.open(MemoryFileStore(), "t-0", CONFIG, 0)
    fill(log, [LARGE, LARGE])
    result = log.read(0, 1 << 30, zero_copy=True)
    assert type(result.records) is bytes and result.batch_count == 2
    log.close()


def test_a_region_outlives_its_segment_and_releases_its_descriptor(tmp_path):
    log, _ = PartitionLog.open(OsFileStore(str(tmp_path)), "t-0", CONFIG, 0)
    fill(log, [LARGE])
    expected = records_of(log.read(0, 1 << 30))
    region = log.read(0, 1 << 30, zero_copy=True).records
    assert type(region) is FileRegion
    log.close()  # the segment's own descriptor is gone; the region has its own
    assert region.read() == expected
    fd = region.fd
    region.close()
    region.close()  # idempotent
    assert region.closed
    with pytest.raises(OSError):
        os.fstat(fd)


def region_of_file(tmp_path, data: bytes, position: int, size: int) -> FileRegion:
    """A region of a new file holding ``data`` (the file's own descriptor already closed)."""
    path = tmp_path / "f"
    path.write_bytes(data)
    handle = os.open(path, os.O_RDWR)
    try:
        return FileRegion.of(handle, position, size)
    finally:
        os.close(handle)


def test_a_dropped_region_is_released_when_collected(tmp_path):
    region = region_of_file(tmp_path, b"x" * 10, 2, 5)
    fd = region.fd
    assert region.read() == b"xxxxx" and len(region) == 5
    del region
    gc.collect()
    with pytest.raises(OSError):
        os.fstat(fd)


def test_a_region_of_a_file_that_shrank_refuses_to_read(tmp_path):
    region = region_of_file(tmp_path, b"y" * 100, 50, 50)
    os.ftruncate(region.fd, 60)
    with pytest.raises(OSError):
        region.read()
    region.close()
