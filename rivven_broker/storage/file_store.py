"""The ``FileStore`` seam: every byte the storage layer reads or writes passes through here.

Theory of operation
-------------------
Storage code never calls ``open``/``os.*`` itself. It asks a ``FileStore`` for a handle and then
reads, writes, syncs and truncates through it. Production uses ``OsFileStore`` (real files,
``os.pwrite``/``os.fdatasync``); tests and the simulator use ``MemoryFileStore``
(``memory_store.py``), which keeps a durable and a volatile layer so that a simulated crash drops
every write that was not synced and may tear the last one.

Paths are ``/``-separated and relative to the store's root. Handles are small integers (file
descriptors in the OS store). ``fsync`` (of the handle it is given), ``sync_filesystem``,
``fsync_dir`` and ``remove`` (of names no handle-holding code uses any more: retention's
``*.deleted`` files) are the only calls that may run on a worker thread; everything else happens
on the caller's thread.

Semantics every implementation keeps (the partition log relies on them):
- ``pwrite`` writes all bytes or raises ``OSError``; data is visible to ``pread`` at once.
- After ``fsync(h)`` returns, every byte written to ``h`` before the call survives a crash.
- ``sync_filesystem()`` returns True after making every byte written to any of the store's files
  before the call survive a crash, as an ``fsync`` of each would (``OsFileStore``: one
  ``syncfs(2)`` of the file system holding the root), or returns False having done nothing
  when the store cannot (the caller then fsyncs file by file). It raises ``OSError`` as
  ``fsync`` does, and an error means what a failed ``fsync`` means: data may be lost, stop.
  Names (``rename``, ``makedirs``, ``remove``) still need ``fsync_dir``: the broker never relies
  on ``sync_filesystem`` for them, so the memory store does not make them durable either.
- ``rename`` atomically replaces ``dst``; it survives a crash only after ``fsync_dir`` of the
  parent directory. ``makedirs`` and ``remove`` likewise need ``fsync_dir`` to be durable.
- ``allocate(h, size)`` makes the file at least ``size`` bytes, zero-filled, without changing
  the bytes already there (preallocation ahead of the writer).
- ``region(h, size, position)`` is ``pread``'s bytes, or a ``FileRegion`` naming them
  (``OsFileStore``: the socket writer then sends them with ``os.sendfile``, no copy in the
  process; the bytes after all when the process is out of file descriptors, as a region
  holds one). Stores without real files return the bytes.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from typing import Callable, Protocol, Sequence

from rivven_broker.file_region import FileRegion

__all__ = ["FileStore", "OsFileStore", "Buffer"]

Buffer = bytes | bytearray | memoryview

#: Data files and directories are the broker's own (and its group's, for backups and
#: monitoring): never world-readable. Records may be anyone's secrets.
_FILE_MODE = 0o640
_DIR_MODE = 0o750


class FileStore(Protocol):
    """Where the storage layer keeps its files. See the module docstring for the semantics."""

    def open(self, path: str, *, create: bool = True) -> int: ...
    def close(self, handle: int) -> None: ...
    def size(self, handle: int) -> int: ...
    def pwrite(self, handle: int, data: Buffer, position: int) -> None: ...
    def pwritev(self, handle: int, parts: Sequence[Buffer], position: int) -> None: ...
    def pread(self, handle: int, size: int, position: int) -> bytes: ...
    def region(self, handle: int, size: int, position: int) -> bytes | FileRegion: ...
    def fsync(self, handle: int) -> None: ...
    def sync_filesystem(self) -> bool: ...
    def truncate(self, handle: int, size: int) -> None: ...
    def allocate(self, handle: int, size: int) -> None: ...
    def exists(self, path: str) -> bool: ...
    def listdir(self, path: str) -> list[str]: ...
    def makedirs(self, path: str) -> None: ...
    def rename(self, source: str, target: str) -> None: ...
    def remove(self, path: str) -> None: ...
    def remove_dir(self, path: str) -> None: ...
    def fsync_dir(self, path: str) -> None: ...


def _load_syncfs() -> Callable[[int], int] | None:
    """libc's ``syncfs``, where it also reports write-back errors: Linux 5.8 and later (since
    then the kernel remembers an error on the file system and ``syncfs`` returns it to every
    descriptor opened before it; earlier kernels returned 0 whatever was lost). None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        major, minor = (int(part) for part in os.uname().release.split(".")[:2])
    except ValueError:
        return None
    if (major, minor) < (5, 8):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int
    return function


_syncfs = _load_syncfs()


