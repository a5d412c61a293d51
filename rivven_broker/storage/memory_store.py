"""``MemoryFileStore``: an in-memory ``FileStore`` that forgets what was never synced.

Theory of operation
-------------------
The store models a disk as two layers, the way a kernel page cache sits over a device:

- *Files* are inodes. Each inode holds its live bytes (what ``pread`` sees) and the bytes as of
  its last ``fsync`` (what survives a crash).
- *Directories* are objects too (renaming one moves it whole, as on a real file system), each
  mapping names to inodes or directories. Each has a live map (what ``listdir``/``open`` see)
  and a durable map, copied from the live one by ``fsync_dir``. So a created, renamed or
  removed name survives a crash only once its parent directory is synced, exactly the rule
  ``file_store.py`` states for every store.

``crash()`` is a process death plus power loss: every handle becomes invalid, the live maps
are replaced by the durable ones (keeping only directories reachable from the root through
durable entries), and every surviving inode goes back to its synced bytes. With
``tear_last_write`` the most recent ``pwrite``/``pwritev`` (if it was not synced since) is
then re-applied partially: a prefix of it, of a length drawn from ``rng`` (shorter than the
write), lands on top of the synced bytes (zero-filling any gap before it). That is the
"torn write" a real disk leaves when power fails mid-write.

``fault_hook(op, path)``, when set, is called at the start of every mutating call (``open``,
``pwrite``, ``pwritev``, ``fsync``, ``sync_filesystem`` (path ``""``), ``truncate``, ``allocate``, ``rename``, ``remove``,
``remove_dir``, ``makedirs``, ``fsync_dir``) and may raise ``OSError`` (EIO, ENOSPC ...) to
inject a fault before the call has any effect. For calls on handles, ``path`` is the path the
file was opened under.

``fsync`` copies only the range that changed since the last one (segments are preallocated,
and copying whole files on every fsync made it the simulator's most expensive call). Every
change appends the range it touched to the inode's ``marks`` *after* changing the bytes;
``fsync`` counts the marks present when it starts, then reads the file's length, sets the
synced bytes to that length, copies the span the counted marks cover, and deletes exactly
those marks. It may run on a worker thread while the owner thread writes: each step is one
list or bytearray operation (atomic under the GIL), a change whose mark it did not count is
copied again by the next fsync, and it records the write sequence number it covered first,
so a racing write is at worst considered unsynced (the conservative direction).
"""

from __future__ import annotations

import errno
import random
import types
from typing import Callable, Mapping, Sequence

from rivven_broker.storage.file_store import Buffer

__all__ = ["MemoryFileStore", "MemoryStoreStatistics"]

FaultHook = Callable[[str, str], None]


class _Inode:
    __slots__ = ("data", "synced", "synced_sequence", "marks")

    def __init__(self) -> None:
        self.data = bytearray()
        self.synced = bytearray()
        self.synced_sequence = 0
        #: ``(start, end)`` of each change since the last fsync counted its marks.
        self.marks: list[tuple[int, int]] = []


class _Dir:
    """A directory: live entries and the entries as of its last ``fsync_dir``."""

    __slots__ = ("live", "durable")

    def __init__(self) -> None:
        self.live: dict[str, _Inode | _Dir] = {}
        self.durable: dict[str, _Inode | _Dir] = {}


class MemoryStoreStatistics:
    """Call counters of a ``MemoryFileStore`` (for tests that count fsyncs)."""

    __slots__ = ("fsyncs", "filesystem_syncs", "dir_fsyncs", "writes", "crashes")

    def __init__(self) -> None:
        self.fsyncs = 0
        self.filesystem_syncs = 0
        self.dir_fsyncs = 0
        self.writes = 0
        self.crashes = 0


def _parts(path: str) -> list[str]:
    parts = [part for part in path.split("/") if part]
    assert ".." not in parts, path
    return parts


