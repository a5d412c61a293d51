"""``SimDatagrams``: the simulated datagram (UDP) path, with loss, duplication and reordering.

Theory of operation
-------------------
SWIM talks in datagrams, and datagrams may be lost, duplicated, reordered and delayed; the
simulator makes each happen from the seed. A ``SimDatagramSocket`` is bound to an endpoint's
name and a port (the name is the host: ``send_to(data, "n2", 9093)``). ``send_to`` decides the
datagram's fate at once, from the fabric's seeded stream, in this order:

1. *dropped* when the sender's incarnation is dead, when a two-way partition, a stall or a
   pause (of either end) holds the link in ``SimNetwork`` (datagrams are not retransmitted:
   what TCP would hold, UDP loses), when a *one-way* block stops this direction, or with
   probability ``loss``;
2. otherwise delivered after a latency drawn from ``[latency_min_ms, latency_max_ms]`` (so
   datagrams overtake each other whenever the jitter exceeds their spacing), plus
   ``reorder_delay_ms`` with probability ``reorder``;
3. and, with probability ``duplicate``, delivered a second time after its own latency.

Delivery is a task in the fabric's nursery sleeping until the datagram's time; it then puts
the datagram in the receiving socket's queue if that socket is still bound and alive, and if
the queue holds fewer than ``queue_datagrams_max`` (a full socket buffer drops, as the kernel
does). Oversized datagrams (over ``datagram_bytes_max``) fail at the sender with
``OSError(EMSGSIZE)``. Every send, drop and delivery goes into the run's ``Trace``.
"""

from __future__ import annotations

import errno
import random
from collections import deque
from typing import Any

import attrs
import trio

from sim.trace import Trace

__all__ = ["DatagramConfig", "SimDatagrams", "SimDatagramSocket"]


@attrs.frozen
class DatagramConfig:
    """Faults and timing of the datagram path (milliseconds of virtual time)."""

    latency_min_ms: float = 0.5
    latency_max_ms: float = 2.0
    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    reorder_delay_ms: float = 20.0
    queue_datagrams_max: int = 1024
    datagram_bytes_max: int = 65_507

    def __attrs_post_init__(self) -> None:
        assert 0 <= self.latency_min_ms <= self.latency_max_ms
        assert all(0.0 <= p <= 1.0 for p in (self.loss, self.duplicate, self.reorder))
        assert self.reorder_delay_ms >= 0 and self.queue_datagrams_max > 0


class SimDatagramSocket:
    """A bound simulated datagram socket (the ``DatagramSocket`` protocol)."""

    def __init__(self, fabric: SimDatagrams, name: str, generation: int, port: int) -> None:
        self._fabric = fabric
        self.name = name
        self.generation = generation
        self.local_port = port
        self.queue: deque[tuple[bytes, str, int]] = deque()
        self.closed = False
        self.lot = trio.lowlevel.ParkingLot()

    async def send_to(self, data: bytes, host: str, port: int) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.closed:
            raise trio.ClosedResourceError("datagram socket closed")
        if len(data) > self._fabric.config.datagram_bytes_max:
            raise OSError(errno.EMSGSIZE, f"datagram of {len(data)} bytes is too long")
        self._fabric.send(self, bytes(data), host, port)
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def receive_from(self) -> tuple[bytes, str, int]:
        await trio.lowlevel.checkpoint_if_cancelled()
        while not self.queue:
            if self.closed:
                raise trio.ClosedResourceError("datagram socket closed")
            await self.lot.park()
        if self.closed:
            raise trio.ClosedResourceError("datagram socket closed")
        datagram = self.queue.popleft()
        await trio.lowlevel.cancel_shielded_checkpoint()
        return datagram

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._fabric.unbind(self)
            self.lot.unpark_all()


