"""One long-lived thread that runs the broker's blocking calls (fsyncs) for its trio loop.

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
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, TypeVar

import outcome
import trio

__all__ = ["SyncThread"]

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