class MemoryFileStore:
    """A ``FileStore`` in memory with crash semantics. See the module docstring."""

    # Compatibility: tests/unit/storage/test_log_manager.py subclasses this store to add
    # directory renames, looking for directories in ``_live``. Renames of directories are
    # native now; an empty mapping sends that subclass to them. Remove with the subclass.
    _live: Mapping[str, object] = types.MappingProxyType({})

    def __init__(self) -> None:
        self.fault_hook: FaultHook | None = None
        self.stats = MemoryStoreStatistics()
        self._root = _Dir()
        self._handles: dict[int, tuple[_Inode, str]] = {}
        self._next_handle = 3
        self._write_sequence = 0
        self._last_write: tuple[_Inode, int, bytes, int] | None = None

    # --- helpers -----------------------------------------------------------------------------

    def _hook(self, op: str, path: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(op, path)

    def _lookup(self, path: str) -> _Inode | _Dir | None:
        node: _Inode | _Dir | None = self._root
        for part in _parts(path):
            if not isinstance(node, _Dir):
                return None
            node = node.live.get(part)
        return node

    def _directory(self, path: str) -> _Dir:
        node = self._lookup(path)
        if not isinstance(node, _Dir):
            raise FileNotFoundError(errno.ENOENT, "no such directory", path)
        return node

    def _parent(self, path: str) -> tuple[_Dir, str]:
        parts = _parts(path)
        assert parts, f"not a file path: {path!r}"
        return self._directory("/".join(parts[:-1])), parts[-1]

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
        before = len(inode.data)
        if position > before:
            inode.data.extend(bytes(position - before))
        inode.data[position:end] = data
        inode.marks.append((min(position, before), end))  # after the bytes: module docstring
        self._write_sequence += 1
        self._last_write = (inode, position, data, self._write_sequence)
        self.stats.writes += 1

    # --- files -------------------------------------------------------------------------------

    def open(self, path: str, *, create: bool = True) -> int:
        self._hook("open", path)
        parent, name = self._parent(path)
        node = parent.live.get(name)
        if isinstance(node, _Dir):
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        if node is None:
            if not create:
                raise FileNotFoundError(errno.ENOENT, "no such file", path)
            node = parent.live[name] = _Inode()
        handle = self._next_handle
        self._next_handle += 1
        self._handles[handle] = (node, "/".join(_parts(path)))
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
        with memoryview(self._inode(handle).data) as data:  # one copy, not two
            return bytes(data[position : position + size])

    def region(self, handle: int, size: int, position: int) -> bytes:
        return self.pread(handle, size, position)  # no real file to send from

    def fsync(self, handle: int) -> None:
        self._hook("fsync", self._path_of(handle))
        inode = self._inode(handle)
        self._sync_inode(inode, self._write_sequence)  # sequence read before the copy
        self.stats.fsyncs += 1

    def sync_filesystem(self, skip: Callable[[str], bool] | None = None) -> bool:
        """``syncfs(2)``'s model: every file's bytes as of the call become durable, the
        files of the tree and those only open (removed since) alike; names do not (the broker
        fsyncs directories itself: ``file_store.py``). ``skip(path)`` True leaves that file
        as it was (the simulator's lying disk). Always True; raises what ``fault_hook`` does."""
        self._hook("sync_filesystem", "")
        sequence = self._write_sequence  # read before the copies: see the module docstring
        files: dict[int, tuple[_Inode, str]] = {}
        pending: list[tuple[_Dir, str]] = [(self._root, "")]
        while pending:
            directory, prefix = pending.pop()
            for name, node in directory.live.items():
                if isinstance(node, _Dir):
                    pending.append((node, prefix + name + "/"))
                else:
                    files.setdefault(id(node), (node, prefix + name))
        for inode, path in self._handles.values():
            files.setdefault(id(inode), (inode, path))
        for inode, path in files.values():
            if skip is None or not skip(path):
                self._sync_inode(inode, sequence)
        self.stats.filesystem_syncs += 1
        return True

    def _sync_inode(self, inode: _Inode, sequence: int) -> None:
        marks = inode.marks
        counted = len(marks)
        if counted:
            length = len(inode.data)
            synced = inode.synced
            if len(synced) > length:
                del synced[length:]
            else:
                synced.extend(bytes(length - len(synced)))
            spans = marks[:counted]
            start = min(span[0] for span in spans)
            end = min(max(span[1] for span in spans), length)
            if start < end:
                synced[start:end] = inode.data[start:end]
            del marks[:counted]
        inode.synced_sequence = sequence

    def truncate(self, handle: int, size: int) -> None:
        self._hook("truncate", self._path_of(handle))
        assert size >= 0
        inode = self._inode(handle)
        before = len(inode.data)
        if size <= before:
            del inode.data[size:]
        else:
            inode.data.extend(bytes(size - before))
        inode.marks.append((min(size, before), size))

    def allocate(self, handle: int, size: int) -> None:
        self._hook("allocate", self._path_of(handle))
        inode = self._inode(handle)
        before = len(inode.data)
        if size > before:
            inode.data.extend(bytes(size - before))
            inode.marks.append((before, size))

    # --- names -------------------------------------------------------------------------------

    def exists(self, path: str) -> bool:
        return self._lookup(path) is not None

    def listdir(self, path: str) -> list[str]:
        return sorted(self._directory(path).live)

    def makedirs(self, path: str) -> None:
        self._hook("makedirs", path)
        node = self._root
        for part in _parts(path):
            child = node.live.get(part)
            if child is None:
                child = node.live[part] = _Dir()
            elif not isinstance(child, _Dir):
                raise FileExistsError(errno.EEXIST, "a file is in the way", path)
            node = child

    def rename(self, source: str, target: str) -> None:
        self._hook("rename", source)
        source_parent, source_name = self._parent(source)
        target_parent, target_name = self._parent(target)
        node = source_parent.live.get(source_name)
        if node is None:
            raise FileNotFoundError(errno.ENOENT, "no such file or directory", source)
        replaced = target_parent.live.get(target_name)
        if replaced is not None and replaced is not node:
            if isinstance(node, _Dir) != isinstance(replaced, _Dir):
                raise IsADirectoryError(errno.EISDIR, "file and directory mismatch", target)
            if isinstance(replaced, _Dir) and replaced.live:
                raise OSError(errno.ENOTEMPTY, "directory not empty", target)
        del source_parent.live[source_name]
        target_parent.live[target_name] = node

    def remove(self, path: str) -> None:
        self._hook("remove", path)
        parent, name = self._parent(path)
        node = parent.live.get(name)
        if node is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        if isinstance(node, _Dir):
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        del parent.live[name]

    def remove_dir(self, path: str) -> None:
        self._hook("remove_dir", path)
        parent, name = self._parent(path)
        node = parent.live.get(name)
        if not isinstance(node, _Dir):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", path)
        if node.live:
            raise OSError(errno.ENOTEMPTY, "directory not empty", path)
        del parent.live[name]

    def fsync_dir(self, path: str) -> None:
        self._hook("fsync_dir", path)
        directory = self._directory(path)
        directory.durable = dict(directory.live)
        self.stats.dir_fsyncs += 1

    # --- crashes -----------------------------------------------------------------------------

    def crash(self, rng: random.Random | None = None, *, tear_last_write: bool = False) -> None:
        """Drop every unsynced change, as a power loss would; see the module docstring.

        All handles become invalid. With ``tear_last_write`` a prefix of the last write (if it
        was not synced since) survives; its length is ``rng.randrange(len(write))``, or half
        the write without ``rng``. Never blocks, never raises.
        """
        self.stats.crashes += 1
        survivors: dict[int, _Inode] = {}
        pending = [self._root]
        while pending:  # only what is reachable through durable entries survives
            directory = pending.pop()
            directory.live = dict(directory.durable)
            for node in directory.live.values():
                if isinstance(node, _Dir):
                    pending.append(node)
                else:
                    survivors[id(node)] = node
        for inode in survivors.values():
            inode.data = bytearray(inode.synced)
            inode.marks.clear()
        last = self._last_write
        if tear_last_write and last is not None:
            inode, position, data, sequence = last
            if id(inode) in survivors and sequence > inode.synced_sequence and data:
                keep = rng.randrange(len(data)) if rng is not None else len(data) // 2
                self._write(inode, data[:keep], position)
                inode.synced = bytearray(inode.data)
                inode.marks.clear()
        self._handles.clear()
        self._last_write = None
        for inode in survivors.values():
            inode.synced_sequence = self._write_sequence

    # --- test helpers ------------------------------------------------------------------------

    def corrupt(self, path: str, position: int, data: bytes) -> None:
        """Overwrite bytes of a file in both layers (disk damage, for tests). Never blocks."""
        inode = self._lookup(path)
        assert isinstance(inode, _Inode), path
        inode.data[position : position + len(data)] = data
        inode.synced[position : position + len(data)] = data

    def open_handles(self) -> int:
        """How many handles are open (tests check for leaks). Never blocks."""
        return len(self._handles)
