"""``BoundedHandles``: an LRU of real descriptors behind virtual handles.

Method: over ``MemoryFileStore`` (which counts its open handles), open many files, use them
in orders that force evictions, and check that the data is always the file's; that never more
than the bound stays open, even when every file is being written; that written-but-unsynced
files are the last closed, and stay pinned when a write races the fsync; that nothing is
pinned when nothing will be fsynced; that an fsync from another thread reaches its file
whatever the cache does meanwhile (evicting everything in the middle of it, from the store's
fault hook), and one on the cache's own thread syncs the cache's descriptor; that renames
of files and directories are followed and a removed file is never created again; and, over
real files, that a ``FileRegion`` outlives the eviction of the descriptor it was made from.
"""

from __future__ import annotations

import os
import random
import threading
from typing import Callable

import pytest

from rivven_broker.file_region import FileRegion
from rivven_broker.storage.file_store import OsFileStore
from rivven_broker.server.sync_thread import on_this_thread
from rivven_broker.storage.handle_cache import BoundedHandles
from rivven_broker.storage.memory_store import MemoryFileStore


def _store(*, pin_unsynced: bool = True) -> tuple[MemoryFileStore, BoundedHandles]:
    store = MemoryFileStore()
    store.makedirs("d")
    store.fsync_dir("")
    return store, BoundedHandles(store, 4, pin_unsynced=pin_unsynced)


def test_many_files_few_descriptors_and_every_read_right():
    store, files = _store()
    handles = [files.open(f"d/f{i}") for i in range(50)]
    for i, handle in enumerate(handles):
        files.pwrite(handle, b"file %d" % i, 0)
        files.fsync(handle)  # unpinned at the next open: evictable
    assert store.open_handles() <= 5
    for i in (3, 47, 3, 0, 25):
        assert files.pread(handles[i], 7, 0).rstrip(b"\0").startswith(b"file %d" % i)
        assert store.open_handles() <= 5
    stats = files.statistics()
    assert stats.reopened >= 4 and stats.evicted >= 45
    for handle in handles:
        files.close(handle)
    assert store.open_handles() == 0


def test_unsynced_files_stay_open_until_fsynced():
    store, files = _store()
    dirty = [files.open(f"d/w{i}") for i in range(3)]
    for handle in dirty:
        files.pwrite(handle, b"unsynced", 0)
    for i in range(10):
        files.open(f"d/r{i}")  # the clean files are the ones closed
    assert files.statistics().pinned_now == 3 and store.open_handles() == 4
    before = files.statistics().opened
    for handle in dirty:
        assert files.pread(handle, 8, 0) == b"unsynced"
    assert files.statistics().opened == before  # never closed, never reopened
    for handle in dirty:
        files.fsync(handle)
    files.open("d/trigger")  # the next open unpins what was synced
    assert files.statistics().pinned_now == 0
    for i in range(4):
        files.open(f"d/s{i}")
    assert files.statistics().opened > before + 4  # now the once dirty ones went too


def test_the_bound_holds_even_when_every_file_is_being_written():
    """Files written faster than they are synced (tiny segments rolling under a slow disk)
    must not take descriptors past the bound: the oldest of them are closed too, and their
    fsync, later, still reaches them."""
    store, files = _store()
    handles = [files.open(f"d/w{i}") for i in range(12)]
    files.fsync_dir("d")
    for i, handle in enumerate(handles):
        files.pwrite(handle, b"w%d" % i, 0)
        assert store.open_handles() <= 4
    stats = files.statistics()
    assert stats.pinned_now == 12 and stats.evicted_unsynced >= 8
    for handle in handles:
        files.fsync(handle)
    store.crash(random.Random(2), tear_last_write=True)
    for i in range(12):
        assert store.pread(store.open(f"d/w{i}", create=False), 3, 0).rstrip(b"\0") == b"w%d" % i


