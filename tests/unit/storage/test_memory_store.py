"""MemoryFileStore keeps exactly the promises of the FileStore seam, including under crashes.

Method: drive the store through writes, syncs, renames and removals, crash it, and check what
survived: synced bytes do, unsynced bytes do not, names need an fsync of their directory, a torn
last write leaves a prefix, handles die with the crash, and the fault hook fires before any
effect.
"""

from __future__ import annotations

import errno
import random

import pytest

from rivven_broker.storage.memory_store import MemoryFileStore


def read_all(store: MemoryFileStore, path: str) -> bytes:
    handle = store.open(path, create=False)
    try:
        return store.pread(handle, store.size(handle), 0)
    finally:
        store.close(handle)


def durable_file(store: MemoryFileStore, path: str, data: bytes) -> int:
    handle = store.open(path)
    store.pwrite(handle, data, 0)
    store.fsync(handle)
    store.fsync_dir("d")
    return handle


@pytest.fixture
def store() -> MemoryFileStore:
    store = MemoryFileStore()
    store.makedirs("d")
    store.fsync_dir("")
    return store


def test_reads_see_writes_at_once_and_gaps_are_zero(store: MemoryFileStore) -> None:
    handle = store.open("d/f")
    store.pwrite(handle, b"abc", 0)
    store.pwritev(handle, [b"de", memoryview(b"fg")], 5)
    assert store.pread(handle, 100, 0) == b"abc\0\0defg"
    assert store.size(handle) == 9
    store.truncate(handle, 2)
    store.allocate(handle, 4)
    assert store.pread(handle, 100, 0) == b"ab\0\0"


def test_crash_drops_unsynced_bytes_and_keeps_synced_ones(store: MemoryFileStore) -> None:
    handle = durable_file(store, "d/f", b"synced")
    store.pwrite(handle, b"-lost", 6)
    store.truncate(handle, 3)  # unsynced too
    store.crash()
    assert read_all(store, "d/f") == b"synced"


def test_fsync_covers_only_its_own_file(store: MemoryFileStore) -> None:
    a = durable_file(store, "d/a", b"")
    b = durable_file(store, "d/b", b"")
    store.pwrite(a, b"aaa", 0)
    store.pwrite(b, b"bbb", 0)
    store.fsync(a)
    store.crash()
    assert read_all(store, "d/a") == b"aaa"
    assert read_all(store, "d/b") == b""


def test_new_name_needs_fsync_dir(store: MemoryFileStore) -> None:
    handle = store.open("d/new")
    store.pwrite(handle, b"data", 0)
    store.fsync(handle)  # the bytes are durable, the name is not
    store.crash()
    assert not store.exists("d/new")
    handle = store.open("d/new")
    store.pwrite(handle, b"data", 0)
    store.fsync(handle)
    store.fsync_dir("d")
    store.crash()
    assert read_all(store, "d/new") == b"data"


def test_rename_and_remove_need_fsync_dir(store: MemoryFileStore) -> None:
    durable_file(store, "d/old", b"1")
    durable_file(store, "d/gone", b"2")
    store.rename("d/old", "d/renamed")
    store.remove("d/gone")
    assert store.listdir("d") == ["renamed"]
    store.crash()
    assert store.listdir("d") == ["gone", "old"]
    store.rename("d/old", "d/renamed")
    store.remove("d/gone")
    store.fsync_dir("d")
    store.crash()
    assert store.listdir("d") == ["renamed"]
    assert read_all(store, "d/renamed") == b"1"


def test_rename_replaces_the_target_atomically(store: MemoryFileStore) -> None:
    durable_file(store, "d/target", b"old")
    durable_file(store, "d/target.tmp", b"new")
    store.rename("d/target.tmp", "d/target")
    store.fsync_dir("d")
    store.crash()
    assert store.listdir("d") == ["target"]
    assert read_all(store, "d/target") == b"new"


def test_a_directory_needs_its_parent_synced(store: MemoryFileStore) -> None:
    store.makedirs("d/sub/deeper")
    store.fsync_dir("d/sub")
    store.crash()  # "d" was never synced after "sub" appeared
    assert not store.exists("d/sub")
    store.makedirs("d/sub")
    store.fsync_dir("d")
    store.crash()
    assert store.exists("d/sub") and store.listdir("d/sub") == []


def test_handles_die_with_the_crash(store: MemoryFileStore) -> None:
    handle = durable_file(store, "d/f", b"x")
    assert store.open_handles() == 1
    store.crash()
    assert store.open_handles() == 0
    with pytest.raises(OSError) as info:
        store.pread(handle, 1, 0)
    assert info.value.errno == errno.EBADF


def test_tear_keeps_a_strict_prefix_of_the_last_unsynced_write(store: MemoryFileStore) -> None:
    handle = durable_file(store, "d/f", b"head:")
    store.pwrite(handle, b"0123456789", 5)
    rng = random.Random(7)
    keep = random.Random(7).randrange(10)
    store.crash(rng, tear_last_write=True)
    assert read_all(store, "d/f") == b"head:" + b"0123456789"[:keep]
    assert keep < 10


