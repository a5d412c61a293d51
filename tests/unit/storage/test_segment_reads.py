"""``read_batches`` and ``scrub_batches`` on one sealed segment, without the log around them.

Method: a log on a ``MemoryFileStore`` with small segments is filled with known batches; the
functions are called on its first sealed segment and compared with the stored bytes; one
byte flipped in the store must make the scrub raise at that batch's position.
"""

from __future__ import annotations

import pytest

from rivven_broker.storage.errors import CorruptRecordsError
from rivven_broker.storage.log_config import LogConfig
from rivven_broker.storage.memory_store import MemoryFileStore
from rivven_broker.storage.partition_log import PartitionLog
from rivven_broker.storage.segment_reads import read_batches, scrub_batches
from tests.unit.storage.log_batches import make_batch, stored

CONFIG = LogConfig(segment_bytes=4096, index_interval_bytes=256)


@pytest.fixture
def filled() -> tuple[MemoryFileStore, PartitionLog, list[bytes]]:
    store = MemoryFileStore()
    log, _ = PartitionLog.open(store, "t-0", CONFIG, 0)
    batches = []
    for i in range(60):
        batch = make_batch(2, bytes([i]) * 100)
        info = log.append(batch, 0)
        batches.append(stored(batch, info.base_offset))
    assert len(log.sealed_segments()) >= 2
    return store, log, batches


def test_whole_batches_from_the_one_holding_the_offset(filled) -> None:
    _, log, batches = filled
    segment = log.sealed_segments()[0]
    result = read_batches(segment, 3, 1, None, False)  # offset 3 is inside the second batch
    assert bytes(result.records) == batches[1]  # at least one whole batch, from its start
    assert (result.next_offset, result.batch_count) == (4, 1)
    result = read_batches(segment, 0, 10_000, 6, False)  # none based at or past offset 6
    assert bytes(result.records) == b"".join(batches[:3])
    assert result.next_offset == 6
    empty = read_batches(segment, 6, 10_000, 6, False)
    assert (bytes(empty.records), empty.next_offset) == (b"", 6)


def test_a_scrub_walks_the_segment_and_finds_a_flipped_byte(filled) -> None:
    store, log, batches = filled
    segment = log.sealed_segments()[0]
    positions, position = [], 0
    while position is not None:
        positions.append(position)
        position = scrub_batches(segment, position, 500)
    assert len(positions) > 1
    where = len(batches[0]) + len(batches[1]) + 70  # inside the third batch's records
    byte = store.pread(segment.log_handle, 1, where)
    store.pwrite(segment.log_handle, bytes([byte[0] ^ 0xFF]), where)
    with pytest.raises(CorruptRecordsError) as found:
        scrub_batches(segment, 0, 10_000)
    assert str(len(batches[0]) + len(batches[1])) in str(found.value)
