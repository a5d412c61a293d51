"""``max_poll_interval_ms`` end to end: a member that stops polling leaves its group.

Goal: KIP-62 as the clients implement it. Two members share a 4-partition topic; member A
(``max_poll_interval_ms`` 1 s, heartbeats every 100 ms, a 30 s session timeout so that only
the new rule can explain the outcome) stops calling ``poll`` while its heartbeats go on;
member B, still polling, gets all four partitions and reads records produced to each of them
well within the session timeout. When A polls again its lost callback reports its old
partitions, it rejoins and the partitions are shared again. Once with blocking consumers
(each in its own thread, as real members run), once with async consumers (under trio and
asyncio). Method: the real broker in the test's trio run (on a trio thread of its own for the
async consumers) over loopback sockets; members report to a
board; the test waits on predicates with deadlines (all below the session timeout), never
sleeps, and asserts no timings.
"""

from __future__ import annotations

import collections
import threading

import anyio
import trio

from rivven_broker.client import Consumer, TopicPartition
from rivven_broker.client.aio import open_consumer
from tests.integration.test_consumer_groups import create_topic, produce
from tests.loops import on_each_loop

TOPIC = "jobs"
ALL = {TopicPartition(TOPIC, p) for p in range(4)}
COMMON = dict(session_timeout_ms=30_000, heartbeat_interval_ms=100, fetch_max_wait_ms=100,
              retry_backoff_ms=20, reconnect_backoff_ms=20, auto_offset_reset="earliest",
              enable_auto_commit=False)
SLOW = dict(max_poll_interval_ms=1_000)
WAIT_S = 20.0  # below the 30 s session timeout: only max_poll_interval_ms can explain it


class Board:
    """What the member threads report; the driver waits on predicates over it."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.assignment: dict[str, set[TopicPartition]] = {}
        self.seen: dict[str, set[tuple[int, int]]] = collections.defaultdict(set)
        self.lost: dict[str, list[set[TopicPartition]]] = collections.defaultdict(list)
        self.paused: set[str] = set()
        self.stop = False

    def wait_for(self, predicate, timeout_s: float = WAIT_S) -> None:
        with self.cond:
            assert self.cond.wait_for(predicate, timeout_s), "condition not reached in time"

    def set(self, **changes) -> None:
        with self.cond:
            for name, value in changes.items():
                setattr(self, name, value)
            self.cond.notify_all()

    def shared(self) -> bool:
        a, b = self.assignment.get("a", set()), self.assignment.get("b", set())
        return len(a) == 2 and len(b) == 2 and a | b == ALL


def member(address: str, name: str, board: Board, options: dict) -> None:
    """Poll and report until ``board.stop``; while paused, do not call ``poll`` at all."""
    consumer = Consumer(address, group_id="g", **COMMON, **options)

    def on_lost(partitions: set[TopicPartition]) -> None:
        with board.cond:
            board.lost[name].append(set(partitions))

    consumer.subscribe([TOPIC], on_lost=on_lost)
    try:
        while True:
            with board.cond:
                board.cond.wait_for(lambda: name not in board.paused or board.stop, 60)
                if board.stop:
                    return
            records = consumer.poll(timeout_ms=100)
            with board.cond:
                board.seen[name].update((r.partition, r.offset) for r in records)
                board.assignment[name] = consumer.assignment()
                board.cond.notify_all()
    finally:
        consumer.close()


def read_past(board: Board, name: str, offset: int) -> bool:
    return {p for p, o in board.seen[name] if o >= offset} == {0, 1, 2, 3}


async def test_a_member_that_stops_polling_leaves_and_rejoins_when_it_polls(start_broker):
    running = await start_broker(group_initial_rebalance_delay_ms=0)
    address = running.address
    board = Board()

    def driver() -> None:
        create_topic(address, 4)
        produce(address, TOPIC, 16, 4)  # offsets 0..3 in every partition
        threads = [
            threading.Thread(target=member, args=(address, "a", board, SLOW)),
            threading.Thread(target=member, args=(address, "b", board, {})),
        ]
        for thread in threads:
            thread.start()
        try:
            board.wait_for(board.shared)
            with board.cond:
                owned_by_a = set(board.assignment["a"])
                board.lost.clear()
            board.set(paused={"a"})  # a stops calling poll; its heartbeat thread goes on
            board.wait_for(lambda: board.assignment.get("b") == ALL)
            produce(address, TOPIC, 16, 4)  # offsets 4..7
            board.wait_for(lambda: read_past(board, "b", 4))
            with board.cond:
                assert not board.lost["a"]  # a has not polled: nobody told its callbacks
            board.set(paused=set())
            board.wait_for(lambda: bool(board.lost["a"]) and board.shared())
            with board.cond:
                assert board.lost["a"][0] == owned_by_a
        finally:
            board.set(stop=True)
            for thread in threads:
                thread.join()

    with trio.fail_after(90):
        await trio.to_thread.run_sync(driver)


@on_each_loop
async def test_an_async_member_that_stops_polling_leaves_and_rejoins(threaded_broker):
    running = threaded_broker(group_initial_rebalance_delay_ms=0)
    await anyio.to_thread.run_sync(create_topic, running.address, 4)
    await anyio.to_thread.run_sync(produce, running.address, TOPIC, 16, 4)
    board = Board()  # one event loop thread: its condition is used as a plain record here
    resume, changed = anyio.Event(), anyio.Event()
    paused = {"a": False}

    def note() -> None:
        nonlocal changed
        changed.set()
        changed = anyio.Event()

    async def wait_until(predicate) -> None:
        with anyio.fail_after(WAIT_S):
            while not predicate():
                await changed.wait()

    async def member(name: str, options: dict) -> None:
        async with open_consumer(running.address, group_id="gt", **COMMON,
                                 **options) as consumer:
            consumer.subscribe([TOPIC], on_lost=lambda ps: board.lost[name].append(set(ps)))
            while not board.stop:
                if paused.get(name):
                    await resume.wait()
                records = await consumer.poll(timeout_ms=100)
                board.seen[name].update((r.partition, r.offset) for r in records)
                board.assignment[name] = consumer.assignment()
                note()

    with anyio.fail_after(90):
        async with anyio.create_task_group() as nursery:
            nursery.start_soon(member, "a", SLOW)
            nursery.start_soon(member, "b", {})
            await wait_until(board.shared)
            owned_by_a = set(board.assignment["a"])
            board.lost.clear()
            paused["a"] = True
            await wait_until(lambda: board.assignment.get("b") == ALL)
            await anyio.to_thread.run_sync(produce, running.address, TOPIC, 16, 4)
            await wait_until(lambda: read_past(board, "b", 4))
            assert not board.lost["a"]
            paused["a"] = False
            resume.set()
            await wait_until(lambda: bool(board.lost["a"]) and board.shared())
            assert board.lost["a"][0] == owned_by_a
            board.stop = True