def _on_another_thread(call: Callable[[], None]) -> None:
    """``call()`` on a thread of its own, as the group commit's fsyncs run when slow."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # (re-raised on the caller's thread)
            failures.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failures:
        raise failures[0]


def test_fsync_on_another_thread_never_uses_a_descriptor_the_cache_may_close():
    """The group commit fsyncs on its own thread while the loop opens files and evicts: here
    the loop evicts everything, the pinned file too, in the middle of the fsync (from the
    store's fault hook). The fsync runs on a descriptor of its own, so it is unaffected; on
    the cache's, the store would refuse the closed handle."""
    store, files = _store()
    handle = files.open("d/active")
    files.pwrite(handle, b"data", 0)

    def evict_everything(op: str, path: str) -> None:
        if op == "fsync":
            store.fault_hook = None
            for i in range(8):
                files.pwrite(files.open(f"d/x{i}"), b"x", 0)

    store.fault_hook = evict_everything
    _on_another_thread(lambda: files.fsync(handle))
    assert files.statistics().evicted_unsynced >= 1  # "d/active" was closed under the fsync
    assert files.pread(handle, 4, 0) == b"data"


def test_fsync_on_the_loops_thread_syncs_the_caches_descriptor():
    """On the loop's thread (``on_loop_thread``, as the broker gives it; the group commit runs
    its fsyncs there while they are fast) nothing can close a descriptor during the fsync: it
    syncs the LRU's and opens nothing, unless the LRU had closed it. From another thread it
    opens its own. Either way the file is unpinned at the next open. Without
    ``on_loop_thread`` every fsync opens its own."""
    store = MemoryFileStore()
    store.makedirs("d")
    files = BoundedHandles(store, 4, on_loop_thread=on_this_thread())
    handle = files.open("d/active")
    files.pwrite(handle, b"data", 0)
    ops: list[str] = []
    store.fault_hook = lambda op, path: ops.append(op)
    files.fsync(handle)
    assert ops == ["fsync"]
    assert files.statistics().opened == 1
    ops.clear()
    _on_another_thread(lambda: files.fsync(handle))
    assert ops == ["open", "fsync"]
    store.fault_hook = None
    for i in range(8):  # the fsyncs unpinned it: the LRU may close it now
        files.open(f"d/other{i}")
    assert files.statistics().pinned_now == 0
    files.pwrite(handle, b"more", 4)  # evicted (unpinned): the write reopens and pins it
    ops.clear()
    store.fault_hook = lambda op, path: ops.append(op)
    for i in range(8):
        files.open(f"d/third{i}")  # "d/active" is pinned again: the LRU keeps it
    ops.clear()
    files.fsync(handle)
    assert ops == ["fsync"]
    assert files.pread(handle, 8, 0) == b"datamore"
    plain_store, unaware = _store()
    other = unaware.open("d/x")
    unaware.pwrite(other, b"x", 0)
    plain_store.fault_hook = lambda op, path: ops.append(op)
    ops.clear()
    unaware.fsync(other)
    assert ops == ["open", "fsync"]


def test_a_write_racing_an_fsync_keeps_the_file_pinned():
    """The group commit fsyncs on its own thread while the loop appends: the loop's write
    lands between the fsync reading the handle's mark and finishing, so that fsync does not
    cover it, and the file must stay pinned until a later fsync does."""
    store, files = _store()
    handle = files.open("d/active")
    files.pwrite(handle, b"first", 0)

    def write_during_the_fsync(op: str, path: str) -> None:
        if op == "fsync":
            store.fault_hook = None
            files.pwrite(handle, b"second", 5)

    store.fault_hook = write_during_the_fsync
    _on_another_thread(lambda: files.fsync(handle))
    for i in range(8):
        files.open(f"d/other{i}")  # unpins only what the fsync covered, then evicts
    assert files.statistics().pinned_now == 1
    assert files.statistics().reopened == 0  # the written file was kept, the clean ones went
    assert files.pread(handle, 11, 0) == b"firstsecond"
    files.fsync(handle)
    files.open("d/later")
    assert files.statistics().pinned_now == 0


def test_nothing_is_pinned_when_nothing_will_be_fsynced():
    """``sync_policy=none``: files are written and never fsynced until close; pinning them
    would keep every file ever written open."""
    store, files = _store(pin_unsynced=False)
    handles = [files.open(f"d/n{i}") for i in range(20)]
    for i, handle in enumerate(handles):
        files.pwrite(handle, b"%d" % i, 0)
    files.fsync_dir("d")
    assert store.open_handles() <= 4
    assert files.statistics().pinned_now == 0
    for handle in handles:  # the close-time flush: through descriptors of its own
        files.fsync(handle)
    assert store.open_handles() <= 4
    store.crash(random.Random(0), tear_last_write=True)
    for i in range(20):  # every fsync reached its file
        assert store.pread(store.open(f"d/n{i}", create=False), 2, 0).rstrip(b"\0") == b"%d" % i


def test_a_fresh_empty_file_is_not_pinned_and_fsync_of_an_evicted_file_reaches_it():
    store, files = _store()
    fresh = [files.open(f"d/n{i}") for i in range(8)]
    for handle in fresh:
        files.truncate(handle, 0)  # a new segment's files: already empty, nothing to pin
    assert files.statistics().pinned_now == 0 and store.open_handles() <= 5
    before = store.stats.fsyncs
    files.fsync(fresh[0])  # evicted: synced through a descriptor of its own
    assert store.stats.fsyncs == before + 1
    assert store.open_handles() <= 5


def test_an_fsync_of_an_evicted_file_makes_its_data_survive_a_crash():
    store, files = _store()
    handle = files.open("d/log")
    files.fsync_dir("d")
    files.pwrite(handle, b"durable", 0)
    files.fsync(handle)
    for i in range(8):
        files.open(f"d/x{i}")  # evicts "d/log"
    files.pwrite(handle, b"!", 7)  # reopened, written, pinned again
    for i in range(8):
        files.open(f"d/y{i}")
    files.fsync(handle)
    store.crash(random.Random(1), tear_last_write=False)
    fresh = BoundedHandles(store, 4)
    assert fresh.pread(fresh.open("d/log", create=False), 8, 0) == b"durable!"


def test_renames_are_followed_and_removed_files_are_never_created_again():
    store, files = _store()
    handle = files.open("d/a.cleaned")
    files.pwrite(handle, b"cleaned", 0)
    files.fsync(handle)
    files.rename("d/a.cleaned", "d/a")
    for i in range(8):
        files.open(f"d/x{i}")  # evict it
    assert files.pread(handle, 7, 0) == b"cleaned"
    store.makedirs("t-0")
    inner = files.open("t-0/seg")
    files.rename("t-0", "t-0.x-delete")
    for i in range(8):
        files.open(f"d/y{i}")
    files.remove("t-0.x-delete/seg")
    files.fsync(inner)  # gone: nothing to sync, no error
    with pytest.raises(FileNotFoundError):
        files.pread(inner, 1, 0)  # an evicted handle of a removed file
    assert not store.exists("t-0.x-delete/seg") and not store.exists("t-0/seg")
    files.close(inner)


def test_a_region_outlives_the_eviction_of_its_descriptor(tmp_path):
    """Zero-copy reads: a ``FileRegion`` duplicates the descriptor, so evicting (closing)
    ours while the region is still to be sent never breaks it."""
    store = OsFileStore(str(tmp_path))
    store.makedirs("d")
    files = BoundedHandles(store, 4)
    handle = files.open("d/segment.log")
    files.pwrite(handle, b"x" * 100 + b"payload", 0)
    files.fsync(handle)
    region = files.region(handle, 7, 100)
    assert isinstance(region, FileRegion)
    others = [files.open(f"d/o{i}") for i in range(8)]  # evicts and closes ours
    assert files.statistics().evicted >= 1
    before = len(os.listdir("/proc/self/fd"))
    assert region.read() == b"payload"
    region.close()
    assert len(os.listdir("/proc/self/fd")) == before - 1
    for other in [handle, *others]:
        files.close(other)
