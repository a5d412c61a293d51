"""PartitionLog appends and reads: offsets, validation, byte limits and timestamp lookups.

Method: a log on MemoryFileStore with small segments and a small index interval; append
hand-built batches, then check stored bytes exactly (only the 16-byte stamp changes), that a bad
request appends nothing, and that reads honour ``max_bytes``, ``max_offset`` and "at least one
whole batch". Store calls are counted through the fault hook.
"""

from __future__ import annotations

import pytest

from rivven_broker.records.header import CorruptBatchError, InvalidBatchError, parse_header
from rivven_broker.storage.errors import OffsetOutOfRangeError, RecordTooLargeError
from rivven_broker.storage.log_config import LogConfig
from rivven_broker.storage.memory_store import MemoryFileStore
from rivven_broker.storage.partition_log import PartitionLog

from .log_batches import make_batch, stored

CONFIG = LogConfig(segment_bytes=4096, index_interval_bytes=256, max_message_bytes=2048)


@pytest.fixture
def store() -> MemoryFileStore:
    return MemoryFileStore()


@pytest.fixture
def log(store: MemoryFileStore) -> PartitionLog:
    log, _ = PartitionLog.open(store, "t-0", CONFIG, 0)
    return log


def fill(log: PartitionLog, count: int, records: int = 3, size: int = 40) -> list[bytes]:
    """Append ``count`` batches; return what the log must hold for each."""
    kept = []
    for i in range(count):
        batch = make_batch(records, bytes([i % 256]) * size, max_timestamp=1000 + 10 * i)
        info = log.append(batch, 5)
        kept.append(stored(batch, info.base_offset))
    log.check_invariants(deep=True)
    return kept


def test_append_assigns_dense_offsets_and_stamps_only_the_first_16_bytes(log: PartitionLog) -> None:
    first = make_batch(5, b"abc", max_timestamp=7, base_offset=999)
    second = make_batch(1, b"", max_timestamp=8)
    info = log.append(first + second, 42, leader_epoch=3)
    assert (info.base_offset, info.last_offset, info.batch_count) == (0, 5, 2)
    assert info.size_bytes == len(first) + len(second) and info.log_append_time_ms == 42
    assert log.log_end_offset == 6 and log.size_bytes == info.size_bytes
    data = log.read(0, 10_000).records
    assert data == stored(first, 0, 3) + stored(second, 5, 3)
    header = parse_header(data)
    assert (header.base_offset, header.partition_leader_epoch) == (0, 3)
    assert data[16:len(first)] == first[16:]  # CRC and everything after it untouched


def test_one_pwritev_per_append(store: MemoryFileStore, log: PartitionLog) -> None:
    calls: list[str] = []
    store.fault_hook = lambda op, path: calls.append(op) if path.endswith(".log") else None
    log.append(b"".join(make_batch(2, b"x" * 30) for _ in range(5)), 0)
    assert calls == ["pwritev"]


@pytest.mark.parametrize(
    "damage, error",
    [
        (lambda b: b[:-1], InvalidBatchError),  # truncated: batch_length runs past the end
        (lambda b: b + b"\0" * 10, InvalidBatchError),  # trailing bytes
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), CorruptBatchError),  # CRC mismatch
        (lambda b: b[:16] + b"\x01" + b[17:], InvalidBatchError),  # magic 1
        (lambda b: b[:50], InvalidBatchError),  # shorter than a header
    ],
)
def test_a_bad_batch_rejects_the_whole_append(log: PartitionLog, damage, error) -> None:
    fill(log, 1)
    good = make_batch(2, b"fine")
    before = (log.log_end_offset, log.size_bytes, log.read(0, 10**6).records)
    with pytest.raises(error):
        log.append(good + damage(make_batch(3, b"payload" * 3)), 0)
    assert (log.log_end_offset, log.size_bytes, log.read(0, 10**6).records) == before


def test_an_empty_append_is_refused(log: PartitionLog) -> None:
    with pytest.raises(InvalidBatchError):
        log.append(b"", 0)


def test_a_batch_over_max_message_bytes_is_refused(log: PartitionLog) -> None:
    with pytest.raises(RecordTooLargeError) as info:
        log.append(make_batch(1, b"a") + make_batch(1, b"x" * 2000), 0)
    assert info.value.size_bytes == 2061 and info.value.max_bytes == 2048
    assert log.log_end_offset == 0
    log.append(make_batch(1, b"x" * (2048 - 61)), 0)  # exactly the limit is fine


