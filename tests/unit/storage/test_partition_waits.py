"""A partition's high watermark and waits: what produce, the coordinators and consumers rely on.

Goal: ``Partition.wait_committed``/``wait_durable`` return True exactly when the offset is
covered, False as soon as it never will be under the leadership the caller appended under
(deposed, led again, cut), and consumers are told when the high watermark moves — after the
group commit under ``sync=always``, never at the append.
Method: real ``PartitionLog`` and ``SyncWorker`` over a ``MemoryFileStore`` in trio's virtual
time, with a gate that holds the group commit's fsync until the test opens it; a stub commit
rule stands in for the replicated ``LeaderState``.
"""

from __future__ import annotations

from typing import Any, Callable

import trio
import trio.testing

from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.storage.log_config import LogConfig
from rivven_broker.storage.memory_store import MemoryFileStore
from rivven_broker.storage.partition import Partition, PartitionEvents
from rivven_broker.storage.partition_log import PartitionLog
from rivven_broker.storage.sync_worker import SyncPolicy, SyncWorker

from .log_batches import make_batch

KEY = ("t", 0)


def allow(header: Any) -> ErrorCode:
    return ErrorCode.NONE


class Gate:
    """A ``run_sync`` whose fsyncs run only once the test opens it."""

    def __init__(self) -> None:
        self.open = trio.Event()

    async def __call__(self, function: Callable[[], Any]) -> Any:
        await self.open.wait()
        return function()


class Rule:
    """A commit rule the test moves by hand (the followers' reports)."""

    def __init__(self) -> None:
        self.high_watermark = 0
        self.local = 0

    def on_local_durable(self, durable_offset: int) -> bool:
        self.local = durable_offset
        return False


class Told:
    def __init__(self) -> None:
        self.appended: list[tuple[str, int]] = []
        self.moved: list[tuple[str, int]] = []

    def events(self) -> PartitionEvents:
        return PartitionEvents(appended=self.appended.append, high_watermark_moved=self.moved.append)


def _open(policy: str, run_sync: Any, told: Told) -> tuple[Partition, SyncWorker]:
    store = MemoryFileStore()
    plog, _ = PartitionLog.open(store, "t-0", LogConfig(segment_bytes=64 * 1024), 0)
    worker = SyncWorker(SyncPolicy.parse(policy), run_sync)
    partition, _ = Partition.open(plog, KEY, worker, told.events())
    return partition, worker


async def test_single_node_high_watermark_moves_at_the_group_commit_not_at_the_append():
    told, gate = Told(), Gate()
    partition, worker = _open("always", gate, told)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        info = partition.append_as_leader(make_batch(3), 0, allow).info
        assert told.appended == [KEY] and told.moved == []  # appended, not committed
        assert partition.high_watermark == 0 and not partition.committed(info.last_offset)
        answers: list[bool] = []

        async def wait() -> None:
            answers.append(await partition.wait_committed(info.last_offset, None))

        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        assert answers == []  # the fsync is held
        gate.open.set()
        await trio.testing.wait_all_tasks_blocked()
        assert answers == [True] and partition.high_watermark == 3 and told.moved == [KEY]
        await worker.aclose()


async def test_without_sync_always_the_log_end_is_the_high_watermark_at_once():
    told = Told()
    partition, worker = _open("none", Gate(), told)
    partition.append_as_leader(make_batch(2), 0, allow)
    assert partition.high_watermark == 2 and told.moved == [KEY]
    assert await partition.wait_committed(1, None)


async def test_a_leader_acknowledges_at_its_rule_and_never_after_it_was_deposed():
    told, gate = Told(), Gate()
    partition, worker = _open("always", gate, told)
    gate.open.set()
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        rule = Rule()
        partition.lead(rule)
        info = partition.append_as_leader(make_batch(2), 0, allow).info
        answers: list[bool] = []

        async def wait(offset: int, under: Any) -> None:
            answers.append(await partition.wait_committed(offset, under))

        nursery.start_soon(wait, info.last_offset, rule)
        await trio.testing.wait_all_tasks_blocked()
        assert answers == [] and rule.local == 2  # durable here, not on the followers
        rule.high_watermark = 2  # a follower's report
        partition.high_watermark_moved()
        await trio.testing.wait_all_tasks_blocked()
        assert answers == [True]

        second = partition.append_as_leader(make_batch(1), 0, allow).info
        nursery.start_soon(wait, second.last_offset, rule)
        await trio.testing.wait_all_tasks_blocked()
        assert answers == [True]
        partition.stop_leading()  # deposed before the followers had it
        await trio.testing.wait_all_tasks_blocked()
        assert answers == [True, False]
        # the local copy is durable, yet under no leadership is it committed by this one
        assert partition.local_durable_end > second.last_offset
        partition.lead(Rule())  # led again, at another epoch: an old append's wait still ends
        assert not await partition.wait_committed(second.last_offset, rule)
        await worker.aclose()


async def test_a_truncation_ends_the_waits_of_what_it_cut():
    told, gate = Told(), Gate()
    partition, worker = _open("always", gate, told)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        info = partition.append_as_follower(make_batch(4), 0)
        answers: list[bool] = []

        async def wait(offset: int) -> None:
            answers.append(await partition.wait_durable(offset))

        nursery.start_soon(wait, info.last_offset)
        await trio.testing.wait_all_tasks_blocked()
        gate.open.set()  # (the group in flight completes first, then the cut)
        await trio.testing.wait_all_tasks_blocked()
        assert answers == [True]
        more = partition.append_as_follower(make_batch(2, base_offset=4), 0)
        gate.open = trio.Event()
        nursery.start_soon(wait, more.last_offset)
        await trio.testing.wait_all_tasks_blocked()
        partition.truncate_to(4)  # a new leader's log diverged
        await trio.testing.wait_all_tasks_blocked()
        assert answers == [True, False] and more.last_offset >= partition.log.log_end_offset
        gate.open.set()
        await worker.aclose()
