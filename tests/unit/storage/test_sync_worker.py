"""SyncWorker: group commit over real PartitionLogs on MemoryFileStore, in virtual time.

Method: trio tests on ``MockClock`` (autojump) with a ``run_sync`` that sleeps a virtual
millisecond before fsyncing (a disk with latency) or waits for a test-controlled gate. Fsyncs
are counted by the store. Checked: many appenders share fsyncs, waiters return only once their
offset is durable (and it then survives a crash), an fsync failure fails every waiter and stops
the worker, the interval policy syncs in the background, detach/aclose flush.
"""

from __future__ import annotations

import errno
from typing import Any, Callable

import pytest
import trio
import trio.testing

from rivven_broker.storage.errors import SyncFailedError
from rivven_broker.storage.log_config import LogConfig
from rivven_broker.storage.memory_store import MemoryFileStore
from rivven_broker.storage.partition_log import PartitionLog
from rivven_broker.server.sync_thread import SyncThread
from rivven_broker.storage.sync_worker import (
    SyncPolicy,
    SyncWorker,
    inline_run_sync,
)

from .log_batches import append_and_sync, make_batch, run_until_failed

BATCH = make_batch(3, b"r" * 200)


def _open(store: MemoryFileStore, directory: str = "t-0") -> PartitionLog:
    log, _ = PartitionLog.open(store, directory, LogConfig(segment_bytes=64 * 1024), 0)
    return log


