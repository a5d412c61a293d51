"""``LeaderEpochCache``: which leader epoch wrote which offsets of one partition (KIP-101).

Theory of operation
-------------------
Every batch a leader appends is stamped with its leader epoch (the stamp's third field). The
cache keeps the first offset of each epoch, ``[(epoch, start_offset), ...]`` with both strictly
increasing, so a follower that has just learnt of a new leader can ask "where did my last epoch
end in your log?" (``end_offset_for``) and truncate to the answer, never to the high watermark
alone: the high watermark a follower knows may lag the leader's, and truncating to it can drop
acknowledged records (KIP-101's first scenario), while keeping more than the leader's epoch
ended with keeps records the new leader never had (its second).

- A leader calls ``assign(epoch, log_end_offset)`` when it takes the partition (before its first
  append in the epoch), a follower when it appends a batch of an epoch newer than the last.
- ``truncate_from_end(offset)`` drops entries at or past a log truncation;
  ``truncate_from_start(offset)`` folds entries below a new log start offset into one.
- ``end_offset_for(epoch, log_end_offset)`` answers Kafka's OffsetsForLeaderEpoch: the largest
  epoch at most ``epoch`` this log knows, and the offset where it ended (the start of the next
  epoch, or the log end offset for the latest); ``(-1, -1)`` when every known epoch is newer.

``highest_epoch`` is the newest epoch ever assigned to this log, kept through truncations: a
crash can cut every record (and so every entry) of an epoch this broker led, and the broker
must still know it led that epoch, never to lead it again (``ReplicaManager._lead``; the
simulator's ``replication_one_leader_per_epoch`` found the hole).

Persistence: ``leader-epoch.checkpoint`` in the partition directory: a version line, a
``highest N`` line, then one ``epoch offset`` line per entry (version 1 files, without the
``highest`` line, are read with the newest entry's epoch), rewritten whole (tmp, fsync, rename, fsync of the directory) at
each change; changes are rare (once per leader change). ``open`` drops entries at or past the
recovered log end offset (their data was lost in a crash), and a damaged file is rebuilt as
empty with a warning: the next leader change assigns again, and a follower with no entry for
its last epoch is answered by the leader's oldest epoch, so the worst case is a longer
truncation, never a kept divergent record.
"""

from __future__ import annotations

import logging
import posixpath
from bisect import bisect_right

from rivven_broker.storage.checkpoint import TMP_SUFFIX
from rivven_broker.storage.file_store import FileStore

__all__ = ["LEADER_EPOCH_FILE", "UNDEFINED_EPOCH", "LeaderEpochCache"]

log = logging.getLogger(__name__)

LEADER_EPOCH_FILE = "leader-epoch.checkpoint"
UNDEFINED_EPOCH = -1
_VERSION_LINE = "rivven-leader-epochs 2"
_VERSION_1_LINE = "rivven-leader-epochs 1"
_FILE_BYTES_MAX = 1 << 20


