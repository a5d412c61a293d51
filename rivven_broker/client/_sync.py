"""Raw request/response calls for blocking callers: a ``Cluster`` run on the caller's thread.

Theory of operation
-------------------
``SyncClient`` hosts one ``Cluster`` (``_aio_net.py``: connections, metadata, and ``call``,
whose retries are the core's ``CallRetry``) on a ``CallerLoop``: an asyncio event loop of its
own that runs only inside a call, on the calling thread (``run_until_complete``), and is
stopped in between. ``call``, ``fetch_metadata`` and ``leader_for`` run the driver's
coroutine there, so the socket I/O of a request, and the receive of its answer (MiBs for a
fetch, straight into the answer's buffer), happen on the caller's thread: no loop thread, no
portal, no hand-off of the answer between threads (which made the executors' decoding thread
and a loop thread take turns on the GIL), and no thread to start per client (a Spark task
opens one). For callers that move record batches as bytes themselves (the Spark executors)
and the CLI.

Between calls nothing runs: the connections' reader and deadline tasks wait, suspended, and
see what happened meanwhile (an answer, a closed socket) in the next call, as the blocking
driver's select loop used to. Thread-safe: one lock serialises calls (a call from a thread
that is running an event loop of its own runs on a short-lived helper thread instead, since
a thread can run one loop at a time).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from typing import Any, Callable, Coroutine

import sniffio

from rivven_broker.client._aio_net import Bridge, open_cluster
from rivven_broker.client.config import ConnectionConfig
from rivven_broker.client.errors import ClosedError
from rivven_broker.client.metadata import MetadataCache

__all__ = ["CallerLoop", "SyncClient"]


class CallerLoop:
    """An asyncio event loop run by its callers, one call at a time (the lock), on their
    own threads. ``host`` enters an async context manager in a task that lives from call to
    call; ``close`` leaves it and closes the loop."""

    def __init__(self) -> None:
        self.bridge = Bridge()  # never attached: the loop runs on the caller's thread
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._hosts: list[tuple[asyncio.Event, asyncio.Task]] = []

    def call(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> Any:
        """Run ``await fn(*args)`` on the loop, on this thread; its result or exception."""
        with self._lock:
            return self._run(fn(*args))

    def _run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        # A fresh context: the caller's may name another event loop to sniffio (a trio
        # thread), and AnyIO would then use that one's primitives here.
        task = self._loop.create_task(coroutine, context=contextvars.Context())
        try:
            sniffio.current_async_library()  # asyncio's, or trio's (a thread-local)
        except sniffio.AsyncLibraryNotFoundError:  # the common case: no loop on this thread
            return self._loop.run_until_complete(task)
        outcome: list[Any] = []  # [result] or [None, exception]

        def run() -> None:
            try:
                outcome.append(self._loop.run_until_complete(task))
            except BaseException as exc:  # raised again on the calling thread
                outcome[:] = [None, exc]

        helper = threading.Thread(target=run, name="rivven-sync-call", daemon=True)
        helper.start()
        helper.join()
        if len(outcome) == 2:
            raise outcome[1]
        return outcome[0]

    def host(self, open_client: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Enter ``open_client(*args, **kwargs)`` (an async context manager) on the loop and
        return what it yields; ``close`` leaves it (as after a normal ``async with`` body)."""
        entered: asyncio.Future = self._loop.create_future()
        leave = asyncio.Event()

        async def keep() -> None:
            try:
                async with open_client(*args, **kwargs) as value:
                    entered.set_result(value)
                    await leave.wait()
            except BaseException as exc:
                if not entered.done():
                    entered.set_exception(exc)
                raise

        with self._lock:
            task = self._loop.create_task(keep(), context=contextvars.Context())
            self._hosts.append((leave, task))
            return self._run(_wait_for(entered))

    def close(self) -> None:
        """Leave every hosted client (newest first) and close the loop. Idempotent."""
        with self._lock:
            if self._loop.is_closed():
                return
            try:
                while self._hosts:
                    leave, task = self._hosts.pop()
                    leave.set()
                    self._run(_wait_for(task, swallow=True))
            finally:
                self._loop.close()


async def _wait_for(future: Any, swallow: bool = False) -> Any:
    """``await future`` (a host task's end: its failure was seen at ``host`` already)."""
    try:
        return await future
    except Exception:
        if not swallow:
            raise
        return None


class SyncClient:
    """Blocking request/response over a private ``Cluster``, on the caller's thread."""

    def __init__(
        self,
        bootstrap: str,
        config: ConnectionConfig,
        *,
        connect_attempts_max: int = 3,
        allow_auto_topic_creation: bool = False,
    ) -> None:
        assert connect_attempts_max >= 1
        self.config = config
        self._loop = CallerLoop()
        try:
            self._cluster = self._loop.host(
                open_cluster, bootstrap, config, bridge=self._loop.bridge,
                connect_attempts_max=connect_attempts_max,
                allow_auto_topic_creation=allow_auto_topic_creation)
        except BaseException:
            self._loop.close()
            raise
        self._closed = False

    @property
    def metadata(self) -> MetadataCache:
        """The metadata cache (read it, or ``request_update``; under ``lock`` to change it)."""
        return self._cluster.metadata

    @property
    def lock(self) -> Any:
        return self._cluster.bridge.lock

    def call(self, request: Any, *, node_id: int | None = None,
             timeout_ms: int | None = None) -> Any:
        """Send ``request`` (to ``node_id`` or any broker) and return the answer.

        Raises:
            ConnectionFailedError (also at once, retriably, for a ``node_id`` the metadata
            does not list), ClientTimeoutError, BrokerError for an ErrorResponse, ClosedError.
        """
        return self._run(self._cluster.call, request, node_id=node_id, timeout_ms=timeout_ms)

    def fetch_metadata(self, topics: list[str] | None, *, timeout_ms: int | None = None) -> Any:
        """A Metadata answer for ``topics`` (None: all); also refreshes the cache."""
        return self._run(self._cluster.fetch_metadata, topics, timeout_ms=timeout_ms)

    def leader_for(self, topic: str, partition: int, *, timeout_ms: int | None = None) -> int:
        """The leader node of a partition (refreshing metadata if needed).

        Raises:
            BrokerError: the topic's error (unknown topic ...), or
                ``UnknownTopicOrPartitionError`` for a partition out of range / leaderless.
        """
        if self._closed:
            raise ClosedError("the client is closed")
        node = self._cluster.known_leader(topic, partition)  # no loop to run when known
        if node is not None:
            return node
        return self._run(self._cluster.leader_for, topic, partition, timeout_ms=timeout_ms)

    def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self._closed:
            raise ClosedError("the client is closed")
        return self._loop.call(functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._loop.close()
