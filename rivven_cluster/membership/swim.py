"""``Membership``: the sans-I/O SWIM + Lifeguard state machine of one node.

Theory of operation
-------------------
The driver feeds events with the time — ``Start(seeds)``, ``Received(...)`` (an authenticated
datagram's messages), ``Tick()`` (at ``next_deadline_ms()``), ``Leave()`` — and carries out the
instructions returned: ``Send(address, payload)`` and ``MemberChanged(member, previous)``. No
I/O, no clock, no module-level randomness: a seeded ``random.Random`` is handed in, so the
simulator and Hypothesis drive the same code as the broker.

Failure detection (SWIM). Every probe period the node pings the next member of a round-robin
order (a fresh shuffle of the live members each pass). No ack within the probe timeout: it asks
``indirect_probes`` random members to ping the target for it (ping-req); they forward the ack,
or (Lifeguard) answer nack when their own ping times out. No ack by the end of the period:
the node *suspects* the target. A suspicion becomes *dead* when its timeout runs out, unless
the member refutes it by announcing a higher incarnation (a member hearing it is suspected or
declared dead does so at once; a probe of a suspect carries the suspicion, so it hears).

Lifeguard (``config.lifeguard``): (1) the *local health multiplier* (awareness 0 .. max-1)
scales the probe period and timeout: +1 per expected nack that did not come when a probe fails
(the helpers are alive, so we are the slow one), +1 when we must refute a suspicion of
ourselves, -1 per successful probe; a node in trouble slows down instead of accusing others.
(2) The suspicion timeout starts at ``max`` and shrinks towards ``min`` as other members
independently suspect the same incarnation (``config.suspicion_bounds_ms``). Off: plain SWIM,
a fixed timeout of ``min`` and no awareness.

Dissemination. Every claim that changed this node's view (alive, suspect, dead, left) becomes
a broadcast, piggybacked on every datagram the node sends (least-sent first, as many as fit)
and gossiped to ``gossip_fanout`` random members every ``gossip_interval_ms``; each is sent
``config.retransmits(n)`` times, about ``λ·log(n)``. One broadcast per member: a newer claim
replaces an older one. Anti-entropy: every ``push_pull_period_ms(n)`` the node exchanges its
whole table with a random member (push-pull, split to fit datagrams), and joining is a
push-pull to the seeds, repeated until one answers, so views converge after any partition.

Which claim wins is ``members.supersedes`` (newer boot, then higher incarnation, then
left > dead > suspect > alive), the same on every node.
"""

from __future__ import annotations

import math
import random
from typing import Union

import attrs

from rivven_cluster.membership.config import MembershipConfig
from rivven_cluster.membership.members import (
    Address,
    Claim,
    Member,
    MemberState,
    supersedes,
)
from rivven_cluster.membership.messages import (
    Ack,
    Alive,
    ClaimMessage,
    Dead,
    Left,
    Message,
    Nack,
    Ping,
    PingReq,
    PushPull,
    Record,
    Suspect,
    claim_of,
    pack,
    split_records,
)

__all__ = [
    "Membership", "Start", "Received", "Tick", "Leave", "Send", "MemberChanged",
    "MembershipStatistics", "Event", "Instruction",
]

_RELAYS_MAX = 64  # ping-reqs served at once; more are ignored (the requester asks others too)
_NEVER = 1 << 62


# --- events and instructions -----------------------------------------------------------------


@attrs.frozen
class Start:
    """Join: push-pull with these cluster addresses until one answers."""

    seeds: tuple[Address, ...]


@attrs.frozen
class Received:
    """An authenticated datagram from ``node_id`` (process ``boot_id``) at ``address``."""

    node_id: int
    boot_id: int
    address: Address
    messages: tuple[Message, ...]


@attrs.frozen
class Tick:
    """Time passed (the driver calls at ``next_deadline_ms()``)."""


@attrs.frozen
class Leave:
    """Leave gracefully: announce ``left`` and stop probing."""


Event = Union[Start, Received, Tick, Leave]


@attrs.frozen
class Send:
    address: Address
    payload: bytes


@attrs.frozen
class MemberChanged:
    member: Member
    previous: MemberState | None  # None: a member this node had not seen


Instruction = Union[Send, MemberChanged]


@attrs.define
class MembershipStatistics:
    probes: int = 0
    probes_failed: int = 0
    indirect_probes: int = 0
    acks: int = 0
    nacks: int = 0
    suspicions: int = 0
    refutations: int = 0
    declared_dead: int = 0
    push_pulls: int = 0
    datagrams_sent: int = 0
    payload_bytes_sent: int = 0
    awareness: int = 0


