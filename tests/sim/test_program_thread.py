"""The simulator's program threads: blocking code strictly alternating with the trio loop.

Method: toy blocking programs run on a ``ProgramThread`` inside ``trio.run`` on an autojumping
``MockClock``, as the simulator runs them, each checking one promise of
``sim/program_thread.py``'s theory of operation: a blocking client constructed there gets the
simulator's loop; its waits last virtual time while the loop runs, and virtual time stands
still while the program runs (even through real sleeps); wake-ups it queues run on the loop
in order; portal calls, hosted context managers, started tasks and the hand-back queue behave
as the real ``LoopThread``'s (errors included); a cancelled caller still waits for its call;
a driver that fails on its own ends the program with its error; a program that keeps asking
the loop at one instant is stopped, not left to spin. The real blocking classes under faults
are tests/sim/test_real_client.py's and the client-blocking scenario's.
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

import pytest
import trio
import trio.testing

import sim.program_thread as program_thread
from rivven_broker.client._aio_net import Signal, open_task_group
from rivven_broker.client._loop_thread import LoopThread, start_loop_thread
from sim.clock import SimClock
from sim.program_thread import ProgramStuckError, SimLoopThread, open_program_thread


def _run(body: Callable[[Any], Any]) -> Any:
    """``await body(program)`` in a simulated trio run; its result."""
    async def main() -> Any:
        clock = SimClock(true_now_s=trio.lowlevel.current_clock().current_time)
        async with open_program_thread("toy", clock) as program:
            return await body(program)

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_blocking_code_gets_the_simulators_loop_and_waits_in_virtual_time() -> None:
    ticks: list[float] = []

    def program() -> tuple[type, float, float]:
        loop = start_loop_thread("client")
        with loop.bridge.lock:
            before = loop.monotonic()
            loop.bridge.wait(2.5)  # nobody notifies: the whole timeout, in virtual time
            return type(loop), before, loop.monotonic()

    async def body(program_thread: Any) -> Any:
        async def tick() -> None:
            while True:
                await trio.sleep(1)
                ticks.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(tick)
            result = await program_thread.call(program)
            nursery.cancel_scope.cancel()
        return result

    kind, before, after = _run(body)
    assert kind is SimLoopThread
    assert (before, after) == (0.0, 2.5)
    assert ticks == [1.0, 2.0]  # the loop ran while the program waited
    assert start_loop_thread("outside") is not None  # (a real LoopThread outside programs)


def test_virtual_time_stands_still_while_the_program_runs() -> None:
    async def body(program_thread: Any) -> Any:
        def program() -> float:
            time.sleep(0.2)  # real time passes; the loop is blocked, so no autojump
            return program_thread.monotonic()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep, 1)  # a deadline autojump would jump to
            seen = program_thread.call_sync(program)
            now = trio.current_time()
            nursery.cancel_scope.cancel()
        return seen, now

    assert _run(body) == (0.0, 0.0)


def test_wake_ups_queued_by_the_program_run_on_the_loop_in_order() -> None:
    log: list[Any] = []

    async def body(program_thread: Any) -> Any:
        loop = await program_thread.call(start_loop_thread, "client")
        bridge = loop.bridge
        signal = Signal(bridge)

        def program() -> float:
            bridge.call_soon(lambda: log.append(("first", trio.current_time())))
            bridge.call_soon(lambda: log.append(("second", trio.current_time())))
            assert log == []  # queued, not run: the loop is blocked
            with bridge.lock:
                bridge.wait(10)  # woken by the loop's fire at 3 s
            return loop.monotonic()

        async def fire_later() -> None:
            await trio.sleep(3)
            signal.fire()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(fire_later)
            woken_at = await program_thread.call(program)
        return woken_at

    assert _run(body) == 3.0
    assert log == [("first", 0.0), ("second", 0.0)]


@asynccontextmanager
async def _toy_client(events: list[str], fail_after_s: float | None = None) -> AsyncIterator[Any]:
    """A stand-in for ``open_producer``: a task group, a value, a recorded exit."""
    async with open_task_group() as nursery:
        if fail_after_s is not None:
            async def fail() -> None:
                await trio.sleep(fail_after_s)
                raise RuntimeError("the driver broke")

            nursery.start_soon(fail)
        events.append("entered")
        try:
            yield "client"
        finally:
            events.append("left")
            nursery.cancel_scope.cancel()


def test_portal_calls_hosting_tasks_and_the_handback_queue() -> None:
    events: list[str] = []

    async def answer(value: int) -> int:
        await trio.sleep(1)
        return value * 2

    async def refuse() -> None:
        await trio.sleep(0.5)
        raise ValueError("refused")

    def program() -> list[Any]:
        loop = start_loop_thread("client")
        seen: list[Any] = [loop.host(_toy_client, events), loop.call(answer, 21)]
        try:
            loop.call(refuse)
        except ValueError as exc:
            seen.append(str(exc))
        queue = loop.handback_queue()
        finished = trio.Event()  # (set on the loop, by a queued call)

        async def hands_back() -> str:  # as a rebalance hands a user callback back
            queue.put("callback")
            await finished.wait()
            return "task done"

        done = loop.start(hands_back)
        done.add_done_callback(lambda _: queue.put(None))
        while not done.done():  # the consumer's pump
            job = queue.get()
            if job is not None:
                seen.append((job, loop.monotonic()))
                loop.bridge.call_soon(finished.set)
        seen.append(done.result())
        loop.close()
        loop.close()  # idempotent
        seen.append(loop.monotonic())
        return seen

    async def body(program_thread: Any) -> Any:
        return await program_thread.call(program)

    assert _run(body) == ["client", 42, "refused", ("callback", 1.5), "task done", 1.5]
    assert events == ["entered", "left"]


def test_a_cancelled_caller_still_waits_for_its_call() -> None:
    def program() -> float:
        loop = start_loop_thread("client")
        with loop.bridge.lock:
            loop.bridge.wait(3)
        return loop.monotonic()

    async def body(program_thread: Any) -> Any:
        results = []
        with trio.move_on_after(1):
            results.append(await program_thread.call(program))
            await trio.sleep(0)  # the cancellation is seen here
            results.append("not reached")
        return results, trio.current_time()

    assert _run(body) == ([3.0], 3.0)


def test_a_driver_failing_on_its_own_ends_the_program_with_its_error() -> None:
    events: list[str] = []

    def program() -> None:
        start_loop_thread("client").host(_toy_client, events, 2.0)

    async def main() -> None:
        clock = SimClock(true_now_s=trio.lowlevel.current_clock().current_time)
        async with open_program_thread("toy", clock) as program_thread:
            await program_thread.call(program)
            await trio.sleep(10)  # cancelled when the driver fails
            events.append("not reached")

    with pytest.raises(RuntimeError, match="the driver broke"):
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert events == ["entered", "left"]


def test_a_program_asking_the_loop_for_ever_at_one_instant_is_stopped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(program_thread, "SPIN_REQUESTS_MAX", 50)
    unwound: list[str] = []

    def program() -> None:
        loop = start_loop_thread("client")
        try:
            with loop.bridge.lock:
                while True:
                    loop.bridge.wait(0)  # a busy loop: time never moves
        finally:
            unwound.append("unwound")

    async def body(program_thread: Any) -> Any:
        with pytest.raises(ProgramStuckError, match="busy loop"):
            await program_thread.call(program)
        return trio.current_time()

    assert _run(body) == 0.0
    assert unwound == ["unwound"]  # the program's call ended (ProgramAborted), the thread stopped


def test_real_loop_threads_are_the_default() -> None:
    loop = start_loop_thread("rivven-test")
    try:
        assert isinstance(loop, LoopThread)
        assert loop.call(lambda: 7) == 7
    finally:
        loop.close()
