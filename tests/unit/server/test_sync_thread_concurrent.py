"""``run_concurrently``, the broker's ``fsync_each``: a group commit's fsyncs on several threads
at once, returning (or raising the first error) only after every one finished; and the
``SyncWorker`` uses it only when given, for groups of ``fsync_each_min`` handles or more."""

from __future__ import annotations

import threading
import time

import pytest

from rivven_broker.server.env import RealEnv
from rivven_broker.server.sync_thread import run_concurrently
from rivven_broker.storage import sync_worker


class _Store:
    def __init__(self, fail: int | None = None, delay_s: float = 0.0) -> None:
        self.fail, self.delay_s = fail, delay_s
        self.synced: list[int] = []
        self.threads: set[str] = set()
        self.dirs: list[str] = []
        self._lock = threading.Lock()

    def fsync(self, handle: int) -> None:
        time.sleep(self.delay_s)
        with self._lock:
            self.threads.add(threading.current_thread().name)
            self.synced.append(handle)
        if handle == self.fail:
            raise OSError(5, "EIO")

    def fsync_dir(self, path: str) -> None:
        with self._lock:
            self.dirs.append((path, len(self.synced)))

    def sync_filesystem(self) -> bool:
        return False  # declines: the group's files are fsynced one by one


def test_a_big_group_is_fsynced_by_several_threads_then_the_directories():
    store = _Store(delay_s=0.002)
    sync_worker._fsync_all([(store, h) for h in range(20)], [(store, "d")], run_concurrently)
    assert sorted(store.synced) == list(range(20))
    assert len(store.threads) > 1
    assert store.dirs == [("d", 20)]  # after every handle


def test_without_fsync_each_or_for_a_small_group_the_order_is_kept():
    store = _Store()
    sync_worker._fsync_all([(store, h) for h in range(20)], [(store, "d")])
    assert store.synced == list(range(20)) and store.threads == {threading.current_thread().name}
    small = _Store()
    sync_worker._fsync_all([(small, 1), (small, 2)], (), run_concurrently)
    assert small.synced == [1, 2] and small.threads == {threading.current_thread().name}


def test_a_failed_fsync_is_raised_once_every_other_thread_finished():
    store = _Store(fail=3, delay_s=0.002)
    with pytest.raises(OSError):
        sync_worker._fsync_all([(store, h) for h in range(20)], [(store, "d")], run_concurrently)
    done = len(store.synced)
    time.sleep(0.02)
    assert len(store.synced) == done  # no fsync outlives the call
    assert done >= 18  # only the failed one's own list stopped (3, then 11 and 19)
    assert store.dirs == []


def test_run_concurrently_with_nothing_to_do():
    run_concurrently(lambda item: None, [])


def test_the_real_environment_offers_it(tmp_path):
    assert RealEnv(str(tmp_path)).fsync_each is run_concurrently
