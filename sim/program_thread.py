"""Blocking programs in the simulator: a thread that strictly alternates with the trio loop.

Theory of operation
-------------------
The blocking client (``Producer``, ``Consumer``, ``Admin``) hosts the async driver on a loop
thread of its own and is called from the user's thread, which blocks in portal calls, on the
driver's ``Bridge`` and on the consumer's hand-back queue. The simulator is one ``trio.run``
on a ``MockClock``, where a second real event loop, a real wait or real time would make a run
a function of the OS's scheduling. So a ``ProgramThread`` runs the REAL blocking classes
(constructed on it, the same code users run) with these substitutions, all through the seam
the fronts already have (``rivven_broker.client._loop_thread``: a front gets its loop from
``start_loop_thread``, and waits and reads time only through it):

- **The loop is the simulator's trio loop.** The program thread sets the ``loop_threads``
  context variable to ``SimLoopThread``: its portal calls (``call``, ``host``, ``start``)
  run on the simulator's loop, in this program's tasks, and its ``bridge`` is a ``SimBridge``.
- **One baton.** At any moment either the trio loop or the program thread runs, never both.
  ``ProgramThread.call(fn, *args)`` (an ``await`` on the trio side) hands ``fn`` to the
  program thread and then blocks the trio thread *synchronously*, inside the calling task's
  step: no other task runs and virtual time cannot move (autojump happens only in the run
  loop) until the program hands the baton back. The program hands it back in exactly two
  ways: its call finished (result or exception), or it asks the loop for something and
  blocks until the answer:

  ``CALL`` a portal call (``fn(*args)``, awaited if it is a coroutine), ``HOST`` enter a
  client's async context manager in a task of its own (``LoopThread.host``), ``EXIT`` leave
  it, ``BLOCK`` wait until woken or a virtual timeout: ``SimBridge.wait`` (woken by the
  driver's ``Bridge.notify``, i.e. every ``Signal.fire``) and the hand-back queue's ``get``
  (woken by its ``put``). The trio side serves the request as an ordinary await of the
  calling task, during which other tasks run and virtual time moves, then passes the
  baton back with the answer.
- **Wake-ups from the program.** ``bridge.call_soon(fn)`` (every ``Signal.fire`` off the loop,
  ``note_poll`` ...) and ``start(fn)`` only queue on the program thread; the trio side runs
  the queue, in order, each time it takes the baton back, before anything else. Nothing
  crosses through trio's ``run_sync_soon`` (whose wake-up is real I/O).
- **Time.** ``SimLoopThread.monotonic`` is the ``MockClock``'s virtual time and ``time_ns``
  the simulated wall clock: the fronts' deadlines (``poll``'s timeout, ``max_block_ms``) are
  virtual. The driver's env clock is a ``SimClock`` over the same ``MockClock`` object, which
  the program thread can read (``trio.current_time()`` only works on the trio thread).
- **Cancellation.** A program call is never interrupted: like a thread's blocking call it
  runs to its end (shielded), and a cancellation is seen at the caller's next checkpoint.
  The drivers (hosted context managers) and started tasks run shielded in this program's
  nursery, so a cancelled workload still closes its clients through them; those the
  program never closed are cancelled when the program ends. A driver that ends on its own
  (an error) cancels the program's body and its error is raised when the program ends, as
  an error out of an ``async with open_producer(...)`` would be.

Since the program's steps and the loop's steps interleave at points fixed by the program's
own calls, and every wake-up is delivered in queue order, a seed still fixes the whole run.
``call_sync`` is the same hand-over for a method that never waits for the loop (``assign``,
``assignment``; a portal call of a plain function is run inline): it can be called from
synchronous trio code. A program thread that blocks on anything else (a real lock, a
``Future.result`` of a record nobody resolved yet) would hold the baton for ever: after
``STUCK_S`` of real time the trio side stops with the program's stack instead of hanging.
"""

from __future__ import annotations

import contextvars
import inspect
import sys
import threading
import traceback
from collections import deque
from concurrent.futures import Future
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

import outcome
import trio

from rivven_broker.client._aio_net import Bridge
from rivven_broker.client._loop_thread import loop_threads
from sim.clock import SimClock

__all__ = ["ProgramThread", "ProgramStuckError", "SimLoopThread", "open_program_thread"]

