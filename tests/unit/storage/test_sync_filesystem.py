"""One ``syncfs(2)`` for a big group commit: ``FileStore.sync_filesystem`` in every store, and
the ``SyncWorker`` using it for groups of ``limits.sync_filesystem_files_min`` files or more.

Checked: the OS store syncs (or, where the kernel cannot report errors, declines), declines when
asked to or once a file lives on another file system, and raises the kernel's error; the memory
store's model makes every file's bytes durable (open-only files too) but no names, and can be
told to lie file by file; the bounded-handle wrapper unpins what it covered; the worker makes
one call for a big group and fsyncs per file for a small one or a store that declines, and a
failed ``sync_filesystem`` stops it for good like a failed fsync; the simulator's disk injects
EIO into it.
"""

from __future__ import annotations

import ctypes
import errno
import random

import pytest
import trio

from rivven_broker.protocol import limits
from rivven_broker.storage import file_store
from rivven_broker.storage.errors import SyncFailedError
from rivven_broker.storage.file_store import OsFileStore
from rivven_broker.storage.handle_cache import BoundedHandles
from rivven_broker.storage.log_config import LogConfig
from rivven_broker.storage.memory_store import MemoryFileStore
from rivven_broker.storage.partition_log import PartitionLog
from rivven_broker.storage.sync_worker import SyncPolicy, SyncWorker, inline_run_sync
from sim.disk import DiskConfig, SimDisk
from sim.trace import Trace

from .log_batches import append_and_sync, make_batch, run_until_failed

BATCH = make_batch(3, b"r" * 200)


def _open(store, directory: str) -> PartitionLog:
    log, _ = PartitionLog.open(store, directory, LogConfig(segment_bytes=64 * 1024), 0)
    return log


# --- OsFileStore ------------------------------------------------------------------------------

def test_the_os_store_syncs_the_file_system_where_the_kernel_reports_errors(tmp_path):
    store = OsFileStore(str(tmp_path))
    handle = store.open("a.log")
    store.pwrite(handle, b"x" * 100, 0)
    done = store.sync_filesystem()
    assert done == (file_store._syncfs is not None)
    assert store.filesystem_syncs == int(done)
    store.close(handle)


@pytest.mark.skipif(file_store._syncfs is None, reason="syncfs cannot report errors here")
def test_the_os_store_declines_when_asked_to_or_across_file_systems(tmp_path, monkeypatch):
    assert not OsFileStore(str(tmp_path / "off"), syncfs=False).sync_filesystem()
    store = OsFileStore(str(tmp_path / "on"))
    assert store.sync_filesystem()
    store.makedirs("t-0")
    store.makedirs("t-1")
    store.close(store.open("t-0/a.log"))
    monkeypatch.setattr(store, "_device", -1)  # as if the next files were on another device
    store.close(store.open("t-0/b.log"))  # a directory is checked once (mounts are directories)
    assert store.sync_filesystem()
    store.close(store.open("t-1/c.log"))
    assert not store.sync_filesystem()
    assert store.filesystem_syncs == 2


@pytest.mark.skipif(file_store._syncfs is None, reason="syncfs cannot report errors here")
def test_a_failed_syncfs_raises_the_kernels_error(tmp_path, monkeypatch):
    store = OsFileStore(str(tmp_path))

    def failing(fd: int) -> int:
        ctypes.set_errno(errno.EIO)
        return -1

    monkeypatch.setattr(file_store, "_syncfs", failing)
    with pytest.raises(OSError) as raised:
        store.sync_filesystem()
    assert raised.value.errno == errno.EIO


# --- the memory store's model ------------------------------------------------------------------

def test_the_memory_model_makes_every_files_bytes_durable_but_no_names():
    store = MemoryFileStore()
    store.makedirs("d")
    store.fsync_dir("")
    kept, gone = store.open("d/kept"), store.open("d/new")
    store.fsync_dir("d")  # only ``kept`` and ``new`` are durable names
    store.pwrite(kept, b"k" * 10, 0)
    store.pwrite(gone, b"n" * 10, 0)
    store.rename("d/new", "d/renamed")  # a name change the model does not make durable
    assert store.sync_filesystem()
    assert store.stats.filesystem_syncs == 1 and store.stats.fsyncs == 0
    store.crash()
    assert store.listdir("d") == ["kept", "new"]
    assert store.pread(store.open("d/kept", create=False), 100, 0) == b"k" * 10
    assert store.pread(store.open("d/new", create=False), 100, 0) == b"n" * 10


def test_the_memory_model_syncs_a_file_only_open_and_can_skip_some():
    store = MemoryFileStore()
    lying, honest = store.open("a.log"), store.open("b.log")
    store.fsync_dir("")
    store.pwrite(lying, b"a" * 5, 0)
    store.pwrite(honest, b"b" * 5, 0)
    store.sync_filesystem(skip=lambda path: path == "a.log")
    store.crash()
    assert store.pread(store.open("a.log", create=False), 10, 0) == b""
    assert store.pread(store.open("b.log", create=False), 10, 0) == b"b" * 5


