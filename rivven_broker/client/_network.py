"""The blocking driver's network layer: sockets, pipelining, reconnects, request timeouts.

Theory of operation
-------------------
``NetworkClient`` keeps one ``BrokerConnection`` per broker address. Each connection is a
non-blocking socket (TCP_NODELAY) around a sans-I/O ``ClientConnection``: ``send`` encodes a
request, queues its bytes and remembers its handler; ``poll(timeout_ms)`` waits (``selectors``)
until a socket is readable or writable, the timeout passes, or another thread calls
``wakeup()``, then writes what it can, reads everything available and calls handlers in
request order. Many requests may be in flight on one connection (pipelining); responses come
back in order, so handlers are a FIFO.

Exactly one thread drives a ``NetworkClient`` (the producer's sender thread, the consumer's
fetch thread, or the caller of an ``Admin`` method under the admin's lock); only ``wakeup`` may
be called from other threads. Handlers run on the driving thread as ``handler(response,
error)`` with exactly one of the two set.

Failures: a refused or lost connection fails every handler in flight on it with
``ConnectionFailedError`` (retriable) and the address waits out a reconnect backoff before the
next ``connect``: ``backoff``, the core's ``ReconnectBackoff`` (``reconnect_backoff_ms``
doubling to ``reconnect_backoff_max_ms``, with jitter), decides when. A request older than its timeout closes its connection (the stream cannot
skip one response) and fails everything in flight there with ``RequestTimedOutError``. A
protocol violation by the server fails them with the error of its code. Every new connection
starts with a ``Handshake``; the connection is *ready* (``is_ready``) once the broker accepted
it, and later requests go out at the newest version both sides list (``sendable``). An
incompatible broker fails the connection with ``UnsupportedVersionError`` (not retriable).

Receiving: small responses are ``recv``'d in chunks of up to 1 MiB and fed to the decoder. A
large one (a fetch answer of MiBs) is received straight into its own buffer
(``ClientConnection.receive_buffer``), so its bytes are never joined, and meanwhile the socket
is asked not to wake the driver before up to 1 MiB more of it has arrived (``SO_RCVLOWAT``, set
back to 1 between responses): one wakeup per MiB instead of one per loopback segment (measured
in a fetch loop of 2 MiB answers: 0.043-0.047 instead of 0.073-0.089 CPU-s per 1M records).

Connecting uses a blocking ``socket.create_connection`` bounded by ``connect_timeout_ms``
(loopback and LAN brokers refuse or accept at once).
"""

from __future__ import annotations

import random
import selectors
import socket
import time
from collections import deque
from typing import Any, Callable

from rivven_broker.client.config import ConnectionConfig
from rivven_broker.client.errors import (
    ConnectionFailedError,
    RequestTimedOutError,
    RivvenError,
    UnsupportedVersionError,
    error_for,
)
from rivven_broker.client.metadata import Address
from rivven_broker.client.reconnect import ReconnectBackoff
from rivven_broker.client.requests import sendable
from rivven_broker.protocol import messages as m
from rivven_broker.protocol.connection import ClientConnection
from rivven_broker.protocol.errors import ProtocolError
from rivven_broker.protocol.framing import DIRECT_BODY_BYTES_MIN

__all__ = ["Handler", "BrokerConnection", "NetworkClient", "monotonic_ms", "wall_ms"]

Handler = Callable[[Any, "RivvenError | None"], None]
_RECV_BYTES = 1 << 20
#: The most bytes of a large response the socket gathers before waking the driver (Linux
#: caps it further at half the largest receive buffer).
_WAKE_BYTES_MAX = 1 << 20


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class BrokerConnection:
    """One socket to one broker. Driven only by its ``NetworkClient``."""

    __slots__ = (
        "address", "sock", "core", "out", "handlers", "error", "writing", "ready", "api_versions",
        "wake_bytes",
    )

    def __init__(self, address: Address, sock: socket.socket, in_flight_max: int) -> None:
        self.address = address
        self.sock = sock
        self.core = ClientConnection(in_flight_max=in_flight_max)
        self.out: deque[memoryview] = deque()
        self.handlers: deque[tuple[int, Handler]] = deque()  # (deadline_ms, handler)
        self.error: RivvenError | None = None
        self.writing = False
        self.ready = False  # set when the broker accepted our Handshake
        self.api_versions: dict[int, tuple[int, int]] = {}
        self.wake_bytes = 1  # the socket's SO_RCVLOWAT; 0 once the platform refused it

    @property
    def in_flight(self) -> int:
        return len(self.handlers)