# --- internal state --------------------------------------------------------------------------


@attrs.define
class _Record:
    node_id: int
    boot_id: int
    incarnation: int
    state: MemberState
    cluster_address: Address
    client_address: Address
    rack: str | None
    since_ms: int
    suspected_at_ms: int = 0
    accuser: int = -1
    confirmers: set[int] = attrs.Factory(set)
    dead_at_ms: int = _NEVER  # the suspicion's deadline

    @property
    def up(self) -> bool:
        return self.state in (MemberState.ALIVE, MemberState.SUSPECT)

    @property
    def claim(self) -> Claim:
        return Claim(self.node_id, self.boot_id, self.incarnation, self.state)

    def snapshot(self) -> Member:
        return Member(self.node_id, self.boot_id, self.incarnation, self.state,
                      self.cluster_address, self.client_address, self.rack, self.since_ms)

    def record(self) -> Record:
        return Record(self.node_id, self.boot_id, self.incarnation, self.state,
                      self.cluster_address, self.client_address, self.rack)


@attrs.define
class _Probe:
    seq: int
    target: int
    timeout_at_ms: int
    acked: bool = False
    indirect_sent: bool = False
    expected_nacks: int = 0
    nacks: int = 0


@attrs.define
class _Relay:
    requester: Address
    requester_seq: int
    timeout_at_ms: int


@attrs.define
class _Broadcast:
    message: ClaimMessage
    transmits: int
    order: int


