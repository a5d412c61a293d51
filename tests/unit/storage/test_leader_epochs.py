"""The leader-epoch cache and follower appends (KIP-101)."""

from __future__ import annotations

import pytest

from rivven_broker.records.header import InvalidBatchError, iter_batches
from rivven_broker.storage.leader_epochs import LEADER_EPOCH_FILE, LeaderEpochCache
from rivven_broker.storage.log_config import LogConfig
from rivven_broker.storage.memory_store import MemoryFileStore
from rivven_broker.storage.partition_log import PartitionLog
from tests.unit.storage.log_batches import make_batch


def test_end_offset_for_answers_where_an_epoch_ended() -> None:
    cache = LeaderEpochCache(None, "d", [(1, 0), (3, 10), (4, 25)])
    assert cache.end_offset_for(1, 40) == (1, 10)
    assert cache.end_offset_for(2, 40) == (1, 10)  # unknown epoch: the one before it
    assert cache.end_offset_for(3, 40) == (3, 25)
    assert cache.end_offset_for(9, 40) == (4, 40)  # the latest ends at the log end
    assert cache.end_offset_for(0, 40) == (-1, -1)
    assert cache.epoch_at(9) == 1 and cache.epoch_at(10) == 3 and cache.epoch_at(99) == 4


def test_truncation_drops_and_folds_entries() -> None:
    cache = LeaderEpochCache(None, "d", [(1, 0), (3, 10), (4, 25)])
    assert cache.truncate_from_end(25)
    assert cache.entries == [(1, 0), (3, 10)]
    assert cache.truncate_from_start(12)
    assert cache.entries == [(3, 12)]
    assert not cache.assign(3, 20)  # an epoch is assigned once
    assert cache.assign(5, 20)
    assert cache.entries == [(3, 12), (5, 20)]


def test_the_checkpoint_survives_reopening_and_drops_entries_past_the_log_end() -> None:
    store = MemoryFileStore()
    store.makedirs("p")
    cache = LeaderEpochCache.open(store, "p", 0)
    cache.assign(1, 0)
    cache.assign(2, 30)
    assert LeaderEpochCache.open(store, "p", 100).entries == [(1, 0), (2, 30)]
    assert LeaderEpochCache.open(store, "p", 30).entries == [(1, 0)]  # a crash cut the log


def test_the_highest_epoch_outlives_a_cut_of_all_its_records() -> None:
    """A broker that led epoch 2 and lost every record of it in a crash must still know it
    led epoch 2 (it must not lead it again: ``ReplicaManager._lead``)."""
    store = MemoryFileStore()
    store.makedirs("p")
    cache = LeaderEpochCache.open(store, "p", 0)
    cache.assign(1, 0)
    cache.assign(2, 30)
    reopened = LeaderEpochCache.open(store, "p", 30)  # the crash cut epoch 2's records
    assert reopened.entries == [(1, 0)] and reopened.latest_epoch == 1
    assert reopened.highest_epoch == 2
    assert LeaderEpochCache.open(store, "p", 0).highest_epoch == 2  # and everything else
    empty = LeaderEpochCache.open(store, "p", 0)
    assert empty.entries == [] and empty.assign(1, 0)  # a follower refetching epoch 1
    assert empty.highest_epoch == 2


def _checkpoint_holding(text: bytes) -> MemoryFileStore:
    store = MemoryFileStore()
    store.makedirs("p")
    handle = store.open(f"p/{LEADER_EPOCH_FILE}")
    store.pwrite(handle, text, 0)
    store.close(handle)
    return store


def test_a_version_1_checkpoint_is_read() -> None:
    store = _checkpoint_holding(b"rivven-leader-epochs 1\n1 0\n4 12\n")
    cache = LeaderEpochCache.open(store, "p", 20)
    assert cache.entries == [(1, 0), (4, 12)] and cache.highest_epoch == 4


def test_a_damaged_checkpoint_starts_empty() -> None:
    store = _checkpoint_holding(b"garbage\n1 x\n")
    assert LeaderEpochCache.open(store, "p", 10).entries == []


def _log(store: MemoryFileStore, name: str) -> PartitionLog:
    return PartitionLog.open(store, name, LogConfig(), 0)[0]


def _batch(value: bytes) -> bytes:
    return make_batch(1, value)


def test_a_follower_keeps_the_leaders_offsets_and_epochs() -> None:
    store = MemoryFileStore()
    leader, follower = _log(store, "leader"), _log(store, "follower")
    leader.become_leader(3)
    leader.append(_batch(b"a"), 1)
    leader.append(_batch(b"b"), 1)
    leader.become_leader(5)
    leader.append(_batch(b"c"), 1)
    copied = leader.read(0, 1 << 20).records
    info = follower.append_as_follower(bytes(copied), 2)
    assert (info.base_offset, info.last_offset) == (0, 2)
    assert follower.epochs.entries == [(3, 0), (5, 2)] == leader.epochs.entries
    assert bytes(follower.read(0, 1 << 20).records) == bytes(copied)
    with pytest.raises(InvalidBatchError):
        follower.append_as_follower(bytes(copied), 3)  # below the log end: refused
    follower.truncate_to(2)
    assert follower.epochs.entries == [(3, 0)]
    assert [h.partition_leader_epoch for _, h in iter_batches(
        bytes(follower.read(0, 1 << 20).records))] == [3, 3]


def test_the_high_watermark_checkpoint_round_trips_and_ignores_damage() -> None:
    from rivven_broker.storage.high_watermarks import (
        HIGH_WATERMARKS_FILE,
        read_high_watermarks,
        write_high_watermarks,
    )
    store = MemoryFileStore()
    assert read_high_watermarks(store) == {}
    values = {("orders", 0): 10, ("orders", 1): 0, ("a.b-c", 7): 123}
    write_high_watermarks(store, values)
    assert read_high_watermarks(store) == values
    handle = store.open(HIGH_WATERMARKS_FILE)
    store.pwrite(handle, b"rivven-high-watermarks 1\n12 x\n", 0)
    store.close(handle)
    assert read_high_watermarks(store) == {}