class NetworkClient:
    """Connections to brokers, driven by one thread (see the module docstring)."""

    def __init__(
        self, config: ConnectionConfig, *, in_flight_max: int, rng: random.Random | None = None
    ) -> None:
        self.config = config
        self.in_flight_max = in_flight_max
        self._connections: dict[Address, BrokerConnection] = {}
        self.backoff = ReconnectBackoff(
            config.reconnect_backoff_ms, config.reconnect_backoff_max_ms, rng or random.Random()
        )
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._closed = False

    # --- connections -------------------------------------------------------------------------
    def is_ready(self, address: Address) -> bool:
        """Connected, handshake done, and able to take one more request now."""
        conn = self._connections.get(address)
        return (
            conn is not None
            and conn.ready
            and conn.error is None
            and conn.in_flight < self.in_flight_max
        )

    def is_connected(self, address: Address) -> bool:
        return address in self._connections

    def in_flight(self, address: Address) -> int:
        conn = self._connections.get(address)
        return 0 if conn is None else conn.in_flight

    def connect(self, address: Address) -> bool:
        """Open a connection (blocking up to connect_timeout_ms). False on failure, recorded
        for the backoff and ``last_error``. Never raises for network errors."""
        assert not self._closed
        if address in self._connections:
            return True
        try:
            sock = socket.create_connection(
                (address.host, address.port), timeout=self.config.connect_timeout_ms / 1000
            )
        except OSError as exc:
            error = ConnectionFailedError(f"cannot connect to {address}: {exc}")
            self._on_connect_failed(address, error)
            return False
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        conn = BrokerConnection(address, sock, self.in_flight_max)
        self._connections[address] = conn
        self._selector.register(sock, selectors.EVENT_READ, conn)
        handshake = m.Handshake(client_id=self.config.client_id)
        self.send(address, handshake, self._handshake_handler(conn))
        return True

    def _handshake_handler(self, conn: BrokerConnection) -> Handler:
        def on_handshake(response: Any, error: RivvenError | None) -> None:
            if error is not None:
                return  # the connection failed; its other handlers learn it too
            if isinstance(response, m.HandshakeResponse) and response.compatible:
                self.backoff.on_connected(conn.address)
                conn.api_versions = dict(response.api_versions)
                conn.ready = True
                return
            text = getattr(response, "message", "") or type(response).__name__
            self._fail(conn, UnsupportedVersionError(f"broker {conn.address} refused: {text}"))

        return on_handshake

    def _on_connect_failed(self, address: Address, error: RivvenError) -> None:
        self.backoff.on_dial_failed(address, error, monotonic_ms())

    def least_loaded(self, candidates: list[Address], now_ms: int) -> Address | None:
        """A connected candidate with the fewest requests in flight, else one we may dial."""
        connected = [a for a in candidates if self.is_ready(a)]
        if connected:
            return min(connected, key=self.in_flight)
        connecting = [a for a in candidates if a in self._connections]
        if connecting:  # handshaking: requests queue behind the Handshake
            return connecting[0]
        dialable = [
            a for a in candidates
            if a not in self._connections and self.backoff.can_dial(a, now_ms)
        ]
        return dialable[0] if dialable else None

    # --- requests ----------------------------------------------------------------------------
    def send(
        self, address: Address, request: Any, handler: Handler | None, timeout_ms: int | None = None
    ) -> None:
        """Queue ``request`` on the connection to ``address`` (which must exist).

        ``handler`` is required unless the request expects no answer (acks=0 produce), in
        which case the caller treats it as done once queued. Never blocks. Errors (a broken
        connection, a request too large) are delivered to ``handler``.
        """
        conn = self._connections.get(address)
        if conn is None or conn.error is not None:
            error = conn.error if conn is not None else ConnectionFailedError(
                f"not connected to {address}"
            )
            if handler is not None:
                handler(None, error)
            return
        try:
            _, data = conn.core.send_request(*sendable(conn.api_versions, request))
        except ProtocolError as exc:
            if handler is not None:
                handler(None, error_for(exc.code, str(exc)))
            return
        if request.expects_response():
            assert handler is not None
            timeout = self.config.request_timeout_ms if timeout_ms is None else timeout_ms
            conn.handlers.append((monotonic_ms() + timeout, handler))
        conn.out.append(memoryview(data))
        self._write(conn)

    def wakeup(self) -> None:
        """Make a ``poll`` in progress (or the next one) return early. Any thread."""
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # the pipe is full (a wakeup is pending anyway) or closed

    def poll(self, timeout_ms: int) -> None:
        """Wait up to ``timeout_ms`` for I/O or a wakeup; do the I/O; call handlers."""
        if self._closed:
            return
        timeout_ms = max(0, min(timeout_ms, self._next_deadline_ms() - monotonic_ms()))
        for key, mask in self._selector.select(timeout_ms / 1000):
            conn = key.data
            if conn is None:
                self._drain_wakeups()
                continue
            if conn.error is not None:
                continue
            if mask & selectors.EVENT_WRITE:
                self._write(conn)
            if mask & selectors.EVENT_READ and conn.error is None:
                self._read(conn)
        self._expire(monotonic_ms())

    def _next_deadline_ms(self) -> int:
        deadlines = [c.handlers[0][0] for c in self._connections.values() if c.handlers]
        return min(deadlines) if deadlines else monotonic_ms() + 3_600_000

    def _drain_wakeups(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _write(self, conn: BrokerConnection) -> None:
        out = conn.out
        try:
            while out:
                view = out[0]
                sent = conn.sock.send(view)
                if sent < len(view):
                    out[0] = view[sent:]
                    break
                out.popleft()
        except BlockingIOError:
            pass
        except OSError as exc:
            self._fail(conn, ConnectionFailedError(f"connection to {conn.address} lost: {exc}"))
            return
        want_write = bool(out)
        if want_write != conn.writing:
            conn.writing = want_write
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want_write else 0)
            self._selector.modify(conn.sock, events, conn)

    def _read(self, conn: BrokerConnection) -> None:
        core = conn.core
        try:
            while True:
                view = core.receive_buffer()
                if view is not None:  # the rest of a large response: straight into its buffer
                    count = conn.sock.recv_into(view)
                    if count:
                        core.received(count)
                    wanted = len(view)
                else:
                    data = conn.sock.recv(_RECV_BYTES)
                    count = len(data)
                    if count:
                        core.receive_data(data)
                    wanted = _RECV_BYTES
                if not count:
                    self._fail(conn, ConnectionFailedError(f"{conn.address} closed the connection"))
                    return
                if count < wanted:
                    break
        except BlockingIOError:
            pass
        except OSError as exc:
            self._fail(conn, ConnectionFailedError(f"connection to {conn.address} lost: {exc}"))
            return
        self._wake_when(conn, core.body_missing)
        try:
            while True:
                event = conn.core.next_event()
                if event is None:
                    return
                _, handler = conn.handlers.popleft()
                handler(event.response, None)
                if conn.error is not None:
                    return
        except ProtocolError as exc:
            self._fail(conn, error_for(exc.code, f"from {conn.address}: {exc}"))

    def _wake_when(self, conn: BrokerConnection, missing: int) -> None:
        """Have the socket wake the driver only once up to ``_WAKE_BYTES_MAX`` of the
        ``missing`` bytes of a large response are in (``SO_RCVLOWAT``); 1 otherwise."""
        if not conn.wake_bytes:
            return
        wake_bytes = min(missing, _WAKE_BYTES_MAX) if missing >= DIRECT_BODY_BYTES_MIN else 1
        if wake_bytes != conn.wake_bytes:
            try:
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, wake_bytes)
                conn.wake_bytes = wake_bytes
            except (OSError, AttributeError):  # not on this platform: wake per segment
                conn.wake_bytes = 0

    def _expire(self, now_ms: int) -> None:
        for conn in list(self._connections.values()):
            if conn.handlers and conn.handlers[0][0] <= now_ms:
                self._fail(conn, RequestTimedOutError(f"no answer from {conn.address} in time"))

    def _fail(self, conn: BrokerConnection, error: RivvenError) -> None:
        """Close ``conn`` and fail its handlers with ``error``."""
        if conn.error is not None:
            return
        conn.error = error
        if self._connections.get(conn.address) is conn:
            del self._connections[conn.address]
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
        self._on_connect_failed(conn.address, error)
        handlers, conn.handlers = conn.handlers, deque()
        for _, handler in handlers:
            handler(None, error)

    def close_connection(self, address: Address, error: RivvenError) -> None:
        conn = self._connections.get(address)
        if conn is not None:
            self._fail(conn, error)

    def close(self, error: RivvenError | None = None) -> None:
        """Close every connection, failing what is in flight. Idempotent."""
        if self._closed:
            return
        for conn in list(self._connections.values()):
            self._fail(conn, error or ConnectionFailedError("the client is closing"))
        self._closed = True
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