#: Real seconds a program may hold the baton before the loop calls it stuck (a hang detector
#: only: no run that passes depends on it).
STUCK_S = 60.0
#: Requests one call may make at one virtual instant before it is called a busy loop (time
#: cannot move while the program keeps asking: the world's livelock guard cannot stop a
#: call, which is shielded, so the call stops itself).
SPIN_REQUESTS_MAX = 20_000

_CALL, _HOST, _EXIT, _BLOCK, _DONE = "call", "host", "exit", "block", "done"
_STOP = object()


class ProgramStuckError(RuntimeError):
    """The program thread blocked on something the simulator does not control, or kept
    asking the loop for ever at one virtual instant."""


class ProgramAborted(BaseException):
    """Raised inside a program's call that the loop gave up on (``ProgramStuckError``)."""


class _Hosted:
    """One client's async context manager, held open in a task until ``exit`` is set."""

    def __init__(self) -> None:
        self.exit = trio.Event()
        self.done = trio.Event()
        self.scope = trio.CancelScope(shield=True)
        self.outcome: outcome.Outcome = outcome.Value(None)
        self.asked_to_exit = False


class ProgramThread:
    """A thread for blocking code that strictly alternates with the simulator's trio loop.

    Create it with ``open_program_thread``; ``await call(fn, *args)`` runs ``fn(*args)`` on
    it. Blocking clients constructed there host their drivers on this trio loop.
    """

    def __init__(self, name: str, nursery: trio.Nursery, wall_clock: SimClock) -> None:
        self.name = name
        #: Virtual seconds (the ``MockClock``'s), readable from any thread.
        self.monotonic: Callable[[], float] = trio.lowlevel.current_clock().current_time
        self.wall_clock = wall_clock
        self._nursery = nursery
        self._loop_ident = threading.get_ident()
        self._to_program = threading.Semaphore(0)
        self._to_loop = threading.Semaphore(0)
        self._message: Any = None  # what the side handing the baton over passes to the other
        self._queued: deque[Callable[[], Any]] = deque()  # run on the loop at the next hand-over
        self._blocked_on: object | None = None
        self._wakeup: trio.Event | None = None
        self._busy = trio.Lock()  # one call at a time: a thread runs one call at a time
        self._hosted: list[_Hosted] = []
        self._tasks: list[trio.CancelScope] = []
        self._failure: BaseException | None = None
        self._body = trio.CancelScope()
        self._thread = threading.Thread(target=contextvars.Context().run, args=(self._main,),
                                        name=f"sim-program-{name}", daemon=True)
        self._running = False

    # --- the trio side ---------------------------------------------------------------------
    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the program thread; its result (or raise its exception).
        Never interrupted: a cancellation is seen at the caller's next checkpoint."""
        assert self._running, f"program {self.name} has stopped"
        async with self._busy:
            with trio.CancelScope(shield=True):
                reply = self._hand_over((fn, args))
                instant, requests = self.monotonic(), 0
                while True:
                    kind, payload = reply
                    self._take_queued(kind, payload)
                    if kind == _DONE:
                        return payload.unwrap()
                    if self.monotonic() != instant:
                        instant, requests = self.monotonic(), 0
                    requests += 1
                    if requests > SPIN_REQUESTS_MAX:
                        self._abort()
                        raise ProgramStuckError(
                            f"program {self.name}: {fn!r} made {SPIN_REQUESTS_MAX} requests "
                            f"at virtual time {instant:.3f} s (a busy loop); last: {kind}")
                    reply = self._hand_over(await self._serve(kind, payload))

    def _abort(self) -> None:
        """Answer the program's request, and every one it makes while unwinding (a bounded
        number), with ``ProgramAborted`` until its call ends."""
        for _ in range(1000):
            kind, _payload = self._hand_over(outcome.Error(ProgramAborted()))
            if kind == _DONE:
                return

    def call_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``call`` for code that never waits for the loop (a portal call of a plain function
        is run inline). Raises AssertionError if it does, or if a ``call`` is in progress."""
        assert not self._busy.locked(), f"{self.name}: call_sync during a call"
        reply = self._hand_over((fn, args))
        while True:
            kind, payload = reply
            self._take_queued(kind, payload)
            if kind == _DONE:
                return payload.unwrap()
            assert kind == _CALL, f"{self.name}: {fn!r} waited for the loop ({kind})"
            reply = self._hand_over(outcome.capture(_run_plain, *payload))

    def _hand_over(self, message: Any) -> Any:
        """Give the baton to the program thread; block (this whole trio thread) until it gives
        it back; what it passed."""
        self._message = message
        self._to_program.release()
        if not self._to_loop.acquire(timeout=STUCK_S):
            frame = sys._current_frames().get(self._thread.ident or -1)
            stack = "".join(traceback.format_stack(frame)) if frame is not None else "?"
            raise ProgramStuckError(f"program {self.name} held the baton for {STUCK_S} s "
                                    f"(blocked outside the simulator?):\n{stack}")
        message, self._message = self._message, None
        return message

    def _take_queued(self, kind: str, payload: Any) -> None:
        """(Baton just taken back.) Note what the program now blocks on, then run what it
        queued for the loop, in order (a wake-up among them is not missed)."""
        if kind == _BLOCK:
            self._blocked_on, self._wakeup = payload[0], trio.Event()
        while self._queued:
            self._queued.popleft()()

    async def _serve(self, kind: str, payload: Any) -> outcome.Outcome:
        if kind == _CALL:
            return await outcome.acapture(_run_awaiting, *payload)
        if kind == _BLOCK:
            _, timeout_s = payload
            assert self._wakeup is not None
            with trio.move_on_after(max(timeout_s, 0.0) if timeout_s is not None else float("inf")):
                await self._wakeup.wait()
            self._blocked_on = self._wakeup = None
            return outcome.Value(None)
        if kind == _HOST:
            hosted = _Hosted()
            self._hosted.append(hosted)
            result = await outcome.acapture(self._nursery.start, self._hold, hosted, *payload)
            return outcome.Value((hosted, result))
        assert kind == _EXIT, kind
        hosted = payload
        hosted.asked_to_exit = True
        hosted.exit.set()
        await hosted.done.wait()
        return hosted.outcome

    async def _hold(self, hosted: _Hosted, open_client: Callable[..., Any], args: tuple,
                    kwargs: dict, task_status: trio.TaskStatus[Any]) -> None:
        started = False
        with hosted.scope:
            try:
                async with open_client(*args, **kwargs) as value:
                    started = True
                    task_status.started(value)
                    await hosted.exit.wait()
            except BaseException as error:  # reported when the program leaves it, as a portal does
                if not started:
                    raise  # out of nursery.start, to the program's ``host``
                hosted.outcome = outcome.Error(error)
            finally:
                hosted.done.set()
        if not hosted.asked_to_exit and self._failure is None:
            self._failure = hosted.outcome.error if isinstance(hosted.outcome, outcome.Error) \
                else RuntimeError(f"a driver of {self.name} ended on its own")
            self._body.cancel()

    def _start_task(self, fn: Callable[..., Any], args: tuple, future: Future) -> None:
        async def run() -> None:
            with trio.CancelScope(shield=True) as scope:
                self._tasks.append(scope)
                result = await outcome.acapture(_run_awaiting, fn, args)
            self._tasks.remove(scope)
            if isinstance(result, outcome.Error):
                future.set_exception(result.error)
            else:
                future.set_result(result.value)

        self._nursery.start_soon(run)

    def wake(self, target: object) -> None:
        """(On the loop.) Wake the program if it blocks on ``target``."""
        if self._blocked_on is target and self._wakeup is not None:
            self._wakeup.set()

    def _stop(self) -> None:
        if self._running:
            self._running = False
            self._hand_over(_STOP)
            self._thread.join()
        for hosted in self._hosted:  # clients the program never closed
            if not hosted.done.is_set():
                hosted.asked_to_exit = True
                hosted.scope.cancel()
        for scope in list(self._tasks):
            scope.cancel()

    # --- the program side ------------------------------------------------------------------
    def _main(self) -> None:
        loop_threads.set(self._loop_thread)
        self._to_program.acquire()
        while True:
            job = self._message
            if job is _STOP:
                self._to_loop.release()
                return
            fn, args = job
            self._message = (_DONE, outcome.capture(fn, *args))
            self._to_loop.release()
            self._to_program.acquire()

    def ask(self, kind: str, payload: Any) -> Any:
        """(On the program thread.) Hand the baton to the loop with a request; block until it
        answers; the answer's value (or raise its exception)."""
        assert threading.get_ident() == self._thread.ident, "ask from another thread"
        self._message = (kind, payload)
        self._to_loop.release()
        self._to_program.acquire()
        answer, self._message = self._message, None
        return answer.unwrap()

    def block(self, target: object, timeout_s: float | None) -> None:
        """(On the program thread.) Wait until ``wake(target)`` or ``timeout_s`` virtual
        seconds; the caller re-checks what it waits for."""
        self.ask(_BLOCK, (target, timeout_s))

    def queue_on_loop(self, fn: Callable[[], Any]) -> None:
        """(Any thread.) Run ``fn()`` on the loop: at once there, else at the next hand-over."""
        if threading.get_ident() == self._loop_ident:
            fn()
        else:
            self._queued.append(fn)

    def start(self, fn: Callable[..., Any], args: tuple) -> Future:
        future: Future = Future()
        self.queue_on_loop(lambda: self._start_task(fn, args, future))
        return future

    def _loop_thread(self, name: str) -> SimLoopThread:
        return SimLoopThread(self, name)