class SlowDisk:
    """A ``run_sync`` whose every call takes 1 ms of virtual time; counts the calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, function: Callable[[], Any]) -> Any:
        self.calls += 1
        await trio.sleep(0.001)
        return function()


class Gate:
    """A ``run_sync`` that runs the function only when the test opens the gate."""

    def __init__(self) -> None:
        self.open = trio.Event()

    async def __call__(self, function: Callable[[], Any]) -> Any:
        await self.open.wait()
        return function()


async def _produce(worker: SyncWorker, log: PartitionLog, count: int, acked: list[int]) -> None:
    for _ in range(count):
        info = log.append(BATCH, 0)
        worker.mark_dirty(log)
        await worker.wait_durable(log, info.last_offset)
        assert log.durable_offset > info.last_offset
        acked.append(info.last_offset)


@pytest.mark.parametrize(
    ("text", "policy"),
    [
        ("always", SyncPolicy("always")),
        ("none", SyncPolicy("none")),
        ("interval_ms=250", SyncPolicy("interval", 250)),
    ],
)
def test_policy_parse(text: str, policy: SyncPolicy) -> None:
    assert SyncPolicy.parse(text) == policy
    assert str(policy) == text


@pytest.mark.parametrize("text", ["", "Always", "interval_ms=0", "interval_ms=-5", "interval_ms=", "interval=5", "sometimes"])
def test_policy_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        SyncPolicy.parse(text)


async def test_many_appenders_share_fsyncs(autojump_clock: trio.testing.MockClock) -> None:
    store = MemoryFileStore()
    log = _open(store)
    disk = SlowDisk()
    worker = SyncWorker(SyncPolicy.parse("always"), disk)
    acked: list[int] = []
    fsyncs_before = store.stats.fsyncs
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        async with trio.open_nursery() as producers:
            for _ in range(20):
                producers.start_soon(_produce, worker, log, 5, acked)
        await worker.aclose()
    appends = 20 * 5
    assert len(acked) == appends
    stats = worker.statistics()
    fsyncs = store.stats.fsyncs - fsyncs_before
    assert fsyncs == stats.fsyncs == disk.calls  # one handle per group here
    assert fsyncs <= appends / 10  # shared: about one fsync per round of 20 appenders
    assert stats.waits == appends and stats.waiters == 0 and not stats.failed
    store.crash()
    reopened = _open(store)
    assert reopened.log_end_offset >= max(acked) + 1  # every acknowledged offset survived


async def test_one_group_covers_every_dirty_log() -> None:
    store = MemoryFileStore()
    logs = [_open(store, f"t-{n}") for n in range(3)]
    disk = SlowDisk()
    worker = SyncWorker(SyncPolicy.parse("always"), disk)
    await append_and_sync(worker, logs, BATCH)
    stats = worker.statistics()
    assert (disk.calls, stats.groups, stats.fsyncs, stats.logs_synced) == (1, 1, 3, 3)


async def test_waiters_wake_only_when_durable() -> None:
    store = MemoryFileStore()
    log = _open(store)
    gate = Gate()
    worker = SyncWorker(SyncPolicy.parse("always"), gate)
    done: list[int] = []

    async def wait(offset: int) -> None:
        await worker.wait_durable(log, offset)
        done.append(offset)

    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        first = log.append(BATCH, 0)
        worker.mark_dirty(log)
        nursery.start_soon(wait, first.last_offset)
        await trio.testing.wait_all_tasks_blocked()
        second = log.append(BATCH, 0)  # arrives while the first group's fsync is held
        worker.mark_dirty(log)
        nursery.start_soon(wait, second.last_offset)
        await trio.testing.wait_all_tasks_blocked()
        assert done == [] and log.durable_offset == 0
        gate.open.set()
        await trio.testing.wait_all_tasks_blocked()
        assert done == [first.last_offset, second.last_offset]
        assert log.durable_offset == second.last_offset + 1
        assert worker.statistics().groups == 2
        await worker.wait_durable(log, first.last_offset)  # already durable: returns at once
        await worker.aclose()


async def test_fsync_failure_fails_every_waiter_and_stops_the_worker() -> None:
    store = MemoryFileStore()
    log = _open(store)
    gate = Gate()
    worker = SyncWorker(SyncPolicy.parse("always"), gate)
    failures: list[BaseException] = []

    async def wait(offset: int) -> None:
        try:
            await worker.wait_durable(log, offset)
        except SyncFailedError as exc:
            failures.append(exc)

    def fail_fsync(op: str, path: str) -> None:
        if op == "fsync":
            raise OSError(errno.EIO, "injected")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_until_failed, worker, failures)
        for _ in range(5):
            info = log.append(BATCH, 0)
            worker.mark_dirty(log)
            nursery.start_soon(wait, info.last_offset)
            await trio.testing.wait_all_tasks_blocked()
        store.fault_hook = fail_fsync
        gate.open.set()
    assert len(failures) == 6  # five waiters and the worker itself
    assert all(isinstance(exc, SyncFailedError) for exc in failures)
    assert all(isinstance(exc.__cause__, OSError) for exc in failures)
    assert worker.statistics().failed and log.durable_offset == 0
    with pytest.raises(SyncFailedError):
        worker.mark_dirty(log)
    with pytest.raises(SyncFailedError):
        await worker.wait_durable(log, 0)
    with pytest.raises(SyncFailedError):
        await worker.aclose()


async def test_interval_policy_syncs_in_the_background(autojump_clock: trio.testing.MockClock) -> None:
    store = MemoryFileStore()
    log = _open(store)
    worker = SyncWorker(SyncPolicy.parse("interval_ms=100"), inline_run_sync)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        start = trio.current_time()
        info = log.append(BATCH, 0)
        worker.mark_dirty(log)
        await worker.wait_durable(log, info.last_offset)  # returns at once
        assert trio.current_time() == start and log.durable_offset == 0
        await trio.sleep(0.05)
        assert log.durable_offset == 0
        await trio.sleep(0.06)
        assert log.durable_offset == info.last_offset + 1
        groups = worker.statistics().groups
        await trio.sleep(1)  # nothing dirty: no empty groups
        assert worker.statistics().groups == groups == 1
        second = log.append(BATCH, 0)
        worker.mark_dirty(log)
        await worker.aclose()  # flushes without waiting for the next tick
        assert log.durable_offset == second.last_offset + 1
        assert trio.current_time() < start + 1.2


async def test_none_policy_never_fsyncs() -> None:
    store = MemoryFileStore()
    log = _open(store)
    fsyncs = store.stats.fsyncs
    worker = SyncWorker(SyncPolicy.parse("none"), inline_run_sync)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        info = log.append(BATCH, 0)
        worker.mark_dirty(log)
        await worker.wait_durable(log, info.last_offset)
        await worker.aclose()
    assert store.stats.fsyncs == fsyncs and log.durable_offset == 0
    assert worker.statistics().groups == 0


async def test_detach_flushes_and_forgets_the_log() -> None:
    store = MemoryFileStore()
    log, other = _open(store, "a-0"), _open(store, "b-0")
    gate = Gate()
    worker = SyncWorker(SyncPolicy.parse("always"), gate)
    done: list[str] = []

    async def wait(name: str, target: PartitionLog, offset: int) -> None:
        await worker.wait_durable(target, offset)
        done.append(name)

    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        for name, target in (("a", log), ("b", other)):
            info = target.append(BATCH, 0)
            worker.mark_dirty(target)
            nursery.start_soon(wait, name, target, info.last_offset)
        await trio.testing.wait_all_tasks_blocked()  # the group holding both is in flight

        detached = False

        async def detach() -> None:
            nonlocal detached
            await worker.detach(log)
            detached = True

        nursery.start_soon(detach)
        await trio.testing.wait_all_tasks_blocked()
        assert not detached  # waits for the in-flight group that holds the log's handle
        late = log.append(BATCH, 0)  # a last append before the detach completes
        gate.open.set()
        await trio.testing.wait_all_tasks_blocked()
        assert detached and sorted(done) == ["a", "b"]
        assert log.durable_offset == late.last_offset + 1  # detach synced what was left
        log.close()
        worker.mark_dirty(other)
        await worker.aclose()
    assert worker.statistics().dirty_logs == 0


async def test_aclose_without_run_flushes() -> None:
    store = MemoryFileStore()
    log = _open(store)
    worker = SyncWorker(SyncPolicy.parse("always"), inline_run_sync)
    info = log.append(BATCH, 0)
    worker.mark_dirty(log)
    await worker.aclose()
    assert log.durable_offset == info.last_offset + 1
    with pytest.raises(SyncFailedError):
        await worker.wait_durable(log, log.append(BATCH, 0).last_offset)


async def test_the_production_sync_thread_really_fsyncs() -> None:
    store = MemoryFileStore()
    log = _open(store)
    worker = SyncWorker(SyncPolicy.parse("always"), SyncThread().run_sync)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        info = log.append(BATCH, 0)
        worker.mark_dirty(log)
        await worker.wait_durable(log, info.last_offset)
        await worker.aclose()
    store.crash()
    assert _open(store).log_end_offset == info.last_offset + 1


async def test_waiter_on_truncated_offsets_fails_instead_of_hanging() -> None:
    store = MemoryFileStore()
    log = _open(store)
    gate = Gate()
    worker = SyncWorker(SyncPolicy.parse("always"), gate)
    failures: list[SyncFailedError] = []

    async def wait(offset: int) -> None:
        try:
            await worker.wait_durable(log, offset)
        except SyncFailedError as exc:
            failures.append(exc)

    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        info = log.append(BATCH, 0)
        worker.mark_dirty(log)
        nursery.start_soon(wait, info.last_offset)
        await trio.testing.wait_all_tasks_blocked()
        log.truncate_to(0)  # e.g. a follower truncating while the group is in flight
        gate.open.set()
        await trio.testing.wait_all_tasks_blocked()
        assert len(failures) == 1 and "cannot become durable" in str(failures[0])
        assert not worker.statistics().failed  # the worker itself carries on
        again = log.append(BATCH, 0)
        worker.mark_dirty(log)
        await worker.wait_durable(log, again.last_offset)
        await worker.aclose()


class TaskRecordingDisk(SlowDisk):
    """``SlowDisk`` that also records which task ran each group's fsyncs."""

    def __init__(self) -> None:
        super().__init__()
        self.tasks: list[str] = []

    async def __call__(self, function: Callable[[], Any]) -> Any:
        self.tasks.append(trio.lowlevel.current_task().name)
        return await super().__call__(function)


