"""``MembershipDriver``: the trio driver of the SWIM core, on the broker's datagram socket.

Theory of operation
-------------------
All membership state lives in ``rivven_cluster.membership.Membership``; this driver owns the
UDP socket (``env.net.bind_udp`` on the cluster address), the clock, the key ring and the
frame sequence. Two tasks:

- the *receiver* takes each datagram, opens its frame (``open_frame``: MAC, timestamp window,
  replay guard), unpacks its payload and hands the messages to the core. A rejected datagram is
  counted by reason and logged at most once a minute per reason; it never raises.
- the *timer* sleeps until the core's ``next_deadline_ms`` (woken early when handling a
  datagram brings the deadline closer) and gives it a ``Tick``.

Each instruction is carried out in order: ``Send`` is sealed (the ring's first key, this
boot's id, the next sequence number, the wall clock) and sent; ``MemberChanged`` is logged
and passed to ``on_change`` (the broker's cluster view). ``reload(ring)`` swaps the key ring
(SIGHUP: key rotation, no restart). ``leave()`` announces a graceful departure and lets two
gossip rounds carry it before the socket closes.

The boot id packs this start's wall-clock milliseconds above 16 random bits from the env's
``membership`` stream, so a restarted broker is a newer process to everyone.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import trio

from rivven_broker.server.env import DatagramSocket, Env
from rivven_cluster.membership import (
    Address,
    KeyRing,
    Leave,
    Member,
    MemberChanged,
    Membership,
    MembershipConfig,
    MemberState,
    Reason,
    Received,
    Rejection,
    ReplayGuard,
    Send,
    Start,
    Tick,
    make_boot_id,
    open_frame,
    seal,
    unpack,
)

__all__ = ["MembershipDriver"]

log = logging.getLogger(__name__)

_WARN_EVERY_MS = 60_000
#: Clock skew tolerated between brokers (and datagram delay) before a frame is stale.
TIMESTAMP_WINDOW_MS = 30_000


class MembershipDriver:
    """Runs one broker's membership (see the module docstring)."""

    def __init__(
        self,
        env: Env,
        *,
        node_id: int,
        cluster_address: Address,
        client_address: Address,
        rack: str | None,
        seeds: tuple[Address, ...],
        key_ring: KeyRing,
        config: MembershipConfig,
        on_change: Callable[[MemberChanged], None] | None = None,
    ) -> None:
        self.env = env
        self.node_id = node_id
        self.cluster_address = cluster_address
        self.client_address = client_address
        self._rack = rack
        self._seeds = seeds
        self._ring = key_ring
        self.config = config
        self._on_change = on_change
        self._guard = ReplayGuard()
        self._socket: DatagramSocket | None = None
        self._seq = 0
        self.core: Membership | None = None
        self.boot_id = 0
        self._wakeup = trio.Event()
        self._scheduled_ms = 0
        #: Datagrams dropped, by reason (``frame.Reason`` values).
        self.rejected: dict[str, int] = {reason.value: 0 for reason in Reason}
        self.datagrams_received = 0
        self.bytes_received = 0
        self.bytes_sent = 0
        self._warned_ms: dict[str, int] = {}

    # --- the public face -------------------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Bind the cluster address and run until cancelled. ``task_status.started(port)``
        reports the bound UDP port.

        Raises:
            OSError: the cluster address cannot be bound.
        """
        env = self.env
        self._socket = await env.net.bind_udp(self.cluster_address.host,
                                               self.cluster_address.port)
        if self.cluster_address.port == 0:
            self.cluster_address = Address(self.cluster_address.host, self._socket.local_port)
        rng = env.rng("membership")
        self.boot_id = make_boot_id(env.clock.wall_ms(), rng.randrange(1 << 16))
        now_ms = env.clock.monotonic_ms()
        self.core = Membership(
            self.config, node_id=self.node_id, boot_id=self.boot_id,
            cluster_address=self.cluster_address, client_address=self.client_address,
            rack=self._rack, rng=rng, now_ms=now_ms,
        )
        log.info("membership: node %d (boot %d) on %s, joining through %s", self.node_id,
                 self.boot_id, self.cluster_address,
                 ", ".join(map(str, self._seeds)) or "nobody")
        try:
            async with trio.open_nursery() as nursery:
                await self._carry_out(self.core.handle(Start(self._seeds), now_ms))
                nursery.start_soon(self._receive_loop)
                nursery.start_soon(self._timer_loop)
                task_status.started(self._socket.local_port)
        except* trio.ClosedResourceError:  # the socket was taken away (a simulated crash)
            log.info("membership: node %d stopped: its socket closed", self.node_id)
        finally:
            self._socket.close()

    def reload(self, ring: KeyRing) -> None:
        """Use ``ring`` from now on (key rotation). Never blocks."""
        self._ring = ring

    async def leave(self) -> None:
        """Announce that this broker leaves, and give the news two gossip rounds to spread.
        Blocks for about two gossip intervals."""
        if self.core is None or self._socket is None:
            return
        await self._carry_out(self.core.handle(Leave(), self.env.clock.monotonic_ms()))
        await self.env.clock.sleep_ms(2 * self.config.gossip_interval_ms)

    def members(self) -> list[Member]:
        """This broker's view of the cluster (itself included)."""
        return [] if self.core is None else self.core.members()

    # --- the loops -------------------------------------------------------------------------

    async def _receive_loop(self) -> None:
        assert self._socket is not None and self.core is not None
        while True:
            data, host, port = await self._socket.receive_from()
            self.datagrams_received += 1
            self.bytes_received += len(data)
            opened = open_frame(self._ring, data, self.env.clock.wall_ms(), self._guard,
                                timestamp_window_ms=TIMESTAMP_WINDOW_MS)
            if isinstance(opened, Rejection):
                self._reject(opened.reason, opened.detail, host, port)
                continue
            header, payload = opened
            messages = unpack(payload)
            if messages is None:
                self._reject(Reason.MALFORMED_PAYLOAD, f"node {header.node_id}", host, port)
                continue
            if header.node_id == self.node_id:
                continue  # our own (a looped-back datagram, or a twin with our id: logged below)
            event = Received(header.node_id, header.boot_id, Address(host, port),
                             tuple(messages))
            await self._carry_out(self.core.handle(event, self.env.clock.monotonic_ms()))

    async def _timer_loop(self) -> None:
        assert self.core is not None
        clock = self.env.clock
        while True:
            deadline = self.core.next_deadline_ms()
            if clock.monotonic_ms() < deadline:
                self._scheduled_ms = deadline
                self._wakeup = trio.Event()
                with trio.move_on_after(max(deadline - clock.monotonic_ms(), 0) / 1000):
                    await self._wakeup.wait()
                continue
            await self._carry_out(self.core.handle(Tick(), clock.monotonic_ms()))

    # --- instructions ----------------------------------------------------------------------

    async def _carry_out(self, instructions: list) -> None:
        assert self._socket is not None and self.core is not None
        for instruction in instructions:
            if isinstance(instruction, Send):
                self._seq += 1
                frame = seal(self._ring, self.node_id, self.boot_id, self._seq,
                             self.env.clock.wall_ms(), instruction.payload)
                self.bytes_sent += len(frame)
                try:
                    await self._socket.send_to(frame, instruction.address.host,
                                               instruction.address.port)
                except OSError as exc:  # a local failure (no buffer, no route): a lost datagram
                    self._warn("send", f"cannot send to {instruction.address}: {exc}")
            else:
                assert isinstance(instruction, MemberChanged)
                self._changed(instruction)
        if self.core.next_deadline_ms() < self._scheduled_ms:
            self._wakeup.set()

    def _changed(self, change: MemberChanged) -> None:
        member = change.member
        previous = "new" if change.previous is None else change.previous.label
        level = logging.WARNING if member.state is MemberState.DEAD else logging.INFO
        log.log(level, "membership: node %d (%s, rack %s) %s -> %s (incarnation %d)",
                member.node_id, member.cluster_address, member.rack or "-", previous,
                member.state.label, member.incarnation)
        if self._on_change is not None:
            self._on_change(change)

    def _reject(self, reason: Reason, detail: str, host: str, port: int) -> None:
        self.rejected[reason.value] += 1
        self._warn(reason.value, f"dropped a datagram from {host}:{port}: {reason.value} "
                                 f"({detail}); see rivven_cluster_datagrams_rejected_total")

    def _warn(self, key: str, message: str) -> None:
        now_ms = self.env.clock.monotonic_ms()
        last = self._warned_ms.get(key)
        if last is None or now_ms - last >= _WARN_EVERY_MS:
            self._warned_ms[key] = now_ms
            log.warning("membership: %s", message)
