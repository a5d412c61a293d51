"""One consumer group's state: members, generation, protocol, committed offsets.

Theory of operation
-------------------
A ``Group`` is plain mutable data plus the rules that are local to one group: which state
changes are legal, which protocol the members agree on, what the group looks like as a
``__consumer_offsets`` record, and the invariants that must hold between events
(``check_invariants``). The coordinator (``group_coordinator.py``) decides *when* things
happen; this module says what a group *is*.

States (Kafka's names, which users see in ``rivven group list``)::

    Empty --join--> PreparingRebalance --round closes--> CompletingRebalance --leader's
      ^                 |    ^                              |    sync durable--> Stable
      |   no members    |    |  join / leave / expiry       |                      |
      +-----------------+    +------------------------------+----------------------+
    Empty --delete--> Dead (until the tombstones are durable; then the group is gone)

- **Empty**: no members; may hold committed offsets (also of groups that never had members:
  "simple" commits with generation -1). Its offsets expire ``offsets_retention_ms`` after
  the later of their commit and the moment the group became empty.
- **PreparingRebalance**: a round is open; members rejoin (their JoinGroup answers are held).
- **CompletingRebalance**: the round closed with a new generation; the leader computes the
  assignment; followers' SyncGroup answers are held.
- **Stable**: every member has its assignment; heartbeats answer NONE.
- **Dead**: being deleted; every request gets COORDINATOR_NOT_AVAILABLE until it is gone.

Members keep their join order (dict order): the first member to join a round leads it unless
the previous leader is still there. Static members (``group_instance_id``) are also indexed
by instance id so a restarted instance takes over its old member's place and assignment.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, Hashable

import attrs

from rivven_broker.coordinator.offsets_codec import GroupValue, MemberValue, OffsetValue
from rivven_broker.protocol.errors import ErrorCode

__all__ = ["GroupState", "Member", "Group", "PersistOutcome", "TimerKind", "TopicPartitionKey"]

TopicPartitionKey = tuple[str, int]
#: Settles one persist's outcome: ``(context, persist_id, error or None, now_ms)``.
PersistOutcome = Callable[[Any, int, ErrorCode | None, int], None]


class TimerKind(enum.StrEnum):
    """What a coordinator timer is for. A ``StrEnum``: timers are heap entries
    ``(deadline_ms, kind, group, member)``, and equal deadlines fire in the order of these
    names, as they did when the kinds were bare strings."""

    SESSION = "session"  # a member's session ran out unless renewed since
    PENDING = "pending"  # a member id handed out by a JoinGroup that never came back
    REBALANCE = "rebalance"  # the rebalance (join, then sync) took too long
    JOIN_READY = "join_ready"  # every known member may have joined: look again


class GroupState(enum.Enum):
    """A group's state; the value is the name shown on the wire."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


_LEGAL = {
    GroupState.EMPTY: {GroupState.PREPARING_REBALANCE, GroupState.DEAD},
    GroupState.PREPARING_REBALANCE: {
        GroupState.COMPLETING_REBALANCE,
        GroupState.EMPTY,
        GroupState.DEAD,
    },
    GroupState.COMPLETING_REBALANCE: {
        GroupState.STABLE,
        GroupState.PREPARING_REBALANCE,
        GroupState.DEAD,
    },
    GroupState.STABLE: {GroupState.PREPARING_REBALANCE, GroupState.DEAD},
    GroupState.DEAD: {GroupState.EMPTY},  # a deletion whose tombstones failed to persist
}


@attrs.define(eq=False)
class Member:
    """One member of a group, with the responses it is waiting for."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]
    session_deadline_ms: int
    assignment: bytes = b""
    join_token: Hashable | None = None  # a held JoinGroup answer
    sync_token: Hashable | None = None  # a held SyncGroup answer

    def metadata_for(self, protocol_name: str | None) -> bytes:
        """This member's subscription bytes for ``protocol_name`` (b"" if it has none)."""
        for name, metadata in self.protocols:
            if name == protocol_name:
                return metadata
        return b""

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def is_awaiting(self) -> bool:
        """Members whose answer is held are alive by definition: their sessions don't run."""
        return self.join_token is not None or self.sync_token is not None

    def to_value(self) -> MemberValue:
        return MemberValue(
            self.member_id,
            self.group_instance_id,
            self.client_id,
            self.client_host,
            self.session_timeout_ms,
            self.rebalance_timeout_ms,
            self.protocols,
            self.assignment,
        )