class Overlaps:
    """A ``run_sync`` around another that records, per call, whether another was running."""

    def __init__(self, inner: Callable[[Callable[[], Any]], Any]) -> None:
        self.inner = inner
        self.running = 0
        self.overlapped: list[bool] = []

    async def __call__(self, function: Callable[[], Any]) -> Any:
        self.running += 1
        self.overlapped.append(self.running > 1)
        try:
            return await self.inner(function)
        finally:
            self.running -= 1


def _append_to(worker: SyncWorker, log: PartitionLog) -> Callable[[], None]:
    """A ``write`` for ``write_then_commit``: one append to ``log``, marked dirty."""
    def write() -> None:
        log.append(BATCH, 0)
        worker.mark_dirty(log)
    return write


async def test_write_then_commit_runs_the_group_in_the_callers_task(
        autojump_clock: trio.testing.MockClock) -> None:
    store = MemoryFileStore()
    log = _open(store)
    disk = TaskRecordingDisk()
    worker = SyncWorker(SyncPolicy.parse("always"), disk, commit_in_caller=lambda: True)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await worker.write_then_commit(_append_to(worker, log))
        assert log.durable_offset == log.log_end_offset  # durable on return
        assert worker.statistics().groups == 1 and worker.statistics().dirty_logs == 0
        assert disk.tasks == [trio.lowlevel.current_task().name]  # this task, not the worker
        await worker.aclose()
    assert disk.calls == 1  # the worker woke for nothing: no second group


