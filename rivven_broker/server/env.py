"""``Env``: everything a node may ask of the outside world, behind one seam.

Theory of operation
-------------------
A broker never reads the clock, draws a random number, opens a socket or touches a file by
itself. It asks its ``Env``:

- ``clock``: ``monotonic_ms()`` for timeouts and ages, ``wall_ms()`` for timestamps written
  into logs, ``sleep_until(deadline)`` / ``sleep_ms(ms)`` to wait.
- ``rng(name)``: a named ``random.Random`` stream. In production it is seeded from the OS;
  in the simulator it is ``random.Random(f"{seed}/{node}/{name}")``, so adding a new stream
  never shifts the numbers another stream draws.
- ``net``: byte streams. ``serve_tcp`` listens and calls a handler per connection;
  ``open_tcp_stream`` dials. Streams are trio ``Stream`` objects (``send_all``,
  ``receive_some``, ``aclose``), real sockets here and in-memory streams in the simulator.
  And datagrams (SWIM's): ``bind_udp`` gives a ``DatagramSocket`` (``send_to``,
  ``receive_from``, ``close``): a real UDP socket here; in the simulator a datagram may be
  lost, duplicated, reordered or delayed, and partitions may be one-way.
  And ``readiness()``: a ``Readiness`` set that one task (the produce lane,
  ``produce_lane.py``) uses to watch many accepted streams at once and to read and write them
  without waiting: an epoll set and ``os.read``/``os.write`` here, the simulated streams'
  buffers in the simulator — one lane, driven the same way in both.
- ``disk``: the storage ``FileStore``.
- ``run_sync``: runs a blocking function (opening logs, a cleaner step) off the event loop,
  on one long-lived thread in production (``SyncThread``); the simulator runs it inline after
  waiting its disk's fsync latency.
- ``run_fsync``: runs the group commit's fsyncs, short and bounded calls. Production runs them
  on the loop itself while they are fast and on the same thread once slow
  (``InlineWhileFast``, see ``sync_thread.py`` for the measurements); the simulator treats
  them as ``run_sync``.
- ``commit_in_caller()`` (optional): whether the produce lane may run a group commit in its
  own task now (``storage/sync_worker.py``, ``write_then_commit``): production while the
  fsyncs run on the loop, the simulator always.

``RealEnv`` is what ``rivven-broker`` and the trio client use. The simulator's ``SimEnv``
implements the same protocol over a virtual clock, network and disk. A tidy test forbids
direct use of ``time``, ``random`` functions, ``os.urandom``, threads and sockets anywhere
else in node code.
"""

from __future__ import annotations

import errno
import os
import random
import select
import time
from typing import Any, Awaitable, Callable, Protocol, TypeVar

import trio

from rivven_broker.server.eager_stream import EagerStream
from rivven_broker.server.sync_thread import InlineWhileFast, SyncThread, run_concurrently
from rivven_broker.storage.file_store import FileStore, OsFileStore

__all__ = [
    "Clock", "Net", "Env", "DatagramSocket", "Readiness", "RealClock", "RealNet",
    "RealReadiness", "RealEnv",
]

T = TypeVar("T")
StreamHandler = Callable[[trio.abc.Stream], Awaitable[None]]
#: Told of each ``accept`` that failed for lack of descriptors or memory (the errno's name).
AcceptFailed = Callable[[str], None]

# accept(2) failures that mean "the system is out of something", not "this listener is broken".
_ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
_ACCEPT_BACKOFF_S = (0.01, 1.0)  # first and longest pause after a failed accept


class Clock(Protocol):
    def monotonic_ms(self) -> int: ...
    def wall_ms(self) -> int: ...
    async def sleep_until_ms(self, deadline_ms: int) -> None: ...
    async def sleep_ms(self, duration_ms: int) -> None: ...


class DatagramSocket(Protocol):
    """A bound datagram socket. Best effort: a datagram may be lost, and nothing says so."""

    #: The port actually bound (useful after binding port 0).
    local_port: int

    async def send_to(self, data: bytes, host: str, port: int) -> None:
        """Send one datagram. Does not wait for the network; a checkpoint. Never raises for
        a datagram the network drops; ``OSError`` for a local failure (e.g. no buffer, a
        datagram larger than the path allows) and ``trio.ClosedResourceError`` after
        ``close``."""
        ...

    async def receive_from(self) -> tuple[bytes, str, int]:
        """The next datagram and its sender's host and port. Blocks until one arrives."""
        ...

    def close(self) -> None:
        """Close the socket; a pending ``receive_from`` raises ``ClosedResourceError``."""
        ...