class LeaderEpochCache:
    """The epoch history of one partition. Not thread-safe: its partition's owner calls it."""

    def __init__(self, store: FileStore | None, directory: str,
                 entries: list[tuple[int, int]] | None = None,
                 highest_epoch: int = UNDEFINED_EPOCH) -> None:
        """Internal: use ``open`` (``store=None``: in memory only, for tests)."""
        self._store = store
        self._directory = directory
        self._entries: list[tuple[int, int]] = list(entries or [])
        self._highest = max(highest_epoch, self.latest_epoch)
        self._check()

    @classmethod
    def open(cls, store: FileStore, directory: str, log_end_offset: int) -> LeaderEpochCache:
        """Read the checkpoint of ``directory`` (missing: empty). Blocks on file I/O.

        Raises:
            OSError: the store failed.
        """
        path = posixpath.join(directory, LEADER_EPOCH_FILE)
        entries: list[tuple[int, int]] = []
        highest = UNDEFINED_EPOCH
        if store.exists(path):
            handle = store.open(path, create=False)
            try:
                data = store.pread(handle, _FILE_BYTES_MAX, 0)
            finally:
                store.close(handle)
            parsed = _parse(data)
            if parsed is None:
                log.warning("%s is damaged: starting an empty leader-epoch history", path)
            else:
                highest, entries = parsed
        cache = cls(store, directory, entries, highest)
        cache.truncate_from_end(log_end_offset)  # entries past a crash's cut
        return cache

    # -- reading -----------------------------------------------------------------------------

    @property
    def entries(self) -> list[tuple[int, int]]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        return self._entries[-1][0] if self._entries else UNDEFINED_EPOCH

    @property
    def highest_epoch(self) -> int:
        """The newest epoch ever assigned, even if truncations have since cut all its data."""
        return self._highest

    def epoch_at(self, offset: int) -> int:
        """The epoch that wrote ``offset`` (UNDEFINED_EPOCH before the first entry)."""
        index = bisect_right([start for _, start in self._entries], offset) - 1
        return self._entries[index][0] if index >= 0 else UNDEFINED_EPOCH

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """``(epoch found, its end offset)`` (module docstring); ``(-1, -1)`` if none."""
        found = None
        for index, (known, _) in enumerate(self._entries):
            if known > epoch:
                break
            found = index
        if found is None:
            return UNDEFINED_EPOCH, -1
        known = self._entries[found][0]
        if found + 1 < len(self._entries):
            return known, self._entries[found + 1][1]
        return known, log_end_offset

    # -- changing ----------------------------------------------------------------------------

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; durable when it returns. Returns
        whether anything changed (an epoch already known is not assigned again)."""
        if self._entries and epoch <= self._entries[-1][0]:
            return False
        entries = [(e, s) for e, s in self._entries if s < start_offset]
        entries.append((epoch, start_offset))
        self._highest = max(self._highest, epoch)
        self._replace(entries)
        return True

    def truncate_from_end(self, offset: int) -> bool:
        """Drop the entries that start at or past ``offset`` (the log was cut there)."""
        kept = [(e, s) for e, s in self._entries if s < offset]
        if len(kept) == len(self._entries):
            return False
        self._replace(kept)
        return True

    def truncate_from_start(self, offset: int) -> bool:
        """The log now starts at ``offset``: entries wholly below it fold into one at it."""
        below = [(e, s) for e, s in self._entries if s <= offset]
        if not below or below == self._entries[:1] and below[0][1] == offset:
            return False
        kept = [(below[-1][0], offset)] + [(e, s) for e, s in self._entries if s > offset]
        self._replace(kept)
        return True

    def _replace(self, entries: list[tuple[int, int]]) -> None:
        self._entries = entries
        self._check()
        if self._store is not None:
            _write(self._store, self._directory, self._highest, entries)

    def _check(self) -> None:
        for (e1, s1), (e2, s2) in zip(self._entries, self._entries[1:]):
            assert e1 < e2 and s1 < s2, self._entries
        assert self._highest >= self.latest_epoch, (self._highest, self._entries)


def _parse(data: bytes) -> tuple[int, list[tuple[int, int]]] | None:
    """``(highest epoch, entries)`` of a checkpoint's text, or None if it is damaged."""
    try:
        lines = data.decode("ascii").splitlines()
    except UnicodeDecodeError:
        return None
    highest = UNDEFINED_EPOCH
    if lines and lines[0] == _VERSION_LINE:
        highest_line = lines[1].split() if len(lines) > 1 else []
        if len(highest_line) != 2 or highest_line[0] != "highest" \
                or not highest_line[1].lstrip("-").isdigit():
            return None
        highest = int(highest_line[1])
        lines = lines[1:]
    elif not lines or lines[0] != _VERSION_1_LINE:
        return None
    entries = []
    for line in lines[1:]:
        parts = line.split()
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            return None
        entries.append((int(parts[0]), int(parts[1])))
    for (e1, s1), (e2, s2) in zip(entries, entries[1:]):
        if not (e1 < e2 and s1 < s2):
            return None
    return highest, entries


def _write(store: FileStore, directory: str, highest: int,
           entries: list[tuple[int, int]]) -> None:
    path = posixpath.join(directory, LEADER_EPOCH_FILE)
    tmp = path + TMP_SUFFIX
    body = "\n".join([_VERSION_LINE, f"highest {highest}",
                      *(f"{e} {s}" for e, s in entries)]) + "\n"
    handle = store.open(tmp)
    try:
        store.truncate(handle, 0)
        store.pwrite(handle, body.encode("ascii"), 0)
        store.fsync(handle)
    finally:
        store.close(handle)
    store.rename(tmp, path)
    store.fsync_dir(directory)
