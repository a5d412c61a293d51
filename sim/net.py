"""``SimNetwork``: in-memory TCP between simulated endpoints, with latency, stalls and resets.

Theory of operation
-------------------
Every node and every workload client is an *endpoint* with a name (``n1``, ``p1`` ...); the
name is also its host name, so a client dials ``open_tcp_stream("n1", 9092)``. Each endpoint
incarnation gets a ``SimNet`` (the ``Net`` protocol of ``rivven_broker.server.env``) bound to
its name; the ``SimNetwork`` behind them is shared.

A connection is two one-way *halves*. ``send_all`` appends a chunk to its half's queue with a
delivery time ``max(previous delivery, now + latency)`` (latency drawn per chunk from the
network's seeded stream), so each half is FIFO whatever the latencies. Delivery is *lazy*: no
task moves chunks. A chunk whose delivery time has come is in the receiver's inbox as far as
anyone can tell, so the receiver takes every due chunk when it reads (``_settle``), and a
receiver waiting for data sleeps in a cancel scope whose deadline the sender sets to the head
chunk's delivery time: one wake-up per delivery, none for a network task. Because a fault
changes what "due" means (a partition holds data), every change of topology first settles all
halves under the topology that held until then, so lazy delivery gives the same answers as
eager delivery would have. Latency is drawn from ``[latency_min_ms, latency_max_ms]``, or from
the link's own range in ``link_latency``. Flow control: a sender waits while its half holds
``buffer_bytes_max`` bytes queued or unread, as a TCP window would.

Faults, all keyed by endpoint names:

- *Partition* between two endpoints: halves crossing it hold their data (TCP retransmitting);
  a half whose data stays held for ``stall_timeout_ms`` breaks the connection (a TCP user
  timeout; one watchdog task keeps these deadlines, and sleeps while nothing is partitioned);
  after a heal held data flows again, in order. Partitions are counted, so overlapping ones
  compose. A dial across a partition waits for the heal up to ``connect_timeout_ms`` and then
  fails with ``TimeoutError`` (an ``OSError``), like a connect whose SYNs are lost.
- *Stall* of a link between two endpoints (a frozen switch, a congested path): its traffic is
  held, in order, without ever timing out, until the stall ends.
- *Pause* of an endpoint (a stopped process or a VM freeze): its traffic is held in both
  directions but never times out; dials to it still connect (the kernel accepts).
- *Reset*: connections between two endpoints, or all of one endpoint's, break at once: both
  sides' pending and future calls raise ``trio.BrokenResourceError``; queued data is lost.
- *Crash* of an endpoint: all its connections reset, its listeners vanish (later dials are
  refused) and its ``SimNet`` is revoked: the dead incarnation can neither dial nor listen.

A dial to an endpoint with no listener on the port fails with ``ConnectionRefusedError``; to
an unknown host, ``OSError(EHOSTUNREACH)``. Every delivery (when the receiver takes it), open,
close and reset goes into the run's ``Trace``.
"""

from __future__ import annotations

import contextlib
import errno
import math
import random
from collections import deque
from typing import Any, Awaitable, Callable, Iterator, Sequence

import attrs
import trio

from sim.datagrams import DatagramConfig, SimDatagrams, SimDatagramSocket
from sim.trace import Trace

__all__ = ["NetworkConfig", "SimNetwork", "SimNet", "SimStream"]

StreamHandler = Callable[[trio.abc.Stream], Awaitable[None]]
_EPHEMERAL_PORT_FIRST = 40_000
_RECEIVE_BYTES_DEFAULT = 65_536


@attrs.frozen
class NetworkConfig:
    """Timing of the simulated network, in milliseconds of true (virtual) time."""

    latency_min_ms: float = 0.5
    latency_max_ms: float = 2.0
    stall_timeout_ms: int = 5_000
    connect_timeout_ms: int = 3_000
    buffer_bytes_max: int = 4 * 1024 * 1024
    #: Per-link overrides: ((endpoint, endpoint), (latency_min_ms, latency_max_ms)).
    link_latency: tuple[tuple[tuple[str, str], tuple[float, float]], ...] = ()
    #: The datagram path's own faults and timing (``sim/datagrams.py``).
    datagrams: DatagramConfig = DatagramConfig()

    def __attrs_post_init__(self) -> None:
        assert 0 <= self.latency_min_ms <= self.latency_max_ms
        assert all(0 <= low <= high for _, (low, high) in self.link_latency)
        assert self.stall_timeout_ms > 0 and self.connect_timeout_ms > 0
        assert self.buffer_bytes_max > 0


