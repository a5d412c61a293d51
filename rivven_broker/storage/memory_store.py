"""``MemoryFileStore``: an in-memory ``FileStore`` that forgets what was never synced.

Theory of operation
-------------------
The store models a disk as two layers, the way a kernel page cache sits over a device:

- *Files* are inodes. Each inode holds its live bytes (what ``pread`` sees) and the bytes as of
  its last ``fsync`` (what survives a crash).
- *Directories* map names to inodes or subdirectories. Each directory has a live map (what
  ``listdir``/``open`` see) and a durable map, copied from the live one by ``fsync_dir``. So a
  created, renamed or removed name survives a crash only once its parent directory is synced,
  exactly the rule ``file_store.py`` states for every store.

``crash()`` is a process death plus power loss: every handle becomes invalid, the live maps
are replaced by the durable ones (keeping only directories reachable from the root through
durable entries), and every surviving inode goes back to its synced bytes. With
``tear_last_write`` the most recent ``pwrite``/``pwritev`` (if it was not synced since) is
then re-applied partially: a prefix of it, of a length drawn from ``rng`` (shorter than the
write), lands on top of the synced bytes (zero-filling any gap before it). That is the
"torn write" a real disk leaves when power fails mid-write.

``fault_hook(op, path)``, when set, is called at the start of every mutating call (``open``,
``pwrite``, ``pwritev``, ``fsync``, ``truncate``, ``allocate``, ``rename``, ``remove``,
``remove_dir``, ``makedirs``, ``fsync_dir``) and may raise ``OSError`` (EIO, ENOSPC ...) to
inject a fault before the call has any effect. For calls on handles, ``path`` is the path the
file was opened under.

``fsync`` may run on a worker thread while the owner thread writes: it copies the live bytes in
one step (atomic under the GIL) and records the write sequence number it covered first, so a
racing write is at worst considered unsynced (the conservative direction).
"""

from __future__ import annotations

import errno
import posixpath
import random
from typing import Callable, Sequence

from rivven_broker.storage.file_store import Buffer

__all__ = ["MemoryFileStore", "MemoryStoreStatistics"]

FaultHook = Callable[[str, str], None]


class _Inode:
    __slots__ = ("data", "synced", "synced_sequence")

    def __init__(self) -> None:
        self.data = bytearray()
        self.synced = b""
        self.synced_sequence = 0


_DIRECTORY = None  # the value a directory map stores for a subdirectory
_Entries = dict[str, "_Inode | None"]


class MemoryStoreStatistics:
    """Call counters of a ``MemoryFileStore`` (for tests that count fsyncs)."""

    __slots__ = ("fsyncs", "dir_fsyncs", "writes", "crashes")

    def __init__(self) -> None:
        self.fsyncs = 0
        self.dir_fsyncs = 0
        self.writes = 0
        self.crashes = 0


def _normalize(path: str) -> str:
    path = path.strip("/")
    assert ".." not in path.split("/"), path
    return path


def _split(path: str) -> tuple[str, str]:
    parent, name = posixpath.split(_normalize(path))
    assert name, f"not a file path: {path!r}"
    return parent, name


