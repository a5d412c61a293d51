"""The Raft journal and snapshot store of the controller, on the Env disk, with fsync.

Theory of operation
-------------------
PySyncObj's own file journal writes through mmap and never fsyncs; this one is injected in its
place (``pysyncobj_host``) and keeps the same interface (``add``, ``deleteEntriesFrom`` ...,
``setCurrentTerm``). Entries live in memory (the controller log is small) and in ``log``:

    u32 length | u32 crc32c(body) | body = msgpack [command, index, term]

Term, vote and commit index live in ``meta``: two 64-byte slots written alternately, each
``crc32c | sequence | term | voted for | commit index``; the valid slot with the higher sequence
wins, so a torn write loses at most the update being written, never the previous one.

Writes only mark the journal dirty; ``sync_plan()`` returns the work that makes everything so
far durable (fsync of the log, the next meta slot and its fsync), to run off the loop. The Raft
host runs it after every tick and before any message those writes justify leaves the node: an
AppendEntries answer only after its entries, a vote only after the term and vote, and the
leader counts itself toward a commit only in the tick after its own entries were synced.
Startup truncates a torn or corrupt tail at the first bad record and clamps the commit index
to the last entry.

Truncation follows Raft's rule, not PySyncObj's. PySyncObj deletes every entry after an
AppendEntries' previous index and appends the ones it carries, even when they are the same
entries (it happens whenever a late answer rewinds the leader's next index for a follower):
on disk that would briefly forget entries this node already acknowledged. So
``deleteEntriesFrom`` forgets them in memory only; the file keeps them (``_kept``) and an
``add`` of the same entry just takes it back. Only an entry that differs (a real conflict)
cuts the file, and a cut below what was synced is fsynced at once, so the conflicting entry
written next can never tear synced bytes. A crash in between recovers the kept entries: the
state of a node that never received that AppendEntries, which Raft allows.

Compaction (``deleteEntriesTo``, after a snapshot) rewrites the log into ``log.tmp``, fsyncs it
and renames it over ``log``: rare, and whole. ``SnapshotStore`` keeps the snapshot the same way.
"""

from __future__ import annotations

import struct
from typing import Any, Callable

import crc32c
import msgpack

from rivven_broker.storage.file_store import FileStore

__all__ = ["RaftJournal", "SnapshotStore", "JournalCorruption"]

_RECORD = struct.Struct(">II")
_SLOT = struct.Struct(">IQQqQ")  # crc, sequence, term, voted for (-1: nobody), commit index
_SLOT_BYTES = 64
_NOBODY = -1


class JournalCorruption(Exception):
    """Meta slots both unreadable: the node must not guess its term and vote."""


def _join(directory: str, name: str) -> str:
    return f"{directory}/{name}"


def _durable_directory(disk: FileStore, directory: str) -> None:
    """Create ``directory`` and make its name, and its parents' names, survive a crash."""
    disk.makedirs(directory)
    parts = directory.split("/")
    for depth in range(len(parts), -1, -1):
        disk.fsync_dir("/".join(parts[:depth]))