class _Half:
    """One direction of a connection: bytes from ``source`` to ``target``."""

    __slots__ = (
        "source", "target", "queue", "buffered_bytes", "last_delivery_s", "inbox", "eof",
        "fin_queued", "receiver_closed", "reader_scope", "writer_lot",
    )

    def __init__(self, source: str, target: str) -> None:
        self.source = source
        self.target = target
        self.queue: deque[tuple[float, bytes | None]] = deque()
        self.buffered_bytes = 0  # queued plus delivered but unread
        self.last_delivery_s = 0.0
        self.inbox = bytearray()
        self.eof = False
        self.fin_queued = False
        self.receiver_closed = False
        #: The scope a reader waiting for data sleeps in (its deadline: the head's delivery).
        self.reader_scope: trio.CancelScope | None = None
        self.writer_lot = trio.lowlevel.ParkingLot()

    def wake_reader(self, deadline: float = -math.inf) -> None:
        """Make a waiting reader look again no later than ``deadline`` (at once by default)."""
        scope = self.reader_scope
        if scope is not None and deadline < scope.deadline:
            scope.deadline = deadline

    def wake_all(self) -> None:
        self.wake_reader()
        self.writer_lot.unpark_all()


class _Connection:
    __slots__ = ("number", "client", "server", "port", "forward", "backward", "broken",
                 "open_ends")

    def __init__(self, number: int, client: str, server: str, port: int) -> None:
        self.number = number
        self.client = client
        self.server = server
        self.port = port
        self.forward = _Half(client, server)
        self.backward = _Half(server, client)
        self.broken = False
        self.open_ends = 2

    def touches(self, endpoint: str) -> bool:
        return endpoint in (self.client, self.server)


