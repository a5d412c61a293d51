"""LogManager.add_partitions: a topic's partition count grows, durably and crash-safely.

Method: drive the real ``LogManager`` on ``MemoryFileStore`` (with directory renames) and on
real files. Growing keeps every existing partition's data and adds empty logs at offset 0;
refusals (not growing, over the limit, unknown topic) change nothing on disk. Crash safety is
checked exhaustively like create/delete in ``test_log_manager``: the k-th store call fails, the
store crashes, and the reopened manager must show either the old count (with no directory of a
new partition left) or the new one (with every directory), never anything in between.
"""

from __future__ import annotations

import pytest

from rivven_broker.protocol import limits
from rivven_broker.storage.errors import InvalidPartitionsError, UnknownTopicOrPartitionError
from rivven_broker.storage.file_store import FileStore
from rivven_broker.storage.log_manager import LogManager
from rivven_broker.storage.registry import REGISTRY_FILE

from .log_batches import make_batch
from .test_log_manager import DirRenameStore, _append, _crash_points, _partition_dirs, store

__all__ = ["store"]  # the fixture, shared with test_log_manager


def _registry_bytes(store: FileStore) -> bytes:
    handle = store.open(REGISTRY_FILE, create=False)
    try:
        return store.pread(handle, store.size(handle), 0)
    finally:
        store.close(handle)


def test_grow_keeps_old_data_adds_empty_partitions_and_persists(store: FileStore) -> None:
    manager, _ = LogManager.open(store, 0)
    created = manager.create_topic("t", 2, 1, {"retention.ms": "60000"}, 5)
    _append(manager, "t", 0, 3)
    _append(manager, "t", 1, 1)
    grown = manager.add_partitions("t", 5, 9)
    assert grown.partitions == 5
    assert (grown.topic_id, grown.created_ms, grown.config) == (
        created.topic_id, created.created_ms, created.config
    )
    assert manager.topics()["t"] == grown
    ends = [manager.get_log("t", p).log_end_offset for p in range(5)]
    assert ends == [6, 2, 0, 0, 0]
    assert all(manager.get_log("t", p).log_start_offset == 0 for p in range(2, 5))
    assert _partition_dirs(store) == {f"t-{p}" for p in range(5)}
    manager.get_log("t", 4).append(make_batch(3, b"new"), 10)
    manager.check_invariants()
    manager.close()

    again, reports = LogManager.open(store, 20)
    assert again.topics()["t"].partitions == 5
    assert sorted(reports) == [("t", p) for p in range(5)]
    assert [again.get_log("t", p).log_end_offset for p in range(5)] == [6, 2, 0, 0, 3]
    assert again.topics()["t"].config.retention_ms == 60000
    again.check_invariants()
    again.close()


def test_refusals_change_nothing() -> None:
    store = DirRenameStore()
    manager, _ = LogManager.open(store, 0)
    manager.create_topic("t", 3, 1, {}, 0)
    before = _registry_bytes(store)
    for count, words in [(3, "can only grow"), (2, "can only grow"), (0, "can only grow"),
                         (limits.partitions_per_topic_max + 1, "at most")]:
        with pytest.raises(InvalidPartitionsError, match=words):
            manager.add_partitions("t", count, 1)
    with pytest.raises(UnknownTopicOrPartitionError):
        manager.add_partitions("missing", 5, 1)
    assert manager.topics()["t"].partitions == 3
    assert _registry_bytes(store) == before
    assert _partition_dirs(store) == {"t-0", "t-1", "t-2"}
    manager.check_invariants()


def test_grow_to_the_limit() -> None:
    manager, _ = LogManager.open(DirRenameStore(), 0)
    manager.create_topic("t", limits.partitions_per_topic_max - 1, 1, {}, 0)
    assert manager.add_partitions("t", limits.partitions_per_topic_max, 1).partitions == (
        limits.partitions_per_topic_max
    )
    manager.check_invariants()


def test_a_stale_directory_of_a_new_partition_is_replaced_by_an_empty_log() -> None:
    store = DirRenameStore()
    manager, _ = LogManager.open(store, 0)
    manager.create_topic("t", 1, 1, {}, 0)
    store.makedirs("t-1")  # left over by a failed grow (open would remove it; we got here first)
    handle = store.open("t-1/00000000000000000000.log", create=True)
    store.pwrite(handle, make_batch(4, b"stale"), 0)
    store.close(handle)
    manager.add_partitions("t", 2, 1)
    assert manager.get_log("t", 1).log_end_offset == 0
    manager.check_invariants()
    manager.close()
    again, _ = LogManager.open(store, 0)
    assert again.get_log("t", 1).log_end_offset == 0


def _prepare_grow(manager: LogManager) -> None:
    manager.create_topic("grow", 2, 1, {}, 0)
    for partition in range(2):
        _append(manager, "grow", partition, 2)
        manager.get_log("grow", partition).flush()


def test_grow_survives_a_crash_at_every_step() -> None:
    points = 0
    def grow(_: DirRenameStore, manager: LogManager) -> None:
        manager.add_partitions("grow", 5, 1)

    for store, completed in _crash_points(grow, _prepare_grow):
        points += 1
        manager, _ = LogManager.open(store, 0)
        count = manager.topics()["grow"].partitions
        assert count in (2, 5)
        assert count == 5 or not completed
        assert _partition_dirs(store) == {f"grow-{p}" for p in range(count)}
        assert [manager.get_log("grow", p).log_end_offset for p in range(count)] == (
            [4, 4] + [0] * (count - 2)
        )
        manager.check_invariants()
        manager.close()
        again, _ = LogManager.open(store, 0)  # and it stays that way
        assert again.topics()["grow"].partitions == count
        again.close()
    assert points > 5
