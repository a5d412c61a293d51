"""``SwimHarness``: N membership cores on a tiny deterministic datagram network, pure.

Theory of operation
-------------------
For tests, Hypothesis and the detection figures: each node is a ``Membership`` core; every
``Send`` it returns is sealed into a real frame (``frame.seal``), given a fate from the
harness's seeded ``random.Random`` (lost with probability ``loss``, across a partition, or to a
crashed node; otherwise delivered after ``latency_ms`` plus up to ``jitter_ms``, duplicated
with probability ``duplicate``), and opened again by the receiver (``frame.open_frame`` with
its own ``ReplayGuard``) before the receiving core sees it. Time is an integer of
milliseconds; ``run_until`` delivers datagrams and fires each core's ``Tick`` at its
``next_deadline_ms`` in time order (ties by node id), so a seed fixes the whole run.

It is not the simulator (``sim/``, which runs the broker's real trio driver on virtual
sockets); it is the core alone, fast enough for thousands of seeds.
"""

from __future__ import annotations

import heapq
import random
from typing import Callable

from rivven_cluster.membership.config import MembershipConfig
from rivven_cluster.membership.frame import Rejection, ReplayGuard, open_frame, seal
from rivven_cluster.membership.key_ring import KeyRing
from rivven_cluster.membership.members import Address, MemberState, make_boot_id
from rivven_cluster.membership.messages import unpack
from rivven_cluster.membership.swim import (
    Leave,
    MemberChanged,
    Membership,
    Received,
    Send,
    Start,
    Tick,
)

__all__ = ["SwimHarness"]

_KEY = KeyRing((b"harness-key-0123456789",))


class SwimHarness:
    """``nodes`` cores named 1..nodes, all joined through node 1 (see the module docstring)."""

    def __init__(
        self,
        nodes: int,
        *,
        seed: int,
        config: MembershipConfig | None = None,
        loss: float = 0.0,
        duplicate: float = 0.0,
        latency_ms: int = 1,
        jitter_ms: int = 0,
        on_change: Callable[[int, MemberChanged, int], None] | None = None,
    ) -> None:
        self.config = config or MembershipConfig()
        self.rng = random.Random(f"swim-harness/{seed}")
        self.seed = seed
        self.loss, self.duplicate = loss, duplicate
        self.latency_ms, self.jitter_ms = latency_ms, jitter_ms
        self.on_change = on_change
        self.now_ms = 0
        self.cores: dict[int, Membership] = {}
        self.guards: dict[int, ReplayGuard] = {}
        self.up: set[int] = set()
        self.blocked: set[tuple[int, int]] = set()  # (from, to): datagrams dropped
        self.boots: dict[int, int] = {}
        self.sequences: dict[int, int] = {}
        self._queue: list[tuple[int, int, int, int, bytes]] = []  # (at, order, to, from, frame)
        self._order = 0
        self.datagrams = 0
        self.bytes = 0
        for node in range(1, nodes + 1):
            self.start(node)

    @staticmethod
    def address(node: int) -> Address:
        return Address(f"n{node}", 9093)

    def start(self, node: int) -> None:
        """(Re)start ``node`` as a new process (a new boot id) and join through node 1 (or 2)."""
        self.boots[node] = make_boot_id(self.now_ms + 1, self.rng.randrange(1 << 16))
        self.sequences[node] = 0
        self.cores[node] = Membership(
            self.config, node_id=node, boot_id=self.boots[node],
            cluster_address=self.address(node), client_address=Address(f"n{node}", 9092),
            rack=None, rng=random.Random(f"swim-harness/{self.seed}/{node}/{self.boots[node]}"),
            now_ms=self.now_ms,
        )
        self.guards[node] = ReplayGuard()
        self.up.add(node)
        seeds = tuple(self.address(peer) for peer in (1, 2) if peer != node and peer in self.cores)
        self._carry_out(node, self.cores[node].handle(Start(seeds), self.now_ms))

    def crash(self, node: int) -> None:
        self.up.discard(node)

    def leave(self, node: int) -> None:
        self._carry_out(node, self.cores[node].handle(Leave(), self.now_ms))

    def partition(self, *groups: set[int]) -> None:
        for i, group in enumerate(groups):
            for other in groups[i + 1:]:
                for a in group:
                    for b in other:
                        self.blocked |= {(a, b), (b, a)}

    def heal(self) -> None:
        self.blocked.clear()

    def view(self, observer: int) -> dict[int, MemberState]:
        return {member.node_id: member.state for member in self.cores[observer].members()}

    def run_until(self, end_ms: int) -> None:
        """Advance to ``end_ms``, delivering and ticking in time order."""
        while True:
            next_tick = min(((core.next_deadline_ms(), node) for node, core in self.cores.items()
                             if node in self.up), default=(end_ms + 1, 0))
            next_datagram = self._queue[0][0] if self._queue else end_ms + 1
            at = min(next_tick[0], next_datagram)
            if at > end_ms:
                self.now_ms = end_ms
                return
            self.now_ms = max(self.now_ms, at)
            if next_datagram <= next_tick[0]:
                _, _, to, sender, frame = heapq.heappop(self._queue)
                self._deliver(to, frame)
            else:
                node = next_tick[1]
                self._carry_out(node, self.cores[node].handle(Tick(), self.now_ms))

    def _deliver(self, to: int, frame: bytes) -> None:
        if to not in self.up:
            return
        opened = open_frame(_KEY, frame, self.now_ms, self.guards[to], timestamp_window_ms=30_000)
        if isinstance(opened, Rejection):
            return  # a duplicate the replay guard absorbed
        header, payload = opened
        messages = unpack(payload)
        assert messages is not None, "the harness only carries what cores packed"
        event = Received(header.node_id, header.boot_id, self.address(header.node_id),
                         tuple(messages))
        self._carry_out(to, self.cores[to].handle(event, self.now_ms))

    def _carry_out(self, node: int, instructions: list) -> None:
        for instruction in instructions:
            if isinstance(instruction, Send):
                self._send(node, instruction)
            elif self.on_change is not None:
                self.on_change(node, instruction, self.now_ms)

    def _send(self, node: int, send: Send) -> None:
        self.sequences[node] += 1
        frame = seal(_KEY, node, self.boots[node], self.sequences[node], self.now_ms,
                     send.payload)
        self.datagrams += 1
        self.bytes += len(frame)
        to = int(send.address.host[1:])
        if (node, to) in self.blocked or self.rng.random() < self.loss:
            return
        copies = 2 if self.rng.random() < self.duplicate else 1
        for _ in range(copies):
            delay = self.latency_ms + (self.rng.randint(0, self.jitter_ms) if self.jitter_ms else 0)
            self._order += 1
            heapq.heappush(self._queue, (self.now_ms + delay, self._order, to, node, frame))
