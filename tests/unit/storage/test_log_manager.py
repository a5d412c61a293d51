"""LogManager: topics and their logs over a FileStore, including crashes mid-create/delete.

Method: drive the real ``LogManager``/``PartitionLog`` on ``MemoryFileStore`` (and on real files
in ``tmp_path`` for the main life cycle). Crash safety is checked exhaustively: a fault hook makes
the k-th store call of ``create_topic``/``delete_topic`` fail, the store then crashes (dropping
everything unsynced), and the reopened manager must show the topic either fully there or fully
gone, never half, and never a deleted topic back.
"""

from __future__ import annotations

import errno
import posixpath
import random
from pathlib import Path
from typing import Callable

import pytest

from rivven_broker.protocol import limits
from rivven_broker.storage.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidTopicNameError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)
from rivven_broker.storage.file_store import FileStore, OsFileStore
from rivven_broker.storage.handle_cache import BoundedHandles
from rivven_broker.storage.log_manager import DELETE_SUFFIX, SPACE_RESERVE_FILE, LogManager
from rivven_broker.storage.memory_store import MemoryFileStore
from rivven_broker.storage.registry import REGISTRY_FILE, parse_partition_dir

from .log_batches import make_batch


class DirRenameStore(MemoryFileStore):
    """``MemoryFileStore`` plus directory renames, which the base store does not model.

    Directories there are keyed by path, so a renamed directory's entries move to the new path
    in both layers. If a crash comes before the parent is synced, the old name comes back with
    no entries (a real file system would bring back its files); the log manager only renames
    directories it is deleting, so that difference only loses files already condemned.
    """

    def rename(self, source: str, target: str) -> None:
        old, new = source.strip("/"), target.strip("/")
        if old not in self._live:  # a file: the base store handles it
            super().rename(source, target)
            return
        self._hook("rename", source)
        assert not self.exists(new), new
        old_parent, old_name = posixpath.split(old)
        new_parent, new_name = posixpath.split(new)
        del self._live[old_parent][old_name]
        self._live[new_parent][new_name] = None
        for layer in (self._live, self._durable):
            for path in [p for p in layer if p == old or p.startswith(old + "/")]:
                layer[new + path[len(old) :]] = layer.pop(path)


def _store_kinds() -> list[str]:
    return ["memory", "os", "os-4-open"]


@pytest.fixture(params=_store_kinds())
def store(request: pytest.FixtureRequest, tmp_path: Path) -> FileStore:
    if request.param == "memory":
        return DirRenameStore()
    if request.param == "os-4-open":  # the broker's descriptor cache, at its smallest
        return BoundedHandles(OsFileStore(str(tmp_path)), 4)
    return OsFileStore(str(tmp_path))


def _append(manager: LogManager, topic: str, partition: int, count: int, now_ms: int = 1) -> None:
    log = manager.get_log(topic, partition)
    for number in range(count):
        log.append(make_batch(2, bytes([number]) * 50, max_timestamp=now_ms), now_ms)


def _partition_dirs(store: FileStore) -> set[str]:
    return {name for name in store.listdir("") if parse_partition_dir(name) is not None}


def test_create_append_reopen_delete(store: FileStore) -> None:
    manager, reports = LogManager.open(store, 0, rng=random.Random(1))
    assert reports == {} and manager.open_report.registry_source == "empty"
    info = manager.create_topic("my-orders", 3, 1, {"retention.ms": "1000"}, now_ms=5)
    assert (info.partitions, info.replication_factor, info.created_ms) == (3, 1, 5)
    assert info.config.retention_ms == 1000
    assert _partition_dirs(store) == {"my-orders-0", "my-orders-1", "my-orders-2"}
    _append(manager, "my-orders", 1, 3)
    manager.check_invariants()
    manager.close()

    manager, reports = LogManager.open(store, 10, rng=random.Random(2))
    assert manager.open_report.registry_source == "file"
    assert set(reports) == {("my-orders", 0), ("my-orders", 1), ("my-orders", 2)}
    assert all(not report.cuts for report in reports.values())
    assert manager.topics()["my-orders"] == info
    assert manager.has_topic("my-orders") and not manager.has_topic("my-order")
    log = manager.get_log("my-orders", 1)
    assert (log.log_start_offset, log.log_end_offset) == (0, 6)
    assert log.read(0, 1 << 20).records  # the data survived the reopen
    manager.check_invariants()

    manager.delete_topic("my-orders")
    assert dict(manager.topics()) == {} and not manager.has_topic("my-orders")
    assert store.listdir("") == sorted([REGISTRY_FILE, SPACE_RESERVE_FILE])
    with pytest.raises(UnknownTopicOrPartitionError):
        manager.get_log("my-orders", 0)
    manager.close()
    manager, reports = LogManager.open(store, 20)
    assert dict(manager.topics()) == {} and reports == {}
    manager.close()
    if isinstance(store, MemoryFileStore):
        assert store.open_handles() == 0