def test_sparse_batches_are_refused_from_producers(log: PartitionLog) -> None:
    batch = bytearray(make_batch(3))
    batch[57:61] = (2).to_bytes(4, "big")  # record_count 2 with last_offset_delta 2
    with pytest.raises(InvalidBatchError):
        log.append(bytes(batch), 0)


def test_read_returns_the_batch_containing_the_offset(log: PartitionLog) -> None:
    kept = fill(log, 10, records=3)
    for offset in range(30):
        result = log.read(offset, 1)
        assert result.records == kept[offset // 3]
        assert result.next_offset == (offset // 3 + 1) * 3


def test_read_honours_max_bytes_but_returns_at_least_one_batch(log: PartitionLog) -> None:
    kept = fill(log, 10, records=1, size=39)  # 100 bytes each
    assert log.read(0, 0).records == kept[0]
    assert log.read(0, 99).records == kept[0]
    assert log.read(0, 250).records == b"".join(kept[:2])
    result = log.read(3, 300)
    assert result.records == b"".join(kept[3:6]) and result.next_offset == 6
    assert result.batch_count == 3


def test_read_never_returns_a_batch_at_or_past_max_offset(log: PartitionLog) -> None:
    kept = fill(log, 5, records=2)
    assert log.read(0, 10**6, max_offset=5).records == b"".join(kept[:3])  # base 4 < 5
    assert log.read(0, 10**6, max_offset=4).records == b"".join(kept[:2])
    empty = log.read(4, 10**6, max_offset=4)
    assert empty.records == b"" and empty.next_offset == 4 and empty.batch_count == 0


def test_read_at_the_end_is_empty_and_out_of_range_raises(log: PartitionLog) -> None:
    fill(log, 2, records=2)
    assert log.read(4, 100).records == b""
    assert log.read(4, 100).next_offset == 4
    with pytest.raises(OffsetOutOfRangeError) as info:
        log.read(5, 100)
    assert (info.value.log_start_offset, info.value.log_end_offset) == (0, 4)
    log.delete_records(2)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(1, 100)


def test_reads_stay_within_one_segment(log: PartitionLog) -> None:
    kept = fill(log, 60, records=1, size=39)  # 6000 bytes: two segments of 4096 bytes max
    bases = log.segment_base_offsets
    assert len(bases) == 2
    result = log.read(0, 10**6)
    assert result.next_offset == bases[1] and result.records == b"".join(kept[: bases[1]])
    assert log.read(bases[1], 10**6).records == b"".join(kept[bases[1] :])


def test_offset_for_timestamp(log: PartitionLog) -> None:
    # max timestamps 1000, 1010, ... one batch of 3 offsets each; then an older-stamped one
    fill(log, 40, records=3)
    log.append(make_batch(1, max_timestamp=5), 0)
    assert log.offset_for_timestamp(0) == 0
    assert log.offset_for_timestamp(1000) == 0
    assert log.offset_for_timestamp(1001) == 3
    assert log.offset_for_timestamp(1250) == 75
    assert log.offset_for_timestamp(1390) == 117
    assert log.offset_for_timestamp(1391) is None
    log.delete_records(10)  # inside the batch 9..11, whose max timestamp is 1030
    assert log.offset_for_timestamp(1000) == 10
    assert log.offset_for_timestamp(1031) == 12


def test_statistics_count_appends(log: PartitionLog) -> None:
    fill(log, 3)
    stats = log.statistics()
    assert (stats.appends, stats.appended_batches, stats.log_end_offset) == (3, 3, 9)
    assert stats.appended_bytes == stats.size_bytes == log.size_bytes


def test_a_read_from_where_the_last_one_ended_skips_the_index_walk(log: PartitionLog) -> None:
    """``Segment.remember``: a follower or a tailing consumer reads on from the offset the last
    read ended at; that read starts at the remembered position, and a truncation forgets it."""
    fill(log, 20, records=2, size=30)
    first = log.read(0, 300)
    segment = log._segments[-1]
    walks = []
    lookup = segment.offset_index.lookup
    segment.offset_index.lookup = lambda relative: walks.append(relative) or lookup(relative)
    second = log.read(first.next_offset, 300)
    assert walks == [] and second.next_offset > first.next_offset
    assert bytes(second.records) == bytes(log.read(first.next_offset, 300).records)
    log.truncate_to(first.next_offset - 2)  # the first read's last batch and all after
    kept = fill(log, 5, records=2, size=70)  # other sizes: the old positions mean nothing
    again = log.read(first.next_offset, 300)
    assert walks  # the hint was forgotten: found through the index
    assert bytes(again.records).startswith(kept[1])