class SimStream(trio.abc.Stream):
    """One end of a simulated TCP connection."""

    def __init__(self, network: SimNetwork, connection: _Connection, outgoing: _Half,
                 incoming: _Half) -> None:
        self._network = network
        self._connection = connection
        self._out = outgoing
        self._in = incoming
        self._closed = False

    @property
    def local(self) -> str:
        return self._out.source

    @property
    def remote(self) -> str:
        return self._out.target

    def _check(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("stream closed")
        if self._connection.broken:
            raise trio.BrokenResourceError("connection reset")

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Queue ``data`` for delivery. Blocks while the send window is full.

        Raises ``trio.BrokenResourceError`` after a reset, ``trio.ClosedResourceError`` after
        ``aclose``.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check()
        if self._out.fin_queued:
            raise trio.ClosedResourceError("send side closed")
        limit = self._network.config.buffer_bytes_max
        while self._out.buffered_bytes >= limit:
            await self._out.writer_lot.park()
            self._check()
        if data:
            self._network._enqueue(self._out, bytes(data))
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        while not self._closed and not self._connection.broken and (
            self._out.buffered_bytes >= self._network.config.buffer_bytes_max
        ):
            await self._out.writer_lot.park()
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """The next bytes (``b""`` at end of stream). Blocks until some arrive.

        Raises ``trio.BrokenResourceError`` after a reset, ``trio.ClosedResourceError`` after
        ``aclose``.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        network, incoming = self._network, self._in
        while True:
            self._check()
            network._settle(self._connection, incoming)
            if incoming.inbox or incoming.eof:
                break
            with trio.CancelScope(deadline=network._due_at(incoming)) as scope:
                incoming.reader_scope = scope
                try:
                    await trio.sleep_forever()
                finally:
                    incoming.reader_scope = None
        size = _RECEIVE_BYTES_DEFAULT if max_bytes is None else max_bytes
        data = bytes(incoming.inbox[:size])
        del incoming.inbox[:size]
        incoming.buffered_bytes -= len(data)
        incoming.writer_lot.unpark_all()
        await trio.lowlevel.cancel_shielded_checkpoint()
        return data

    async def aclose(self) -> None:
        """Close this end: a FIN follows the queued data; unread incoming data is dropped."""
        if not self._closed:
            self._closed = True
            if not self._connection.broken:
                self._network._close_half(self._connection, self._out, self._in)
            self._out.wake_all()
            self._in.wake_all()
        await trio.lowlevel.checkpoint()


class SimNetwork:
    """The shared fabric. Create inside ``trio.run`` and start ``run`` in the root nursery."""

    def __init__(self, config: NetworkConfig, rng: random.Random, trace: Trace,
                 datagram_rng: random.Random | None = None) -> None:
        self.config = config
        self._rng = rng
        self._trace = trace
        #: The datagram path (SWIM's UDP), obeying this fabric's partitions and incarnations.
        self.datagrams = SimDatagrams(
            self, config.datagrams, datagram_rng or random.Random(0), trace
        )
        self._listeners: dict[tuple[str, int], trio.MemorySendChannel[SimStream]] = {}
        self._connections: dict[int, _Connection] = {}
        self._next_connection = 1
        self._next_port: dict[str, int] = {}
        self._blocked: dict[tuple[str, str], int] = {}
        self._blocked_since: dict[tuple[str, str], float] = {}
        self._paused: dict[str, int] = {}
        self._stalled: dict[tuple[str, str], int] = {}
        self._link_latency = {_pair(a, b): bounds for (a, b), bounds in config.link_latency}
        self._generation: dict[str, int] = {}
        self._topology = trio.lowlevel.ParkingLot()
        self._watchdog: trio.CancelScope | None = None
        self.resets = 0

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Host the datagram path and the stall watchdog until cancelled."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.datagrams.run)
            task_status.started()
            await self._watch_stalls()

    def endpoint(self, name: str) -> SimNet:
        """A fresh ``SimNet`` for a new incarnation of endpoint ``name``. Never blocks."""
        generation = self._generation.get(name, 0) + 1
        self._generation[name] = generation
        return SimNet(self, name, generation)

    # --- state queries ----------------------------------------------------------------------

    def partitioned(self, a: str, b: str) -> bool:
        return _pair(a, b) in self._blocked

    def held(self, a: str, b: str) -> bool:
        """True when traffic between ``a`` and ``b`` cannot flow now."""
        return bool(
            (self._blocked or self._paused or self._stalled)
            and (self.partitioned(a, b) or a in self._paused or b in self._paused
                 or _pair(a, b) in self._stalled)
        )

    def connection_count(self) -> int:
        return len(self._connections)

    # --- faults -----------------------------------------------------------------------------

    def partition(self, groups: Sequence[Sequence[str]]) -> list[tuple[str, str]]:
        """Cut every link between endpoints of different groups; returns the cut pairs."""
        pairs = sorted(
            {_pair(a, b) for i, g in enumerate(groups) for h in groups[i + 1 :] for a in g for b in h}
        )
        with self._changing_topology():
            now = trio.current_time()
            for pair in pairs:
                assert pair[0] != pair[1], f"an endpoint in two groups: {pair[0]}"
                if _hold(self._blocked, pair):
                    self._blocked_since[pair] = now
        self._trace.event("net.partition", pairs)
        return pairs

    def heal(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Undo one ``partition`` (the pairs it returned)."""
        with self._changing_topology():
            for pair in pairs:
                if _release(self._blocked, pair):
                    del self._blocked_since[pair]
        self._trace.event("net.heal", list(pairs))

    def stall(self, a: str, b: str) -> None:
        """Hold traffic between ``a`` and ``b`` (no timeout, no reset) until ``unstall``."""
        pair = _pair(a, b)
        with self._changing_topology():
            _hold(self._stalled, pair)
        self._trace.event("net.stall", pair)

    def unstall(self, a: str, b: str) -> None:
        pair = _pair(a, b)
        with self._changing_topology():
            _release(self._stalled, pair)
        self._trace.event("net.unstall", pair)

    def pause(self, endpoint: str) -> None:
        with self._changing_topology():
            _hold(self._paused, endpoint)
        self._trace.event("net.pause", endpoint)

    def resume(self, endpoint: str) -> None:
        with self._changing_topology():
            _release(self._paused, endpoint)
        self._trace.event("net.resume", endpoint)

    def reset(self, a: str, b: str | None = None) -> int:
        """Break every connection between ``a`` and ``b`` (or all of ``a``'s). Returns count."""
        victims = [
            c for c in self._connections.values()
            if c.touches(a) and (b is None or c.touches(b))
        ]
        for connection in victims:
            self._break(connection, "reset")
        return len(victims)

    def crash(self, endpoint: str) -> None:
        """The endpoint died: reset its connections, drop its listeners, revoke its SimNet."""
        self._generation[endpoint] = self._generation.get(endpoint, 0) + 1
        for key in [k for k in self._listeners if k[0] == endpoint]:
            self._listeners.pop(key).close()
        self.reset(endpoint)
        self.datagrams.crash(endpoint)
        self._trace.event("net.crash", endpoint)

    # --- internals --------------------------------------------------------------------------

    def _alive(self, endpoint: str, generation: int) -> bool:
        return self._generation.get(endpoint) == generation

    def _latency_s(self, a: str = "", b: str = "") -> float:
        low, high = self._link_latency.get(
            _pair(a, b), (self.config.latency_min_ms, self.config.latency_max_ms))
        return (low if low == high else self._rng.uniform(low, high)) / 1000.0

    @contextlib.contextmanager
    def _changing_topology(self) -> Iterator[None]:
        """Around a change of what is held: deliver what was due under the old topology
        first (lazy delivery must not judge the past by the new one), then wake the readers
        whose link changed, the stall watchdog and the dials waiting for a heal."""
        halves = [half for connection in self._connections.values()
                  for half in (connection.forward, connection.backward)]
        for connection in list(self._connections.values()):
            self._settle(connection, connection.forward)
            self._settle(connection, connection.backward)
        before = [self.held(half.source, half.target) for half in halves]
        yield
        for half, was_held in zip(halves, before):
            if was_held != self.held(half.source, half.target):
                half.wake_reader()
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._topology.unpark_all()

    def _due_at(self, half: _Half) -> float:
        """When a reader of ``half`` must look again: the head's delivery, never if held."""
        if not half.queue or self.held(half.source, half.target):
            return math.inf
        return half.queue[0][0]

    def _settle(self, connection: _Connection, half: _Half) -> None:
        """Move every chunk whose delivery time has come into the inbox, unless held."""
        queue = half.queue
        if not queue or connection.broken:
            return
        now = trio.current_time()
        if queue[0][0] > now or self.held(half.source, half.target):
            return
        while queue and queue[0][0] <= now:
            _, chunk = queue.popleft()
            if chunk is None:
                half.eof = True
                self._trace.event("net.fin", connection.number, half.source)
                break
            half.inbox += chunk
            self._trace.event("net.data", connection.number, half.source, payload=chunk)

    def _enqueue(self, half: _Half, chunk: bytes | None) -> None:
        if half.receiver_closed and chunk is not None:
            return  # the far end closed: the bytes land nowhere (and free no window)
        latency_s = self._latency_s(half.source, half.target)
        delivery = max(half.last_delivery_s, trio.current_time() + latency_s)
        half.last_delivery_s = delivery
        half.queue.append((delivery, chunk))
        if chunk is not None:
            half.buffered_bytes += len(chunk)
        if half.reader_scope is not None and not self.held(half.source, half.target):
            half.wake_reader(half.queue[0][0])
        if self._watchdog is not None and self.partitioned(half.source, half.target):
            self._watchdog.cancel()

    def _close_half(self, connection: _Connection, outgoing: _Half, incoming: _Half) -> None:
        incoming.receiver_closed = True
        incoming.buffered_bytes = 0
        incoming.inbox.clear()
        incoming.queue.clear()
        if not outgoing.fin_queued:
            outgoing.fin_queued = True
            self._enqueue(outgoing, None)
        connection.open_ends -= 1
        if connection.open_ends == 0:
            self._connections.pop(connection.number, None)
        self._trace.event("net.close", connection.number, outgoing.source)

    def _break(self, connection: _Connection, why: str) -> None:
        if connection.broken:
            return
        connection.broken = True
        self.resets += 1
        self._connections.pop(connection.number, None)
        for half in (connection.forward, connection.backward):
            half.queue.clear()
            half.wake_all()
        self._trace.event("net.break", connection.number, why)

    def _overdue_stalls(self) -> float:
        """Break every connection whose data has been held by a partition for the stall
        timeout; answer the next such deadline (``inf`` when none is pending)."""
        if not self._blocked:
            return math.inf
        stall_s = self.config.stall_timeout_ms / 1000.0
        now = trio.current_time()
        next_deadline = math.inf
        for connection in list(self._connections.values()):
            for half in (connection.forward, connection.backward):
                pair = _pair(half.source, half.target)
                if not half.queue or pair not in self._blocked:
                    continue
                deadline = max(half.queue[0][0], self._blocked_since[pair]) + stall_s
                if deadline <= now:
                    self._break(connection, "stall")
                    break
                next_deadline = min(next_deadline, deadline)
        return next_deadline

    async def _watch_stalls(self) -> None:
        while True:
            with trio.CancelScope(deadline=self._overdue_stalls()) as scope:
                self._watchdog = scope
                try:
                    await trio.sleep_forever()
                finally:
                    self._watchdog = None

    async def _connect(self, source: str, generation: int, host: str, port: int) -> SimStream:
        if host not in self._generation:
            await trio.sleep(self._latency_s())
            raise OSError(errno.EHOSTUNREACH, f"no route to host {host}")
        deadline = trio.current_time() + self.config.connect_timeout_ms / 1000.0
        await trio.sleep(2 * self._latency_s(source, host))  # SYN, SYN-ACK
        while self.partitioned(source, host):
            if trio.current_time() >= deadline:
                self._trace.event("net.connect_timeout", source, host, port)
                raise TimeoutError(errno.ETIMEDOUT, f"connect to {host}:{port} timed out")
            with trio.move_on_at(deadline):
                await self._topology.park()
        if not self._alive(source, generation):
            raise OSError(errno.ENETDOWN, f"{source} is down")
        listener = self._listeners.get((host, port))
        if listener is None:
            self._trace.event("net.refused", source, host, port)
            raise ConnectionRefusedError(errno.ECONNREFUSED, f"{host}:{port} refused")
        number = self._next_connection
        self._next_connection += 1
        connection = _Connection(number, source, host, port)
        self._connections[number] = connection
        server_end = SimStream(self, connection, connection.backward, connection.forward)
        listener.send_nowait(server_end)
        self._trace.event("net.open", number, source, host, port)
        return SimStream(self, connection, connection.forward, connection.backward)


class SimReadiness:
    """The ``Readiness`` of simulated streams (``rivven_broker/server/env.py``): a stream is
    ready when bytes, its end or a reset are there to read (after delivering what is due);
    ``wait`` sleeps in one cancel scope that every watched stream's incoming half may wake
    (each half's ``reader_scope``), with the deadline of the earliest delivery."""

    def __init__(self, network: SimNetwork) -> None:
        self._network = network
        self._streams: dict[SimStream, None] = {}  # insertion-ordered: deterministic

    def watch(self, stream: trio.abc.Stream) -> bool:
        if not isinstance(stream, SimStream):
            return False
        self._streams[stream] = None
        return True

    def unwatch(self, stream: trio.abc.Stream) -> None:
        self._streams.pop(stream, None)  # type: ignore[call-overload]

    def ready(self) -> list[trio.abc.Stream]:
        network = self._network
        ready: list[trio.abc.Stream] = []
        for stream in self._streams:
            incoming = stream._in
            network._settle(stream._connection, incoming)
            if incoming.inbox or incoming.eof or stream._closed or stream._connection.broken:
                ready.append(stream)
        return ready

    async def wait(self) -> None:
        network = self._network
        halves = [stream._in for stream in self._streams]
        deadline = min((network._due_at(half) for half in halves), default=math.inf)
        with trio.CancelScope(deadline=deadline) as scope:
            for half in halves:
                half.reader_scope = scope
            try:
                await trio.sleep_forever()
            finally:
                for half in halves:
                    if half.reader_scope is scope:
                        half.reader_scope = None

    def receive_now(self, stream: trio.abc.Stream, max_bytes: int) -> bytes | None:
        assert isinstance(stream, SimStream)
        stream._check()
        incoming = stream._in
        self._network._settle(stream._connection, incoming)
        if not incoming.inbox:
            return b"" if incoming.eof else None
        data = bytes(incoming.inbox[:max_bytes])
        del incoming.inbox[:max_bytes]
        incoming.buffered_bytes -= len(data)
        incoming.writer_lot.unpark_all()
        return data

    def send_now(self, stream: trio.abc.Stream, data: bytes) -> int:
        assert isinstance(stream, SimStream)
        stream._check()
        if stream._out.fin_queued:
            raise trio.ClosedResourceError("send side closed")
        if stream._out.buffered_bytes >= self._network.config.buffer_bytes_max:
            return 0
        if data:
            self._network._enqueue(stream._out, bytes(data))
        return len(data)

    def close(self) -> None:
        self._streams.clear()


class SimNet:
    """One endpoint incarnation's view of the network (the ``Net`` protocol)."""

    def __init__(self, network: SimNetwork, name: str, generation: int) -> None:
        self._network = network
        self.name = name
        self._generation = generation

    def readiness(self) -> SimReadiness:
        return SimReadiness(self._network)

    def _check_alive(self) -> None:
        if not self._network._alive(self.name, self._generation):
            raise OSError(errno.ENETDOWN, f"{self.name} is down")

    async def serve_tcp(
        self,
        handler: StreamHandler,
        host: str,
        port: int,
        *,
        handler_nursery: trio.Nursery | None = None,
        on_accept_failed: Any = None,  # a simulated endpoint never runs out of descriptors
        task_status: Any = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on ``port`` of this endpoint (``host`` is ignored: an endpoint has one
        address) and run ``handler(stream)`` per connection, in ``handler_nursery`` if given,
        until cancelled. Each stream is closed when its handler returns.

        Raises ``OSError(EADDRINUSE)`` when the port is taken, ``OSError(ENETDOWN)`` when
        this incarnation has crashed.
        """
        self._check_alive()
        network = self._network
        if port == 0:
            port = network._next_port.get(self.name, _EPHEMERAL_PORT_FIRST)
            network._next_port[self.name] = port + 1
        key = (self.name, port)
        if key in network._listeners:
            raise OSError(errno.EADDRINUSE, f"{self.name}:{port} in use")
        send, receive = trio.open_memory_channel[SimStream](float("inf"))
        network._listeners[key] = send
        network._trace.event("net.listen", self.name, port)

        async def run_handler(stream: SimStream) -> None:
            try:
                await handler(stream)
            finally:
                await trio.aclose_forcefully(stream)

        try:
            if handler_nursery is not None:
                task_status.started(port)
                async for stream in receive:
                    handler_nursery.start_soon(run_handler, stream)
            else:
                async with trio.open_nursery() as nursery:
                    task_status.started(port)
                    async for stream in receive:
                        nursery.start_soon(run_handler, stream)
        finally:
            if network._listeners.get(key) is send:
                del network._listeners[key]
                send.close()

    async def bind_udp(self, host: str, port: int) -> SimDatagramSocket:
        """A datagram socket on ``port`` of this endpoint (``host`` is ignored, as for
        ``serve_tcp``). Raises ``OSError(EADDRINUSE)`` or ``OSError(ENETDOWN)``."""
        self._check_alive()
        await trio.lowlevel.checkpoint()
        return self._network.datagrams.bind(self.name, self._generation, port)

    async def open_tcp_stream(self, host: str, port: int) -> SimStream:
        """Dial ``host:port``. Blocks for the handshake (longer across a partition).

        Raises ``ConnectionRefusedError``, ``TimeoutError`` or another ``OSError``.
        """
        self._check_alive()
        return await self._network._connect(self.name, self._generation, host, port)


def _hold(counts: dict[Any, int], key: Any) -> bool:
    """Count one more hold of ``key`` (faults compose); True when it is the first."""
    counts[key] = counts.get(key, 0) + 1
    return counts[key] == 1


def _release(counts: dict[Any, int], key: Any) -> bool:
    """Undo one ``_hold``; True when it was the last (``key`` is then gone)."""
    count = counts.get(key, 0) - 1
    assert count >= 0, key
    if count:
        counts[key] = count
        return False
    del counts[key]
    return True


def _pair(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)