class Readiness(Protocol):
    """Many accepted streams watched by one task (see the module docstring). Never blocks,
    except ``wait``."""

    def watch(self, stream: trio.abc.Stream) -> bool:
        """Watch ``stream`` for bytes (or its end). False: this kind of stream cannot be
        watched (its connection keeps reading in its own task)."""
        ...

    def unwatch(self, stream: trio.abc.Stream) -> None:
        """Stop watching ``stream`` (nothing happens if it was not watched)."""
        ...

    def ready(self) -> list[trio.abc.Stream]:
        """The watched streams with bytes, an end or an error to read now; not a checkpoint."""
        ...

    async def wait(self) -> None:
        """Until ``ready()`` may be non-empty. Cancellable (the lane wakes itself so)."""
        ...

    def receive_now(self, stream: trio.abc.Stream, max_bytes: int) -> bytes | None:
        """Up to ``max_bytes`` bytes that are there now; ``b""`` at the end of the stream;
        ``None`` when there are none yet. Raises ``trio.BrokenResourceError`` (reset) or
        ``trio.ClosedResourceError``."""
        ...

    def send_now(self, stream: trio.abc.Stream, data: bytes) -> int:
        """Send what the stream takes now, without waiting; the bytes taken (maybe 0).
        Raises ``trio.BrokenResourceError`` or ``trio.ClosedResourceError``."""
        ...

    def close(self) -> None:
        """Forget every stream and release the set."""
        ...


class Net(Protocol):
    def readiness(self) -> Readiness:
        """A new, empty ``Readiness`` set for this endpoint's accepted streams."""
        ...

    async def serve_tcp(
        self,
        handler: StreamHandler,
        host: str,
        port: int,
        *,
        handler_nursery: trio.Nursery | None = None,
        on_accept_failed: AcceptFailed | None = None,
        task_status: Any = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen and run ``handler(stream)`` per connection until cancelled.

        ``task_status.started(port)`` reports the bound port (useful with port 0). The stream
        is closed when ``handler`` returns. With ``handler_nursery``, handlers run there
        instead of inside this call: cancelling ``serve_tcp`` then only stops accepting, and
        the connections already open live on (a graceful shutdown needs exactly that). An
        accept that fails for lack of descriptors or memory is reported to
        ``on_accept_failed`` and retried after a pause, never raised.
        """
        ...

    async def open_tcp_stream(self, host: str, port: int) -> trio.abc.Stream: ...

    async def bind_udp(self, host: str, port: int) -> DatagramSocket:
        """A datagram socket bound to ``host:port`` (port 0: any free port).

        Raises ``OSError`` when the address cannot be bound."""
        ...


class Env(Protocol):
    clock: Clock
    net: Net
    disk: FileStore

    def rng(self, name: str) -> random.Random: ...
    async def run_sync(self, fn: Callable[..., T], *args: Any) -> T: ...
    async def run_fsync(self, fn: Callable[..., T], *args: Any) -> T: ...


class RealClock:
    """Trio's clock for monotonic time (virtual under a MockClock), the OS for wall time."""

    def monotonic_ms(self) -> int:
        return int(trio.current_time() * 1000)

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

    async def sleep_until_ms(self, deadline_ms: int) -> None:
        await trio.sleep_until(deadline_ms / 1000)

    async def sleep_ms(self, duration_ms: int) -> None:
        await trio.sleep(max(duration_ms, 0) / 1000)


class RealNet:
    """Real TCP sockets through trio."""

    def readiness(self) -> RealReadiness:
        return RealReadiness()

    async def serve_tcp(
        self,
        handler: StreamHandler,
        host: str,
        port: int,
        *,
        handler_nursery: trio.Nursery | None = None,
        on_accept_failed: AcceptFailed | None = None,
        task_status: Any = trio.TASK_STATUS_IGNORED,
    ) -> None:
        listeners = await trio.open_tcp_listeners(port, host=host, backlog=1024)
        bound_port = listeners[0].socket.getsockname()[1]

        async def eager(stream: trio.SocketStream) -> None:
            try:
                await handler(EagerStream(stream))  # no scheduler pass per send or receive
            finally:
                await trio.aclose_forcefully(stream)

        async with trio.open_nursery() as accepting:
            handlers = handler_nursery or accepting
            for listener in listeners:
                accepting.start_soon(_accept_loop, listener, eager, handlers, on_accept_failed)
            task_status.started(bound_port)

    async def open_tcp_stream(self, host: str, port: int) -> trio.abc.Stream:
        stream = await trio.open_tcp_stream(host, port)
        stream.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY, 1)
        return stream

    async def bind_udp(self, host: str, port: int) -> RealDatagramSocket:
        """Port 0 picks a port that is free for TCP too: a cluster port carries SWIM over UDP
        and the Raft links over TCP on the same number."""
        family = trio.socket.AF_INET6 if ":" in host else trio.socket.AF_INET
        for _ in range(_PORT_TRIES if port == 0 else 1):
            chosen = port or await _free_tcp_port(family, host)
            sock = trio.socket.socket(family, trio.socket.SOCK_DGRAM)
            try:
                await sock.bind((host, chosen))
            except OSError:
                sock.close()
                if port:
                    raise
                continue
            except BaseException:
                sock.close()
                raise
            return RealDatagramSocket(sock)
        raise OSError(errno.EADDRINUSE, f"no port on {host} free for both UDP and TCP")


