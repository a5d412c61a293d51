"""The scrubber's plan (pure) and ``PartitionLog.scrub`` on an in-memory store.

Method: the plan is driven with hand-made partition and segment lists that change between
steps (segments deleted, partitions added) and must visit everything once per pass; ``scrub``
runs over a real partition log on ``MemoryFileStore`` with small segments, clean and then with
one flipped byte, which it must report as ``CorruptRecordsError`` naming the batch's offset.
"""

from __future__ import annotations

import pytest

from rivven_broker.server.scrubber import ScrubPlan
from rivven_broker.storage.errors import CorruptRecordsError
from rivven_broker.storage.memory_store import MemoryFileStore
from tests.unit.storage.log_batches import make_batch
from tests.unit.storage.test_log_segments import open_log


def _walk(plan, partitions, sealed, sizes, steps=100):
    seen = []
    for _ in range(steps):
        where = plan.next(partitions, sealed)
        if where is None:
            return seen
        key, base, position = where
        seen.append((key, base, position))
        after = position + 10
        plan.done(after if after < sizes[(key, base)] else None, partitions, sealed)
    return seen


def test_the_plan_visits_every_sealed_segment_round_robin_and_counts_passes():
    partitions = [("a", 0), ("a", 1), ("b", 0)]
    sealed = {("a", 0): [0, 100], ("a", 1): [], ("b", 0): [0]}
    sizes = {(("a", 0), 0): 20, (("a", 0), 100): 10, (("b", 0), 0): 10}
    plan = ScrubPlan()
    seen = _walk(plan, partitions, sealed, sizes, steps=4)
    assert seen == [(("a", 0), 0, 0), (("a", 0), 0, 10), (("a", 0), 100, 0), (("b", 0), 0, 0)]
    assert _walk(plan, partitions, sealed, sizes, steps=1) == [(("a", 0), 0, 0)]
    assert plan.passes == 1


def test_the_plan_skips_what_went_away_and_idles_when_nothing_is_sealed():
    plan = ScrubPlan()
    partitions = [("a", 0)]
    assert plan.next(partitions, {("a", 0): []}) is None
    plan.next(partitions, {("a", 0): [0, 50]})
    assert plan.next(partitions, {("a", 0): [50]}) == (("a", 0), 50, 0)  # 0 deleted
    assert plan.next([("z", 0)], {("z", 0): [7]}) == (("z", 0), 7, 0)  # the partition went


def test_scrub_checks_sealed_segments_and_names_a_damaged_batch():
    store = MemoryFileStore()
    plog = open_log(store)
    for _ in range(40):
        plog.append(make_batch(2, b"r" * 39), 0)
    bases = plog.sealed_segment_bases()
    assert len(bases) >= 2
    for base in bases:
        position = 0
        while position is not None:
            position = plog.scrub(base, position, 256)
    segment = plog._segments[1]
    middle = segment.size // 2
    byte = store.pread(segment.log_handle, 1, middle)
    store.pwrite(segment.log_handle, bytes([byte[0] ^ 0xFF]), middle)
    with pytest.raises(CorruptRecordsError) as found:
        position = 0
        while position is not None:
            position = plog.scrub(segment.base_offset, position, 100_000)
    assert segment.base_offset <= found.value.offset < segment.next_offset
    assert found.value.file == segment.log_path
    assert plog.scrub(10**9, 0, 100) is None  # not a sealed segment