def test_recreated_topic_starts_empty(store: FileStore) -> None:
    manager, _ = LogManager.open(store, 0)
    first = manager.create_topic("t", 1, 1, {}, 0)
    _append(manager, "t", 0, 2)
    manager.delete_topic("t")
    second = manager.create_topic("t", 2, 1, {}, 1)
    assert second.topic_id != first.topic_id
    assert manager.get_log("t", 0).log_end_offset == 0
    manager.close()


def test_create_rejects_bad_arguments_and_creates_nothing() -> None:
    store = DirRenameStore()
    manager, _ = LogManager.open(store, 0)
    manager.create_topic("taken", 1, 1, {}, 0)
    before = store.listdir("")
    cases: list[tuple[type[Exception], Callable[[], object]]] = [
        (TopicExistsError, lambda: manager.create_topic("taken", 1, 1, {}, 0)),
        (InvalidTopicNameError, lambda: manager.create_topic("bad name", 1, 1, {}, 0)),
        (InvalidTopicNameError, lambda: manager.create_topic(".hidden", 1, 1, {}, 0)),
        (InvalidPartitionsError, lambda: manager.create_topic("p", 0, 1, {}, 0)),
        (InvalidPartitionsError, lambda: manager.create_topic("p", limits.partitions_per_topic_max + 1, 1, {}, 0)),
        (InvalidReplicationFactorError, lambda: manager.create_topic("r", 1, 0, {}, 0)),
        (InvalidReplicationFactorError, lambda: manager.create_topic("r", 1, limits.replication_factor_max + 1, {}, 0)),
        (InvalidConfigError, lambda: manager.create_topic("c", 1, 1, {"segment.ms": "0"}, 0)),
        (InvalidConfigError, lambda: manager.create_topic("c", 1, 1, {"nope": "1"}, 0)),
    ]
    for error, call in cases:
        with pytest.raises(error):
            call()
    assert store.listdir("") == before and list(manager.topics()) == ["taken"]
    manager.check_invariants()


def test_unknown_topics_and_partitions() -> None:
    manager, _ = LogManager.open(DirRenameStore(), 0)
    manager.create_topic("t", 2, 1, {}, 0)
    for call in (
        lambda: manager.get_log("t", 2),
        lambda: manager.get_log("u", 0),
        lambda: manager.delete_topic("u"),
        lambda: manager.alter_topic_config("u", {}),
    ):
        with pytest.raises(UnknownTopicOrPartitionError):
            call()
    with pytest.raises(UnknownTopicOrPartitionError) as info:
        manager.get_log("t", 5)
    assert (info.value.topic, info.value.partition) == ("t", 5)


def test_alter_topic_config_applies_and_persists() -> None:
    store = DirRenameStore()
    manager, _ = LogManager.open(store, 0, preallocate_bytes=4096)
    manager.create_topic("t", 2, 1, {"retention.ms": "1000"}, 0)
    log = manager.get_log("t", 0)
    info = manager.alter_topic_config("t", {"retention.ms": None, "segment.bytes": "2048"})
    assert info.config.to_strings(include_defaults=False) == {"segment.bytes": "2048"}
    assert manager.get_log("t", 0) is log  # the same object, new settings
    assert log.config.segment_bytes == 2048 and log.config.preallocate_bytes == 4096
    assert log.config.retention_ms == limits.retention_ms_default
    with pytest.raises(InvalidConfigError):
        manager.alter_topic_config("t", {"segment.bytes": "1"})
    assert manager.topics()["t"] == info and log.config.segment_bytes == 2048
    manager.check_invariants()
    manager.close()
    manager, _ = LogManager.open(store, 0, preallocate_bytes=4096)
    assert manager.topics()["t"] == info
    assert manager.get_log("t", 1).config.segment_bytes == 2048
    manager.check_invariants()


