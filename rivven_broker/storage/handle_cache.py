"""``BoundedHandles``: a ``FileStore`` that keeps at most N files open, whatever the log holds.

Theory of operation
-------------------
Every segment has three files (log, offset index, time index), so descriptors grew with
partitions x segments: a 1,000-partition ``CreateTopic`` from any client took 3,000, and the
process ran out (issue 16). This wrapper gives the storage layer *virtual* handles: ``open``
creates or opens the file as asked and returns a number; the real descriptor behind it is
kept in an LRU of at most ``open_files_max``, closed when it falls off the end, and opened
again by path (never creating it) on the next use. The hot paths (the active segment's
append, reads of the tail) stay in the cache and pay one dict lookup and an LRU move.

The bound is strict: after every call at most ``open_files_max`` descriptors are open (plus,
for the length of an ``fsync`` called from another thread, the one it opens). Within it, files
with changes not yet fsynced (writes, preallocation, a truncation that changed the size) are
*pinned*: the LRU closes every clean file before one of them. Closing loses no data (fsync
syncs the file, whichever descriptor wrote it), but Linux reports an asynchronous write-back
error to a later fsync only while the kernel keeps the file's inode, which an open descriptor
guarantees; so a file written stays open until the group commit has synced it, unless the files
being written alone pass the bound (then the oldest of them are closed too, and counted). Under
``sync_policy=none`` nothing is fsynced before close, so nothing is pinned
(``pin_unsynced=False``): every file ever written would otherwise be preferred.

Threads: everything runs on the caller's (the event loop's) thread except ``fsync`` and
``sync_filesystem``, which the group commit and the cleaner may call from theirs. On another
thread ``fsync`` never touches the LRU's descriptors (the loop may close one at any time): it
opens one of its own by path, syncs, closes it, and appends ``(handle, mark)`` to ``_synced``,
the only state it changes (a list append is atomic). On the loop's own thread (the group commit
runs its fsyncs there while they are fast) nothing can close a descriptor under it, so it syncs
the LRU's, reopening it only if it was evicted: no path lookup, no open and close per group
commit (~12 us of a one-request pass here). The storage layer knows no threads: which thread is
the loop's, the broker says (``on_loop_thread``, ``server/sync_thread.py`` ``on_this_thread``);
without it every fsync opens its own. The loop unpins at its next open, and only if no change
came after the mark the sync saw: a write racing the fsync keeps the pin. ``rename`` keeps a
virtual handle's path right (compaction swaps files in place); a handle whose file was removed
fails on its next use as a closed one would (an ``fsync`` of it does nothing: the data is gone
by design).

The wrapper holds no data: reopening is always correct; only its counts (``statistics``)
say how often it had to.
"""

from __future__ import annotations

import itertools
import posixpath
from collections import OrderedDict
from typing import Callable, Sequence

import attrs

from rivven_broker.file_region import FileRegion
from rivven_broker.storage.file_store import Buffer, FileStore

__all__ = ["BoundedHandles", "HandleStatistics"]


@attrs.define
class HandleStatistics:
    """Counts of a ``BoundedHandles`` (cumulative except the ``_now`` ones)."""

    opened: int = 0  # real opens by the cache, first and again (not fsync's own)
    reopened: int = 0  # opens of a handle whose descriptor the LRU had closed
    evicted: int = 0  # descriptors the LRU closed
    evicted_unsynced: int = 0  # ... of them, files still waiting for their fsync
    open_now: int = 0  # at most open_files_max
    pinned_now: int = 0  # written and not yet known synced (fsynced ones unpin at the next open)


