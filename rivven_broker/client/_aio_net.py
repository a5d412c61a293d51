"""The async driver's network layer: sockets, pipelined connections, a pool, metadata, calls.

Theory of operation
-------------------
Written on AnyIO, so the same code runs under trio and under asyncio (whichever event loop
calls it). Everything goes through an ``env`` with ``clock`` (``monotonic_ms``, ``wall_ms``),
``net`` (``open_tcp_stream(host, port)``) and optionally ``rng(name)``: the broker's
``RealEnv`` and the simulator's ``SimEnv`` both fit, and ``ClientEnv`` (real sockets, the
event loop's clock) is the default, so the simulator can run real clients on its virtual
network and clock (under trio's ``MockClock``).

A stream is anything with trio's ``send_all``, ``receive_some`` and ``aclose`` (the
simulator's ``SimStream``). ``ClientEnv``'s are ``SocketStream``s: a non-blocking socket
(TCP_NODELAY) awaited with ``anyio.wait_readable``/``wait_writable``, which adds the receive
path's two measured tricks of the old blocking driver. A large response (a fetch answer of
MiBs) is received straight into its own buffer (``ClientConnection.receive_buffer``, via
``receive_into``), so its bytes are never joined; meanwhile the socket is asked not to wake
the reader before up to 1 MiB more of it has arrived (``SO_RCVLOWAT``, set back to 1 between
responses): one wake-up per MiB instead of one per loopback segment.

``Connection`` wraps one stream and a ``ClientConnection``. ``request`` takes the send lock
*before* numbering the request, so bytes leave in correlation-id order; a reader task (in the
client's task group) pairs responses with waiters in order. A request that times out, a
protocol violation or a lost stream breaks the connection: every waiter gets the error
(responses cannot be skipped on a pipelined stream), and the pool dials again on next use
after a backoff. New connections send a ``Handshake`` first. After pairing the answers of one
receive the reader calls the cluster's ``after_answers`` (the producer steps its sender there:
an answer and the requests it lets out without a task switch).

``Cluster`` is the pool plus the ``MetadataCache``: ``any_connection`` (the cache's
``candidates``: known brokers, then the bootstrap list round robin), ``refresh`` (one Metadata
request at a time, as the cache's ``refresh_due`` says; ``on_update`` is called after each),
and ``call``: one request with retries, every decision the core's ``CallRetry``. When a broker
may be dialled again is the core's ``ReconnectBackoff``.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from collections import deque
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable

import anyio
import anyio.abc
import anyio.lowlevel
import trio  # only its stream errors: the simulator's streams raise them

from rivven_broker.client.call_retry import CallRetry
from rivven_broker.client.config import ConnectionConfig
from rivven_broker.client.errors import (
    ClosedError,
    ConnectionFailedError,
    RequestTimedOutError,
    RivvenError,
    UnsupportedVersionError,
    error_for,
)
from rivven_broker.client.metadata import Address, MetadataCache, parse_bootstrap
from rivven_broker.client.reconnect import ReconnectBackoff
from rivven_broker.client.requests import check_response, metadata_request, sendable
from rivven_broker.client.retry import RetryPolicy
from rivven_broker.protocol import messages as m
from rivven_broker.protocol.connection import ClientConnection
from rivven_broker.protocol.errors import ProtocolError
from rivven_broker.protocol.framing import DIRECT_BODY_BYTES_MIN

__all__ = ["Background", "Bridge", "ClientEnv", "Cluster", "Connection", "Signal", "SocketStream",
           "Spawner", "env_rng", "open_cluster", "open_socket_stream", "open_task_group"]

_RECEIVE_BYTES = 1 << 20
#: The most bytes of a large response the socket gathers before waking the reader (Linux
#: caps it further at half the largest receive buffer).
_WAKE_BYTES_MAX = 1 << 20
#: What a lost stream raises: the OS's errors, AnyIO's, and trio's (the simulator's streams).
STREAM_ERRORS = (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError,
                 anyio.EndOfStream, trio.BrokenResourceError, trio.ClosedResourceError)


class SocketStream:
    """One connected non-blocking TCP socket, awaited through AnyIO (trio or asyncio).

    ``close`` may come from another task while one waits on the socket: the wait is
    cancelled (its own scope) and the socket closed when it has left the event loop's
    readiness watch, never while still registered there."""

    __slots__ = ("sock", "wake_bytes", "_closed", "_waits")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.wake_bytes = 1  # the socket's SO_RCVLOWAT; 0 once the platform refused it
        self._closed = False
        self._waits: list[anyio.CancelScope] = []

    async def _wait(self, ready: Callable[[socket.socket], Awaitable[None]]) -> None:
        scope = anyio.CancelScope()
        self._waits.append(scope)
        try:
            with scope:
                await ready(self.sock)
        finally:
            self._waits.remove(scope)
            if self._closed and not self._waits:
                self.sock.close()
        if self._closed:
            raise anyio.ClosedResourceError

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Send every byte. Raises OSError (ClosedResourceError after ``close``)."""
        sock = self.sock
        view = memoryview(data)
        while view:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                sent = sock.send(view)
            except BlockingIOError:
                await self._wait(anyio.wait_writable)
                continue
            view = view[sent:]

    def try_send(self, data: bytes | bytearray | memoryview) -> memoryview | None:
        """Send what the socket takes now, without waiting; the rest (None: all sent).
        Raises OSError (ClosedResourceError after ``close``)."""
        if self._closed:
            raise anyio.ClosedResourceError
        view = memoryview(data)
        try:
            sent = self.sock.send(view)
        except BlockingIOError:
            return view
        return view[sent:] if sent < len(view) else None

    async def receive_some(self, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` bytes (``b""`` at end of stream); always a checkpoint."""
        sock = self.sock
        while True:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                data = sock.recv(max_bytes)
            except BlockingIOError:
                await self._wait(anyio.wait_readable)
                continue
            await anyio.lowlevel.checkpoint()
            return data

    async def receive_into(self, view: memoryview) -> int:
        """Receive into ``view``; the count (0 at end of stream); always a checkpoint."""
        sock = self.sock
        while True:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                count = sock.recv_into(view)
            except BlockingIOError:
                await self._wait(anyio.wait_readable)
                continue
            await anyio.lowlevel.checkpoint()
            return count

    def wake_when(self, missing: int) -> None:
        """Have the socket wake the reader only once up to ``_WAKE_BYTES_MAX`` of the
        ``missing`` bytes of a large response are in (``SO_RCVLOWAT``); 1 otherwise."""
        if not self.wake_bytes or self._closed:
            return
        wake_bytes = min(missing, _WAKE_BYTES_MAX) if missing >= DIRECT_BODY_BYTES_MIN else 1
        if wake_bytes != self.wake_bytes:
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, wake_bytes)
                self.wake_bytes = wake_bytes
            except (OSError, AttributeError):  # not on this platform: wake per segment
                self.wake_bytes = 0

    async def aclose(self) -> None:
        self.close()
        await anyio.lowlevel.checkpoint()

    def close(self) -> None:
        """Close (at once, or as soon as a waiting task left its wait). Never blocks."""
        if self._closed:
            return
        self._closed = True
        if not self._waits:
            self.sock.close()
        for scope in self._waits:
            scope.cancel()


async def open_socket_stream(host: str, port: int) -> SocketStream:
    """Connect a non-blocking TCP socket. Raises OSError."""
    try:  # a numeric address (the common case) needs no resolver thread
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    error: OSError = OSError(f"no address for {host}:{port}")
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                sock.connect(address)
            except BlockingIOError:
                await anyio.wait_writable(sock)
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    raise OSError(code, f"connect to {host}:{port}: {os.strerror(code)}")
            return SocketStream(sock)
        except OSError as exc:
            sock.close()
            error = exc
        except BaseException:
            sock.close()
            raise
    raise error


class _ClientClock:
    """The OS's monotonic clock (any thread may read it: the blocking front appends records
    on its callers' threads) and its wall clock."""

    def monotonic_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000


class _ClientNet:
    async def open_tcp_stream(self, host: str, port: int) -> SocketStream:
        return await open_socket_stream(host, port)


class ClientEnv:
    """The default env of the async client: real sockets, the event loop's clock,
    OS-seeded randomness."""

    def __init__(self) -> None:
        self.clock = _ClientClock()
        self.net = _ClientNet()

    def rng(self, name: str) -> random.Random:
        return random.Random()


def env_rng(env: Any, name: str) -> random.Random:
    maker = getattr(env, "rng", None)
    return maker(name) if maker is not None else random.Random()


@asynccontextmanager
async def open_task_group() -> AsyncIterator[anyio.abc.TaskGroup]:
    """A client's task group. A single error (the body's, or one task's) leaves it as itself,
    not wrapped in an exception group: ``open_producer(lingr_ms=1)`` raises ``TypeError``."""
    try:
        async with anyio.create_task_group() as group:
            yield group
    except BaseExceptionGroup as errors:
        if len(errors.exceptions) == 1:
            raise errors.exceptions[0] from None
        raise


class Bridge:
    """How one client's state is shared between its event loop and other threads.

    ``lock`` guards the client's core state (accumulator, fetch state, metadata cache): the
    loop holds it around each core call, never across an await, and the blocking front holds
    it on its callers' threads (``Producer.send`` appends under it, ``Consumer.poll`` takes
    completed fetches under it). ``changed`` (a condition on ``lock``) is where those threads
    wait; every ``Signal.fire`` notifies it once a front ``attach``ed a loop. A ``Signal`` fired
    off the loop's thread is fired on the loop (``call_soon``). Without a blocking front (an
    async program) the lock is never contended and nothing hops threads."""

    __slots__ = ("lock", "changed", "waiting", "_loop_thread", "_call_soon")

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.waiting = 0  # threads in ``wait``: ``notify`` is free while there are none
        self._loop_thread: int | None = None
        self._call_soon: Callable[..., None] | None = None

    def attach(self, loop_thread: int, call_soon: Callable[..., None]) -> None:
        """Serve threads outside the loop: ``call_soon(fn)`` runs ``fn()`` on the loop thread
        ``loop_thread`` (any thread may call it)."""
        self._loop_thread = loop_thread
        self._call_soon = call_soon

    @property
    def attached(self) -> bool:
        return self._call_soon is not None

    def on_loop(self) -> bool:
        return self._call_soon is None or threading.get_ident() == self._loop_thread

    def call_soon(self, fn: Callable[..., None]) -> None:
        """Run ``fn()`` on the loop thread soon (at once when already there). Never blocks;
        does nothing once the loop is gone."""
        if self.on_loop():
            fn()
            return
        try:
            self._call_soon(fn)  # type: ignore[misc]
        except RuntimeError:  # the loop has stopped: nobody waits there any more
            pass

    def wait(self, timeout_s: float) -> None:
        """Wait (``lock`` held, on a thread other than the loop's) until the next ``notify``
        or ``timeout_s``; then re-check the condition waited for."""
        self.waiting += 1
        try:
            self.changed.wait(timeout_s)
        finally:
            self.waiting -= 1

    def notify(self) -> None:
        """Wake the threads in ``wait`` (they re-check their condition). A waiter counts
        itself under ``lock`` before it checks its condition, and state changes are made
        under ``lock`` before they are signalled, so reading ``waiting`` unlocked misses
        nobody."""
        if self.waiting:
            with self.lock:
                self.changed.notify_all()


class Signal:
    """A level-free broadcast: ``fire()`` wakes every current ``wait()``er (on the loop) and,
    with a ``bridge``, every thread in its ``wait``. ``fire`` may be called from any thread;
    off the loop it is carried out there. The event is made only when someone waits: most
    fires (a batch sealed, an answer in) find nobody waiting."""

    __slots__ = ("_event", "_bridge")

    def __init__(self, bridge: Bridge | None = None) -> None:
        self._event: anyio.Event | None = None
        self._bridge = bridge

    def fire(self) -> None:
        bridge = self._bridge
        if bridge is not None and bridge.attached:
            if not bridge.on_loop():
                bridge.call_soon(self.fire)
                return
            bridge.notify()
        event = self._event
        if event is not None:
            self._event = None
            event.set()

    def current(self) -> anyio.Event:
        """The event the next ``fire()`` sets: capture it before a check to never miss a fire.
        On the loop only."""
        event = self._event
        if event is None:
            event = self._event = anyio.Event()
        return event

    async def wait(self, timeout_ms: int | None = None) -> None:
        event = self.current()
        if timeout_ms is None:
            await event.wait()
        else:
            with anyio.move_on_after(max(timeout_ms, 0) / 1000):
                await event.wait()


class Background:
    """A client's own tasks (connection readers, fetches, heartbeats), started in its nursery,
    each in a shielded scope that only ``stop`` cancels.

    When the scope around an ``async with open_consumer(...)`` is cancelled, the consumer still
    closes properly (commit, LeaveGroup), shielded; that close needs the task that reads its
    connection. Plain nursery tasks would be cancelled with the outer scope at once, the
    answer never read, and the close would wait out its whole request timeout. So these
    tasks run on until the client's ``finally`` calls ``stop``, after its close. A task
    started after ``stop`` runs already cancelled (``anyio.aclose_forcefully`` still closes)."""

    def __init__(self, nursery: anyio.abc.TaskGroup) -> None:
        self._nursery = nursery
        #: (a dict, not a set: cancelled in the order started, the same in every run)
        self._scopes: dict[anyio.CancelScope, None] = {}
        self._stopped = False

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Start ``fn(*args)``. Raises RuntimeError when the nursery is closed."""
        self._nursery.start_soon(self._run, fn, args)

    async def _run(self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]) -> None:
        with anyio.CancelScope(shield=True) as scope:
            if self._stopped:
                scope.cancel()
            self._scopes[scope] = None
            try:
                await fn(*args)
            finally:
                del self._scopes[scope]

    def stop(self) -> None:
        """Cancel every task started here, and any started later. Never blocks."""
        self._stopped = True
        for scope in list(self._scopes):
            scope.cancel()


#: Where a client starts its tasks: a task group, or a ``Background`` over one.
Spawner = anyio.abc.TaskGroup | Background


#: ``on_answer(response, error)``: exactly one of the two is set (None, None for no answer)
AnswerCallback = Callable[[Any, "RivvenError | None"], None]


class _Waiter:
    """An answer awaited (``event``) or handed to a callback (``on_answer``)."""

    __slots__ = ("event", "response", "error", "deadline_ms", "on_answer")

    def __init__(self, deadline_ms: int = 0, on_answer: AnswerCallback | None = None) -> None:
        self.event = anyio.Event() if on_answer is None else None
        self.response: Any = None
        self.error: RivvenError | None = None
        self.deadline_ms = deadline_ms
        self.on_answer = on_answer

    def settle(self, response: Any, error: RivvenError | None) -> None:
        self.response, self.error = response, error
        if self.on_answer is not None:
            self.on_answer(response, error)
        else:
            self.event.set()


class Connection:
    """One pipelined stream to one broker.

    ``after_answers()``, when given, is called by the reader once it paired the answers of
    one receive with their waiters (not after a receive that answered nothing; after
    ``fail`` when the connection broke meanwhile): a client that follows answers with
    requests (the producer's sender) steps there, on the reader's turn, instead of in a task
    woken for it. An answer's callback may break the connection (a request it sends finds
    the stream gone): the reader then stops at once, pairing nothing more (its waiters were
    failed)."""

    def __init__(
        self, address: Address, stream: Any, in_flight_max: int, nursery: Spawner,
        clock: Any = None, after_answers: Callable[[], None] | None = None,
    ) -> None:
        self.address = address
        self.stream = stream
        self.nursery = nursery
        self.core = ClientConnection(in_flight_max=in_flight_max)
        self.waiters: deque[_Waiter] = deque()
        self.send_lock = anyio.Lock()
        self._unsent: deque[memoryview] = deque()  # ``request_soon`` bytes still to send
        self.clock = clock or _ClientClock()
        self._watch_at_ms: int | None = None  # when ``watch_deadlines`` wakes next
        self._deadlines = Signal()
        self.error: RivvenError | None = None
        self.api_versions: dict[int, tuple[int, int]] = {}
        self.after_answers = after_answers

    @property
    def in_flight(self) -> int:
        return len(self.waiters)

    async def request(self, request: Any, timeout_ms: int) -> Any:
        """Send and await the answer (None for acks=0 produce). Raises the connection's error,
        ``RequestTimedOutError`` (which breaks the connection) or a local protocol error."""
        if self.error is not None:
            raise self.error
        waiter = None
        if request.expects_response():
            waiter = _Waiter(self.clock.monotonic_ms() + timeout_ms)
        async with self.send_lock:
            if self.error is not None:
                raise self.error
            if self._unsent:  # the rest of a ``request_soon``'s bytes go first
                await self._send_unsent()
                if self.error is not None:
                    raise self.error
            try:
                _, data = self.core.send_request(*sendable(self.api_versions, request))
            except ProtocolError as exc:
                raise error_for(exc.code, str(exc)) from exc
            if waiter is not None:
                self.waiters.append(waiter)
                watch_at = self._watch_at_ms
                if watch_at is None or waiter.deadline_ms < watch_at:
                    self._deadlines.fire()  # due sooner than the watch expects
            try:
                await self.stream.send_all(data)
            except STREAM_ERRORS as exc:
                self.fail(ConnectionFailedError(f"connection to {self.address} lost: {exc!r}"))
        if waiter is None:
            return None
        await waiter.event.wait()  # answered, failed, or timed out (``watch_deadlines``)
        if waiter.error is not None:
            raise waiter.error
        return waiter.response

    def request_soon(self, request: Any, timeout_ms: int, on_answer: AnswerCallback) -> bool:
        """Send ``request`` without awaiting: the reader calls ``on_answer(response, error)``
        (``(None, None)`` at once when no answer is expected). Only on a ``SocketStream`` with
        nobody sending: False otherwise (use ``request``). Bytes the socket cannot take now
        are sent by a task, before any later request's. Saves the task, the event and the
        task switches of ``request`` per request on the producer's hot path."""
        try_send = getattr(self.stream, "try_send", None)
        if try_send is None or self.send_lock.locked() or self._unsent:
            return False
        if self.error is not None:
            on_answer(None, self.error)
            return True
        try:
            _, data = self.core.send_request(*sendable(self.api_versions, request))
        except ProtocolError as exc:
            on_answer(None, error_for(exc.code, str(exc)))
            return True
        if request.expects_response():
            waiter = _Waiter(self.clock.monotonic_ms() + timeout_ms, on_answer)
            self.waiters.append(waiter)
            watch_at = self._watch_at_ms
            if watch_at is None or waiter.deadline_ms < watch_at:
                self._deadlines.fire()
        else:
            waiter = None
        try:
            rest = try_send(data)
        except STREAM_ERRORS as exc:
            self.fail(ConnectionFailedError(f"connection to {self.address} lost: {exc!r}"))
            rest = None
        if rest:
            self._unsent.append(rest)
            self.nursery.start_soon(self._send_unsent_locked)
        if waiter is None:
            on_answer(None, self.error)
        return True

    async def _send_unsent_locked(self) -> None:
        async with self.send_lock:
            await self._send_unsent()

    async def _send_unsent(self) -> None:
        """Send what ``request_soon`` left (send lock held)."""
        while self._unsent and self.error is None:
            data = self._unsent.popleft()
            try:
                await self.stream.send_all(data)
            except STREAM_ERRORS as exc:
                self.fail(ConnectionFailedError(f"connection to {self.address} lost: {exc!r}"))

    async def watch_deadlines(self) -> None:
        """Fail the connection once an unanswered request is older than its timeout (a
        ``RequestTimedOutError`` for every waiter: responses cannot be skipped). One timer per
        connection, re-armed by a request only when it is due sooner, instead of a cancel
        scope around every request."""
        clock = self.clock
        while self.error is None:
            if not self.waiters:
                self._watch_at_ms = None
                await self._deadlines.wait()
                continue
            due = min(waiter.deadline_ms for waiter in self.waiters)
            now = clock.monotonic_ms()
            if due <= now:
                self.fail(RequestTimedOutError(f"no answer from {self.address} in time"))
                return
            self._watch_at_ms = due
            await self._deadlines.wait(due - now)

    async def read_loop(self) -> None:
        """Pair responses with waiters until the stream ends or breaks."""
        core, stream = self.core, self.stream
        receive_into = getattr(stream, "receive_into", None)  # a SocketStream's tricks
        wake_when = getattr(stream, "wake_when", None)
        answered = False  # answers paired since ``after_answers`` was last called
        try:
            while self.error is None:
                try:
                    view = None if receive_into is None else core.receive_buffer()
                    if view is not None:  # the rest of a large response: into its buffer
                        count = await receive_into(view)
                        if count:
                            core.received(count)
                    else:
                        data = await stream.receive_some(_RECEIVE_BYTES)
                        count = len(data)
                        if count:
                            core.receive_data(data)
                except STREAM_ERRORS as exc:
                    self.fail(ConnectionFailedError(f"connection to {self.address} lost: {exc!r}"))
                    return
                if self.error is not None:  # failed meanwhile (a request timed out): its
                    return  # waiters are answered, and these bytes answer nobody
                if not count:
                    self.fail(ConnectionFailedError(f"{self.address} closed the connection"))
                    return
                if wake_when is not None:
                    wake_when(core.body_missing)
                while (event := core.next_event()) is not None:
                    self.waiters.popleft().settle(event.response, None)
                    answered = True
                    if self.error is not None:  # an answer's callback broke the connection:
                        return  # its waiters are failed; the rest of the bytes answer nobody
                if answered and self.after_answers is not None:
                    answered = False
                    self.after_answers()
        except ProtocolError as exc:
            self.fail(error_for(exc.code, f"from {self.address}: {exc}"))
        finally:  # broken after some answers: they are still owed their step (after ``fail``)
            if answered and self.after_answers is not None:
                self.after_answers()

    def fail(self, error: RivvenError) -> None:
        """Break the connection: every waiter gets ``error``; the stream is closed."""
        if self.error is not None:
            return
        self.error = error
        waiters, self.waiters = self.waiters, deque()
        self._unsent.clear()
        for waiter in waiters:
            waiter.settle(None, error)
        self._deadlines.fire()  # its watch ends
        close = getattr(self.stream, "close", None)
        if close is not None:  # a SocketStream closes at once
            close()
            return
        try:
            self.nursery.start_soon(anyio.aclose_forcefully, self.stream)
        except RuntimeError:  # the task group is gone: the stream went with it
            pass


class Cluster:
    """Connections plus metadata for one client. Lives in the client's task group."""

    def __init__(
        self,
        bootstrap: str,
        config: ConnectionConfig,
        env: Any,
        nursery: Spawner,
        *,
        in_flight_max: int,
        allow_auto_topic_creation: bool = False,
        connect_attempts_max: int = 3,
        bridge: Bridge | None = None,
    ) -> None:
        """``bridge``: the client's (its ``lock`` also guards the metadata cache)."""
        self.config = config
        self.bridge = bridge or Bridge()
        self._lock = self.bridge.lock
        self.env = env
        self.clock = env.clock
        self.nursery = nursery
        self.in_flight_max = in_flight_max
        self.allow_auto_topic_creation = allow_auto_topic_creation
        self.connect_attempts_max = connect_attempts_max
        self.rng = env_rng(env, "client")
        self.metadata = MetadataCache(
            parse_bootstrap(bootstrap),
            metadata_max_age_ms=config.metadata_max_age_ms,
            refresh_backoff_ms=config.retry_backoff_ms,
        )
        self.retry = RetryPolicy(
            retry_backoff_ms=config.retry_backoff_ms,
            retry_backoff_max_ms=config.retry_backoff_max_ms,
        )
        self.changed = Signal(self.bridge)  # fires when metadata changes (or a refresh failed)
        #: called after every refresh (its answer or failure): a driver's wake-up
        self.on_update: Callable[[], None] | None = None
        #: given to every new connection (``Connection``'s docstring): the producer's sender
        #: steps right after a receive brought answers
        self.after_answers: Callable[[], None] | None = None
        self.backoff = ReconnectBackoff(
            config.reconnect_backoff_ms, config.reconnect_backoff_max_ms, self.rng
        )
        self._connections: dict[Address, Connection] = {}
        self._dialing: dict[Address, anyio.Event] = {}
        self._closed = False

    @property
    def last_error(self) -> RivvenError | None:
        """Why the last dial failed (any address)."""
        return self.backoff.last_error

    def now_ms(self) -> int:
        return self.clock.monotonic_ms()

    # --- connections -----------------------------------------------------------------------
    def connection(self, address: Address) -> Connection | None:
        conn = self._connections.get(address)
        return conn if conn is not None and conn.error is None else None

    def can_dial(self, address: Address, now_ms: int) -> bool:
        return self.backoff.can_dial(address, now_ms) and address not in self._dialing

    def dial_waiting(self, nodes: list[int], now_ms: int) -> int | None:
        """Start dialling the leaders a core's step named (those out of their backoff, not
        being dialled already); returns the earliest end of a backoff among the others."""
        wake_at = None
        for node_id in nodes:
            address = self.metadata.address_of(node_id)
            if address is None or address in self._dialing:
                continue
            if self.backoff.can_dial(address, now_ms):
                self.nursery.start_soon(self._dial_soon, address)
            else:
                retry_at = self.backoff.retry_at_ms(address)
                wake_at = retry_at if wake_at is None else min(wake_at, retry_at)
        return wake_at

    async def _dial_soon(self, address: Address) -> None:
        try:
            await self.connect(address)
        except ClosedError:
            return
        except RivvenError:
            with self._lock:
                self.metadata.request_update()  # the leader may have moved
        if self.on_update is not None:
            self.on_update()

    async def connect(self, address: Address) -> Connection:
        """The connection to ``address``, dialling it if needed.

        Raises:
            ConnectionFailedError: the dial failed (the address then waits out a backoff).
            ClosedError: the client is closed.
        """
        while True:
            if self._closed:
                raise ClosedError("the client is closed")
            conn = self.connection(address)
            if conn is not None:
                return conn
            dialing = self._dialing.get(address)
            if dialing is None:
                break
            await dialing.wait()
        done = self._dialing[address] = anyio.Event()
        try:
            try:
                with anyio.fail_after(self.config.connect_timeout_ms / 1000):
                    stream = await self.env.net.open_tcp_stream(address.host, address.port)
            except (OSError, TimeoutError) as exc:
                error = ConnectionFailedError(f"cannot connect to {address}: {exc!r}")
                self._dial_failed(address, error)
                raise error from exc
            conn = Connection(address, stream, self.in_flight_max, self.nursery, self.clock,
                              self.after_answers)
            self.nursery.start_soon(conn.read_loop)
            self.nursery.start_soon(conn.watch_deadlines)
            await self._handshake(conn)
            self._connections[address] = conn
        finally:
            del self._dialing[address]
            done.set()
        return conn

    async def _handshake(self, conn: Connection) -> None:
        """Send the Handshake and wait for it; raise (and back off) if it fails."""
        try:
            response = await conn.request(
                m.Handshake(client_id=self.config.client_id), self.config.request_timeout_ms
            )
        except RivvenError as error:
            conn.fail(error)
            self._dial_failed(conn.address, error)
            raise ConnectionFailedError(f"handshake with {conn.address} failed: {error}") from error
        if isinstance(response, m.HandshakeResponse) and response.compatible:
            self.backoff.on_connected(conn.address)
            conn.api_versions = dict(response.api_versions)
            return
        text = getattr(response, "message", "") or type(response).__name__
        error = UnsupportedVersionError(f"broker {conn.address} refused: {text}")
        conn.fail(error)
        self._dial_failed(conn.address, error)
        raise error

    def _dial_failed(self, address: Address, error: RivvenError) -> None:
        self.backoff.on_dial_failed(address, error, self.now_ms())

    async def any_connection(self) -> Connection | None:
        """A connected broker with the fewest requests in flight, else one being dialled or a
        fresh dial (None if every candidate waits out a backoff or the dial failed)."""
        with self._lock:
            candidates = self.metadata.candidates()
        live = [c for a in candidates if (c := self.connection(a)) is not None]
        if live:
            return min(live, key=lambda c: c.in_flight)
        now = self.now_ms()
        for address in candidates:  # one being dialled already: wait for that dial (as the
            # first request on a new connection queues behind its Handshake)
            if address in self._dialing or self.backoff.can_dial(address, now):
                try:
                    return await self.connect(address)
                except RivvenError:
                    return None
        return None

    # --- metadata ----------------------------------------------------------------------------
    async def refresh(self, force: bool = True) -> None:
        """One Metadata request for the wanted topics (skipped if one is running; unless
        ``force``, also when the cache says none is due)."""
        metadata, lock = self.metadata, self._lock
        with lock:
            if self._closed or not metadata.refresh_due(self.now_ms(), force=force):
                return
            metadata.on_refresh_started()
        try:
            conn = await self.any_connection()
            if conn is None:
                with lock:
                    metadata.on_failure(self.now_ms())
                return
            with lock:
                metadata.on_request_sent(self.now_ms())
                request = metadata_request(metadata.request_topics(),
                                           self.allow_auto_topic_creation)
            try:
                response = await conn.request(request, self.config.request_timeout_ms)
                response = check_response(response, m.MetadataResponse)
            except RivvenError:
                with lock:
                    metadata.on_failure(self.now_ms())
                return
            with lock:
                metadata.on_update(response, self.now_ms())
        finally:
            with lock:
                if metadata.refresh_in_flight:  # cancelled: let the next one start
                    metadata.on_failure(self.now_ms())
            self.changed.fire()
            if self.on_update is not None:
                self.on_update()

    def refresh_soon(self) -> None:
        """Start a refresh in the background if the cache says one is due."""
        with self._lock:
            due = not self._closed and self.metadata.refresh_due(self.now_ms())
        if due:
            self.nursery.start_soon(self.refresh, False)

    # --- calls with retries --------------------------------------------------------------------
    async def call(
        self, request: Any, *, node_id: int | None = None, timeout_ms: int | None = None
    ) -> Any:
        """Send ``request`` (to ``node_id`` or any broker) and return the answer.

        Raises as ``SyncClient.call`` does (the same ``CallRetry``): ConnectionFailedError
        (also, at once and retriably, for a ``node_id`` the metadata does not list: a refresh
        is asked for and the caller finds its target again), ClientTimeoutError, BrokerError
        for an ErrorResponse, ClosedError.
        """
        timeout_ms = self.config.request_timeout_ms if timeout_ms is None else timeout_ms
        retry = CallRetry(
            now_ms=self.now_ms(), timeout_ms=timeout_ms, policy=self.retry, rng=self.rng,
            metadata=self.metadata, connect_attempts_max=self.connect_attempts_max,
        )
        lock = self._lock
        while True:
            if self._closed:
                raise ClosedError("the client is closed")
            with lock:
                retry.target_known(node_id)
            failed_before = self.backoff.failed_dials
            conn, candidates = await self._target(node_id)
            now = self.now_ms()
            if conn is None:
                with lock:
                    wait_ms = retry.no_connection(
                        now, dial_failed=self.backoff.failed_dials > failed_before,
                        next_dial_ms=self.backoff.next_dial_ms(candidates, now),
                        error=self.backoff.last_error,
                    )
                await anyio.sleep(wait_ms / 1000)
                continue
            try:
                return retry.answer(await conn.request(request, retry.attempt(now)))
            except RivvenError as error:
                with lock:
                    wait_ms = retry.failed(error, self.now_ms())
            await anyio.sleep(wait_ms / 1000)

    async def _target(
        self, node_id: int | None
    ) -> tuple[Connection | None, list[Address]]:
        if node_id is None:
            conn = await self.any_connection()
            with self._lock:
                return conn, self.metadata.addresses()
        address = self.metadata.address_of(node_id)
        assert address is not None, "CallRetry.target_known checked it"
        if self.connection(address) is None and not self.can_dial(address, self.now_ms()):
            return None, [address]
        try:
            return await self.connect(address), [address]
        except RivvenError:
            return None, [address]

    async def fetch_metadata(self, topics: list[str] | None, *,
                             timeout_ms: int | None = None) -> Any:
        """A Metadata answer for ``topics`` (None: all); also refreshes the cache."""
        response = check_response(
            await self.call(metadata_request(topics, False), timeout_ms=timeout_ms),
            m.MetadataResponse)
        self.update_metadata(response)
        return response

    async def leader_for(self, topic: str, partition: int, *,
                         timeout_ms: int | None = None) -> int:
        """The partition's leader, refreshing metadata once if unknown.

        Raises:
            BrokerError: the topic's error, or UnknownTopicOrPartitionError.
        """
        node = self.known_leader(topic, partition)
        if node is None:
            with self._lock:
                request = metadata_request(self.metadata.request_topics(), False)
            response = check_response(await self.call(request, timeout_ms=timeout_ms),
                                      m.MetadataResponse)
            with self._lock:
                self.metadata.on_update(response, self.now_ms())
                node = self.metadata.leader_or_raise(topic, partition)
        return node

    def known_leader(self, topic: str, partition: int) -> int | None:
        """The partition's leader if the cache knows it (the topic is tracked from now on);
        never waits: ``leader_for`` without its Metadata request."""
        with self._lock:
            self.metadata.add_topics([topic])
            return self.metadata.leader_for(topic, partition)

    def update_metadata(self, response: Any) -> None:
        """Take a Metadata answer a caller asked for itself."""
        with self._lock:
            self.metadata.on_update(response, self.now_ms())

    def close(self) -> None:
        """Break every connection (waiters get ``ClosedError``). Idempotent; never blocks."""
        self._closed = True
        for conn in list(self._connections.values()):
            conn.fail(ClosedError("the client is closed"))
        self._connections.clear()
        self.changed.fire()


@asynccontextmanager
async def open_cluster(bootstrap: str, config: ConnectionConfig, *, env: Any = None,
                       bridge: Bridge | None = None, **options: Any) -> AsyncIterator[Cluster]:
    """A ``Cluster`` of its own (raw requests with retries) for an ``async with`` body."""
    async with open_task_group() as nursery:
        cluster = Cluster(bootstrap, config, env or ClientEnv(), nursery, in_flight_max=8,
                          bridge=bridge, **options)
        try:
            yield cluster
        finally:
            cluster.close()
            nursery.cancel_scope.cancel()
