"""Where the broker's blocking calls run: one long-lived thread, or the loop while fsyncs are fast.

Theory of operation
-------------------
Group commit makes one blocking call per group: an fsync of every dirty handle. Handing it to
``trio.to_thread.run_sync`` costs, per call, a capacity-limiter acquire (a checkpoint), a job
for trio's thread cache, a copy of the context and a thread rename, on top of the two thread
hand-offs every design pays. At thousands of groups a second that is a visible share of the
broker's one core and of every acknowledgement's latency.

``SyncThread.run_sync(fn, *args)`` instead puts ``(fn, args, token, task)`` on a queue read
by one thread, parks the calling task (``wait_task_rescheduled``), and the thread, after
``fn`` returns or raises, hands the outcome back with ``TrioToken.run_sync_soon(reschedule)``.
Calls run one at a time, in the order they were made, which is what group commit wants
(fsyncs back to back, never in parallel).

A call cannot be abandoned: cancelling the caller waits for ``fn`` to finish, then delivers
its outcome (as ``trio.to_thread.run_sync`` does without ``abandon_on_cancel``); a checkpoint
before queueing honours a cancellation that came first. The thread is started on first use
and exits after ``idle_s`` with nothing to do (a later call starts a new one), so brokers
started and stopped in one process (tests) leave no thread behind for long. A lock orders
"is there a thread?" against "the thread is leaving", so no job is ever queued to a thread
that has gone.

The group commit's fsyncs are the one blocking call made thousands of times a second, and on
a fast disk handing each to a thread costs more than it saves: a futex wake, a GIL hand-off
and a context switch on the broker's core there, the wake-up socket, the entry-queue task and
the worker's resumption back, against an fdatasync that takes 0.15-0.25 ms on this machine.
Measured interleaved on one pinned core (six runs each, medians), running them inline took
9 % less broker CPU per record at a fixed 300 k records/s (2.64 against 2.91 s per million)
and the same in the closed loop, and the loop blocked for the fsync loses little: what
arrives meanwhile waits in the kernel and joins the next group, as Redis does with
``appendfsync always``. On a slow disk the trade turns: every fetch and every other
connection would wait for each fsync. ``InlineWhileFast`` decides per call. It runs calls on
the trio thread while they are fast; one call slower than ``slow_s`` (1 ms) moves the calls
to the ``SyncThread``, where they stay for at least ``hold_calls`` (64) calls and until their
moving average (which includes the hand-off) is back under half of ``slow_s``. So one slow
fsync stalls the loop once, and a disk that stays slow never stalls it again.

``run_concurrently(function, items)`` is the group commit's ``fsync_each`` (given to the
``SyncWorker`` by ``RealEnv``): the items are dealt round robin to at most
``concurrent_threads`` lists, the calling thread works through the first and a shared pool of
daemon-less worker threads (created on first use, kept for the process) the others; it
returns when every list is done and raises the first error then, so no fsync outlives the
group. fdatasync of 51 files with ~1 KiB appended to each, /tmp on this host, 40 rounds,
interleaved twice: one after the other 6.0 / 8.9 ms (median), 8 threads 3.8 / 3.0 ms.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from typing import Any, Callable, Sequence, TypeVar

import outcome
import trio

__all__ = ["SyncThread", "InlineWhileFast", "run_concurrently", "on_this_thread"]

T = TypeVar("T")
_Job = tuple[Callable[..., Any], tuple[Any, ...], trio.lowlevel.TrioToken, trio.lowlevel.Task]


class SyncThread:
    """Runs blocking calls on one dedicated thread, one at a time. See the module docstring."""

    def __init__(self, name: str = "rivven-sync", idle_s: float = 10.0) -> None:
        assert idle_s > 0
        self._name = name
        self._idle_s = idle_s
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.calls = 0  # completed calls (statistics and tests)

    @property
    def running(self) -> bool:
        """Whether the thread is alive right now. Never blocks."""
        return self._thread is not None

    async def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the dedicated thread; its result, or its exception raised here.

        Blocks the calling task (not the loop) until ``fn`` returns. Not cancellable once
        queued: a cancel waits for ``fn``.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        job = (fn, args, trio.lowlevel.current_trio_token(), trio.lowlevel.current_task())
        with self._lock:
            self._jobs.put(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
                self._thread.start()
        result: T = await trio.lowlevel.wait_task_rescheduled(
            lambda _: trio.lowlevel.Abort.FAILED
        )
        return result

    def _serve(self) -> None:
        """The thread: run jobs in order; leave after ``idle_s`` without one."""
        jobs = self._jobs
        while True:
            try:
                fn, args, token, task = jobs.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    if jobs.empty():
                        self._thread = None
                        return
                continue
            result = outcome.capture(fn, *args)
            self.calls += 1
            try:
                token.run_sync_soon(trio.lowlevel.reschedule, task, result)
            except trio.RunFinishedError:  # the loop is gone; nobody waits for this outcome
                pass


class InlineWhileFast:
    """Runs fast blocking calls on the trio thread, slow ones on a ``SyncThread``.

    See the module docstring. ``timer`` returns seconds (``time.perf_counter`` in production:
    the wall time a call blocks the loop, not trio's clock).
    """

    def __init__(
        self,
        thread: SyncThread,
        timer: Callable[[], float],
        *,
        slow_s: float = 0.001,
        hold_calls: int = 64,
        weight: float = 0.25,
    ) -> None:
        assert slow_s > 0 and hold_calls >= 0 and 0 < weight <= 1
        self._thread = thread
        self._timer = timer
        self._slow_s = slow_s
        self._hold_calls = hold_calls
        self._weight = weight
        self.inline = True  # where the next call runs
        self.average_s = 0.0  # moving average of recent calls' durations
        self._held = 0  # calls still to make on the thread before going back inline
        self.moves_off_loop = 0  # statistics and tests

    async def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, inline or on the thread; its result, or its exception raised here.

        Inline, the loop blocks for the call and this is a checkpoint only if already
        cancelled; on the thread, it is ``SyncThread.run_sync``.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        started = self._timer()
        if self.inline:
            result = fn(*args)
        else:
            result = await self._thread.run_sync(fn, *args)
        self._note(self._timer() - started)
        return result

    def _note(self, elapsed_s: float) -> None:
        self.average_s += (elapsed_s - self.average_s) * self._weight
        if self.inline:
            if elapsed_s > self._slow_s:
                self.inline = False
                self._held = self._hold_calls
                self.moves_off_loop += 1
        elif self._held > 0:
            self._held -= 1
        elif self.average_s < self._slow_s / 2:
            self.inline = True


#: Threads fsyncing one group at once, the caller included.
concurrent_threads = 8
_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _shared_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(
                concurrent_threads - 1, thread_name_prefix="rivven-fsync")
        return _pool


def run_concurrently(function: Callable[[Any], None], items: Sequence[Any]) -> None:
    """``function(item)`` for every item, on up to ``concurrent_threads`` threads (this one
    included). Returns when all are done; then raises the first error, if any (a list whose
    call failed stops there, as a serial loop would)."""
    lists = [items[index::concurrent_threads]
             for index in range(min(concurrent_threads, len(items)))]

    def work(share: Sequence[Any]) -> None:
        for item in share:
            function(item)

    if not lists:
        return
    futures = [_shared_pool().submit(work, share) for share in lists[1:]]
    errors: list[BaseException] = []
    try:
        work(lists[0])
    except BaseException as error:  # noqa: BLE001 - raised below, after the others
        errors.append(error)
    for future in futures:
        error = future.exception()  # waits for it
        if error is not None:
            errors.append(error)
    if errors:
        raise errors[0]


def on_this_thread() -> Callable[[], bool]:
    """Whether a later call runs on the thread that called this (the loop's): what the handle
    cache asks before an fsync through a descriptor only the loop may close
    (``storage/handle_cache.py``). The group commit's fsyncs run there while they are fast,
    on the ``SyncThread`` or ``run_concurrently``'s pool otherwise."""
    ident = threading.get_ident()
    return lambda: threading.get_ident() == ident
