"""``BoundedHandles``: a ``FileStore`` that keeps at most N files open, whatever the log holds.

Theory of operation
-------------------
Every segment has three files (log, offset index, time index), so descriptors grew with
partitions x segments: a 1,000-partition ``CreateTopic`` from any client took 3,000, and the
process ran out (issue 16). This wrapper gives the storage layer *virtual* handles: ``open``
creates or opens the file as asked and returns a number; the real descriptor behind it is
kept in an LRU of at most ``open_files_max``, closed when it falls off the end, and opened
again by path on the next use. The hot paths (the active segment's append and fsync, reads of
the tail) stay in the cache and pay one dict lookup.

A descriptor with changes not yet fsynced (writes, preallocation, a truncation that changed
the size) is *pinned* and never closed by the LRU: closing does not lose the data on Linux
(fsync syncs the file, whichever descriptor wrote it), but an asynchronous write-back error is
only reported to descriptors open when it happens, and the group commit must see it; and the
group commit may fsync from its own thread, so a descriptor it may use must not move (an fsync
of an unpinned handle uses a descriptor of its own). So the bound can be exceeded by the files
being written between two group commits, which the group commit itself bounds. ``rename`` keeps a virtual handle's path
right (compaction swaps files in place); a handle whose file was removed fails on its next
use as a closed one would.

The wrapper holds no data: reopening is always correct; only its counts (``statistics``)
say how often it had to.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import attrs

from rivven_broker.file_region import FileRegion
from rivven_broker.storage.file_store import Buffer, FileStore

__all__ = ["BoundedHandles", "HandleStatistics"]


@attrs.define
class HandleStatistics:
    opened: int = 0  # real opens, first and again
    reopened: int = 0  # opens of a handle whose descriptor the LRU had closed
    evicted: int = 0
    open_now: int = 0
    pinned_now: int = 0
    #: Handles unpinned by an fsync since the last eviction pass (open beyond the bound until
    #: the next open on the loop evicts them: fsync may run off the loop).
    unpinned: int = 0


class BoundedHandles:
    """A ``FileStore`` over ``store`` with at most ``open_files_max`` real descriptors open
    (plus those pinned by unsynced writes). Not thread-safe: one caller at a time, as the
    storage layer already is (the fsync thread only calls ``fsync``; see ``fsync``)."""

    def __init__(self, store: FileStore, open_files_max: int) -> None:
        assert open_files_max >= 4
        self._store = store
        self.open_files_max = open_files_max
        self._paths: dict[int, str] = {}  # virtual handle -> path
        self._real: OrderedDict[int, int] = OrderedDict()  # virtual -> real, LRU order
        self._dirty: set[int] = set()  # virtual handles with writes since their last fsync
        self._next = 1
        self.stats = HandleStatistics()

    def __getattr__(self, name: str) -> object:  # whatever else the store offers (root ...)
        return getattr(self._store, name)

    # --- handles ---------------------------------------------------------------------------

    def open(self, path: str, *, create: bool = True) -> int:
        real = self._store.open(path, create=create)
        handle = self._next
        self._next += 1
        self._paths[handle] = path
        self._real[handle] = real
        self.stats.opened += 1
        self._evict()
        return handle

    def close(self, handle: int) -> None:
        self._paths.pop(handle)
        self._dirty.discard(handle)
        real = self._real.pop(handle, None)
        if real is not None:
            self._store.close(real)

    def _fd(self, handle: int) -> int:
        real = self._real.get(handle)
        if real is not None:
            self._real.move_to_end(handle)
            return real
        path = self._paths[handle]  # KeyError: a closed handle (a programmer error)
        real = self._store.open(path, create=False)
        self._real[handle] = real
        self.stats.opened += 1
        self.stats.reopened += 1
        self._evict()
        return real

    def _evict(self) -> None:
        """Close least recently used descriptors beyond the bound: never a pinned one, nor
        the most recent (the one the caller is about to use)."""
        self.stats.unpinned = 0
        if len(self._real) <= self.open_files_max:
            return
        for handle in list(self._real)[:-1]:
            if len(self._real) <= self.open_files_max:
                break
            if handle in self._dirty:
                continue
            self._store.close(self._real.pop(handle))
            self.stats.evicted += 1

    def statistics(self) -> HandleStatistics:
        self.stats.open_now = len(self._real)
        self.stats.pinned_now = len(self._dirty)
        return attrs.evolve(self.stats)

    # --- data ------------------------------------------------------------------------------

    def size(self, handle: int) -> int:
        return self._store.size(self._fd(handle))

    def pwrite(self, handle: int, data: Buffer, position: int) -> None:
        real = self._fd(handle)
        self._dirty.add(handle)
        self._store.pwrite(real, data, position)

    def pwritev(self, handle: int, parts: Sequence[Buffer], position: int) -> None:
        real = self._fd(handle)
        self._dirty.add(handle)
        self._store.pwritev(real, parts, position)

    def pread(self, handle: int, size: int, position: int) -> bytes:
        return self._store.pread(self._fd(handle), size, position)

    def region(self, handle: int, size: int, position: int) -> bytes | FileRegion:
        return self._store.region(self._fd(handle), size, position)

    def fsync(self, handle: int) -> None:
        # The group commit may call this from its fsync thread while the loop opens and evicts
        # others. A handle with changes is pinned, so its descriptor stays open and in place;
        # any other (data written before a restart, say) is synced through a descriptor of its
        # own, opened and closed here: the shared LRU is never touched off the loop.
        if handle in self._dirty:
            self._store.fsync(self._real[handle])
            self._dirty.discard(handle)
            self.stats.unpinned += 1  # over the bound until the next open evicts
            return
        try:
            real = self._store.open(self._paths[handle], create=False)
        except FileNotFoundError:
            return  # removed meanwhile (retention, a deleted topic): nothing left to sync
        try:
            self._store.fsync(real)
        finally:
            self._store.close(real)

    def truncate(self, handle: int, size: int) -> None:
        real = self._fd(handle)
        if self._store.size(real) != size:  # a new, empty file stays unpinned
            self._dirty.add(handle)
            self._store.truncate(real, size)

    def allocate(self, handle: int, size: int) -> None:
        real = self._fd(handle)
        self._dirty.add(handle)
        self._store.allocate(real, size)

    # --- names -----------------------------------------------------------------------------

    def exists(self, path: str) -> bool:
        return self._store.exists(path)

    def listdir(self, path: str) -> list[str]:
        return self._store.listdir(path)

    def makedirs(self, path: str) -> None:
        self._store.makedirs(path)

    def rename(self, source: str, target: str) -> None:
        self._store.rename(source, target)
        prefix = source + "/"
        for handle, path in self._paths.items():  # a file, or files under a directory
            if path == source:
                self._paths[handle] = target
            elif path.startswith(prefix):
                self._paths[handle] = target + path[len(source):]

    def remove(self, path: str) -> None:
        self._store.remove(path)

    def remove_dir(self, path: str) -> None:
        self._store.remove_dir(path)

    def fsync_dir(self, path: str) -> None:
        self._store.fsync_dir(path)