def test_topic_ids_from_rng_and_from_a_persisted_counter() -> None:
    ids = []
    for _ in range(2):
        manager, _ = LogManager.open(DirRenameStore(), 0, rng=random.Random(7))
        ids.append(manager.create_topic("a", 1, 1, {}, 0).topic_id)
    assert ids[0] == ids[1] and len(ids[0]) == 32  # deterministic from the injected rng

    store = DirRenameStore()
    manager, _ = LogManager.open(store, 0)
    first = manager.create_topic("a", 1, 1, {}, 0).topic_id
    manager.delete_topic("a")
    manager.close()
    manager, _ = LogManager.open(store, 0)
    second = manager.create_topic("a", 1, 1, {}, 0).topic_id
    assert first != second  # the counter survived the reopen: no id is reused


def test_registry_fallback_recovers_topics_and_rewrites_registry(store: FileStore) -> None:
    manager, _ = LogManager.open(store, 0)
    manager.create_topic("keep-me", 2, 3, {"retention.ms": "5"}, 0)
    _append(manager, "keep-me", 1, 2)
    manager.close()
    store.remove(REGISTRY_FILE)
    manager, reports = LogManager.open(store, 99)
    report = manager.open_report
    assert report.registry_fallback and "missing" in (report.registry_problem or "")
    info = manager.topics()["keep-me"]
    assert info.partitions == 2 and info.replication_factor == 1 and info.created_ms == 99
    assert info.config.retention_ms == limits.retention_ms_default  # configs are lost: defaults
    assert manager.get_log("keep-me", 1).log_end_offset == 4  # but the data is not
    assert set(reports) == {("keep-me", 0), ("keep-me", 1)}
    manager.close()
    manager, _ = LogManager.open(store, 100)
    assert manager.open_report.registry_source == "file"  # the recovered registry was saved
    manager.close()


def test_open_removes_leftover_delete_dirs_and_orphans() -> None:
    store = DirRenameStore()
    manager, _ = LogManager.open(store, 0)
    manager.create_topic("t", 1, 1, {}, 0)
    manager.close()
    for directory in ("gone-0", "t-3", f"x-0.ab{DELETE_SUFFIX}"):
        store.makedirs(directory)
        handle = store.open(f"{directory}/00000000000000000000.log")
        store.pwrite(handle, b"junk", 0)
        store.close(handle)
    manager, reports = LogManager.open(store, 0)
    assert manager.open_report.removed_dirs == tuple(sorted(
        [f"x-0.ab{DELETE_SUFFIX}", f"gone-0.orphan{DELETE_SUFFIX}", f"t-3.orphan{DELETE_SUFFIX}"]
    ))
    assert store.listdir("") == sorted([SPACE_RESERVE_FILE, "t-0", REGISTRY_FILE])
    assert set(reports) == {("t", 0)}
    manager.close()


def test_open_recreates_a_missing_partition_dir() -> None:
    store = DirRenameStore()
    manager, _ = LogManager.open(store, 0)
    manager.create_topic("t", 2, 1, {}, 0)
    manager.close()
    for name in store.listdir("t-1"):
        store.remove(f"t-1/{name}")
    store.remove_dir("t-1")
    manager, _ = LogManager.open(store, 0)
    assert manager.open_report.created_dirs == ("t-1",)
    manager.check_invariants()


