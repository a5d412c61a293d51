"""SyncThread and InlineWhileFast: where the real broker runs its blocking calls.

Method: real threads under a real trio loop. SyncThread: calls return their result or raise
their exception in the caller, run in the order made on one thread that is not the loop's,
survive a cancellation that arrives while they run (the caller still gets the outcome), honour
one that came first, and the thread leaves when idle and comes back on the next call.
InlineWhileFast, with a scripted timer giving each call's duration: fast calls run on the
loop's thread, one slow call moves the calls to the thread, they come back only after the
hold and once the moving average is fast again; exceptions and cancellation behave alike.
"""

from __future__ import annotations

import threading

import pytest
import trio

from rivven_broker.server.sync_thread import InlineWhileFast, SyncThread


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
    # The thread itself, taken inside the call: with 10 ms of idleness allowed, it may be gone
    # by the time the caller runs again on a loaded machine.
    thread = await runner.run_sync(threading.current_thread)
    assert thread is not threading.current_thread()
    await trio.to_thread.run_sync(thread.join, 10)
    assert not thread.is_alive() and not runner.running
    assert await runner.run_sync(lambda: 2) == 2
    assert runner.running and runner._thread is not thread


class _ScriptedTimer:
    """A timer whose every second reading is ``duration_s`` after the one before."""

    def __init__(self) -> None:
        self.now = 0.0
        self.duration_s = 0.0001
        self._started = False

    def __call__(self) -> float:
        if self._started:
            self.now += self.duration_s
        self._started = not self._started
        return self.now


async def _where(runner: InlineWhileFast) -> str:
    loop_thread = threading.get_ident()
    ident = await runner.run_sync(threading.get_ident)
    return "loop" if ident == loop_thread else "thread"


async def test_fast_calls_run_on_the_loop_and_slow_ones_move_to_the_thread():
    timer = _ScriptedTimer()
    runner = InlineWhileFast(SyncThread(), timer, slow_s=0.001, hold_calls=3)
    assert await runner.run_sync(lambda a, b: a * b, 6, 7) == 42
    assert [await _where(runner) for _ in range(3)] == ["loop"] * 3
    timer.duration_s = 0.005  # one slow call: the next ones go to the thread
    assert await _where(runner) == "loop"
    assert runner.moves_off_loop == 1 and not runner.inline
    timer.duration_s = 0.0001
    # The hold (3 calls), then the average must fall under slow_s / 2 before coming back.
    places = [await _where(runner) for _ in range(8)]
    assert places[:4] == ["thread"] * 4
    assert "loop" in places
    back = places.index("loop")
    assert places[back:] == ["loop"] * (8 - back)
    assert runner.moves_off_loop == 1


async def test_a_disk_that_stays_slow_stays_on_the_thread():
    timer = _ScriptedTimer()
    runner = InlineWhileFast(SyncThread(), timer, slow_s=0.001, hold_calls=2)
    timer.duration_s = 0.003
    assert [await _where(runner) for _ in range(10)] == ["loop"] + ["thread"] * 9
    assert runner.moves_off_loop == 1


async def test_inline_calls_raise_in_the_caller_and_honour_an_earlier_cancel():
    runner = InlineWhileFast(SyncThread(), _ScriptedTimer())

    def fail() -> None:
        raise OSError(5, "Input/output error")

    with pytest.raises(OSError, match="Input/output error"):
        await runner.run_sync(fail)
    ran = []
    with trio.CancelScope() as scope:
        scope.cancel()
        await runner.run_sync(ran.append, 1)
    assert ran == [] and scope.cancelled_caught