@asynccontextmanager
async def open_program_thread(name: str, wall_clock: SimClock) -> AsyncIterator[ProgramThread]:
    """A program thread for the body (``wall_clock``: its clients' env clock, a ``SimClock``
    any thread may read); stopped at the body's end, its unclosed clients cancelled. Raises
    the error of a driver that ended on its own (the body is cancelled then), and an error of
    the body as itself, not in an exception group."""
    try:
        async with trio.open_nursery() as nursery:
            program = ProgramThread(name, nursery, wall_clock)
            program._thread.start()
            program._running = True
            try:
                with program._body:
                    yield program
            finally:
                program._stop()
    except BaseExceptionGroup as errors:
        if len(errors.exceptions) == 1:
            raise errors.exceptions[0] from None
        raise
    if program._failure is not None:
        raise program._failure


def _run_plain(fn: Callable[..., Any], args: tuple) -> Any:
    result = fn(*args)
    assert not inspect.isawaitable(result), f"{fn!r} must be awaited: not from call_sync"
    return result


async def _run_awaiting(fn: Callable[..., Any], args: tuple) -> Any:
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


class SimBridge(Bridge):
    """The driver's ``Bridge`` with the program thread's waits and wake-ups."""

    __slots__ = ("_program",)

    def __init__(self, program: ProgramThread) -> None:
        super().__init__()
        self._program = program
        self.attach(program._loop_ident, program.queue_on_loop)

    def wait(self, timeout_s: float) -> None:
        """(Program thread, ``lock`` held.) Release the lock, wait for ``notify`` or
        ``timeout_s`` virtual seconds with the loop running, take the lock again."""
        state = self.changed._release_save()  # type: ignore[attr-defined]
        try:
            self._program.block(self, timeout_s)
        finally:
            self.changed._acquire_restore(state)  # type: ignore[attr-defined]

    def notify(self) -> None:
        self._program.wake(self)