class _FailAt:
    """A fault hook that raises EIO at the ``target``-th store call (0-based)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.calls = 0

    def __call__(self, op: str, path: str) -> None:
        self.calls += 1
        if self.calls - 1 == self.target:
            raise OSError(errno.EIO, f"injected at {op} {path}")


def _crash_points(run: Callable[[DirRenameStore, LogManager], None], prepare: Callable[[LogManager], None]):  # type: ignore[no-untyped-def]
    """Yield (store, completed) for a crash at every store call of ``run``, then one after it."""
    target = 0
    while True:
        store = DirRenameStore()
        manager, _ = LogManager.open(store, 0)
        prepare(manager)
        hook = _FailAt(target)
        store.fault_hook = hook
        completed = True
        try:
            run(store, manager)
        except OSError:
            completed = False
        store.fault_hook = None
        store.crash(random.Random(target), tear_last_write=True)
        yield store, completed
        if completed:
            return
        target += 1


def _prepare_doomed(manager: LogManager) -> None:
    manager.create_topic("other", 1, 1, {}, 0)
    manager.create_topic("doomed-1", 3, 1, {}, 0)
    for partition in range(3):
        _append(manager, "doomed-1", partition, 2)
        manager.get_log("doomed-1", partition).flush()


def test_delete_survives_a_crash_at_every_step() -> None:
    points = 0
    for store, completed in _crash_points(lambda _, m: m.delete_topic("doomed-1"), _prepare_doomed):
        points += 1
        manager, _ = LogManager.open(store, 0)
        topics = manager.topics()
        assert "other" in topics
        doomed_dirs = {d for d in _partition_dirs(store) if d.startswith("doomed-1-")}
        if "doomed-1" in topics:  # crashed before the commit point: fully there, data intact
            assert not completed
            assert doomed_dirs == {"doomed-1-0", "doomed-1-1", "doomed-1-2"}
            assert all(manager.get_log("doomed-1", p).log_end_offset == 4 for p in range(3))
        else:
            assert doomed_dirs == set()
            assert not any(name.endswith(DELETE_SUFFIX) for name in store.listdir(""))
        manager.check_invariants()
        manager.close()
        again, _ = LogManager.open(store, 0)  # and it stays that way
        assert ("doomed-1" in again.topics()) == ("doomed-1" in topics)
        again.close()
    assert points > 8


def test_create_survives_a_crash_at_every_step() -> None:
    def create(_: DirRenameStore, manager: LogManager) -> None:
        manager.create_topic("fresh", 3, 1, {"retention.ms": "7"}, 0)

    for store, completed in _crash_points(create, lambda m: None):
        manager, _ = LogManager.open(store, 0)
        if "fresh" in manager.topics():
            assert manager.topics()["fresh"].config.retention_ms == 7
            assert {d for d in _partition_dirs(store)} == {"fresh-0", "fresh-1", "fresh-2"}
        else:
            assert not completed and _partition_dirs(store) == set()
        manager.check_invariants()
        manager.close()


def test_apply_retention_by_size_and_not_for_compacted_topics() -> None:
    manager, _ = LogManager.open(DirRenameStore(), 0)
    sized = {"segment.bytes": "1024", "retention.bytes": "1024"}
    manager.create_topic("sized", 1, 1, sized, 0)
    manager.create_topic("compacted", 1, 1, {**sized, "cleanup.policy": "compact"}, 0)
    for topic in ("sized", "compacted"):
        _append(manager, topic, 0, 40)
    assert manager.apply_retention(now_ms=1) > 0
    assert manager.get_log("sized", 0).log_start_offset > 0
    assert manager.get_log("compacted", 0).log_start_offset == 0
    manager.check_invariants()
    manager.close()


def test_apply_retention_by_time(tmp_path: Path) -> None:
    manager, _ = LogManager.open(OsFileStore(str(tmp_path)), 0)
    manager.create_topic("t", 1, 1, {"segment.bytes": "1024", "retention.ms": "1000"}, 0)
    _append(manager, "t", 0, 30, now_ms=10)
    assert manager.apply_retention(now_ms=500) == 0
    assert manager.apply_retention(now_ms=5000) > 0
    manager.check_invariants()
    manager.close()


def test_a_delete_that_fails_before_its_commit_point_changes_nothing() -> None:
    store = DirRenameStore()
    manager, _ = LogManager.open(store, 0)
    _prepare_doomed(manager)
    store.fault_hook = _FailAt(0)  # the registry save's first call
    with pytest.raises(OSError):
        manager.delete_topic("doomed-1")
    store.fault_hook = None
    assert "doomed-1" in manager.topics()
    _append(manager, "doomed-1", 0, 1)  # the logs are still open and usable
    manager.check_invariants()
    manager.delete_topic("doomed-1")
    assert "doomed-1" not in manager.topics()
    manager.check_invariants()