@attrs.define(eq=False)
class Group:
    """A group and everything the coordinator knows about it."""

    group_id: str
    state_timestamp_ms: int
    state: GroupState = GroupState.EMPTY
    protocol_type: str | None = None
    protocol_name: str | None = None
    generation: int = 0
    leader_id: str | None = None
    members: dict[str, Member] = attrs.Factory(dict)
    static_members: dict[str, str] = attrs.Factory(dict)  # instance id -> member id
    pending_members: dict[str, int] = attrs.Factory(dict)  # KIP-394 ids -> expiry deadline
    offsets: dict[TopicPartitionKey, OffsetValue] = attrs.Factory(dict)
    pending_commits: dict[TopicPartitionKey, int] = attrs.Factory(dict)  # in-flight counts
    rebalance_deadline_ms: int = 0  # Preparing: the round closes; Completing: syncs are due
    join_ready_ms: int = 0  # Preparing: the round may not close before this
    sync_persist_id: int | None = None  # the leader's assignment being made durable
    delete_persist_id: int | None = None  # the tombstones of a deletion being made durable
    has_group_record: bool = False  # a group record is in the log (a deletion tombstones it)

    # --- transitions -------------------------------------------------------------------

    def transition(self, state: GroupState, now_ms: int) -> None:
        """Move to ``state``; asserts the move is legal."""
        assert state in _LEGAL[self.state], (self.group_id, self.state, state)
        self.state = state
        self.state_timestamp_ms = now_ms

    # --- protocols -----------------------------------------------------------------------

    def candidate_protocols(self, excluding: str | None = None) -> set[str] | None:
        """Protocols every member (but ``excluding``) supports; None when there is no member."""
        common: set[str] | None = None
        for member_id, member in self.members.items():
            if member_id == excluding:
                continue
            names = set(member.protocol_names())
            common = names if common is None else common & names
        return common

    def supports(
        self, protocol_type: str, protocols: tuple[tuple[str, bytes], ...], member_id: str
    ) -> bool:
        """Whether a member offering ``protocols`` of ``protocol_type`` fits the group: with
        no other member anything goes; otherwise the type must match and one protocol must be
        supported by every other member."""
        if not protocol_type or not protocols:
            return False
        common = self.candidate_protocols(excluding=member_id)
        if common is None:
            return True
        return protocol_type == self.protocol_type and bool(common & {n for n, _ in protocols})

    def select_protocol(self) -> str:
        """The protocol for the next generation: among those all members support, the one
        most members prefer most (ties: the name first in sorting order)."""
        common = self.candidate_protocols()
        assert common, (self.group_id, "no common protocol")
        votes: dict[str, int] = dict.fromkeys(common, 0)
        for member in self.members.values():
            favourite = next(n for n in member.protocol_names() if n in common)
            votes[favourite] += 1
        return min(votes, key=lambda name: (-votes[name], name))

    # --- views ---------------------------------------------------------------------------

    def all_members_joined(self) -> bool:
        return all(member.join_token is not None for member in self.members.values())

    def max_rebalance_timeout_ms(self, default_ms: int) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=default_ms)

    def to_value(self, assignments: dict[str, bytes] | None = None) -> GroupValue:
        """The group as a ``__consumer_offsets`` record value (``assignments`` override)."""
        members = []
        for member in self.members.values():
            value = member.to_value()
            if assignments is not None:
                value = attrs.evolve(value, assignment=assignments.get(member.member_id, b""))
            members.append(value)
        return GroupValue(
            self.protocol_type,
            self.generation,
            self.protocol_name,
            self.leader_id,
            self.state_timestamp_ms,
            tuple(members),
        )

    def is_removable(self) -> bool:
        """Empty, with nothing committed or in flight: it can disappear."""
        return (
            self.state is GroupState.EMPTY
            and not self.offsets
            and not self.pending_commits
            and not self.pending_members
        )

    # --- invariants ----------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Assert the rules that hold between events (for tests and the simulator)."""
        state = self.state
        assert self.generation >= 0
        for member_id, member in self.members.items():
            assert member.member_id == member_id
            assert member.protocols, member_id
            if member.group_instance_id is not None:
                assert self.static_members.get(member.group_instance_id) == member_id
            assert member.join_token is None or state is GroupState.PREPARING_REBALANCE
            assert member.sync_token is None or state is GroupState.COMPLETING_REBALANCE
        for instance_id, member_id in self.static_members.items():
            assert self.members[member_id].group_instance_id == instance_id
        assert not set(self.pending_members) & set(self.members)
        assert all(count > 0 for count in self.pending_commits.values())
        if state in (GroupState.EMPTY, GroupState.DEAD):
            assert not self.members and self.leader_id is None
            assert self.protocol_name is None
        if state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            assert self.members and self.leader_id in self.members
            assert self.protocol_name is not None
            assert all(self.protocol_name in m.protocol_names() for m in self.members.values())
        if state is GroupState.PREPARING_REBALANCE:
            assert self.leader_id is None or self.leader_id in self.members
        assert self.sync_persist_id is None or state is GroupState.COMPLETING_REBALANCE
        assert (self.delete_persist_id is not None) == (state is GroupState.DEAD)
        if self.members:
            assert self.protocol_type is not None