class BoundedHandles:
    """A ``FileStore`` over ``store`` with at most ``open_files_max`` real descriptors open.
    Not thread-safe except ``fsync`` (see the module docstring): one caller at a time, as the
    storage layer already is."""

    def __init__(
        self, store: FileStore, open_files_max: int, *, pin_unsynced: bool = True,
        on_loop_thread: Callable[[], bool] | None = None,
    ) -> None:
        assert open_files_max >= 4
        self._store = store
        self._on_loop_thread = on_loop_thread
        self.open_files_max = open_files_max
        self._pin = pin_unsynced
        self._paths: dict[int, str] = {}  # virtual handle -> path
        self._in_dir: dict[str, set[int]] = {}  # directory -> handles of files directly in it
        self._real: OrderedDict[int, int] = OrderedDict()  # virtual -> real, LRU order
        self._dirty: dict[int, int] = {}  # pinned handle -> mark of its last change
        self._marks = itertools.count(1)
        self._synced: list[tuple[int, int]] = []  # (handle, mark) fsynced; the loop unpins
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
        self._in_dir.setdefault(posixpath.dirname(path), set()).add(handle)
        self._real[handle] = real
        self.stats.opened += 1
        self._evict()
        return handle

    def close(self, handle: int) -> None:
        self._forget_path(handle, self._paths.pop(handle))
        self._dirty.pop(handle, None)
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

    def _changed(self, handle: int) -> None:
        """Pin ``handle`` after a change to its file, done or failed (a failed write may have
        written part of its bytes)."""
        if self._pin:
            self._dirty[handle] = next(self._marks)

    def _evict(self) -> None:
        """Unpin what was fsynced since, then close least recently used descriptors beyond
        the bound: clean files first, pinned ones only if they alone pass it; never the most
        recent (the one the caller is about to use)."""
        while self._synced:
            handle, mark = self._synced.pop()
            if self._dirty.get(handle) == mark:  # no change since the mark that was synced
                del self._dirty[handle]
        excess = len(self._real) - self.open_files_max
        if excess <= 0:
            return
        newest = next(reversed(self._real))
        victims: list[int] = []
        for pinned_too in (False, True):  # the scan stops once it has enough, from the LRU end
            for handle in self._real:
                if len(victims) == excess or handle == newest:
                    break
                if (handle in self._dirty) == pinned_too:
                    victims.append(handle)
        for handle in victims:
            self._store.close(self._real.pop(handle))
            if handle in self._dirty:
                self.stats.evicted_unsynced += 1
        self.stats.evicted += len(victims)

    def statistics(self) -> HandleStatistics:
        """Counts (a copy). Never blocks."""
        self.stats.open_now = len(self._real)
        self.stats.pinned_now = len(self._dirty)
        return attrs.evolve(self.stats)

    # --- data ------------------------------------------------------------------------------

    def size(self, handle: int) -> int:
        return self._store.size(self._fd(handle))

    def pwrite(self, handle: int, data: Buffer, position: int) -> None:
        real = self._fd(handle)
        try:
            self._store.pwrite(real, data, position)
        finally:
            self._changed(handle)

    def pwritev(self, handle: int, parts: Sequence[Buffer], position: int) -> None:
        real = self._fd(handle)
        try:
            self._store.pwritev(real, parts, position)
        finally:
            self._changed(handle)

    def pread(self, handle: int, size: int, position: int) -> bytes:
        return self._store.pread(self._fd(handle), size, position)

    def region(self, handle: int, size: int, position: int) -> bytes | FileRegion:
        # A FileRegion holds a duplicate of the descriptor: evicting ours never breaks it.
        return self._store.region(self._fd(handle), size, position)

    def fsync(self, handle: int) -> None:
        # On another thread (the group commit's or the cleaner's, while the loop opens and
        # evicts) it never uses the LRU's descriptors and changes nothing but ``_synced``; on
        # the loop's own thread it syncs the LRU's. The mark is read before the sync, so a
        # change racing it leaves the handle pinned.
        mark = self._dirty.get(handle)
        on_loop_thread = self._on_loop_thread
        if on_loop_thread is not None and on_loop_thread():  # nothing closes it meanwhile
            try:
                real = self._fd(handle)
            except FileNotFoundError:
                return  # removed meanwhile (retention, a deleted topic): nothing left to sync
            self._store.fsync(real)
        else:
            try:
                real = self._store.open(self._paths[handle], create=False)
            except FileNotFoundError:
                return  # as above
            try:
                self._store.fsync(real)
            finally:
                self._store.close(real)
        if mark is not None:
            self._synced.append((handle, mark))

    def sync_filesystem(self) -> bool:
        # Thread rules as ``fsync``'s: the marks are copied before the sync (one dict copy,
        # atomic under the GIL), so a change racing it keeps its pin.
        marks = list(dict(self._dirty).items())
        if not self._store.sync_filesystem():
            return False
        self._synced.extend(marks)
        return True

    def truncate(self, handle: int, size: int) -> None:
        real = self._fd(handle)
        if self._store.size(real) != size:  # a new, empty file stays unpinned
            try:
                self._store.truncate(real, size)
            finally:
                self._changed(handle)

    def allocate(self, handle: int, size: int) -> None:
        real = self._fd(handle)
        try:
            self._store.allocate(real, size)
        finally:
            self._changed(handle)

    # --- names -----------------------------------------------------------------------------

    def exists(self, path: str) -> bool:
        return self._store.exists(path)

    def listdir(self, path: str) -> list[str]:
        return self._store.listdir(path)

    def makedirs(self, path: str) -> None:
        self._store.makedirs(path)

    def rename(self, source: str, target: str) -> None:
        """Rename, and follow it: handles of the file ``source``, or of the files directly in
        the directory ``source`` (the data directory's layout has no deeper ones), name their
        files by the new path from now on. Costs the handles moved, not all of them."""
        self._store.rename(source, target)
        inside = self._in_dir.pop(source, None)  # ``source`` is a directory with open files
        if inside is not None:
            self._in_dir.setdefault(target, set()).update(inside)
            for handle in inside:
                self._paths[handle] = target + self._paths[handle][len(source):]
        siblings = self._in_dir.get(posixpath.dirname(source), ())
        for handle in [h for h in siblings if self._paths[h] == source]:  # the file ``source``
            self._forget_path(handle, source)
            self._paths[handle] = target
            self._in_dir.setdefault(posixpath.dirname(target), set()).add(handle)

    def _forget_path(self, handle: int, path: str) -> None:
        directory = posixpath.dirname(path)
        inside = self._in_dir[directory]
        inside.discard(handle)
        if not inside:
            del self._in_dir[directory]

    def remove(self, path: str) -> None:
        self._store.remove(path)

    def remove_dir(self, path: str) -> None:
        self._store.remove_dir(path)

    def fsync_dir(self, path: str) -> None:
        self._store.fsync_dir(path)