async def test_the_simulated_disk_fails_it_as_an_fsync():
    disk = SimDisk("n1", DiskConfig(), random.Random(1), Trace())
    view = disk.view()
    handle = view.open("a.log")
    view.pwrite(handle, b"x", 0)
    disk.fail_fsyncs(1)
    with pytest.raises(OSError) as raised:
        view.sync_filesystem()
    assert raised.value.errno == errno.EIO and disk.fsync_failures == 1
    assert view.sync_filesystem()


def test_the_bounded_handles_unpin_what_it_covered():
    handles = BoundedHandles(MemoryFileStore(), 4)
    files = [handles.open(f"f{n}") for n in range(3)]
    for handle in files:
        handles.pwrite(handle, b"x", 0)
    assert handles.statistics().pinned_now == 3
    assert handles.sync_filesystem()
    handles.close(handles.open("g"))  # the loop unpins at its next open
    assert handles.statistics().pinned_now == 0


# --- the group commit ----------------------------------------------------------------------

class _Declining(MemoryFileStore):
    def sync_filesystem(self, skip=None) -> bool:
        return False


async def _one_group(store: MemoryFileStore, logs: int, **options) -> SyncWorker:
    worker = SyncWorker(SyncPolicy.parse("always"), inline_run_sync, **options)
    await append_and_sync(worker, [_open(store, f"t-{n}") for n in range(logs)], BATCH)
    return worker


async def test_a_big_group_makes_one_filesystem_sync_and_survives_a_crash():
    files = limits.sync_filesystem_files_min
    store = MemoryFileStore()
    worker = await _one_group(store, files)
    assert store.stats.filesystem_syncs == 1 and store.stats.fsyncs == 0
    assert worker.statistics().fsyncs == 1 and worker.statistics().logs_synced == files
    store.crash()
    for n in range(files):
        assert _open(store, f"t-{n}").log_end_offset == 3


async def test_a_small_group_or_a_declining_store_fsyncs_each_file():
    small = MemoryFileStore()
    await _one_group(small, limits.sync_filesystem_files_min - 1)
    assert small.stats.filesystem_syncs == 0
    assert small.stats.fsyncs == limits.sync_filesystem_files_min - 1
    declining = _Declining()
    worker = await _one_group(declining, limits.sync_filesystem_files_min)
    assert declining.stats.fsyncs == limits.sync_filesystem_files_min
    assert worker.statistics().fsyncs == limits.sync_filesystem_files_min


async def test_the_bound_is_the_workers_own():
    store = MemoryFileStore()
    await _one_group(store, 2, filesystem_sync_files_min=2)
    assert store.stats.filesystem_syncs == 1 and store.stats.fsyncs == 0
    never = MemoryFileStore()  # --sync-filesystem-files 0
    await _one_group(never, limits.sync_filesystem_files_min, filesystem_sync_files_min=0)
    assert never.stats.filesystem_syncs == 0
    assert never.stats.fsyncs == limits.sync_filesystem_files_min


def test_the_broker_option_sets_the_bound():
    from rivven_broker.server.config import BrokerConfig, ConfigError, load_config

    assert BrokerConfig().sync_filesystem_files == limits.sync_filesystem_files_min
    assert load_config([], environ={"RIVVEN_SYNC_FILESYSTEM_FILES": "0"}) \
        .sync_filesystem_files == 0
    assert load_config(["--sync-filesystem-files", "64"]).sync_filesystem_files == 64
    with pytest.raises(ConfigError):
        load_config(["--sync-filesystem-files", "-1"])


async def test_a_failed_filesystem_sync_stops_the_worker_for_good():
    store = MemoryFileStore()
    logs = [_open(store, f"t-{n}") for n in range(limits.sync_filesystem_files_min)]

    def fail(op: str, path: str) -> None:
        if op == "sync_filesystem":
            raise OSError(errno.EIO, "injected")

    store.fault_hook = fail
    worker = SyncWorker(SyncPolicy.parse("always"), inline_run_sync)
    infos = [log.append(BATCH, 0) for log in logs]
    for log in logs:
        worker.mark_dirty(log)
    failures: list[BaseException] = []

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_until_failed, worker, failures)
        try:
            await worker.wait_durable(logs[0], infos[0].last_offset)
        except SyncFailedError as exc:
            failures.append(exc)
    assert len(failures) == 2 and all(isinstance(exc.__cause__, OSError) for exc in failures)
    assert worker.statistics().failed and all(log.durable_offset == 0 for log in logs)
    with pytest.raises(SyncFailedError):
        worker.mark_dirty(logs[0])
