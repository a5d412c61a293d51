"""``BoundedHandles``: an LRU of real descriptors behind virtual handles.

Method: over ``MemoryFileStore`` (which counts its open handles), open many files, use them
in orders that force evictions, and check that the data is always the file's, that at most
the bound stays open (plus pinned and the one in use), that written-but-unsynced files stay
open until fsynced, that an fsync of an evicted file still reaches it, and that renames and
removals are followed.
"""

from __future__ import annotations

from rivven_broker.storage.handle_cache import BoundedHandles
from rivven_broker.storage.memory_store import MemoryFileStore


def _store() -> tuple[MemoryFileStore, BoundedHandles]:
    store = MemoryFileStore()
    store.makedirs("d")
    return store, BoundedHandles(store, 4)


def test_many_files_few_descriptors_and_every_read_right():
    store, files = _store()
    handles = [files.open(f"d/f{i}") for i in range(50)]
    for i, handle in enumerate(handles):
        files.pwrite(handle, b"file %d" % i, 0)
        files.fsync(handle)  # unpinned: evictable
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
    dirty = [files.open(f"d/w{i}") for i in range(6)]
    for handle in dirty:
        files.pwrite(handle, b"unsynced", 0)
    others = [files.open(f"d/r{i}") for i in range(10)]
    assert all(files._real.get(handle) is not None for handle in dirty)  # pinned
    assert files.statistics().pinned_now == 6
    for handle in dirty:
        files.fsync(handle)
    files.open("d/trigger")  # the next open evicts what the fsyncs unpinned
    assert store.open_handles() <= 5
    del others


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


def test_renames_are_followed_and_removed_files_need_no_sync():
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