def test_tear_without_rng_keeps_half(store: MemoryFileStore) -> None:
    handle = durable_file(store, "d/f", b"")
    store.pwrite(handle, b"x" * 9, 0)
    store.pwrite(handle, b"abcdefgh", 9)  # the last write; the first one is simply lost
    store.crash(tear_last_write=True)
    assert read_all(store, "d/f") == b"\0" * 9 + b"abcd"


def test_a_synced_last_write_is_not_torn(store: MemoryFileStore) -> None:
    handle = durable_file(store, "d/f", b"")
    store.pwrite(handle, b"complete", 0)
    store.fsync(handle)
    store.crash(random.Random(1), tear_last_write=True)
    assert read_all(store, "d/f") == b"complete"


def test_torn_bytes_are_on_disk_after_the_crash(store: MemoryFileStore) -> None:
    handle = durable_file(store, "d/f", b"")
    store.pwrite(handle, b"abcdefgh", 0)
    store.crash(tear_last_write=True)
    store.crash()  # a second crash must not take back what the disk already held
    assert read_all(store, "d/f") == b"abcd"


def test_fault_hook_fires_before_any_effect(store: MemoryFileStore) -> None:
    handle = durable_file(store, "d/f", b"abc")
    calls: list[tuple[str, str]] = []

    def hook(op: str, path: str) -> None:
        calls.append((op, path))
        raise OSError(errno.ENOSPC, "disk full")

    store.fault_hook = hook
    with pytest.raises(OSError):
        store.pwrite(handle, b"zzz", 0)
    with pytest.raises(OSError):
        store.rename("d/f", "d/g")
    with pytest.raises(OSError):
        store.open("d/h")
    store.fault_hook = None
    assert calls == [("pwrite", "d/f"), ("rename", "d/f"), ("open", "d/h")]
    assert store.pread(handle, 10, 0) == b"abc" and store.listdir("d") == ["f"]


def test_errors_name_the_problem(store: MemoryFileStore) -> None:
    with pytest.raises(FileNotFoundError):
        store.open("d/missing", create=False)
    with pytest.raises(FileNotFoundError):
        store.open("nodir/f")
    with pytest.raises(IsADirectoryError):
        store.open("d")
    durable_file(store, "d/f", b"")
    with pytest.raises(OSError) as info:
        store.remove_dir("d")
    assert info.value.errno == errno.ENOTEMPTY


def test_directories_rename_whole_and_a_recreated_one_starts_empty(
    store: MemoryFileStore,
) -> None:
    store.makedirs("d/p")
    store.fsync_dir("d")
    durable_file(store, "d/p/f", b"x")
    store.fsync_dir("d/p")
    store.rename("d/p", "d/p-delete")
    store.fsync_dir("d")
    assert store.listdir("d/p-delete") == ["f"]
    store.remove("d/p-delete/f")
    store.remove_dir("d/p-delete")
    store.makedirs("d/p")
    store.fsync_dir("d")
    store.crash()
    assert store.listdir("d") == ["p"]
    assert store.listdir("d/p") == []  # a new directory, not the old one's durable entries


@pytest.mark.parametrize("seed", range(30))
def test_a_crash_keeps_exactly_the_bytes_of_the_last_fsync(seed: int) -> None:
    """After any mix of writes (gaps, overwrites below the synced end), truncations,
    allocations, fsyncs and crashes, what survives a crash is exactly the bytes as of the
    last fsync, and reads always see the live bytes."""
    rng = random.Random(seed)
    store = MemoryFileStore()
    store.makedirs("d")
    handle = store.open("d/f")
    store.fsync_dir("")
    store.fsync_dir("d")
    live, synced = bytearray(), bytearray()
    for _ in range(200):
        op = rng.choice(["write", "write", "write", "truncate", "allocate", "fsync", "fsync",
                         "crash"])
        if op == "write":
            position = rng.randrange(len(live) + 50)
            data = rng.randbytes(rng.randrange(1, 40))
            store.pwrite(handle, data, position)
            live.extend(bytes(max(0, position - len(live))))
            live[position:position + len(data)] = data
        elif op == "truncate":
            size = rng.randrange(len(live) + 20)
            store.truncate(handle, size)
            live = live[:size] + bytes(max(0, size - len(live)))
        elif op == "allocate":
            size = rng.randrange(len(live) + 20)
            store.allocate(handle, size)
            live.extend(bytes(max(0, size - len(live))))
        elif op == "fsync":
            store.fsync(handle)
            synced = bytearray(live)
        else:
            store.crash()
            handle = store.open("d/f", create=False)
            live = bytearray(synced)
        assert store.pread(handle, 1 << 20, 0) == bytes(live)
    store.crash()
    handle = store.open("d/f", create=False)
    assert store.pread(handle, 1 << 20, 0) == bytes(synced)
