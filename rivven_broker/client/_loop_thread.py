"""The blocking front's event loop: one background thread running the async driver.

Theory of operation
-------------------
A blocking ``Producer``, ``Consumer`` or ``Admin`` owns one ``LoopThread``: a daemon thread
running an AnyIO event loop (asyncio by default; ``BACKEND``) that hosts the client's async
driver (``_aio_*``) and an AnyIO ``BlockingPortal``. Calls that wait for the network anyway
(``flush``, transactions, commits, admin requests) go through the portal (``call``): the
caller's thread blocks until the coroutine finished on the loop. The hot paths do not: they
share the driver's ``Bridge`` (``bridge``), whose lock they take on the caller's thread, and
whose ``call_soon`` wakes the loop without a round trip (``loop.call_soon_threadsafe`` or
trio's ``run_sync_soon``).

``host(open_client, ...)`` enters an async context manager (``open_producer`` ...) on the loop
and returns what it yields; ``close`` leaves them all, stops the loop and joins the thread.
A daemon thread: a client nobody closed does not keep the interpreter from exiting.

Everything a blocking front waits on or reads the time from is its loop thread's: the portal
(``call``, ``start``), the bridge (``bridge.wait``, ``bridge.call_soon``), ``handback_queue``
and the clocks ``monotonic`` and ``time_ns``. So another implementation of this one class
can run the fronts unchanged: a front gets its loop from ``start_loop_thread``, which builds
what the ``loop_threads`` context variable names (``LoopThread`` unless the code constructing
the client set it; the simulator sets it on its program threads, ``sim/program_thread.py``).
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from contextvars import ContextVar
from typing import Any, Callable

import anyio
import anyio.from_thread
import sniffio

from rivven_broker.client._aio_net import Bridge

__all__ = ["BACKEND", "LoopThread", "loop_threads", "start_loop_thread"]

#: The event loop a blocking client runs on: "asyncio" (default) or "trio".
BACKEND = "asyncio"


def _loop_call_soon() -> Callable[..., Any]:
    """The running loop's thread-safe "run this soon" (the caller is on the loop). asyncio
    runs such a callback in a context of its own, not the calling thread's (which may name
    another event loop to sniffio, and AnyIO would then make that loop's events)."""
    if sniffio.current_async_library() == "trio":
        import trio

        return trio.lowlevel.current_trio_token().run_sync_soon
    import asyncio
    import contextvars

    loop = asyncio.get_running_loop()
    context = contextvars.Context()
    context.run(sniffio.current_async_library_cvar.set, "asyncio")

    def call_soon(fn: Callable[[], Any]) -> None:
        loop.call_soon_threadsafe(fn, context=context)

    return call_soon


class LoopThread:
    """One event loop on a daemon thread of its own, with a blocking portal into it."""

    #: The clock a front's deadlines read (seconds) and the wall clock of its record
    #: timestamps (nanoseconds since the epoch). Any thread may read them.
    monotonic = staticmethod(time.monotonic)
    time_ns = staticmethod(time.time_ns)

    def __init__(self, name: str, backend: str | None = None) -> None:
        self.bridge = Bridge()
        started: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._exits: list[Any] = []

        async def main() -> None:
            try:
                async with anyio.from_thread.BlockingPortal() as portal:
                    self.bridge.attach(threading.get_ident(), _loop_call_soon())
                    started.put(portal)
                    await portal.sleep_until_stopped()
            except BaseException as exc:  # report a failed start instead of hanging
                started.put(exc)
                raise

        self._thread = threading.Thread(
            target=anyio.run, args=(main,), kwargs={"backend": backend or BACKEND},
            name=name, daemon=True,
        )
        self._thread.start()
        portal = started.get()
        if isinstance(portal, BaseException):
            raise portal
        self.portal: anyio.from_thread.BlockingPortal = portal
        self._closed = False

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``await fn(*args)`` (or ``fn(*args)``) on the loop; its result or exception.
        Blocks the calling thread (never call it from the loop's own thread)."""
        return self.portal.call(fn, *args)

    def start(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Start ``fn(*args)`` (awaited if a coroutine) on the loop; a future of its outcome.
        Never blocks."""
        return self.portal.start_task_soon(fn, *args)

    def handback_queue(self) -> queue.SimpleQueue:
        """A queue for work the loop hands back to a caller's thread: ``put`` from any
        thread, ``get`` blocks the caller until an item is there."""
        return queue.SimpleQueue()

    def host(self, open_client: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Enter ``open_client(*args, **kwargs)`` (an async context manager) on the loop and
        return what it yields; ``close`` leaves it (as after a normal ``async with`` body)."""
        manager = self.portal.wrap_async_context_manager(open_client(*args, **kwargs))
        value = manager.__enter__()
        self._exits.append(manager)
        return value

    def close(self) -> None:
        """Leave every hosted client (newest first), stop the loop, join the thread.
        Idempotent; never call it from the loop's own thread."""
        if self._closed:
            return
        self._closed = True
        try:
            while self._exits:
                self._exits.pop().__exit__(None, None, None)
        finally:
            try:
                self.portal.call(self.portal.stop)
            except RuntimeError:  # the loop is gone already
                pass
            self._thread.join()


#: What builds a blocking client's loop (called with a thread name): read by
#: ``start_loop_thread`` in the context constructing the client.
loop_threads: ContextVar[Callable[[str], LoopThread]] = ContextVar(
    "rivven_loop_threads", default=LoopThread)


def start_loop_thread(name: str) -> LoopThread:
    """The loop a blocking client constructed here hosts its driver on (``loop_threads``)."""
    return loop_threads.get()(name)