_PORT_TRIES = 64
_CLOSED_ERRNOS = (errno.EBADF, errno.ENOTSOCK)


class RealReadiness:
    """An epoll set (level-triggered) over the descriptors of ``EagerStream``\\ s: ``ready``
    is one ``epoll_wait`` with timeout 0, ``wait`` is trio's ``wait_readable`` on the epoll
    descriptor itself (readable when any watched socket is), and the lane reads and writes
    with plain ``os.read``/``os.write`` (the sockets are non-blocking)."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._streams: dict[int, trio.abc.Stream] = {}
        self._fds: dict[trio.abc.Stream, int] = {}

    def watch(self, stream: trio.abc.Stream) -> bool:
        if type(stream) is not EagerStream:
            return False
        fd = stream.socket.fileno()
        if fd < 0:
            return False
        stale = self._streams.get(fd)
        if stale is not None:  # a closed stream's number, taken again: forget the old one
            self.unwatch(stale)
        self._epoll.register(fd, select.EPOLLIN)
        self._streams[fd] = stream
        self._fds[stream] = fd
        return True

    def unwatch(self, stream: trio.abc.Stream) -> None:
        fd = self._fds.pop(stream, None)
        if fd is None:
            return
        del self._streams[fd]
        try:
            self._epoll.unregister(fd)
        except OSError:  # already closed: the kernel dropped it from the set
            pass

    def ready(self) -> list[trio.abc.Stream]:
        streams = self._streams
        return [streams[fd] for fd, _ in self._epoll.poll(0) if fd in streams]

    async def wait(self) -> None:
        await trio.lowlevel.wait_readable(self._epoll.fileno())

    def receive_now(self, stream: trio.abc.Stream, max_bytes: int) -> bytes | None:
        try:
            return os.read(stream.socket.fileno(), max_bytes)  # type: ignore[attr-defined]
        except BlockingIOError:
            return None
        except OSError as exc:
            raise _stream_error(exc) from exc

    def send_now(self, stream: trio.abc.Stream, data: bytes) -> int:
        try:
            return os.write(stream.socket.fileno(), data)  # type: ignore[attr-defined]
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise _stream_error(exc) from exc

    def close(self) -> None:
        self._streams.clear()
        self._fds.clear()
        self._epoll.close()


def _stream_error(exc: OSError) -> Exception:
    if exc.errno in _CLOSED_ERRNOS:
        return trio.ClosedResourceError("this socket was already closed")
    return trio.BrokenResourceError(f"socket connection broken: {exc}")


async def _free_tcp_port(family: int, host: str) -> int:
    with trio.socket.socket(family, trio.socket.SOCK_STREAM) as probe:
        await probe.bind((host, 0))
        return int(probe.getsockname()[1])


class RealDatagramSocket:
    """A real UDP socket through trio."""

    _RECEIVE_BYTES = 65_536

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self._sock = sock
        self.local_port: int = sock.getsockname()[1]

    async def send_to(self, data: bytes, host: str, port: int) -> None:
        try:
            await self._sock.sendto(data, (host, port))
        except (ConnectionRefusedError, ConnectionResetError):
            pass  # an ICMP answer to an earlier datagram: the network lost it, as UDP may
        except OSError as exc:
            if exc.errno == errno.EBADF:
                raise trio.ClosedResourceError("datagram socket closed") from exc
            raise

    async def receive_from(self) -> tuple[bytes, str, int]:
        while True:
            try:
                data, address = await self._sock.recvfrom(self._RECEIVE_BYTES)
            except (ConnectionRefusedError, ConnectionResetError):
                continue  # an ICMP error about an earlier send: not a datagram
            except OSError as exc:
                if exc.errno == errno.EBADF:
                    raise trio.ClosedResourceError("datagram socket closed") from exc
                raise
            return data, str(address[0]), int(address[1])

    def close(self) -> None:
        self._sock.close()


async def _accept_loop(
    listener: trio.SocketListener,
    handler: Callable[[trio.SocketStream], Awaitable[None]],
    handlers: trio.Nursery,
    on_accept_failed: AcceptFailed | None,
) -> None:
    """Accept connections for ever, each handled in ``handlers``.

    Out of descriptors (EMFILE/ENFILE) or memory, accept cannot take the connection, which then
    waits in the backlog, its client hanging. So a spare descriptor is kept: on EMFILE it is
    closed, the waiting connection accepted and closed at once (its client sees the close, not
    a hang), and the spare taken again. Each failure is reported, and accepting pauses
    (10 ms, doubling to 1 s, back to 10 ms after a success) instead of spinning.
    """
    spare: int | None = os.open(os.devnull, os.O_RDONLY)
    pause_s = _ACCEPT_BACKOFF_S[0]
    try:
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in _ACCEPT_CAPACITY_ERRNOS:
                        raise
                    if on_accept_failed is not None:
                        on_accept_failed(errno.errorcode[exc.errno])
                    if exc.errno == errno.EMFILE:
                        if spare is not None:
                            os.close(spare)
                            spare = None  # its number may be anyone's now, even if we stop here
                            await _refuse_one(listener)
                        spare = _reopen_spare()
                    await trio.sleep(pause_s)
                    pause_s = min(pause_s * 2, _ACCEPT_BACKOFF_S[1])
                    continue
                pause_s = _ACCEPT_BACKOFF_S[0]
                handlers.start_soon(handler, stream)
    finally:
        if spare is not None:
            os.close(spare)


async def _refuse_one(listener: trio.SocketListener) -> None:
    """Accept one waiting connection (a descriptor was just freed for it) and close it; give
    up after a moment if it went away meanwhile."""
    with trio.move_on_after(0.05):
        try:
            stream = await listener.accept()
        except OSError:
            return
        await trio.aclose_forcefully(stream)


def _reopen_spare() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY)
    except OSError:  # still none free: try again after the next failure
        return None


class RealEnv:
    """Production: trio time, OS entropy for seeds, real sockets, real files."""

    def __init__(self, data_dir: str) -> None:
        self.clock = RealClock()
        self.net = RealNet()
        self.disk: FileStore = OsFileStore(data_dir)
        self._seed = int.from_bytes(os.urandom(16), "big")
        self._streams: dict[str, random.Random] = {}
        self._sync_thread = SyncThread()
        self._fsyncs = InlineWhileFast(self._sync_thread, time.perf_counter)

    def rng(self, name: str) -> random.Random:
        # One stream per name: two callers asking for "ids" share one sequence, never repeat it.
        stream = self._streams.get(name)
        if stream is None:
            stream = self._streams[name] = random.Random(f"{self._seed}/{name}")
        return stream

    async def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        # One dedicated thread, calls in order: group commit wants fsyncs back to back, not in
        # parallel, and without trio.to_thread's per-call set-up (see sync_thread.py).
        return await self._sync_thread.run_sync(fn, *args)

    async def run_fsync(self, fn: Callable[..., T], *args: Any) -> T:
        # On the loop while fsyncs are fast, on the thread once slow (see sync_thread.py).
        return await self._fsyncs.run_sync(fn, *args)

    def commit_in_caller(self) -> bool:
        # While fsyncs run on the loop, a group commit in the produce lane's task blocks the
        # loop as the worker's would, without the hand-off (storage/sync_worker.py).
        return self._fsyncs.inline

    # The group commit fsyncs a group's files on several threads at once (sync_thread.py).
    fsync_each = staticmethod(run_concurrently)