@pytest.mark.parametrize("why", ["the caller may not", "the write raised"])
async def test_write_then_commit_leaves_the_group_to_the_worker(
        why: str, autojump_clock: trio.testing.MockClock) -> None:
    store = MemoryFileStore()
    log = _open(store)
    disk = TaskRecordingDisk()
    worker = SyncWorker(SyncPolicy.parse("always"), disk,
                        commit_in_caller=lambda: why != "the caller may not")
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)

        def write() -> None:
            log.append(BATCH, 0)
            worker.mark_dirty(log)
            if why == "the write raised":
                raise OSError(errno.EIO, "a later partition's write")

        try:
            await worker.write_then_commit(write)
        except OSError:
            assert why == "the write raised"
        assert log.durable_offset < log.log_end_offset  # not committed by the caller
        await worker.wait_durable(log, log.log_end_offset - 1)  # the worker woke and did
        assert disk.tasks and trio.lowlevel.current_task().name not in disk.tasks
        await worker.aclose()


async def test_write_then_commit_never_overlaps_a_running_group() -> None:
    store = MemoryFileStore()
    first, second = _open(store, "t-0"), _open(store, "t-1")
    gate = Gate()
    disk = Overlaps(gate)
    worker = SyncWorker(SyncPolicy.parse("always"), disk, commit_in_caller=lambda: True)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        first.append(BATCH, 0)
        worker.mark_dirty(first)
        await trio.testing.wait_all_tasks_blocked()  # the worker's group waits at the gate
        # A group runs: this one is left to the worker.
        await worker.write_then_commit(_append_to(worker, second))
        assert second.durable_offset < second.log_end_offset
        gate.open.set()
        await worker.wait_durable(second, second.log_end_offset - 1)
        assert first.durable_offset == first.log_end_offset
        await worker.aclose()
    assert disk.overlapped == [False, False]  # two groups, one after the other


async def test_the_worker_waits_for_the_callers_group(
        autojump_clock: trio.testing.MockClock) -> None:
    store = MemoryFileStore()
    first, second = _open(store, "t-0"), _open(store, "t-1")
    disk = Overlaps(SlowDisk())
    worker = SyncWorker(SyncPolicy.parse("always"), disk, commit_in_caller=lambda: True)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)

        async def append_meanwhile() -> None:  # during the caller's group: wakes the worker
            await trio.sleep(0.0005)
            second.append(BATCH, 0)
            worker.mark_dirty(second)
            await worker.wait_durable(second, second.log_end_offset - 1)

        nursery.start_soon(append_meanwhile)
        await worker.write_then_commit(_append_to(worker, first))
        assert first.durable_offset == first.log_end_offset
        await trio.sleep(0.01)
        assert second.durable_offset == second.log_end_offset
        await worker.aclose()
    assert disk.overlapped == [False, False]
