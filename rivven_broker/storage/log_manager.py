"""``LogManager``: every partition log of a data directory, and the topics they belong to.

Theory of operation
-------------------
A synchronous core over one ``FileStore`` (the data directory). It owns the topic registry
(``topics.json``, see ``registry.py``) and one ``PartitionLog`` per partition, in the directory
``<topic>-<partition>``. It never fsyncs appended data itself (that is the ``SyncWorker``'s
job); it fsyncs only what makes topic creation and deletion durable.

The registry is the commit point: a topic exists exactly when ``topics.json`` lists it.

- ``create_topic``: validate, make the partition directories (fsync the data directory), open
  an empty log in each, then save the registry. A crash before the save leaves directories no
  topic owns ("orphans"); ``open`` deletes them.
- ``delete_topic``: save the registry without the topic (the commit point), close the logs,
  rename every partition directory to ``<topic>-<p>.<id>-delete`` and fsync the data directory,
  then remove the files and directories. A crash at any point cannot resurrect the topic: before
  the save it was never deleted; after it the registry no longer lists it, a renamed directory
  no longer parses as a partition, and ``open`` finishes the removal of ``*-delete`` directories
  and of orphans. (The rename first also keeps a half-removed directory from ever being read as
  a partition, even by the registry's fallback scan.)
- ``add_partitions``: validate (the count only grows), retire stale directories of the new
  partition numbers (orphans of a failed grow), make the new partition directories (fsync the
  data directory), open an empty log in each, then save the registry with the new count. A
  crash before the save leaves the old count and the new directories as orphans, which
  ``open`` deletes; after it, the new count with every directory in place.
- ``open``: remove leftover ``*-delete`` directories, load the registry (falling back to a
  directory scan, which is then saved as the new registry; a fresh directory gets an empty
  registry at once, so a missing ``topics.json`` later means damage), delete orphans, create missing
  partition directories, and open (recover) every log. What happened is in ``open_report``.

Callers in trio code must ``await sync_worker.detach(log)`` for every log of a topic before
``delete_topic`` or ``close`` (those close logs; no fsync of theirs may be in flight).
``alter_topic_config`` changes the logs' ``config`` in place, so log objects stay valid.

Pure of clocks and randomness: ``now_ms`` and an optional ``random.Random`` for topic ids are
passed in (without one, ids come from a counter persisted in the registry).
"""

from __future__ import annotations

import random
import types
from typing import Callable, Iterator, Mapping, TypeVar

import attrs

from rivven_broker.protocol import limits
from rivven_broker.storage.errors import (
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    StorageError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)
from rivven_broker.storage.file_store import FileStore
from rivven_broker.storage.partition_log import PartitionLog
from rivven_broker.storage.recovery import RecoveryReport
from rivven_broker.storage.segment import disk_full
from rivven_broker.storage.registry import (
    TopicInfo,
    load_registry,
    parse_partition_dir,
    partition_dir,
    save_registry,
    validate_topic_name,
)
from rivven_broker.storage.topic_config import TopicConfig

__all__ = ["LogManager", "OpenReport", "TopicPartition", "DELETE_SUFFIX"]

TopicPartition = tuple[str, int]
#: Directories being deleted end with this (never a partition number, so never parsed as one).
T = TypeVar("T")
DELETE_SUFFIX = "-delete"
#: Room kept in the data directory for metadata writes on a full disk (``ensure_space_reserve``).
SPACE_RESERVE_FILE = ".space-reserve"
_NAME_BYTES_MAX = 255  # file name limit of common file systems


@attrs.frozen
class OpenReport:
    """What ``LogManager.open`` found and did, besides per-log recovery."""

    registry_source: str  # "file", "scan" (fallback: topics.json missing/unreadable) or "empty"
    registry_problem: str | None
    removed_dirs: tuple[str, ...]  # leftover *-delete and orphan directories removed
    created_dirs: tuple[str, ...]  # partition directories that were missing and made empty

    @property
    def registry_fallback(self) -> bool:
        return self.registry_source == "scan"