class Membership:
    """One node's SWIM state machine (see the module docstring). Not thread-safe; never
    blocks."""

    def __init__(
        self,
        config: MembershipConfig,
        *,
        node_id: int,
        boot_id: int,
        cluster_address: Address,
        client_address: Address,
        rack: str | None,
        rng: random.Random,
        now_ms: int,
    ) -> None:
        self.config = config
        self.node_id = node_id
        self._rng = rng
        me = _Record(node_id, boot_id, 0, MemberState.ALIVE, cluster_address, client_address,
                     rack, now_ms)
        self._records: dict[int, _Record] = {node_id: me}
        self._me = me
        self._out: list[Instruction] = []
        self._order: list[int] = []
        self._probe: _Probe | None = None
        self._relays: dict[int, _Relay] = {}
        self._broadcasts: dict[int, _Broadcast] = {}
        self._broadcast_order = 0
        self._seq = 0
        self._awareness = 0
        self._next_probe_ms = now_ms + rng.randrange(config.probe_interval_ms)
        self._next_gossip_ms = now_ms + rng.randrange(config.gossip_interval_ms)
        self._next_push_pull_ms = now_ms + config.push_pull_period_ms(1)
        self._next_reconnect_ms = now_ms + config.reconnect_interval_ms
        self._seeds: tuple[Address, ...] = ()
        self._join_retry_ms = _NEVER
        self._leaving = False
        self._introduced: dict[tuple[int, int], int] = {}
        self.stats = MembershipStatistics()
        self._broadcast_claim(self._alive_message(me))

    # --- the public face -------------------------------------------------------------------

    def handle(self, event: Event, now_ms: int) -> list[Instruction]:
        """Apply ``event`` at ``now_ms``; return what the driver must do. Never blocks."""
        if isinstance(event, Received):
            self._received(event, now_ms)
        elif isinstance(event, Tick):
            self._tick(now_ms)
        elif isinstance(event, Start):
            self._seeds = event.seeds
            self._join(now_ms)
        else:
            assert isinstance(event, Leave), event
            self._leave(now_ms)
        out, self._out = self._out, []
        return out

    def next_deadline_ms(self) -> int:
        """When ``Tick`` is next due."""
        deadline = min(self._next_probe_ms, self._next_gossip_ms, self._next_push_pull_ms,
                       self._join_retry_ms, self._next_reconnect_ms)
        probe = self._probe
        if probe is not None and not probe.acked and not probe.indirect_sent:
            deadline = min(deadline, probe.timeout_at_ms)
        for relay in self._relays.values():
            deadline = min(deadline, relay.timeout_at_ms)
        for record in self._records.values():
            if record.state is MemberState.SUSPECT:
                deadline = min(deadline, record.dead_at_ms)
        return deadline

    def members(self) -> list[Member]:
        """Every member this node knows (itself included), by node id."""
        return [self._records[node].snapshot() for node in sorted(self._records)]

    def member(self, node_id: int) -> Member | None:
        record = self._records.get(node_id)
        return None if record is None else record.snapshot()

    @property
    def incarnation(self) -> int:
        return self._me.incarnation

    @property
    def joined(self) -> bool:
        return self._join_retry_ms == _NEVER

    def statistics(self) -> MembershipStatistics:
        self.stats.awareness = self._awareness
        return attrs.evolve(self.stats)

    def check_invariants(self) -> None:
        """Assert the state is consistent (tests and the simulator call this)."""
        me = self._records[self.node_id]
        assert me is self._me
        assert me.state in (MemberState.ALIVE, MemberState.LEFT)
        assert me.state is MemberState.LEFT or not self._leaving
        assert 0 <= self._awareness < self.config.awareness_max
        assert len(self._records) <= self.config.members_max + 1
        assert len(self._relays) <= _RELAYS_MAX
        assert set(self._broadcasts) <= set(self._records)
        for node, record in self._records.items():
            assert record.node_id == node and record.incarnation >= 0
            if record.state is MemberState.SUSPECT:
                assert record.dead_at_ms < _NEVER and record.accuser >= 0
                assert record.accuser not in record.confirmers
            if node == self.node_id:
                assert record.state is not MemberState.SUSPECT

    # --- receiving -------------------------------------------------------------------------

    def _received(self, event: Received, now_ms: int) -> None:
        if not self.joined and event.node_id != self.node_id:
            self._join_retry_ms = _NEVER  # somebody talks to us: we are in
        self._introduce(event, now_ms)
        for message in event.messages:
            kind = type(message)
            if kind is Ping:
                self._on_ping(event, message, now_ms)  # type: ignore[arg-type]
            elif kind is Ack:
                self._on_ack(message.seq, now_ms)
            elif kind is Nack:
                probe = self._probe
                if probe is not None and message.seq == probe.seq:
                    probe.nacks += 1
                    self.stats.nacks += 1
            elif kind is PingReq:
                self._on_ping_req(event, message, now_ms)  # type: ignore[arg-type]
            elif kind is PushPull:
                self._on_push_pull(event, message, now_ms)  # type: ignore[arg-type]
            else:
                self._apply(message, now_ms)  # type: ignore[arg-type]

    def _introduce(self, event: Received, now_ms: int) -> None:
        """A datagram from a process we do not know (its alive claim ran out of retransmits
        before it reached us): exchange state with it, at most once per join retry period."""
        record = self._records.get(event.node_id)
        if record is not None and record.boot_id >= event.boot_id and record.up:
            return
        if event.node_id == self.node_id or any(type(m) is PushPull for m in event.messages):
            return
        key = (event.node_id, event.boot_id)
        if self._introduced.get(key, -_NEVER) + self.config.join_retry_ms > now_ms:
            return
        if len(self._introduced) >= self.config.members_max:
            self._introduced.clear()
        self._introduced[key] = now_ms
        self._send_state(event.address, reply=False)

    def _on_ping(self, event: Received, ping: Ping, now_ms: int) -> None:
        if ping.target != self.node_id or ping.target_boot not in (0, self._me.boot_id):
            return  # meant for a previous process of ours, or for someone else
        self._send(event.address, Ack(ping.seq))

    def _on_ack(self, seq: int, now_ms: int) -> None:
        probe = self._probe
        if probe is not None and seq == probe.seq:
            if not probe.acked:
                probe.acked = True
                self.stats.acks += 1
            return
        relay = self._relays.pop(seq, None)
        if relay is not None:
            self._send(relay.requester, Ack(relay.requester_seq))

    def _on_ping_req(self, event: Received, request: PingReq, now_ms: int) -> None:
        if len(self._relays) >= _RELAYS_MAX or request.target == self.node_id:
            return
        seq = self._next_seq()
        # Half a probe timeout: the requester sent this a probe timeout into its period and
        # judges at the period's end, so a nack must leave well before that.
        timeout_ms = max(1, self.config.probe_timeout_ms // 2)
        self._relays[seq] = _Relay(event.address, request.seq, now_ms + timeout_ms)
        self._send(request.address, Ping(seq, request.target, request.target_boot))

    def _on_push_pull(self, event: Received, message: PushPull, now_ms: int) -> None:
        for record in message.records:
            self._merge_record(record, now_ms)
        if not message.reply:
            self._send_state(event.address, reply=True)

    # --- claims ----------------------------------------------------------------------------

    def _merge_record(self, record: Record, now_ms: int) -> None:
        """A push-pull record: a claim that also carries the member's addresses."""
        if record.state is MemberState.ALIVE:
            self._apply(Alive(record.node_id, record.boot_id, record.incarnation,
                              record.cluster_address, record.client_address, record.rack), now_ms)
            return
        if record.node_id not in self._records and record.node_id != self.node_id:
            if len(self._records) > self.config.members_max:
                return
            known = self._records[record.node_id] = _Record(
                record.node_id, record.boot_id, record.incarnation, record.state,
                record.cluster_address, record.client_address, record.rack, now_ms,
            )
            if record.state is MemberState.SUSPECT:  # as a suspicion of our own, from now
                self._suspect(known, self.node_id, now_ms)
            self._out.append(MemberChanged(known.snapshot(), None))
            return
        message: ClaimMessage  # a record names no accuser: it becomes ours
        if record.state is MemberState.SUSPECT:
            message = Suspect(record.node_id, record.boot_id, record.incarnation, self.node_id)
        elif record.state is MemberState.DEAD:
            message = Dead(record.node_id, record.boot_id, record.incarnation, self.node_id)
        else:
            message = Left(record.node_id, record.boot_id, record.incarnation)
        self._apply(message, now_ms)

    def _apply(self, message: ClaimMessage, now_ms: int) -> None:
        claim = claim_of(message)
        if claim.node_id == self.node_id:
            self._about_me(claim, now_ms)
            return
        record = self._records.get(claim.node_id)
        if not supersedes(claim, None if record is None else record.claim):
            if (record is not None and type(message) is Suspect
                    and record.state is MemberState.SUSPECT and claim == record.claim
                    and self._confirm(record, message.accuser, now_ms)):
                self._broadcast_claim(message)  # so others count this accuser too
            return
        if type(message) is Alive:
            self._became_alive(record, message, now_ms)
        elif record is None:
            return  # suspect, dead or left of a member we never saw: nothing to address
        elif type(message) is Suspect:
            self._set_state(record, claim, now_ms)
            self._suspect(record, message.accuser, now_ms)
        else:
            self._set_state(record, claim, now_ms)
            record.dead_at_ms = _NEVER
        self._broadcast_claim(message)

    def _about_me(self, claim: Claim, now_ms: int) -> None:
        me = self._me
        if claim.boot_id != me.boot_id or claim.state is MemberState.ALIVE or self._leaving:
            return  # about another process of ours, or nothing to refute
        if claim.incarnation < me.incarnation:
            return  # already refuted
        me.incarnation = claim.incarnation + 1
        self.stats.refutations += 1
        if self.config.lifeguard:
            self._awareness = min(self._awareness + 1, self.config.awareness_max - 1)
        self._broadcast_claim(self._alive_message(me))

    def _became_alive(self, record: _Record | None, message: Alive, now_ms: int) -> None:
        if record is None:
            if len(self._records) > self.config.members_max:
                return
            record = _Record(message.node_id, message.boot_id, message.incarnation,
                             MemberState.ALIVE, message.cluster_address, message.client_address,
                             message.rack, now_ms)
            self._records[message.node_id] = record
            self._out.append(MemberChanged(record.snapshot(), None))
            self._broadcast_claim(message)
            return
        record.cluster_address = message.cluster_address
        record.client_address = message.client_address
        record.rack = message.rack
        record.dead_at_ms = _NEVER
        record.confirmers.clear()
        self._set_state(record, claim_of(message), now_ms)
        self._broadcast_claim(message)

    def _set_state(self, record: _Record, claim: Claim, now_ms: int) -> None:
        previous = record.state
        record.boot_id, record.incarnation, record.state = (
            claim.boot_id, claim.incarnation, claim.state)
        if previous is not claim.state:
            record.since_ms = now_ms
            self._out.append(MemberChanged(record.snapshot(), previous))

    def _suspect(self, record: _Record, accuser: int, now_ms: int) -> None:
        record.suspected_at_ms = now_ms
        record.accuser = accuser
        record.confirmers = set()
        record.dead_at_ms = now_ms + self._suspicion_timeout_ms(0)

    def _confirm(self, record: _Record, accuser: int, now_ms: int) -> bool:
        """Count an independent accuser of a suspicion; whether it was new."""
        if accuser == record.accuser or accuser in record.confirmers or not self.config.lifeguard:
            return False
        record.confirmers.add(accuser)
        timeout = self._suspicion_timeout_ms(len(record.confirmers))
        record.dead_at_ms = min(record.dead_at_ms, record.suspected_at_ms + timeout)
        return True

    def _suspicion_timeout_ms(self, confirmations: int) -> int:
        members = self._up_count()
        low, high = self.config.suspicion_bounds_ms(members)
        expected = self.config.suspicion_multiplier - 2
        if members - 2 < expected:
            expected = 0
        if expected < 1 or low == high:
            return low
        shrunk = high - (high - low) * math.log(confirmations + 1) / math.log(expected + 1)
        return max(low, int(shrunk))

    # --- time ------------------------------------------------------------------------------

    def _tick(self, now_ms: int) -> None:
        for record in list(self._records.values()):
            if record.state is MemberState.SUSPECT and record.dead_at_ms <= now_ms:
                self.stats.declared_dead += 1
                self._apply(Dead(record.node_id, record.boot_id, record.incarnation,
                                 self.node_id), now_ms)
        for seq, relay in list(self._relays.items()):
            if relay.timeout_at_ms <= now_ms:
                del self._relays[seq]
                if self.config.lifeguard:
                    self._send(relay.requester, Nack(relay.requester_seq))
        probe = self._probe
        if (probe is not None and not probe.acked and not probe.indirect_sent
                and probe.timeout_at_ms <= now_ms):
            self._probe_indirectly(probe)
        if self._next_probe_ms <= now_ms:
            self._finish_probe(now_ms)
            if not self._leaving:
                self._start_probe(now_ms)
            period = self.config.probe_interval_ms * (self._awareness + 1)
            self._next_probe_ms = now_ms + period
            self._forget_departed(now_ms)
        if self._next_gossip_ms <= now_ms:
            self._gossip()
            self._next_gossip_ms = now_ms + self.config.gossip_interval_ms
        if self._next_push_pull_ms <= now_ms:
            target = self._random_members(1)
            if target:
                self.stats.push_pulls += 1
                self._send_state(target[0].cluster_address, reply=False)
            self._next_push_pull_ms = now_ms + self.config.push_pull_period_ms(self._up_count())
        if self._join_retry_ms <= now_ms:
            self._join(now_ms)
        if self._next_reconnect_ms <= now_ms:
            self._reconnect()
            self._next_reconnect_ms = now_ms + self.config.reconnect_interval_ms

    def _start_probe(self, now_ms: int) -> None:
        target = self._next_target()
        if target is None:
            self._probe = None
            return
        seq = self._next_seq()
        timeout_ms = self.config.probe_timeout_ms * (self._awareness + 1)
        self._probe = _Probe(seq, target.node_id, now_ms + timeout_ms)
        self.stats.probes += 1
        buddy: list[ClaimMessage] = []
        if target.state is MemberState.SUSPECT:  # tell it, so it can refute (buddy system)
            buddy.append(Suspect(target.node_id, target.boot_id, target.incarnation,
                                 target.accuser))
        self._send(target.cluster_address, Ping(seq, target.node_id, target.boot_id), buddy)

    def _probe_indirectly(self, probe: _Probe) -> None:
        probe.indirect_sent = True
        target = self._records.get(probe.target)
        if target is None:
            return
        helpers = self._random_members(self.config.indirect_probes, exclude=probe.target)
        probe.expected_nacks = len(helpers) if self.config.lifeguard else 0
        request = PingReq(probe.seq, target.node_id, target.boot_id, target.cluster_address)
        for helper in helpers:
            self.stats.indirect_probes += 1
            self._send(helper.cluster_address, request)

    def _finish_probe(self, now_ms: int) -> None:
        probe, self._probe = self._probe, None
        if probe is None:
            return
        lifeguard = self.config.lifeguard
        if probe.acked:
            if lifeguard:
                self._awareness = max(self._awareness - 1, 0)
            return
        self.stats.probes_failed += 1
        if lifeguard:
            missing = probe.expected_nacks - probe.nacks if probe.expected_nacks else 1
            self._awareness = min(self._awareness + max(missing, 0),
                                  self.config.awareness_max - 1)
        target = self._records.get(probe.target)
        if target is None or target.state not in (MemberState.ALIVE, MemberState.SUSPECT):
            return
        if target.state is MemberState.ALIVE:
            self.stats.suspicions += 1
        # A suspicion of our own, or (already suspect) our confirmation of another's.
        self._apply(Suspect(target.node_id, target.boot_id, target.incarnation, self.node_id),
                    now_ms)

    def _next_target(self) -> _Record | None:
        for _ in range(2):
            while self._order:
                node = self._order.pop()
                record = self._records.get(node)
                if record is not None and record.state in (MemberState.ALIVE,
                                                           MemberState.SUSPECT):
                    return record
            self._order = sorted(node for node, record in self._records.items()
                                 if node != self.node_id and record.state in (
                                     MemberState.ALIVE, MemberState.SUSPECT))
            self._rng.shuffle(self._order)
        return None

    def _reconnect(self) -> None:
        """Push-pull with one random member we believe dead: if it is alive after all (a
        partition healed), the exchange tells each side, and each refutes its own death."""
        if self._leaving:
            return
        dead = [record for node, record in sorted(self._records.items())
                if record.state is MemberState.DEAD]
        if dead:
            self._send_state(self._rng.choice(dead).cluster_address, reply=False)

    def _forget_departed(self, now_ms: int) -> None:
        reclaim_ms = self.config.dead_member_reclaim_ms
        for node, record in list(self._records.items()):
            if (node != self.node_id and record.state in (MemberState.DEAD, MemberState.LEFT)
                    and record.since_ms + reclaim_ms <= now_ms):
                del self._records[node]
                self._broadcasts.pop(node, None)

    # --- joining and leaving ---------------------------------------------------------------

    def _join(self, now_ms: int) -> None:
        if not self._seeds:
            self._join_retry_ms = _NEVER
            return
        for seed in self._seeds:
            self._send_state(seed, reply=False)
        self._join_retry_ms = now_ms + self.config.join_retry_ms

    def _leave(self, now_ms: int) -> None:
        if self._leaving:
            return
        self._leaving = True
        me = self._me
        me.incarnation += 1
        me.state = MemberState.LEFT
        me.since_ms = now_ms
        self._probe = None
        self._join_retry_ms = _NEVER
        self._broadcast_claim(Left(me.node_id, me.boot_id, me.incarnation))
        self._gossip()

    # --- sending ---------------------------------------------------------------------------

    def _send(self, address: Address, primary: Message | None,
              first: list[ClaimMessage] | None = None) -> None:
        first = first or []
        ordered = sorted(self._broadcasts.values(), key=lambda b: (b.transmits, b.order))
        claims = first + [b.message for b in ordered]
        payload, taken = pack(primary, claims, self.config.payload_bytes_max)
        self._count_transmits(claims[len(first):max(taken, len(first))])
        self.stats.datagrams_sent += 1
        self.stats.payload_bytes_sent += len(payload)
        self._out.append(Send(address, payload))

    def _count_transmits(self, sent: list[ClaimMessage]) -> None:
        limit = self.config.retransmits(self._up_count())
        for message in sent:
            broadcast = self._broadcasts.get(message.node_id)
            if broadcast is None or broadcast.message is not message:
                continue
            broadcast.transmits += 1
            if broadcast.transmits >= limit:
                del self._broadcasts[message.node_id]

    def _gossip(self) -> None:
        if not self._broadcasts:
            return
        for member in self._random_members(self.config.gossip_fanout):
            if not self._broadcasts:
                return
            self._send(member.cluster_address, None)

    def _send_state(self, address: Address, *, reply: bool) -> None:
        records = [record.record() for record in self._records.values()]
        for chunk in split_records(records, reply, self.config.payload_bytes_max):
            self._send(address, chunk)

    def _broadcast_claim(self, message: ClaimMessage) -> None:
        self._broadcast_order += 1
        self._broadcasts[message.node_id] = _Broadcast(message, 0, self._broadcast_order)

    # --- helpers ---------------------------------------------------------------------------

    def _alive_message(self, record: _Record) -> Alive:
        return Alive(record.node_id, record.boot_id, record.incarnation, record.cluster_address,
                     record.client_address, record.rack)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _up_count(self) -> int:
        return sum(1 for record in self._records.values()
                   if record.state in (MemberState.ALIVE, MemberState.SUSPECT))

    def _random_members(self, count: int, exclude: int = -1) -> list[_Record]:
        candidates = [record for node, record in sorted(self._records.items())
                      if node not in (self.node_id, exclude)
                      and record.state in (MemberState.ALIVE, MemberState.SUSPECT)]
        if len(candidates) <= count:
            return candidates
        return self._rng.sample(candidates, count)