class OsFileStore:
    """Real files under ``root``. The only storage module that touches ``os`` for files.

    ``sync_filesystem`` is ``syncfs(2)`` on a descriptor of the root, opened with the store so
    that the kernel reports to it every write-back error from then on. It declines (False)
    where ``syncfs`` cannot report errors (not Linux, a kernel before 5.8), when ``syncfs=False``
    was asked, and once a file was opened on another file system than the root (a mount point
    inside the data directory: the first file opened in each directory is checked). It syncs
    the whole file system, other programs' files too: on a disk shared with a heavy writer it
    can take longer than fsyncs of the broker's own files, and a write-back error of any file
    there stops the broker (the safe side)."""

    def __init__(self, root: str, *, syncfs: bool = True) -> None:
        self.root = os.path.abspath(root)
        os.makedirs(self.root, _DIR_MODE, exist_ok=True)
        self._root_fd: int | None = None
        self._one_filesystem = False  # every file opened so far is on the root's file system
        #: Directories whose files were checked: a mount point is a directory, so the first
        #: file opened in each tells (the bounded handle cache opens a file per fsync: one
        #: ``fstat`` per directory, not per open)
        self._checked: set[str] = set()
        if syncfs and _syncfs is not None:
            self._root_fd = os.open(self.root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
                                    | getattr(os, "O_CLOEXEC", 0))
            self._device = os.fstat(self._root_fd).st_dev
            self._one_filesystem = True
        self.filesystem_syncs = 0  # statistics and tests

    def __del__(self) -> None:
        fd, self._root_fd = getattr(self, "_root_fd", None), None
        if fd is not None:
            os.close(fd)

    def _path(self, path: str) -> str:
        assert not os.path.isabs(path), path
        assert ".." not in path.split("/"), path
        return os.path.join(self.root, path) if path else self.root

    def open(self, path: str, *, create: bool = True) -> int:
        flags = os.O_RDWR | getattr(os, "O_CLOEXEC", 0)
        if create:
            flags |= os.O_CREAT
        handle = os.open(self._path(path), flags, _FILE_MODE)
        if self._one_filesystem:
            directory = path.rpartition("/")[0]
            if directory not in self._checked:
                if os.fstat(handle).st_dev != self._device:
                    self._one_filesystem = False  # for good: syncfs would miss this file
                self._checked.add(directory)
        return handle

    def close(self, handle: int) -> None:
        os.close(handle)

    def size(self, handle: int) -> int:
        return os.fstat(handle).st_size

    def pwrite(self, handle: int, data: Buffer, position: int) -> None:
        view = memoryview(data)
        while view:
            written = os.pwrite(handle, view, position)
            if written <= 0:  # pragma: no cover - the kernel reports errors by raising
                raise OSError(errno.EIO, "short write")
            view = view[written:]
            position += written

    def pwritev(self, handle: int, parts: Sequence[Buffer], position: int) -> None:
        total = sum(map(len, parts))
        written = os.pwritev(handle, parts, position)
        if written != total:  # rare: fall back to finishing part by part
            done = 0
            for part in parts:
                end = done + len(part)
                if end > written:
                    start = max(written - done, 0)
                    self.pwrite(handle, memoryview(part)[start:], position + done + start)
                done = end

    def pread(self, handle: int, size: int, position: int) -> bytes:
        return os.pread(handle, size, position)

    def region(self, handle: int, size: int, position: int) -> bytes | FileRegion:
        try:
            return FileRegion.of(handle, position, size)
        except OSError as exc:  # out of descriptors (a region holds one): copy instead
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            return self.pread(handle, size, position)

    def fsync(self, handle: int) -> None:
        os.fdatasync(handle)

    def sync_filesystem(self) -> bool:
        # The loop may clear ``_one_filesystem`` meanwhile: only for a file opened after the
        # group this call serves took its handles, so not one this call must sync.
        fd = self._root_fd
        if fd is None or not self._one_filesystem:
            return False
        assert _syncfs is not None
        if _syncfs(fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"syncfs of {self.root}: {os.strerror(code)}")
        self.filesystem_syncs += 1
        return True

    def truncate(self, handle: int, size: int) -> None:
        os.ftruncate(handle, size)

    def allocate(self, handle: int, size: int) -> None:
        current = os.fstat(handle).st_size
        if size <= current:
            return
        # Write real zeros (not fallocate's unwritten extents): fdatasync of an append into
        # written blocks does not have to convert extents, which measured cheaper here.
        chunk = bytes(min(size - current, 1 << 20))
        position = current
        while position < size:
            part = memoryview(chunk)[: size - position]
            self.pwrite(handle, part, position)
            position += len(part)

    def exists(self, path: str) -> bool:
        return os.path.exists(self._path(path))

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(self._path(path)))

    def makedirs(self, path: str) -> None:
        os.makedirs(self._path(path), _DIR_MODE, exist_ok=True)

    def rename(self, source: str, target: str) -> None:
        os.replace(self._path(source), self._path(target))

    def remove(self, path: str) -> None:
        os.remove(self._path(path))

    def remove_dir(self, path: str) -> None:
        os.rmdir(self._path(path))
        self._checked.discard(path)  # a name made again (or mounted on) is checked again

    def fsync_dir(self, path: str) -> None:
        fd = os.open(self._path(path), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