class MemoryFileStore:
    """A ``FileStore`` in memory with crash semantics. See the module docstring."""

    def __init__(self) -> None:
        self.fault_hook: FaultHook | None = None
        self.stats = MemoryStoreStatistics()
        self._live: dict[str, _Entries] = {"": {}}
        self._durable: dict[str, _Entries] = {"": {}}
        self._handles: dict[int, tuple[_Inode, str]] = {}
        self._next_handle = 3
        self._write_sequence = 0
        self._last_write: tuple[_Inode, int, bytes, int] | None = None

    # --- helpers -----------------------------------------------------------------------------

    def _hook(self, op: str, path: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(op, path)

    def _directory(self, path: str) -> _Entries:
        entries = self._live.get(_normalize(path))
        if entries is None:
            raise FileNotFoundError(errno.ENOENT, "no such directory", path)
        return entries

    def _inode(self, handle: int) -> _Inode:
        try:
            return self._handles[handle][0]
        except KeyError:
            raise OSError(errno.EBADF, "bad file handle", str(handle)) from None

    def _path_of(self, handle: int) -> str:
        entry = self._handles.get(handle)
        return "" if entry is None else entry[1]

    def _write(self, inode: _Inode, data: bytes, position: int) -> None:
        end = position + len(data)
        if position > len(inode.data):
            inode.data.extend(bytes(position - len(inode.data)))
        inode.data[position:end] = data
        self._write_sequence += 1
        self._last_write = (inode, position, data, self._write_sequence)
        self.stats.writes += 1

    # --- files -------------------------------------------------------------------------------

    def open(self, path: str, *, create: bool = True) -> int:
        self._hook("open", path)
        parent, name = _split(path)
        entries = self._directory(parent)
        if name in entries:
            inode = entries[name]
            if inode is None:
                raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        elif create:
            inode = entries[name] = _Inode()
        else:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        handle = self._next_handle
        self._next_handle += 1
        self._handles[handle] = (inode, _normalize(path))
        return handle

    def close(self, handle: int) -> None:
        self._inode(handle)
        del self._handles[handle]

    def size(self, handle: int) -> int:
        return len(self._inode(handle).data)

    def pwrite(self, handle: int, data: Buffer, position: int) -> None:
        self._hook("pwrite", self._path_of(handle))
        assert position >= 0
        self._write(self._inode(handle), bytes(data), position)

    def pwritev(self, handle: int, parts: Sequence[Buffer], position: int) -> None:
        self._hook("pwritev", self._path_of(handle))
        assert position >= 0
        self._write(self._inode(handle), b"".join(parts), position)

    def pread(self, handle: int, size: int, position: int) -> bytes:
        assert size >= 0 and position >= 0
        return bytes(self._inode(handle).data[position : position + size])

    def fsync(self, handle: int) -> None:
        self._hook("fsync", self._path_of(handle))
        inode = self._inode(handle)
        sequence = self._write_sequence  # read before the copy: see the module docstring
        inode.synced = bytes(inode.data)
        inode.synced_sequence = sequence
        self.stats.fsyncs += 1

    def truncate(self, handle: int, size: int) -> None:
        self._hook("truncate", self._path_of(handle))
        assert size >= 0
        inode = self._inode(handle)
        if size <= len(inode.data):
            del inode.data[size:]
        else:
            inode.data.extend(bytes(size - len(inode.data)))

    def allocate(self, handle: int, size: int) -> None:
        self._hook("allocate", self._path_of(handle))
        inode = self._inode(handle)
        if size > len(inode.data):
            inode.data.extend(bytes(size - len(inode.data)))

    # --- names -------------------------------------------------------------------------------

    def exists(self, path: str) -> bool:
        path = _normalize(path)
        if path in self._live:
            return True
        parent, name = posixpath.split(path)
        return name in self._live.get(parent, {})

    def listdir(self, path: str) -> list[str]:
        return sorted(self._directory(path))

    def makedirs(self, path: str) -> None:
        self._hook("makedirs", path)
        path = _normalize(path)
        parts = path.split("/") if path else []
        for depth in range(1, len(parts) + 1):
            current = "/".join(parts[:depth])
            parent, name = posixpath.split(current)
            entries = self._live[parent]
            if name in entries:
                if entries[name] is not None:
                    raise FileExistsError(errno.EEXIST, "a file is in the way", current)
                continue
            entries[name] = _DIRECTORY
            self._live[current] = {}

    def rename(self, source: str, target: str) -> None:
        self._hook("rename", source)
        source_parent, source_name = _split(source)
        target_parent, target_name = _split(target)
        source_entries = self._directory(source_parent)
        target_entries = self._directory(target_parent)
        if source_name not in source_entries:
            raise FileNotFoundError(errno.ENOENT, "no such file", source)
        inode = source_entries[source_name]
        assert inode is not None, "MemoryFileStore renames files only"
        if target_entries.get(target_name, inode) is None:
            raise IsADirectoryError(errno.EISDIR, "is a directory", target)
        del source_entries[source_name]
        target_entries[target_name] = inode

    def remove(self, path: str) -> None:
        self._hook("remove", path)
        parent, name = _split(path)
        entries = self._directory(parent)
        if name not in entries:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        if entries[name] is None:
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        del entries[name]

    def remove_dir(self, path: str) -> None:
        self._hook("remove_dir", path)
        parent, name = _split(path)
        path = _normalize(path)
        if self._directory(path):
            raise OSError(errno.ENOTEMPTY, "directory not empty", path)
        del self._live[path]
        del self._live[parent][name]

    def fsync_dir(self, path: str) -> None:
        self._hook("fsync_dir", path)
        self._durable[_normalize(path)] = dict(self._directory(path))
        self.stats.dir_fsyncs += 1

    # --- crashes -----------------------------------------------------------------------------

    def crash(self, rng: random.Random | None = None, *, tear_last_write: bool = False) -> None:
        """Drop every unsynced change, as a power loss would; see the module docstring.

        All handles become invalid. With ``tear_last_write`` a prefix of the last write (if it
        was not synced since) survives; its length is ``rng.randrange(len(write))``, or half
        the write without ``rng``. Never blocks, never raises.
        """
        self.stats.crashes += 1
        durable: dict[str, _Entries] = {}
        pending = [""]
        while pending:
            directory = pending.pop()
            entries = dict(self._durable.get(directory, {}))
            durable[directory] = entries
            for name, inode in entries.items():
                if inode is None:
                    pending.append(posixpath.join(directory, name))
        survivors = {id(i): i for e in durable.values() for i in e.values() if i is not None}
        for inode in survivors.values():
            inode.data = bytearray(inode.synced)
        last = self._last_write
        if tear_last_write and last is not None:
            inode, position, data, sequence = last
            if id(inode) in survivors and sequence > inode.synced_sequence and data:
                keep = rng.randrange(len(data)) if rng is not None else len(data) // 2
                self._write(inode, data[:keep], position)
                inode.synced = bytes(inode.data)
        self._durable = durable
        self._live = {directory: dict(entries) for directory, entries in durable.items()}
        self._handles.clear()
        self._last_write = None
        for inode in survivors.values():
            inode.synced_sequence = self._write_sequence

    # --- test helpers ------------------------------------------------------------------------

    def corrupt(self, path: str, position: int, data: bytes) -> None:
        """Overwrite bytes of a file in both layers (disk damage, for tests). Never blocks."""
        parent, name = _split(path)
        inode = self._directory(parent)[name]
        assert inode is not None
        inode.data[position : position + len(data)] = data
        synced = bytearray(inode.synced)
        synced[position : position + len(data)] = data
        inode.synced = bytes(synced)

    def open_handles(self) -> int:
        """How many handles are open (tests check for leaks). Never blocks."""
        return len(self._handles)
