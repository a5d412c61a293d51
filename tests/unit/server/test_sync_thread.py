"""SyncThread: the dedicated thread the real broker runs its fsyncs on.

Method: real threads under a real trio loop. Calls return their result or raise their
exception in the caller, run in the order made on one thread that is not the loop's, survive a
cancellation that arrives while they run (the caller still gets the outcome), honour one that
came first, and the thread leaves when idle and comes back on the next call.
"""

from __future__ import annotations

import threading

import pytest
import trio

from rivven_broker.server.sync_thread import SyncThread


async def test_returns_the_result_computed_on_another_thread():
    runner = SyncThread()
    loop_thread = threading.get_ident()
    total, ident = await runner.run_sync(lambda a, b: (a + b, threading.get_ident()), 2, 3)
    assert total == 5 and ident != loop_thread
    assert await runner.run_sync(lambda: 7) == 7
    assert runner.calls == 2


async def test_raises_the_exception_in_the_caller():
    runner = SyncThread()

    def fail() -> None:
        raise OSError(5, "Input/output error")

    with pytest.raises(OSError, match="Input/output error"):
        await runner.run_sync(fail)
    assert await runner.run_sync(lambda: "still serving") == "still serving"


async def test_calls_run_one_at_a_time_in_the_order_made():
    runner = SyncThread()
    order: list[int] = []
    threads: set[int] = set()

    def record(i: int) -> int:
        order.append(i)
        threads.add(threading.get_ident())
        return i

    results: list[int] = []

    async def call(i: int) -> None:
        results.append(await runner.run_sync(record, i))

    async with trio.open_nursery() as nursery:
        for i in range(50):
            nursery.start_soon(call, i)
            await trio.lowlevel.checkpoint()  # each task queues its call before the next starts
    assert order == list(range(50))
    assert sorted(results) == list(range(50))
    assert len(threads) == 1


async def test_a_cancel_while_running_waits_for_the_call_and_keeps_its_result():
    runner = SyncThread()
    started, release = threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        release.wait(10)
        return "done"

    got: list[str] = []
    with trio.CancelScope() as scope:

        async def run() -> None:
            got.append(await runner.run_sync(slow))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await trio.to_thread.run_sync(started.wait, 10)
            scope.cancel()
            release.set()
    assert got == ["done"]  # the call was not abandoned


async def test_a_cancel_before_the_call_runs_nothing():
    runner = SyncThread()
    ran: list[bool] = []
    with trio.CancelScope() as scope:
        scope.cancel()
        await runner.run_sync(lambda: ran.append(True))
    assert scope.cancelled_caught and not ran and runner.calls == 0


async def test_the_thread_leaves_when_idle_and_returns_on_the_next_call():
    runner = SyncThread(idle_s=0.01)
    assert not runner.running
    assert await runner.run_sync(lambda: 1) == 1
    thread = runner._thread
    assert thread is not None
    await trio.to_thread.run_sync(thread.join, 10)
    assert not thread.is_alive() and not runner.running
    assert await runner.run_sync(lambda: 2) == 2
    assert runner.running and runner._thread is not thread
