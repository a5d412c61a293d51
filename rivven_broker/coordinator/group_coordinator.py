"""The group coordinator: membership, rebalances and fencing, as a pure state machine.

Theory of operation
-------------------
``GroupCoordinator.handle(event, now_ms) -> list[Instruction]`` (events and instructions:
``group_events.py``) is the whole interface; it never blocks, never reads a clock (``now_ms``
is the broker's wall clock in ms, passed in) and draws member ids from an injected
``random.Random``. This module has joins, rounds, timers and the plumbing; SyncGroup,
Heartbeat, LeaveGroup and fencing are in ``group_membership.py``; offsets, deletion, expiry
and loading in ``group_offsets.py``; one group's data and rules in ``group_state.py``.

Membership, one round at a time:

1. **Join.** A dynamic member's first JoinGroup (member id "") gets MEMBER_ID_REQUIRED with a
   fresh id (KIP-394), so a join that is retried after a lost answer cannot leave a ghost
   member behind; the id is remembered for one session timeout. The join with that id adds
   the member. A static member (``group_instance_id``) is added at once; if its instance is
   already known, the new member *replaces* the old one (the old id is fenced with
   FENCED_INSTANCE_ID) and inherits its place and assignment; in a Stable group this needs no
   rebalance, only a durable group record. A join to an Empty, Stable or CompletingRebalance
   group (except a follower rejoining with unchanged protocols) opens a round:
   PreparingRebalance.
2. **Round.** Join answers are held. The round closes when every member has rejoined (and,
   for a round started from Empty, ``initial_rebalance_delay_ms`` has passed, so a fleet of
   consumers starting together makes one generation rather than many), or at the rebalance
   deadline (the longest member rebalance timeout), when members that did not rejoin are
   removed. Closing bumps the generation, picks the protocol all members support that most
   prefer, keeps the leader if it rejoined (else the first to join), and answers every held
   join; the leader's answer lists every member with its subscription.
3. **Sync.** Followers' SyncGroup answers are held. The leader's SyncGroup carries the
   assignment; the coordinator persists the group record and, once ``Persisted``, goes Stable
   and answers everyone. If syncs are not in by the rebalance deadline, members that did not
   sync are removed and a new round opens.
4. **Stable.** Heartbeats renew sessions. A session that runs out removes the member and
   opens a round (members whose answer is held are alive by definition). LeaveGroup does the
   same at once.

Fencing: an unknown member id is UNKNOWN_MEMBER_ID; a known instance id with another member
id is FENCED_INSTANCE_ID; a generation other than the group's is ILLEGAL_GENERATION; a
heartbeat during PreparingRebalance is REBALANCE_IN_PROGRESS (the member must rejoin).

Timers: every deadline set is pushed on a heap ``(deadline_ms, kind, group, member)``; a
``Tick`` pops the due ones and re-checks them against the live state (a renewed session
leaves a stale entry that is simply dropped). ``next_deadline_ms()`` is the heap's top or
the next offsets-expiry sweep, whichever comes first.
"""

from __future__ import annotations

import heapq
import random
from typing import Callable, Hashable

import attrs

from rivven_broker.coordinator.group_events import (
    GroupCoordinatorConfig,
    GroupRequest,
    Instruction,
    Persist,
    Persisted,
    PersistFailed,
    Respond,
    Tick,
    TxnOffsetsCommitted,
)
from rivven_broker.coordinator.group_membership import MembershipMixin
from rivven_broker.coordinator.group_offsets import OffsetsMixin
from rivven_broker.coordinator.group_state import (
    Group,
    GroupState,
    Member,
    PersistOutcome,
    TimerKind,
)
from rivven_broker.coordinator.offsets_codec import GroupKey, encode_group_value, encode_key
from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.group_messages import (
    Heartbeat,
    HeartbeatResponse,
    JoinGroup,
    JoinGroupMember,
    JoinGroupResponse,
    LeaveGroup,
    SyncGroup,
    SyncGroupResponse,
)
from rivven_broker.protocol.message_base import Response
from rivven_broker.protocol.names import group_id_error