class LogManager:
    """Topics and their partition logs over one data directory. See the module docstring."""

    def __init__(
        self, store: FileStore, *, preallocate_bytes: int, rng: random.Random | None
    ) -> None:
        """Internal: use ``LogManager.open``."""
        assert preallocate_bytes >= 0
        self._store = store
        self._preallocate_bytes = preallocate_bytes
        self._rng = rng
        self._next_topic_number = 0
        self._topics: dict[str, TopicInfo] = {}
        self._logs: dict[TopicPartition, PartitionLog] = {}
        self._closed = False
        self.open_report = OpenReport("empty", None, (), ())

    # --- opening ---------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        store: FileStore,
        now_ms: int,
        *,
        preallocate_bytes: int = 0,
        rng: random.Random | None = None,
    ) -> tuple[LogManager, dict[TopicPartition, RecoveryReport]]:
        """Open (recover) every topic in the data directory. Blocks on file I/O.

        Returns the manager and each partition's ``RecoveryReport``; ``manager.open_report``
        says whether the registry fell back to a directory scan and which directories were
        removed or created.

        Raises:
            CorruptLogError: a log is corrupt below its recovery point (see recovery.py).
            OSError: the store failed.
        """
        manager = cls(store, preallocate_bytes=preallocate_bytes, rng=rng)
        removed = [name for name in store.listdir("") if name.endswith(DELETE_SUFFIX)]
        for name in removed:
            manager._remove_dir(name)
        loaded = load_registry(store, now_ms, manager._new_topic_id)
        manager._topics = dict(loaded.topics)
        manager._next_topic_number = max(manager._next_topic_number, loaded.next_topic_number)
        if loaded.source != "file":
            manager._save()  # a fresh directory gets an (empty) registry at once
        retired = [manager._retire_dir(d, "orphan") for d in manager._orphan_dirs()]
        missing = [d for d in manager._all_partition_dirs() if not store.exists(d)]
        for directory in missing:
            store.makedirs(directory)
        if removed or retired or missing:
            store.fsync_dir("")
        for directory in retired:
            manager._remove_dir(directory)
        manager.ensure_space_reserve()
        removed += retired
        reports: dict[TopicPartition, RecoveryReport] = {}
        for info in sorted(manager._topics.values(), key=lambda i: i.name):
            for partition in range(info.partitions):
                reports[(info.name, partition)] = manager._open_log(info, partition, now_ms)
        manager.open_report = OpenReport(
            loaded.source, loaded.problem, tuple(sorted(removed)), tuple(sorted(missing))
        )
        return manager, reports

    def _orphan_dirs(self) -> list[str]:
        orphans = []
        for name in self._store.listdir(""):
            parsed = parse_partition_dir(name)
            if parsed is None:
                continue
            info = self._topics.get(parsed[0])
            if info is None or parsed[1] >= info.partitions:
                orphans.append(name)
        return orphans

    def _all_partition_dirs(self) -> list[str]:
        topics = self._topics.values()
        return [partition_dir(info.name, p) for info in topics for p in range(info.partitions)]

    def _open_log(self, info: TopicInfo, partition: int, now_ms: int) -> RecoveryReport:
        config = info.config.to_log_config(self._preallocate_bytes)
        directory = partition_dir(info.name, partition)
        log, report = PartitionLog.open(self._store, directory, config, now_ms)
        self._logs[(info.name, partition)] = log
        return report

    # --- topics ----------------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        configs: Mapping[str, str],
        now_ms: int,
        *,
        topic_id: str | None = None,
    ) -> TopicInfo:
        """Create a topic with empty partition logs and register it. Blocks on file I/O.

        ``topic_id`` is the cluster metadata's id of the topic (a clustered broker keeps its
        local registry as a cache of that); None draws a new one.

        Raises:
            InvalidTopicNameError, InvalidPartitionsError, InvalidReplicationFactorError,
            InvalidConfigError: bad arguments (nothing is created).
            TopicExistsError: the name is taken.
            OSError: the store failed (the topic is then not registered; ``open`` removes
                whatever directories were made).
        """
        assert not self._closed
        validate_topic_name(name)
        if not 1 <= partitions <= limits.partitions_per_topic_max:
            raise InvalidPartitionsError(
                partitions, f"must be 1..{limits.partitions_per_topic_max}"
            )
        if not 1 <= replication_factor <= limits.replication_factor_max:
            raise InvalidReplicationFactorError(
                replication_factor, f"must be 1..{limits.replication_factor_max}"
            )
        config = TopicConfig.parse(configs)
        if name in self._topics:
            raise TopicExistsError(name)
        if topic_id is None:
            topic_id = self._new_topic_id()
        info = TopicInfo(name, topic_id, partitions, replication_factor, config, now_ms)
        self._install_partitions(info, range(partitions), None, now_ms)
        return info

    def add_partitions(self, name: str, count: int, now_ms: int) -> TopicInfo:
        """Grow topic ``name`` to ``count`` partitions; the new ones start empty at offset 0.

        Existing partitions are untouched. Blocks on file I/O (two directory fsyncs and the
        registry's).

        Raises:
            UnknownTopicOrPartitionError: no such topic.
            InvalidPartitionsError: ``count`` is not above the current count, or is above
                ``limits.partitions_per_topic_max`` (nothing changes).
            OSError: the store failed (the count is then unchanged; ``open`` removes whatever
                directories were made).
        """
        assert not self._closed
        info = self._topics.get(name)
        if info is None:
            raise UnknownTopicOrPartitionError(name)
        if count <= info.partitions:
            raise InvalidPartitionsError(
                count, f"topic {name!r} has {info.partitions}; the count can only grow"
            )
        if count > limits.partitions_per_topic_max:
            raise InvalidPartitionsError(
                count, f"must be at most {limits.partitions_per_topic_max}"
            )
        new_info = attrs.evolve(info, partitions=count)
        self._install_partitions(new_info, range(info.partitions, count), info, now_ms)
        return new_info

    def _install_partitions(
        self, info: TopicInfo, numbers: range, previous: TopicInfo | None, now_ms: int
    ) -> None:
        """Make partitions ``numbers`` of ``info`` and register ``info`` (create and grow).

        Retires directories of those numbers left by a failed earlier attempt, makes and
        fsyncs the new directories, opens an empty log in each, then saves the registry (the
        commit point). On failure the registry keeps ``previous`` (None: no such topic), the
        new logs are closed, and ``open`` later removes the orphan directories. Blocks on I/O.
        """
        name = info.name
        stale = [partition_dir(name, p) for p in numbers]
        stale = [d for d in stale if self._store.exists(d)]  # orphans of a failed attempt
        retired = [self._retire_dir(d, info.topic_id) for d in stale]
        for p in numbers:
            self._store.makedirs(partition_dir(name, p))
        self._store.fsync_dir("")
        for directory in retired:
            self._remove_dir(directory)
        opened = []
        try:
            for p in numbers:
                self._open_log(info, p, now_ms)
                opened.append(p)
            self._topics[name] = info
            self._save()  # the commit point
        except BaseException:
            if previous is None:
                self._topics.pop(name, None)
            else:
                self._topics[name] = previous
            for p in opened:
                self._logs.pop((name, p)).close()
            raise

    def delete_topic(self, name: str) -> None:
        """Delete a topic and all its data for real. Blocks on file I/O.

        Raises:
            UnknownTopicOrPartitionError: no such topic.
            OSError: the store failed. Before the registry save nothing changed; after it the
                topic is deleted and the next ``open`` finishes removing its files.
        """
        assert not self._closed
        info = self._topics.get(name)
        if info is None:
            raise UnknownTopicOrPartitionError(name)
        logs = [self._logs[(name, p)] for p in range(info.partitions)]
        assert all(log.statistics().syncs_outstanding == 0 for log in logs), "detach them first"
        del self._topics[name]
        try:
            self._save()  # the commit point
        except BaseException:
            self._topics[name] = info
            raise
        for p, log in enumerate(logs):
            del self._logs[(name, p)]
            log.abandon()  # its data is going away: no point in syncing it
        retired = [
            self._retire_dir(partition_dir(name, p), info.topic_id) for p in range(info.partitions)
        ]
        self._store.fsync_dir("")
        for directory in retired:
            self._remove_dir(directory)
        self._store.fsync_dir("")
        self.ensure_space_reserve()  # the deleted data made room for it again

    def alter_topic_config(self, name: str, changes: Mapping[str, str | None]) -> TopicInfo:
        """Apply config ``changes`` (``None`` resets a key) to a topic and its logs.

        Blocks on the registry write. The logs obey the new settings from their next append,
        roll or retention pass (a smaller ``segment.bytes`` rolls at the next append).

        Raises:
            UnknownTopicOrPartitionError: no such topic.
            InvalidConfigError: a change is invalid (nothing changes).
            OSError: the store failed (nothing changes).
        """
        assert not self._closed
        info = self._topics.get(name)
        if info is None:
            raise UnknownTopicOrPartitionError(name)
        new_info = attrs.evolve(info, config=info.config.alter(changes))
        self._topics[name] = new_info
        try:
            self._save()
        except BaseException:
            self._topics[name] = info
            raise
        log_config = new_info.config.to_log_config(self._preallocate_bytes)
        for p in range(info.partitions):
            self._logs[(name, p)].config = log_config  # read afresh at every use
        return new_info

    def has_topic(self, name: str) -> bool:
        """``name in topics()``, without the view. Never blocks."""
        return name in self._topics

    def topics(self) -> Mapping[str, TopicInfo]:
        """Every topic by name (a read-only view). Never blocks."""
        return types.MappingProxyType(self._topics)

    def get_log(self, topic: str, partition: int) -> PartitionLog:
        """The log of one partition. Never blocks.

        Raises:
            UnknownTopicOrPartitionError: no such topic or partition.
        """
        log = self._logs.get((topic, partition))
        if log is None:
            raise UnknownTopicOrPartitionError(topic, partition if topic in self._topics else None)
        return log

    def logs(self) -> Iterator[tuple[TopicPartition, PartitionLog]]:
        """Every ``((topic, partition), log)``, sorted. Never blocks."""
        return iter(sorted(self._logs.items(), key=lambda item: item[0]))

    def apply_retention(self, now_ms: int) -> int:
        """Apply every log's retention (time and size); returns segments deleted. Blocks on I/O."""
        assert not self._closed
        return sum(log.apply_retention(now_ms) for _, log in self.logs())

    def close(self) -> None:
        """Flush and close every log. Blocks on fsync. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for _, log in self.logs():
            log.close()
        self._logs.clear()

    def check_invariants(self) -> None:
        """Assert that registry and logs agree and every log's own invariants hold."""
        expected = {(i.name, p) for i in self._topics.values() for p in range(i.partitions)}
        assert self._closed or set(self._logs) == expected, (sorted(self._logs), sorted(expected))
        for (topic, _), log in self._logs.items():
            assert log.config == self._topics[topic].config.to_log_config(self._preallocate_bytes)
            log.check_invariants()

    # --- helpers ---------------------------------------------------------------------------------

    def _new_topic_id(self) -> str:
        while True:
            if self._rng is not None:
                topic_id = f"{self._rng.getrandbits(128):032x}"
            else:
                self._next_topic_number += 1
                topic_id = f"{self._next_topic_number:032x}"
            if all(info.topic_id != topic_id for info in self._topics.values()):
                return topic_id

    def _save(self) -> None:
        """Write the registry; on a full disk, give up the space reserve and try once more (so
        a topic can be deleted to free space when nothing else fits).

        Raises:
            OSError: the store failed (the old registry stands: it is replaced atomically).
        """
        try:
            save_registry(self._store, self._topics, self._next_topic_number)
        except OSError as exc:
            if not disk_full(exc) or not self._store.exists(SPACE_RESERVE_FILE):
                raise
            self._store.remove(SPACE_RESERVE_FILE)
            save_registry(self._store, self._topics, self._next_topic_number)

    def with_room(self, change: Callable[[], T]) -> T:
        """``change()`` (a partition's metadata write, e.g. ``delete_records``); when the disk
        is full and the space reserve is there, give the reserve up and run it once more.

        Raises what ``change`` raises."""
        try:
            return change()
        except (StorageError, OSError) as exc:
            full = isinstance(exc, OSError) and disk_full(exc) or isinstance(
                exc.__cause__, OSError) and disk_full(exc.__cause__)
            if not full or not self._store.exists(SPACE_RESERVE_FILE):
                raise
            self._store.remove(SPACE_RESERVE_FILE)
            return change()

    def ensure_space_reserve(self) -> bool:
        """Keep ``SPACE_RESERVE_FILE`` (``limits.space_reserve_bytes`` of zeros) in the data
        directory, the room metadata writes fall back on when the disk is full; True when it
        is there. Best effort: a full disk leaves it missing until a later call. Blocks on it.
        """
        store = self._store
        if store.exists(SPACE_RESERVE_FILE):
            return True
        try:
            handle = store.open(SPACE_RESERVE_FILE)
            try:
                store.allocate(handle, limits.space_reserve_bytes)
                store.fsync(handle)
            finally:
                store.close(handle)
        except OSError as exc:
            if not disk_full(exc):
                raise
            if store.exists(SPACE_RESERVE_FILE):
                store.remove(SPACE_RESERVE_FILE)
            return False
        return True

    def _retire_dir(self, directory: str, tag: str) -> str:
        """Rename a partition directory to a unique ``*-delete`` name (not yet dir-synced)."""
        for attempt in range(1000):
            suffix = f".{tag[-16:]}{'' if attempt == 0 else f'.{attempt}'}{DELETE_SUFFIX}"
            target = directory[: _NAME_BYTES_MAX - len(suffix)] + suffix
            if not self._store.exists(target):
                self._store.rename(directory, target)
                return target
        raise AssertionError(f"no free delete name for {directory}")

    def _remove_dir(self, directory: str) -> None:
        """Remove a ``*-delete`` directory with its files (the caller fsyncs the parent)."""
        assert directory.endswith(DELETE_SUFFIX), directory
        for name in self._store.listdir(directory):
            self._store.remove(f"{directory}/{name}")
        self._store.remove_dir(directory)