class SimDatagrams:
    """The datagram fabric of one run, beside ``SimNetwork`` (whose partitions, stalls,
    pauses and incarnations it obeys). Start ``run`` in the root nursery."""

    def __init__(self, network: Any, config: DatagramConfig, rng: random.Random,
                 trace: Trace) -> None:
        self._network = network  # sim.net.SimNetwork: held(), _alive()
        self.config = config
        self._rng = rng
        self._trace = trace
        self._nursery: trio.Nursery | None = None
        self._sockets: dict[tuple[str, int], SimDatagramSocket] = {}
        self._one_way: dict[tuple[str, str], int] = {}
        self._next_port: dict[str, int] = {}
        self.sent = 0
        self.dropped = 0
        self.delivered = 0

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    # --- binding ----------------------------------------------------------------------------

    def bind(self, name: str, generation: int, port: int) -> SimDatagramSocket:
        if port == 0:
            port = self._next_port.get(name, 50_000)
            self._next_port[name] = port + 1
        key = (name, port)
        old = self._sockets.get(key)
        if old is not None and not old.closed and self._network._alive(name, old.generation):
            raise OSError(errno.EADDRINUSE, f"{name}:{port} (udp) in use")
        sock = SimDatagramSocket(self, name, generation, port)
        self._sockets[key] = sock
        self._trace.event("udp.bind", name, port)
        return sock

    def unbind(self, sock: SimDatagramSocket) -> None:
        key = (sock.name, sock.local_port)
        if self._sockets.get(key) is sock:
            del self._sockets[key]

    def crash(self, name: str) -> None:
        """Close every socket of endpoint ``name`` (its incarnation died)."""
        for (owner, _), sock in list(self._sockets.items()):
            if owner == name:
                sock.close()

    # --- one-way faults ---------------------------------------------------------------------

    def block_one_way(self, source: str, target: str) -> None:
        """Drop datagrams from ``source`` to ``target`` (not the other way) until unblocked."""
        self._one_way[(source, target)] = self._one_way.get((source, target), 0) + 1
        self._trace.event("udp.block", source, target)

    def unblock_one_way(self, source: str, target: str) -> None:
        count = self._one_way.get((source, target), 0) - 1
        assert count >= 0, (source, target)
        if count:
            self._one_way[(source, target)] = count
        else:
            self._one_way.pop((source, target), None)
        self._trace.event("udp.unblock", source, target)

    # --- the path ---------------------------------------------------------------------------

    def send(self, sock: SimDatagramSocket, data: bytes, host: str, port: int) -> None:
        config, rng = self.config, self._rng
        self.sent += 1
        source = sock.name
        why = None
        if not self._network._alive(source, sock.generation):
            why = "sender down"
        elif self._network.held(source, host):
            why = "link held"
        elif self._one_way.get((source, host), 0):
            why = "one-way block"
        elif rng.random() < config.loss:
            why = "loss"
        if why is not None:
            self.dropped += 1
            self._trace.event("udp.drop", source, host, port, why)
            return
        copies = 2 if rng.random() < config.duplicate else 1
        for _ in range(copies):
            delay_ms = rng.uniform(config.latency_min_ms, config.latency_max_ms)
            if rng.random() < config.reorder:
                delay_ms += config.reorder_delay_ms
            assert self._nursery is not None, "SimDatagrams.run is not running"
            self._nursery.start_soon(
                self._deliver, trio.current_time() + delay_ms / 1000, data, source,
                sock.local_port, host, port,
            )

    async def _deliver(self, at: float, data: bytes, source: str, source_port: int, host: str,
                       port: int) -> None:
        await trio.sleep_until(at)
        target = self._sockets.get((host, port))
        if (
            target is None
            or target.closed
            or not self._network._alive(host, target.generation)
            or self._network.held(source, host)  # cut while in flight
            or len(target.queue) >= self.config.queue_datagrams_max
        ):
            self.dropped += 1
            self._trace.event("udp.lost", source, host, port)
            return
        self.delivered += 1
        target.queue.append((data, source, source_port))
        target.lot.unpark_all()
        self._trace.event("udp.data", source, host, port, payload=data)