__all__ = ["GroupCoordinator", "CoordinatorStatistics"]

_PREPARING = GroupState.PREPARING_REBALANCE
_COMPLETING = GroupState.COMPLETING_REBALANCE
_MEMBER_ID_PREFIX_CHARS_MAX = 200


@attrs.frozen
class CoordinatorStatistics:
    """Counts for metrics and tests. ``groups_by_state`` maps state names to counts."""

    groups: int
    groups_by_state: dict[str, int]
    members: int
    pending_members: int
    committed_offsets: int
    persists_in_flight: int
    held_responses: int
    timers: int


class GroupCoordinator(MembershipMixin, OffsetsMixin):
    """Consumer groups of one coordinator, driven by events. Never blocks; not thread-safe.

    ``log_end_offset(topic, partition)`` answers the next offset of a partition, or None when
    it does not exist; OffsetCommit refuses offsets beyond it. Call ``load`` once, before the
    first event, with the ``__consumer_offsets`` records of the partitions this coordinator
    owns.
    """

    def __init__(
        self,
        rng: random.Random,
        log_end_offset: Callable[[str, int], int | None],
        config: GroupCoordinatorConfig | None = None,
    ) -> None:
        self.config = config if config is not None else GroupCoordinatorConfig()
        self._rng = rng
        self._log_end_offset = log_end_offset
        self._groups: dict[str, Group] = {}
        self._persists: dict[int, object] = {}
        self._next_persist_id = 1
        self._timers: list[tuple[int, TimerKind, str, str]] = []
        self._next_expiry_ms: int | None = None
        self._out: list[Instruction] = []
        #: Who settles a persist's outcome, by the type of its context: one table.
        self._persist_outcomes: dict[type, PersistOutcome] = {
            **self._membership_outcomes(), **self._offsets_outcomes()}

    # --- the interface -----------------------------------------------------------------

    def handle(
        self, event: GroupRequest | Tick | Persisted | PersistFailed | TxnOffsetsCommitted,
        now_ms: int,
    ) -> list[Instruction]:
        """Apply ``event`` at ``now_ms``; return what the driver must do. Never blocks, never
        raises for any request (bad ones are answered with error codes)."""
        assert not self._out, "handle() is not re-entrant"
        if self._next_expiry_ms is None:
            self._next_expiry_ms = now_ms + self.config.offsets_retention_check_interval_ms
        if isinstance(event, GroupRequest):
            self._dispatch(event, now_ms)
        elif isinstance(event, Tick):
            self._tick(now_ms)
        elif isinstance(event, Persisted):
            self._persisted(event.persist_id, None, now_ms)
        elif isinstance(event, PersistFailed):
            self._persisted(event.persist_id, event.error_code, now_ms)
        else:
            assert isinstance(event, TxnOffsetsCommitted), event
            self._txn_offsets_committed(event, now_ms)
        out, self._out = self._out, []
        return out

    def next_deadline_ms(self) -> int | None:
        """When the next ``Tick`` is due (None: nothing is scheduled). Never blocks."""
        while self._timers and not self._timer_live(self._timers[0]):
            heapq.heappop(self._timers)
        candidates = [self._timers[0][0]] if self._timers else []
        if self._next_expiry_ms is not None:
            candidates.append(self._next_expiry_ms)
        return min(candidates, default=None)

    def statistics(self) -> CoordinatorStatistics:
        """Counts for metrics. Never blocks."""
        by_state: dict[str, int] = {}
        members = pending = offsets = held = 0
        for group in self._groups.values():
            by_state[group.state.value] = by_state.get(group.state.value, 0) + 1
            members += len(group.members)
            pending += len(group.pending_members)
            offsets += len(group.offsets)
            held += sum(
                (m.join_token is not None) + (m.sync_token is not None)
                for m in group.members.values()
            )
        return CoordinatorStatistics(
            len(self._groups), by_state, members, pending, offsets, len(self._persists), held,
            len(self._timers),
        )

    def group_ids(self) -> list[str]:
        """The ids of the groups this coordinator knows. Never blocks."""
        return list(self._groups)

    def check_invariants(self) -> None:
        """Assert every group's invariants and the coordinator's own. For tests."""
        instance_owners: dict[tuple[str, str], str] = {}
        for group_id, group in self._groups.items():
            assert group.group_id == group_id
            group.check_invariants()
            for instance_id, member_id in group.static_members.items():
                instance_owners[(group_id, instance_id)] = member_id
            if group.sync_persist_id is not None:
                assert group.sync_persist_id in self._persists
            if group.delete_persist_id is not None:
                assert group.delete_persist_id in self._persists
        assert all(pid < self._next_persist_id for pid in self._persists)

    # --- plumbing ------------------------------------------------------------------------

    def _respond(self, token: Hashable, response: Response) -> None:
        self._out.append(Respond(token, response))

    def _persist(self, group: Group, records: list[tuple[bytes, bytes | None]], context) -> int:
        persist_id = self._next_persist_id
        self._next_persist_id += 1
        self._persists[persist_id] = context
        self._out.append(Persist(persist_id, group.group_id, tuple(records)))
        return persist_id

    def _group_record(self, group: Group, assignments: dict[str, bytes] | None = None):
        group.has_group_record = True  # from now on a deletion must tombstone it
        key = encode_key(GroupKey(group.group_id))
        return key, encode_group_value(group.to_value(assignments))

    def _schedule(self, deadline_ms: int, kind: TimerKind, group_id: str,
                  member_id: str = "") -> None:
        heapq.heappush(self._timers, (deadline_ms, kind, group_id, member_id))

    def _timer_live(self, timer: tuple[int, TimerKind, str, str]) -> bool:
        deadline_ms, kind, group_id, member_id = timer
        group = self._groups.get(group_id)
        if group is None:
            return False
        if kind is TimerKind.SESSION:
            member = group.members.get(member_id)
            return member is not None and member.session_deadline_ms == deadline_ms
        if kind is TimerKind.PENDING:
            return group.pending_members.get(member_id) == deadline_ms
        if kind is TimerKind.REBALANCE:
            return group.state in (_PREPARING, _COMPLETING) and (
                group.rebalance_deadline_ms == deadline_ms
            )
        assert kind is TimerKind.JOIN_READY, kind
        return group.state is _PREPARING and group.join_ready_ms == deadline_ms

    def _new_member_id(self, group: Group, client_id: str) -> str:
        prefix = client_id[:_MEMBER_ID_PREFIX_CHARS_MAX] or "member"
        while True:
            member_id = f"{prefix}-{self._rng.getrandbits(128):032x}"
            if member_id not in group.members and member_id not in group.pending_members:
                return member_id

    def _renew(self, group: Group, member: Member, now_ms: int) -> None:
        member.session_deadline_ms = now_ms + member.session_timeout_ms
        self._schedule(member.session_deadline_ms, TimerKind.SESSION, group.group_id, member.member_id)

    def _dispatch(self, event: GroupRequest, now_ms: int) -> None:
        request = event.request
        if isinstance(request, JoinGroup):
            self._join(event, request, now_ms)
        elif isinstance(request, SyncGroup):
            self._sync(event.token, request, now_ms)
        elif isinstance(request, Heartbeat):
            self._respond(event.token, HeartbeatResponse(self._heartbeat(request, now_ms)))
        elif isinstance(request, LeaveGroup):
            self._respond(event.token, self._leave(request, now_ms))
        else:
            self._dispatch_offsets(event.token, request, now_ms)

    # --- timers --------------------------------------------------------------------------

    def _tick(self, now_ms: int) -> None:
        while self._timers and self._timers[0][0] <= now_ms:
            timer = heapq.heappop(self._timers)
            if self._timer_live(timer):
                self._fire(timer, now_ms)
        if self._next_expiry_ms is not None and now_ms >= self._next_expiry_ms:
            self._expire_offsets(now_ms)
            self._next_expiry_ms = now_ms + self.config.offsets_retention_check_interval_ms

    def _fire(self, timer: tuple[int, TimerKind, str, str], now_ms: int) -> None:
        _, kind, group_id, member_id = timer
        group = self._groups[group_id]
        if kind is TimerKind.SESSION:
            member = group.members[member_id]
            if member.is_awaiting():  # alive by definition; look again one session later
                self._renew(group, member, now_ms)
                return
            self._remove_members(group, [member], ErrorCode.UNKNOWN_MEMBER_ID, now_ms)
        elif kind is TimerKind.PENDING:
            del group.pending_members[member_id]
        elif kind is TimerKind.JOIN_READY:
            self._maybe_complete_join(group, now_ms)
        elif group.state is _PREPARING:
            self._complete_join(group, now_ms)
        else:  # syncs are overdue: drop members that never sent SyncGroup, start over
            assert group.state is _COMPLETING
            if group.sync_persist_id is None:
                laggards = [m for m in group.members.values() if m.sync_token is None]
                self._remove_members(group, laggards, ErrorCode.UNKNOWN_MEMBER_ID, now_ms)

    # --- join ----------------------------------------------------------------------------

    def _join(self, event: GroupRequest, request: JoinGroup, now_ms: int) -> None:
        token = event.token

        def refuse(code: ErrorCode, member_id: str = request.member_id) -> None:
            self._respond(token, JoinGroupResponse(code, member_id=member_id))

        code = group_id_error(request.group_id)
        protocols = tuple((p.name, bytes(p.metadata)) for p in request.protocols)
        names = [name for name, _ in protocols]
        config = self.config
        if code is not None:
            return refuse(code)
        if not config.session_timeout_ms_min <= request.session_timeout_ms <= (
            config.session_timeout_ms_max
        ):
            return refuse(ErrorCode.INVALID_SESSION_TIMEOUT)
        if not protocols or len(protocols) > limits.group_protocols_max or (
            len(set(names)) != len(names) or not request.protocol_type
        ):
            return refuse(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        group = self._groups.get(request.group_id)
        if group is None:
            if request.member_id:
                return refuse(ErrorCode.UNKNOWN_MEMBER_ID)
            group = self._groups[request.group_id] = Group(request.group_id, now_ms)
        if group.state is GroupState.DEAD:
            return refuse(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if not group.supports(request.protocol_type, protocols, request.member_id):
            return refuse(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        rebalance_ms = request.rebalance_timeout_ms or config.rebalance_timeout_ms_default
        member = Member(
            request.member_id,
            request.group_instance_id,
            event.client_id,
            event.client_host,
            request.session_timeout_ms,
            min(rebalance_ms, config.rebalance_timeout_ms_max),
            protocols,
            now_ms + request.session_timeout_ms,
        )
        if request.group_instance_id is not None:
            self._join_static(group, member, token, request.protocol_type, now_ms)
        elif not request.member_id:
            if len(group.members) + len(group.pending_members) >= config.group_members_max:
                return refuse(ErrorCode.GROUP_MAX_SIZE_REACHED)
            member_id = self._new_member_id(group, event.client_id)
            group.pending_members[member_id] = now_ms + request.session_timeout_ms
            self._schedule(group.pending_members[member_id], TimerKind.PENDING, group.group_id, member_id)
            refuse(ErrorCode.MEMBER_ID_REQUIRED, member_id)
        elif request.member_id in group.pending_members:
            del group.pending_members[request.member_id]
            self._add_member(group, member, token, request.protocol_type, now_ms)
        elif request.member_id in group.members and (
            group.members[request.member_id].group_instance_id is None
        ):
            self._rejoin(group, group.members[request.member_id], member, token, now_ms)
        else:
            refuse(ErrorCode.UNKNOWN_MEMBER_ID)

    def _join_static(
        self, group: Group, member: Member, token: Hashable, protocol_type: str, now_ms: int
    ) -> None:
        instance_id = member.group_instance_id
        assert instance_id is not None
        known_id = group.static_members.get(instance_id)
        if known_id is None:
            if member.member_id:
                self._respond(token, JoinGroupResponse(ErrorCode.UNKNOWN_MEMBER_ID))
            elif len(group.members) + len(group.pending_members) >= self.config.group_members_max:
                self._respond(token, JoinGroupResponse(ErrorCode.GROUP_MAX_SIZE_REACHED))
            else:
                member.member_id = self._new_member_id(group, member.client_id)
                self._add_member(group, member, token, protocol_type, now_ms)
        elif member.member_id and member.member_id != known_id:
            code = ErrorCode.FENCED_INSTANCE_ID
            self._respond(token, JoinGroupResponse(code, member_id=member.member_id))
        elif member.member_id:
            self._rejoin(group, group.members[known_id], member, token, now_ms)
        else:
            self._replace_static(group, group.members[known_id], member, token, now_ms)

    def _replace_static(
        self, group: Group, old: Member, new: Member, token: Hashable, now_ms: int
    ) -> None:
        """A restarted static member takes over the old member's place and assignment."""
        new.member_id = self._new_member_id(group, new.client_id)
        new.assignment = old.assignment
        self._fence_held(old, ErrorCode.FENCED_INSTANCE_ID)
        snapshot = attrs.evolve(old)
        self._rename(group, old.member_id, new)
        self._renew(group, new, now_ms)
        if group.state is GroupState.STABLE and group.protocol_name in new.protocol_names():
            self._persist_takeover(group, token, snapshot, new.member_id)
        elif group.state is GroupState.STABLE or group.state is _COMPLETING:
            new.join_token = token
            self._prepare_rebalance(group, now_ms)
        else:
            new.join_token = token
            self._maybe_complete_join(group, now_ms)

    def _rename(self, group: Group, old_id: str, new: Member) -> None:
        group.members = {
            (new.member_id if mid == old_id else mid): (new if mid == old_id else m)
            for mid, m in group.members.items()
        }
        if new.group_instance_id is not None:
            group.static_members[new.group_instance_id] = new.member_id
        if group.leader_id == old_id:
            group.leader_id = new.member_id

    def _add_member(
        self, group: Group, member: Member, token: Hashable, protocol_type: str, now_ms: int
    ) -> None:
        if not group.members:
            group.protocol_type = protocol_type
        group.members[member.member_id] = member
        if member.group_instance_id is not None:
            group.static_members[member.group_instance_id] = member.member_id
        member.join_token = token
        if group.state is _PREPARING:
            self._maybe_complete_join(group, now_ms)
        else:
            self._prepare_rebalance(group, now_ms)

    def _rejoin(
        self, group: Group, member: Member, update: Member, token: Hashable, now_ms: int
    ) -> None:
        changed = member.protocols != update.protocols
        member.protocols = update.protocols
        member.session_timeout_ms = update.session_timeout_ms
        member.rebalance_timeout_ms = update.rebalance_timeout_ms
        if member.join_token is not None:  # a retried join replaces the held one
            self._respond(member.join_token, JoinGroupResponse(ErrorCode.REBALANCE_IN_PROGRESS))
            member.join_token = None
        if group.state is _PREPARING:
            member.join_token = token
            self._maybe_complete_join(group, now_ms)
        elif not changed and (
            group.state is _COMPLETING or group.leader_id != member.member_id
        ):
            self._renew(group, member, now_ms)
            self._respond(token, self._join_response(group, member))
        else:
            member.join_token = token
            self._prepare_rebalance(group, now_ms)

    def _join_response(self, group: Group, member: Member) -> JoinGroupResponse:
        members: tuple[JoinGroupMember, ...] = ()
        if member.member_id == group.leader_id and group.state is _COMPLETING:
            protocol = group.protocol_name
            members = tuple(
                JoinGroupMember(m.member_id, m.group_instance_id, m.metadata_for(protocol))
                for m in group.members.values()
            )
        return JoinGroupResponse(
            ErrorCode.NONE,
            group.generation,
            group.protocol_type,
            group.protocol_name,
            group.leader_id or "",
            member.member_id,
            members,
        )

    # --- rounds --------------------------------------------------------------------------

    def _prepare_rebalance(self, group: Group, now_ms: int) -> None:
        """Open a round (from Empty, Stable or CompletingRebalance)."""
        if group.state is _COMPLETING:
            group.sync_persist_id = None  # a persist in flight no longer completes anything
            for member in group.members.values():
                if member.sync_token is not None:
                    code = ErrorCode.REBALANCE_IN_PROGRESS
                    self._respond(member.sync_token, SyncGroupResponse(code))
                    member.sync_token = None
                member.assignment = b""
        started_empty = group.state is GroupState.EMPTY
        group.transition(_PREPARING, now_ms)
        timeout_ms = group.max_rebalance_timeout_ms(self.config.rebalance_timeout_ms_default)
        group.rebalance_deadline_ms = now_ms + timeout_ms
        self._schedule(group.rebalance_deadline_ms, TimerKind.REBALANCE, group.group_id)
        delay_ms = min(self.config.initial_rebalance_delay_ms, timeout_ms) if started_empty else 0
        group.join_ready_ms = now_ms + delay_ms
        if delay_ms:
            self._schedule(group.join_ready_ms, TimerKind.JOIN_READY, group.group_id)
        self._maybe_complete_join(group, now_ms)

    def _maybe_complete_join(self, group: Group, now_ms: int) -> None:
        if group.state is not _PREPARING:
            return
        if now_ms >= group.join_ready_ms and group.all_members_joined():
            self._complete_join(group, now_ms)

    def _complete_join(self, group: Group, now_ms: int) -> None:
        """Close the round: drop who did not rejoin, start the next generation."""
        gone = [m for m in group.members.values() if m.join_token is None]
        for member in gone:
            self._drop(group, member)
        group.generation += 1
        if not group.members:
            group.protocol_name = None
            group.leader_id = None
            group.transition(GroupState.EMPTY, now_ms)
            self._persist(group, [self._group_record(group)], None)
            return
        group.protocol_name = group.select_protocol()
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members))
        group.transition(_COMPLETING, now_ms)
        timeout_ms = group.max_rebalance_timeout_ms(self.config.rebalance_timeout_ms_default)
        group.rebalance_deadline_ms = now_ms + timeout_ms
        self._schedule(group.rebalance_deadline_ms, TimerKind.REBALANCE, group.group_id)
        for member in group.members.values():
            token, member.join_token = member.join_token, None
            self._renew(group, member, now_ms)
            self._respond(token, self._join_response(group, member))

    def _fence_held(self, member: Member, code: ErrorCode) -> None:
        """Answer the member's held join/sync with ``code``."""
        if member.join_token is not None:
            self._respond(member.join_token, JoinGroupResponse(code, member_id=member.member_id))
            member.join_token = None
        if member.sync_token is not None:
            self._respond(member.sync_token, SyncGroupResponse(code))
            member.sync_token = None

    def _drop(self, group: Group, member: Member) -> None:
        del group.members[member.member_id]
        if member.group_instance_id is not None:
            del group.static_members[member.group_instance_id]
        if group.leader_id == member.member_id:
            group.leader_id = None

    def _remove_members(
        self, group: Group, members: list[Member], code: ErrorCode, now_ms: int
    ) -> None:
        """Members leave or expire: answer what they wait for, then rebalance the rest."""
        for member in members:
            self._fence_held(member, code)
            self._drop(group, member)
        if not members:
            return
        if group.state in (GroupState.STABLE, _COMPLETING):
            self._prepare_rebalance(group, now_ms)
        else:
            self._maybe_complete_join(group, now_ms)

    # --- persist outcomes ----------------------------------------------------------------

    def _persisted(self, persist_id: int, error: ErrorCode | None, now_ms: int) -> None:
        context = self._persists.pop(persist_id, None)
        assert context is not None or persist_id < self._next_persist_id, persist_id
        if context is None:  # fire-and-forget records (expiry, an emptied group)
            return
        self._persist_outcomes[type(context)](context, persist_id, error, now_ms)
