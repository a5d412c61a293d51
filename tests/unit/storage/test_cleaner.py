"""The cleaner (compaction, the doing half) on a MemoryFileStore.

Goal: a cleaned partition keeps the latest record per key at its original offset, serves
reads across the gaps, survives reopening, and a crash at *every* mutating store call of a
cleaning leaves each segment either wholly old or wholly new, never neither or both.
Method: real ``PartitionLog``s over ``MemoryFileStore`` filled with ``BatchBuilder`` batches
(small ``segment.bytes`` so there are many sealed segments); the crash sweep injects an
``OSError`` at call k of the cleaning (k = 1, 2, ... until a run completes), crashes the
store and reopens the log, comparing every segment's records with its two allowed versions.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from rivven_broker.records import BatchBuilder, decode_records
from rivven_broker.records.header import iter_batches, validate
from rivven_broker.storage.cleaner import clean_log, prepare_clean, rewrite_batch
from rivven_broker.storage.handle_cache import BoundedHandles
from rivven_broker.storage.log_config import LogConfig
from rivven_broker.storage.memory_store import MemoryFileStore
from rivven_broker.storage.partition_log import PartitionLog

DIRECTORY = "t-0"
CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=256)


def batch(records: list[tuple[bytes | None, bytes | None]], timestamp_ms: int = 1000,
          compression: str = "none") -> bytes:
    builder = BatchBuilder(batch_bytes_max=1 << 20, compression=compression)
    for key, value in records:
        assert builder.append(timestamp_ms, key, value)
    return builder.build()


def all_records(log: PartitionLog) -> list:
    out, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        result = log.read(offset, 1 << 20)
        out += decode_records(result.records, min_offset=offset)
        offset = result.next_offset
    return out


def latest(records) -> dict:
    state: dict = {}
    for record in records:
        state[record.key] = record.value
    return state


def live(records) -> dict:
    """The key map with deleted keys left out (what remains once tombstones expire)."""
    return {key: value for key, value in latest(records).items() if value is not None}


def filled_log(store: MemoryFileStore, rng: random.Random, batches: int = 60) -> PartitionLog:
    log, _ = PartitionLog.open(store, DIRECTORY, CONFIG, 0)
    for i in range(batches):
        records = []
        for _ in range(rng.randint(1, 4)):
            key = b"k%d" % rng.randrange(8)
            value = None if rng.random() < 0.1 else b"v%d" % i
            records.append((key, value))
        codec = ("zstd", "none", "gzip", "none", "snappy", "lz4")[i % 6]
        log.append(batch(records, 1000 + i, codec), 1000 + i)
    log.flush()
    return log


def test_rewrite_batch_keeps_offsets_timestamps_and_bytes():
    for compression in ("none", "gzip", "snappy", "lz4", "zstd"):
        original = batch([(b"a", b"1" * 50), (b"b", b"2" * 50), (b"c", None), (b"d", b"4" * 50)],
                         compression=compression)
        rewritten = rewrite_batch(original, {1, 3})
        header = validate(rewritten, dense=False)
        assert header.compression == validate(original, dense=False).compression  # kept
        assert (header.record_count, header.last_offset_delta) == (2, 3)
        before = {r.offset: r for r in decode_records(original)}
        assert decode_records(rewritten) == [before[1], before[3]]
        empty = rewrite_batch(original, set())
        header = validate(empty, dense=False)
        assert (header.record_count, header.last_offset_delta, header.compression) == (0, 3, 0)
        assert decode_records(empty) == []


def test_cleaning_keeps_latest_per_key_and_reads_across_gaps():
    store = MemoryFileStore()
    log = filled_log(store, random.Random(1))
    before = all_records(log)
    assert len(log.sealed_segments()) >= 3
    result = clean_log(log, now_ms=10**12, delete_retention_ms=10**15)  # tombstones stay
    assert result.segments_cleaned >= 1 and result.records_removed > 0
    after = all_records(log)
    log.check_invariants(deep=True)
    assert latest(after) == latest(before)
    by_offset = {r.offset: r for r in before}
    assert all(by_offset[r.offset] == r for r in after)  # same record at the same offset
    active = log.segment_base_offsets[-1]
    assert [r for r in after if r.offset >= active] == [r for r in before if r.offset >= active]
    removed = sorted(set(by_offset) - {r.offset for r in after})
    for offset in removed:  # a fetch of a removed offset starts at the next kept record
        result = log.read(offset, 1 << 20)
        found = decode_records(result.records, min_offset=offset)
        assert not found or found[0].offset > offset
        assert result.next_offset > offset
    again = clean_log(log, now_ms=10**12, delete_retention_ms=10**15)
    assert again.records_removed == 0  # planning again removes nothing more
    log.close()
    reopened, _ = PartitionLog.open(store, DIRECTORY, CONFIG, 0)
    assert all_records(reopened) == after
    reopened.check_invariants(deep=True)
    reopened.close()


def test_cleaning_through_the_descriptor_cache_swaps_files_under_evicted_handles():
    """The broker's files go through ``BoundedHandles``: with 4 descriptors for dozens of
    files, the cleaner's renames (``.cleaned`` -> ``.swap`` -> final) and removals happen
    to files whose descriptors were closed, and every read after follows the new files."""
    store = MemoryFileStore()
    files = BoundedHandles(store, 4)
    log = filled_log(files, random.Random(3))
    before = all_records(log)
    result = clean_log(log, now_ms=10**12, delete_retention_ms=10**15)
    assert result.segments_cleaned >= 1 and files.statistics().reopened > 0
    after = all_records(log)
    assert latest(after) == latest(before)
    log.check_invariants(deep=True)
    log.close()
    assert store.open_handles() == 0
    reopened, _ = PartitionLog.open(BoundedHandles(store, 4), DIRECTORY, CONFIG, 0)
    assert all_records(reopened) == after
    reopened.close()


def test_expired_tombstones_go_with_their_older_values():
    store = MemoryFileStore()
    log, _ = PartitionLog.open(store, DIRECTORY, CONFIG, 0)
    log.append(batch([(b"gone", b"x" * 900), (b"kept", b"y")], 1000), 1000)
    log.append(batch([(b"gone", None)], 2000), 2000)
    log.append(batch([(b"other", b"z" * 1500)], 3000), 3000)  # rolls: the above are sealed
    log.append(batch([(b"other", b"w")], 4000), 4000)
    log.flush()
    clean_log(log, now_ms=2500, delete_retention_ms=1000)  # the tombstone is still young
    assert latest(all_records(log))[b"gone"] is None
    clean_log(log, now_ms=3001, delete_retention_ms=1000)
    keys = [r.key for r in all_records(log)]
    assert b"gone" not in keys and b"kept" in keys
    log.check_invariants(deep=True)
    log.close()


def test_runs_of_emptied_plain_batches_merge_into_one():
    store = MemoryFileStore()
    log, _ = PartitionLog.open(store, DIRECTORY, CONFIG, 0)
    for i in range(10):
        log.append(batch([(b"k", b"v%d" % i)], 1000 + i), 1000 + i)
    log.roll(2000)
    log.append(batch([(b"x", b"1")], 3000), 3000)
    log.flush()
    clean_log(log, now_ms=5000, delete_retention_ms=10**9)
    (segment,) = log.sealed_segments()
    data = segment.read(0, segment.size)
    headers = [h for _, h in iter_batches(data)]
    assert [(h.base_offset, h.last_offset_delta, h.record_count) for h in headers] == [
        (0, 8, 0), (9, 0, 1)
    ]
    log.check_invariants(deep=True)
    log.close()


class _Fault(OSError):
    pass


def _segment_views(records, bases) -> list[list]:
    """Records split by segment (by the base offsets of the sealed segments)."""
    views = []
    for low, high in zip(bases, bases[1:]):
        views.append([r for r in records if low <= r.offset < high])
    return views


def test_a_crash_at_every_step_leaves_old_or_new_per_segment():
    rng_seed = 7
    reference_store = MemoryFileStore()
    reference = filled_log(reference_store, random.Random(rng_seed))
    bases = list(reference.segment_base_offsets)
    old = all_records(reference)
    clean_log(reference, now_ms=10**12, delete_retention_ms=0)
    new = all_records(reference)
    assert new != old
    old_views, new_views = _segment_views(old, bases), _segment_views(new, bases)
    step = 0
    while True:
        step += 1
        store = MemoryFileStore()
        log = filled_log(store, random.Random(rng_seed))
        calls = 0

        def hook(op: str, path: str) -> None:
            nonlocal calls
            calls += 1
            if calls == step:
                raise _Fault("injected")

        store.fault_hook = hook
        try:
            clean_log(log, now_ms=10**12, delete_retention_ms=0)
            completed = True
        except OSError:
            completed = False
        store.fault_hook = None
        store.crash()
        reopened, _ = PartitionLog.open(store, DIRECTORY, CONFIG, 0)
        records = all_records(reopened)
        assert live(records) == live(old)  # compaction never changes the live key map
        for index, view in enumerate(_segment_views(records, bases)):
            assert view in (old_views[index], new_views[index]), (step, index)
        names = store.listdir(DIRECTORY)
        assert not [n for n in names if n.endswith((".cleaned", ".swap"))], (step, names)
        reopened.check_invariants(deep=True)
        reopened.close()
        if completed:
            assert records == new
            break
    assert step > 20  # the sweep really went through the swap


def test_prepare_changes_nothing_until_commit():
    store = MemoryFileStore()
    log = filled_log(store, random.Random(3))
    before = all_records(log)
    prepared = prepare_clean(log, 10**12, 10**15)
    assert prepared.segments
    assert all_records(log) == before
    assert any(n.endswith(".log.cleaned") for n in store.listdir(DIRECTORY))
    log.close()
    store.crash()  # prepared but never swapped: the leftovers go, the data stays
    reopened, _ = PartitionLog.open(store, DIRECTORY, CONFIG, 0)
    assert all_records(reopened) == before
    assert not [n for n in store.listdir(DIRECTORY) if ".cleaned" in n]
    reopened.close()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.booleans(), st.integers(1, 3)), min_size=1,
                max_size=40))
def test_property_the_key_map_survives_cleaning(ops):
    store = MemoryFileStore()
    log, _ = PartitionLog.open(store, DIRECTORY, LogConfig(segment_bytes=1024), 0)
    for i, (key, tombstone, repeat) in enumerate(ops):
        records = [(b"k%d" % key, None if tombstone else b"v%d" % i * 20)] * repeat
        log.append(batch(records, 1000 + i), 1000 + i)
    before = all_records(log)
    clean_log(log, now_ms=10**12, delete_retention_ms=10**15)
    after = all_records(log)
    assert latest(after) == latest(before)
    log.check_invariants(deep=True)
    log.close()