class _HandbackQueue:
    """``LoopThread.handback_queue`` for a program thread: ``get`` blocks on the loop."""

    def __init__(self, program: ProgramThread) -> None:
        self._program = program
        self._items: deque[Any] = deque()

    def put(self, item: Any) -> None:
        self._items.append(item)
        self._program.wake(self)  # (a no-op on the program thread: it is not blocked)

    def get(self) -> Any:
        while not self._items:
            self._program.block(self, None)
        return self._items.popleft()


class SimLoopThread:
    """``LoopThread`` for blocking clients constructed on a program thread: their loop is the
    simulator's (see the module docstring)."""

    def __init__(self, program: ProgramThread, name: str) -> None:
        self.name = name
        self._program = program
        self.bridge = SimBridge(program)
        self.monotonic = program.monotonic
        self._exits: list[_Hosted] = []
        self._closed = False

    def time_ns(self) -> int:
        """The program's simulated wall clock (its clients' env clock), in nanoseconds."""
        return self._program.wall_clock.wall_ms() * 1_000_000

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._program.ask(_CALL, (fn, args))

    def start(self, fn: Callable[..., Any], *args: Any) -> Future:
        return self._program.start(fn, args)

    def handback_queue(self) -> _HandbackQueue:
        return _HandbackQueue(self._program)

    def host(self, open_client: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        hosted, result = self._program.ask(_HOST, (open_client, args, kwargs))
        value = result.unwrap()
        self._exits.append(hosted)
        return value

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        while self._exits:
            self._program.ask(_EXIT, self._exits.pop())