class RaftJournal:
    def __init__(self, disk: FileStore, directory: str) -> None:
        self._disk = disk
        self._directory = directory
        _durable_directory(disk, directory)
        self._log_path = _join(directory, "log")
        self._log = disk.open(self._log_path)
        self._entries: list[tuple[bytes, int, int]] = []
        self._offsets: list[int] = []
        #: Entries forgotten in memory but still in the file after ``_end``, with their record
        #: lengths, in index order (``deleteEntriesFrom``).
        self._kept: list[tuple[tuple[bytes, int, int], int]] = []
        self._end = 0
        self._log_dirty = False
        self.torn_bytes = self._load_log()
        self._synced_end = self._end
        self._meta = disk.open(_join(directory, "meta"))
        disk.fsync_dir(directory)
        self._sequence, self._term, self._voted, commit = self._load_meta()
        self._commit = min(commit, self._entries[-1][1] if self._entries else 0)
        self._meta_dirty = False

    # -- loading -----------------------------------------------------------------------------

    def _load_log(self) -> int:
        size = self._disk.size(self._log)
        data = self._disk.pread(self._log, size, 0) if size else b""
        position = 0
        while position + _RECORD.size <= size:
            length, checksum = _RECORD.unpack_from(data, position)
            body = data[position + _RECORD.size:position + _RECORD.size + length]
            if length == 0 or len(body) < length or crc32c.crc32c(body) != checksum:
                break  # (a zero-filled tear reads as an empty body with a zero checksum)
            try:
                command, index, term = msgpack.unpackb(body)
            except (ValueError, TypeError, msgpack.UnpackException):
                break
            if self._entries and index != self._entries[-1][1] + 1:
                break
            self._entries.append((command, index, term))
            self._offsets.append(position)
            position += _RECORD.size + length
        self._end = position
        if position < size:
            self._disk.truncate(self._log, position)
            self._disk.fsync(self._log)
        return size - position

    def _load_meta(self) -> tuple[int, int, Any, int]:
        size = self._disk.size(self._meta)
        data = self._disk.pread(self._meta, size, 0) if size else b""
        best: tuple[int, int, Any, int] | None = None
        damaged = 0
        for slot in range(2):
            raw = data[slot * _SLOT_BYTES:(slot + 1) * _SLOT_BYTES]
            if len(raw) < _SLOT_BYTES or not any(raw):
                continue
            checksum, sequence, term, voted, commit = _SLOT.unpack_from(raw)
            if crc32c.crc32c(raw[4:_SLOT.size]) != checksum:
                damaged += 1
                continue
            if best is None or sequence > best[0]:
                best = (sequence, term, None if voted == _NOBODY else voted, commit)
        if best is None:
            if damaged == 2:
                raise JournalCorruption(f"{self._directory}/meta: both slots are damaged")
            return 0, 0, None, 0
        return best

    # -- PySyncObj's Journal interface -------------------------------------------------------

    def add(self, command: bytes, idx: int, term: int) -> None:
        assert not self._entries or idx == self._entries[-1][1] + 1, "journal indexes have a gap"
        entry = (bytes(command), idx, term)
        if self._kept and self._kept[0][0] == entry:  # the file holds it already
            _, length = self._kept.pop(0)
            self._entries.append(entry)
            self._offsets.append(self._end)
            self._end += length
            self._log_dirty = True  # (it may not be synced yet)
            return
        if self._kept:
            self._cut()
        body = msgpack.packb(list(entry))
        record = _RECORD.pack(len(body), crc32c.crc32c(body)) + body
        self._disk.pwrite(self._log, record, self._end)
        self._entries.append(entry)
        self._offsets.append(self._end)
        self._end += len(record)
        self._log_dirty = True

    def clear(self) -> None:
        self.deleteEntriesFrom(0)

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802 (PySyncObj's name)
        """Forget entries from ``entryFrom`` on, in memory; in the file they stay (``_kept``)
        until an entry that differs is written in their place (see the module docstring)."""
        keep = max(0, entryFrom)
        if keep >= len(self._entries):
            return
        ends = self._offsets[keep + 1:] + [self._end]
        removed = [(entry, end - start) for entry, start, end in
                   zip(self._entries[keep:], self._offsets[keep:], ends)]
        self._kept[:0] = removed
        self._end = self._offsets[keep]
        del self._entries[keep:]
        del self._offsets[keep:]

    def _cut(self) -> None:
        """Truncate the file to the entries in memory (a conflicting entry comes next)."""
        self._kept.clear()
        self._disk.truncate(self._log, self._end)
        if self._end < self._synced_end:
            # The next entry will be written over synced bytes: make the cut durable first,
            # or a torn overwrite could damage an entry this node already promised.
            self._disk.fsync(self._log)
            self._synced_end = self._end
        self._log_dirty = True

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802
        """Drop the first ``entryTo`` entries (they are in the snapshot): rewrite, sync, swap.
        Entries kept in the file after the ones in memory are kept in the new file too."""
        kept = self._entries[entryTo:]
        temporary = self._log_path + ".tmp"
        if self._disk.exists(temporary):
            self._disk.remove(temporary)
        handle = self._disk.open(temporary)
        chunks, offsets, position = [], [], 0
        for entry in kept + [entry for entry, _ in self._kept]:
            body = msgpack.packb(list(entry))
            chunks.append(_RECORD.pack(len(body), crc32c.crc32c(body)) + body)
            offsets.append(position)
            position += len(chunks[-1])
        if chunks:
            self._disk.pwrite(handle, b"".join(chunks), 0)
        self._disk.fsync(handle)
        self._disk.close(self._log)
        self._disk.close(handle)
        self._disk.rename(temporary, self._log_path)
        self._disk.fsync_dir(self._directory)
        self._log = self._disk.open(self._log_path)
        self._entries, self._offsets = kept, offsets[:len(kept)]
        self._end = offsets[len(kept)] if len(kept) < len(offsets) else position
        self._synced_end = position

    def __getitem__(self, item: Any) -> Any:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def _destroy(self) -> None:
        self._disk.close(self._log)
        self._disk.close(self._meta)

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:  # noqa: N802
        if raftCommitIndex != self._commit:
            self._commit = raftCommitIndex
            self._meta_dirty = True

    def getRaftCommitIndex(self) -> int:  # noqa: N802
        return max(self._commit, 1)

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:  # noqa: N802
        self._term, self._voted = term, votedForNodeId
        self._meta_dirty = True

    def getCurrentTerm(self) -> int:  # noqa: N802
        return self._term

    def getVotedForNodeId(self) -> Any:  # noqa: N802
        return self._voted

    def onOneSecondTimer(self) -> None:  # noqa: N802
        pass

    # -- durability --------------------------------------------------------------------------

    @property
    def dirty(self) -> bool:
        return self._log_dirty or self._meta_dirty

    def sync_plan(self) -> Callable[[], None] | None:
        """The work that makes every write so far durable (None when there is none); taken on
        the loop, safe to run on another thread while the journal moves on."""
        if not self.dirty:
            return None
        disk, log, meta = self._disk, self._log, self._meta
        sync_log = self._log_dirty
        if sync_log:  # (everything written so far: the kept entries too)
            self._synced_end = max(self._synced_end, self._end + sum(n for _, n in self._kept))
        slot_write: tuple[bytes, int] | None = None
        if self._meta_dirty:
            self._sequence += 1
            voted = _NOBODY if self._voted is None else int(self._voted)
            raw = _SLOT.pack(0, self._sequence, self._term, voted, self._commit)[4:]
            slot = _SLOT.pack(crc32c.crc32c(raw), self._sequence, self._term, voted, self._commit)
            slot_write = (slot.ljust(_SLOT_BYTES, b"\0"), (self._sequence % 2) * _SLOT_BYTES)
        self._log_dirty = self._meta_dirty = False

        def run() -> None:
            if sync_log:
                disk.fsync(log)
            if slot_write is not None:
                disk.pwrite(meta, slot_write[0], slot_write[1])
                disk.fsync(meta)
        return run


class SnapshotStore:
    """One snapshot file, replaced whole (write ``.tmp``, fsync, rename, fsync the directory)."""

    def __init__(self, disk: FileStore, directory: str) -> None:
        self._disk = disk
        self._directory = directory
        _durable_directory(disk, directory)
        self.path = _join(directory, "snapshot")

    def exists(self) -> bool:
        return self._disk.exists(self.path)

    def write(self, data: bytes, *, path: str | None = None) -> None:
        temporary = (path or self.path) + ".tmp"
        handle = self._disk.open(temporary)
        self._disk.truncate(handle, 0)
        framed = _RECORD.pack(len(data), crc32c.crc32c(data)) + data
        self._disk.pwrite(handle, framed, 0)
        self._disk.fsync(handle)
        self._disk.close(handle)
        self._disk.rename(temporary, path or self.path)
        self._disk.fsync_dir(self._directory)

    def read(self) -> bytes:
        handle = self._disk.open(self.path, create=False)
        try:
            data = self._disk.pread(handle, self._disk.size(handle), 0)
        finally:
            self._disk.close(handle)
        length, checksum = _RECORD.unpack_from(data)
        body = data[_RECORD.size:_RECORD.size + length]
        if len(body) != length or crc32c.crc32c(body) != checksum:
            raise JournalCorruption(f"{self.path}: the snapshot is damaged")
        return body
