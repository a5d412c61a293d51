"""A consumer's group membership as a pure core: join, sync, heartbeat, commit, leave.

Theory of operation
-------------------
``GroupCore`` holds what one member knows (member id, generation, chosen protocol, the
partitions it owns) and makes every decision; the blocking and trio drivers only move its
requests and answers and run callbacks. Two ways in:

- ``rebalance()`` is a generator (sans-I/O, like h11's events): while the member must
  (re)join it yields *actions* and receives their outcomes: ``Send(request)`` -> ``(response,
  error)``, ``PartitionCounts(topics)`` -> ``{topic: partitions}``, ``Revoke(partitions,
  lost)`` and ``Assign(added, committed)`` -> None (the driver commits, moves its fetch state
  to ``core.owned`` and calls the user's callbacks), ``Sleep(ms)`` -> None. It returns when
  the member is Stable and owes no rejoin. A fatal error (FENCED_INSTANCE_ID, a protocol the
  group refuses ...) is raised from it and stays in ``fatal``.
- Heartbeats and commits are single requests: ``heartbeat_request()`` /
  ``on_heartbeat(request, code)``, ``commit_request(offsets)`` /
  ``on_commit_response(request, response)``. Their fencing codes flag a rejoin (the next
  ``rebalance()`` does it): REBALANCE_IN_PROGRESS keeps the partitions; ILLEGAL_GENERATION and
  UNKNOWN_MEMBER_ID mean they were *lost* (handed to ``Revoke(lost=True)``: no commit);
  FENCED_INSTANCE_ID is fatal. An answer to a request of an older generation is ignored.
- The poll interval (KIP-62): the driver reports ``on_poll(now_ms)`` when ``poll`` starts
  and ``on_poll_end(now_ms)`` when it returns; the heartbeat side asks
  ``poll_timeout_expired(now_ms)`` before each heartbeat. Expired means the application has
  been out of ``poll`` for more than ``max_poll_interval_ms`` while a member (time spent
  inside ``poll``, waiting or running callbacks, never counts). ``leave_for_poll_timeout()``
  then makes the member leave: its partitions become *lost* (no commit: they may already
  have a new owner), member id and generation are reset, heartbeats stop (the member is no
  longer Stable), and it returns the LeaveGroup to send (None for a static member, which just
  goes silent until its session expires). The next ``poll`` reports the loss and rejoins.

Rebalance protocol: **cooperative** when every configured assignor is cooperative (the
default, cooperative-sticky), else **eager**. An eager member revokes everything before it
joins and advertises its previous assignment (for sticky assignors); a cooperative member
keeps consuming, advertises what it owns, revokes only what its new assignment lacks, and
then rejoins at once so the partition can reach its new owner (KIP-429). The leader runs the
chosen assignor over every member's decoded subscription and the partition counts the driver
looked up; a JoinGroup answer that names this member leader but lists no members (a static
member's takeover) keeps the stored assignment. Newly assigned partitions start at their
committed offsets (one OffsetFetch; None: the driver applies ``auto_offset_reset``).

Pure: no I/O, no clock, no threads; drivers serialise access.
"""

from __future__ import annotations

import enum
from typing import Any, Generator, Iterable, Mapping

import attrs

from rivven_broker.client.errors import RivvenError, error_for
from rivven_broker.client.types import TopicPartition
from rivven_broker.protocol import limits
from rivven_broker.protocol.assignors import (
    COOPERATIVE,
    assign,
    members_from_subscriptions,
    rebalance_protocol,
)
from rivven_broker.protocol.consumer_protocol import (
    Assignment,
    ConsumerProtocolError,
    Subscription,
)
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.group_messages import (
    CONSUMER_PROTOCOL_TYPE,
    NO_GENERATION,
    Heartbeat,
    JoinGroup,
    JoinGroupProtocol,
    LeaveGroup,
    LeaveGroupMember,
    OffsetCommit,
    OffsetCommitPartition,
    OffsetCommitTopic,
    OffsetFetch,
    OffsetFetchTopic,
    SyncGroup,
    SyncGroupAssignment,
)

__all__ = [
    "MemberState",
    "GroupSettings",
    "Send",
    "PartitionCounts",
    "Revoke",
    "Assign",
    "Sleep",
    "GroupCore",
    "COORDINATOR_CODES",
    "FENCING_CODES",
    "committed_offsets",
]

#: Codes that mean "find the coordinator again, then retry".
COORDINATOR_CODES = frozenset(
    {
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    }
)
#: Codes by which the coordinator tells a member its membership is stale.
FENCING_CODES = frozenset(
    {
        ErrorCode.REBALANCE_IN_PROGRESS,
        ErrorCode.ILLEGAL_GENERATION,
        ErrorCode.UNKNOWN_MEMBER_ID,
        ErrorCode.FENCED_INSTANCE_ID,
    }
)
#: Extra time a JoinGroup or SyncGroup answer may take beyond the rebalance timeout.
_HELD_GRACE_MS = 5_000
_FATAL_JOIN_CODES = frozenset(
    {
        ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
        ErrorCode.INVALID_SESSION_TIMEOUT,
        ErrorCode.INVALID_GROUP_ID,
        ErrorCode.GROUP_MAX_SIZE_REACHED,
        ErrorCode.FENCED_INSTANCE_ID,
    }
)


class MemberState(enum.Enum):
    UNJOINED = "unjoined"
    JOINING = "joining"  # a JoinGroup or SyncGroup is out
    STABLE = "stable"  # has the assignment of ``generation``


@attrs.frozen
class GroupSettings:
    """The membership knobs of one consumer (checked by ``ConsumerConfig``)."""

    group_id: str
    group_instance_id: str | None = None
    session_timeout_ms: int = limits.session_timeout_ms_default
    rebalance_timeout_ms: int = 60_000
    heartbeat_interval_ms: int = 3_000
    assignors: tuple[str, ...] = ("cooperative-sticky",)
    retry_backoff_ms: int = 100
    max_poll_interval_ms: int = 300_000

    def __attrs_post_init__(self) -> None:
        assert self.assignors and 0 < self.heartbeat_interval_ms < self.session_timeout_ms
        assert self.max_poll_interval_ms >= self.heartbeat_interval_ms

    @classmethod
    def of(cls, config: Any, retry_backoff_ms: int) -> GroupSettings:
        """The settings of a ``ConsumerConfig`` with a ``group_id`` (both drivers use this)."""
        assert config.group_id is not None
        return cls(
            config.group_id, config.group_instance_id, config.session_timeout_ms,
            config.rebalance_timeout_ms, config.heartbeat_interval_ms,
            config.partition_assignment_strategy, retry_backoff_ms, config.max_poll_interval_ms,
        )


@attrs.frozen
class Send:
    """Send ``request`` to the coordinator; reply with ``(response, error)``. ``timeout_ms``
    None: the driver's request timeout."""

    request: Any
    timeout_ms: int | None = None


@attrs.frozen
class PartitionCounts:
    """Reply with ``{topic: partition count}`` for those of ``topics`` that exist."""

    topics: tuple[str, ...]


@attrs.frozen
class Revoke:
    """Stop owning ``partitions`` (``core.owned`` no longer has them). Unless ``lost``, commit
    their positions first if auto-commit is on; then call on_revoke (on_lost when lost)."""

    partitions: frozenset[TopicPartition]
    lost: bool = False


@attrs.frozen
class Assign:
    """``added`` are new: start each at ``committed[tp]`` (None: auto_offset_reset), make
    ``core.owned`` the fetch assignment, call on_assign."""

    added: frozenset[TopicPartition]
    committed: Mapping[TopicPartition, int | None]


@attrs.frozen
class Sleep:
    """Wait ``ms`` before going on (a backoff)."""

    ms: int


Action = Send | PartitionCounts | Revoke | Assign | Sleep


def committed_offsets(response: Any) -> dict[TopicPartition, int | None]:
    """``{tp: committed offset or None}`` from an OffsetFetchResponse.

    Raises:
        BrokerError: the answer carries a group-level error.
    """
    if response.error_code != ErrorCode.NONE:
        raise error_for(response.error_code, "fetching committed offsets")
    out: dict[TopicPartition, int | None] = {}
    for topic in response.topics:
        for part in topic.partitions:
            ok = part.error_code == ErrorCode.NONE and part.offset >= 0
            out[TopicPartition(topic.name, part.partition)] = part.offset if ok else None
    return out


def _grouped(partitions: Iterable[TopicPartition]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = {}
    for tp in sorted(partitions):
        grouped.setdefault(tp.topic, []).append(tp.partition)
    return grouped


class GroupCore:
    """One member's view of its group. See the module docstring. Not thread-safe."""

    def __init__(self, settings: GroupSettings) -> None:
        self.settings = settings
        self.cooperative = all(rebalance_protocol(n) == COOPERATIVE for n in settings.assignors)
        self.member_id = ""
        self.generation = NO_GENERATION
        self.protocol_name: str | None = None
        self.leader_id = ""
        self.state = MemberState.UNJOINED
        self.owned: frozenset[TopicPartition] = frozenset()
        self.topics: frozenset[str] = frozenset()
        self.subscribed = False
        self.fatal: RivvenError | None = None
        self.coordinator_unknown = True
        #: Partition counts the leader assigned from (0: missing), to notice changes.
        self.assigned_counts: dict[str, int] = {}
        self._previous: frozenset[TopicPartition] = frozenset()  # eager: for stickiness
        self._rejoin = True
        self._lost: frozenset[TopicPartition] = frozenset()
        #: When ``poll`` last started or returned (None: never polled), and whether it runs.
        self.last_poll_ms: int | None = None
        self.in_poll = False

    # --- subscription --------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str]) -> None:
        """Set the subscribed topics; a change makes the member rejoin."""
        topics = frozenset(topics)
        if topics != self.topics or not self.subscribed:
            self._rejoin = True
        self.topics = topics
        self.subscribed = True

    def request_rejoin(self) -> None:
        self._rejoin = True

    @property
    def is_leader(self) -> bool:
        return self.state is MemberState.STABLE and self.leader_id == self.member_id

    def needs_attention(self) -> bool:
        """True when ``rebalance()`` has work (a rejoin, lost partitions, a fatal error)."""
        return self.subscribed and (
            self._rejoin or bool(self._lost) or self.fatal is not None
            or self.state is not MemberState.STABLE
        )

    # --- the rebalance -------------------------------------------------------------------

    def rebalance(self) -> Generator[Action, Any, None]:
        """Join and sync until Stable (see the module docstring). Raises the fatal error."""
        assert self.subscribed
        while self.needs_attention():
            if self.fatal is not None:
                raise self.fatal
            if self._lost:
                lost, self._lost = self._lost, frozenset()
                yield Revoke(lost, lost=True)
            if not self.cooperative and self.owned:
                self._previous, self.owned = self.owned, frozenset()
                yield Revoke(self._previous)
            self.state, self._rejoin = MemberState.JOINING, False
            response, error = yield Send(self._join_request(), self._held_timeout_ms())
            if not (yield from self._joined(response, error)):
                continue
            assignments: tuple[SyncGroupAssignment, ...] = ()
            if response.leader == self.member_id and response.members:
                assignments = yield from self._assign(response.members)
            request = SyncGroup(
                self.settings.group_id, self.generation, self.member_id,
                self.settings.group_instance_id, assignments,
            )
            response, error = yield Send(request, self._held_timeout_ms())
            new = yield from self._synced(response, error)
            if new is None:
                continue
            yield from self._take(new)

    def _held_timeout_ms(self) -> int:
        return self.settings.rebalance_timeout_ms + _HELD_GRACE_MS

    def _join_request(self) -> JoinGroup:
        owned = self.owned if self.cooperative else self._previous
        metadata = Subscription(sorted(self.topics), sorted(owned), self.generation).encode()
        return JoinGroup(
            self.settings.group_id,
            self.member_id,
            self.settings.group_instance_id,
            self.settings.session_timeout_ms,
            self.settings.rebalance_timeout_ms,
            CONSUMER_PROTOCOL_TYPE,
            tuple(JoinGroupProtocol(name, metadata) for name in self.settings.assignors),
        )

    def _failed(self, error: RivvenError) -> Generator[Action, Any, None]:
        """A join/sync/fetch request failed as a whole: back off (or give up)."""
        self.state = MemberState.UNJOINED if self.state is MemberState.JOINING else self.state
        self._rejoin = True
        if not error.retriable:
            self.fatal = error
            raise error
        self.coordinator_unknown = True
        yield Sleep(self.settings.retry_backoff_ms)

    def _refused(self, code: ErrorCode, what: str) -> Generator[Action, Any, None]:
        """The coordinator answered a join or sync with ``code`` (not NONE)."""
        self.state = MemberState.UNJOINED
        self._rejoin = True
        if code in COORDINATOR_CODES:
            self.coordinator_unknown = True
            yield Sleep(self.settings.retry_backoff_ms)
        elif code in FENCING_CODES:
            self._fenced(code)
            if self.fatal is not None:
                raise self.fatal
        elif code in _FATAL_JOIN_CODES or not code.retriable:
            self.fatal = error_for(code, f"{what} of group {self.settings.group_id!r}")
            raise self.fatal
        else:
            yield Sleep(self.settings.retry_backoff_ms)

    def _joined(self, response: Any, error: RivvenError | None) -> Generator[Action, Any, bool]:
        if error is not None:
            yield from self._failed(error)
            return False
        code = response.error_code
        if code == ErrorCode.MEMBER_ID_REQUIRED:
            self.member_id, self._rejoin = response.member_id, True
            return False
        if code != ErrorCode.NONE:
            yield from self._refused(code, "join")
            return False
        self.generation = response.generation_id
        self.member_id = response.member_id
        self.protocol_name = response.protocol_name
        self.leader_id = response.leader
        return True

    def _assign(self, members: Iterable[Any]) -> Generator[Action, Any, tuple]:
        """Run the chosen assignor as the leader."""
        try:
            decoded = [(m.member_id, m.group_instance_id, Subscription.decode(m.metadata))
                       for m in members]
        except ConsumerProtocolError as exc:
            self.fatal = error_for(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, str(exc))
            raise self.fatal from exc
        topics = sorted({t for _, _, sub in decoded for t in sub.topics})
        counts = yield PartitionCounts(tuple(topics))
        self.assigned_counts = {topic: counts.get(topic, 0) for topic in topics}
        assert self.protocol_name is not None
        result = assign(self.protocol_name, members_from_subscriptions(decoded), counts)
        return tuple(
            SyncGroupAssignment(member_id, Assignment(parts).encode())
            for member_id, parts in result.items()
        )

    def _synced(
        self, response: Any, error: RivvenError | None
    ) -> Generator[Action, Any, frozenset[TopicPartition] | None]:
        if error is not None:
            yield from self._failed(error)
            return None
        if response.error_code != ErrorCode.NONE:
            yield from self._refused(response.error_code, "sync")
            return None
        try:
            pairs = Assignment.decode(response.assignment).partitions
        except ConsumerProtocolError as exc:
            self.fatal = error_for(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, str(exc))
            raise self.fatal from exc
        return frozenset(TopicPartition(topic, partition) for topic, partition in pairs)

    def _take(self, new: frozenset[TopicPartition]) -> Generator[Action, Any, None]:
        """Become Stable with ``new``: revoke what it lacks, start what it adds."""
        self.state = MemberState.STABLE
        revoked = self.owned - new
        added = new - self.owned
        if revoked:
            self.owned = self.owned & new
            yield Revoke(revoked)
            if self.cooperative:
                self._rejoin = True  # so the revoked partitions reach their new owners
        self.owned = new
        self._previous = frozenset()
        if added:
            committed = yield from self.fetch_committed(added)
            yield Assign(added, committed)

    def fetch_committed(
        self, partitions: Iterable[TopicPartition]
    ) -> Generator[Action, Any, dict[TopicPartition, int | None]]:
        """The committed offsets of ``partitions`` (one OffsetFetch, retried on retriable
        failures). Raises a non-retriable failure."""
        partitions = frozenset(partitions)
        while True:
            response, error = yield Send(self.offset_fetch_request(partitions))
            if error is None and response.error_code in COORDINATOR_CODES:
                self.coordinator_unknown = True
                error = error_for(response.error_code, "fetching committed offsets")
            if error is not None:
                if not error.retriable:
                    raise error
                yield Sleep(self.settings.retry_backoff_ms)
                continue
            found = committed_offsets(response)
            return {tp: found.get(tp) for tp in partitions}

    # --- single requests ---------------------------------------------------------------

    def offset_fetch_request(self, partitions: Iterable[TopicPartition]) -> OffsetFetch:
        topics = tuple(OffsetFetchTopic(t, tuple(ps)) for t, ps in _grouped(partitions).items())
        return OffsetFetch(self.settings.group_id, topics)

    def heartbeat_request(self) -> Heartbeat | None:
        """A Heartbeat when the member is Stable, else None."""
        if self.state is not MemberState.STABLE or not self.member_id:
            return None
        return Heartbeat(
            self.settings.group_id, self.generation, self.member_id,
            self.settings.group_instance_id,
        )

    def on_heartbeat(self, request: Heartbeat, code: ErrorCode) -> None:
        """Apply a heartbeat's answer (ignored when it is about an older generation)."""
        if code == ErrorCode.NONE or not self._current(request.generation_id, request.member_id):
            return
        if code in COORDINATOR_CODES:
            self.coordinator_unknown = True
        elif code in FENCING_CODES:
            self._fenced(code)

    def commit_request(
        self, offsets: Mapping[TopicPartition, tuple[int, str | None]]
    ) -> OffsetCommit:
        """An OffsetCommit for ``offsets`` (tp -> (next offset, metadata)): as a member of the
        current generation when there is one, else a simple commit (generation -1)."""
        topics = []
        grouped: dict[str, list[OffsetCommitPartition]] = {}
        for tp, (offset, metadata) in sorted(offsets.items()):
            part = OffsetCommitPartition(tp.partition, offset, metadata)
            grouped.setdefault(tp.topic, []).append(part)
        for name, parts in grouped.items():
            topics.append(OffsetCommitTopic(name, tuple(parts)))
        if self.generation >= 0 and self.member_id and self.state is not MemberState.UNJOINED:
            return OffsetCommit(
                self.settings.group_id, self.generation, self.member_id,
                self.settings.group_instance_id, tuple(topics),
            )
        return OffsetCommit(self.settings.group_id, NO_GENERATION, "", None, tuple(topics))

    def on_commit_response(
        self, request: OffsetCommit, response: Any
    ) -> dict[TopicPartition, ErrorCode]:
        """Per-partition outcomes of a commit; applies fencing codes of a member commit."""
        out: dict[TopicPartition, ErrorCode] = {}
        for topic in response.topics:
            for part in topic.partitions:
                code = ErrorCode.from_wire(part.error_code)
                out[TopicPartition(topic.name, part.partition)] = code
        codes = set(out.values())
        if request.generation_id >= 0 and self._current(request.generation_id, request.member_id):
            for code in sorted(codes & FENCING_CODES, key=int):
                self._fenced(code)
        if codes & COORDINATOR_CODES:
            self.coordinator_unknown = True
        return out

    def leave_request(self) -> LeaveGroup | None:
        """The LeaveGroup a closing dynamic member sends (None: static or not a member).
        The member is reset to unjoined either way."""
        request = None
        if self.member_id and self.settings.group_instance_id is None:
            member = LeaveGroupMember(self.member_id, None)
            request = LeaveGroup(self.settings.group_id, (member,))
        self.member_id = ""
        self.generation = NO_GENERATION
        self.state = MemberState.UNJOINED
        self.owned = frozenset()
        self._rejoin = True
        self.subscribed = False
        return request

    # --- the poll interval (KIP-62) -------------------------------------------------------

    def on_poll(self, now_ms: int) -> None:
        """The application is inside ``poll`` (called at its start, may repeat)."""
        self.last_poll_ms, self.in_poll = now_ms, True

    def on_poll_end(self, now_ms: int) -> None:
        """``poll`` returned (or raised): the poll interval starts counting from ``now_ms``."""
        self.last_poll_ms, self.in_poll = now_ms, False

    def poll_idle_ms(self, now_ms: int) -> int:
        """How long the application has been out of ``poll`` (0 inside it or never polled)."""
        if self.in_poll or self.last_poll_ms is None:
            return 0
        return max(now_ms - self.last_poll_ms, 0)

    def poll_timeout_expired(self, now_ms: int) -> bool:
        """True when this member must leave: it is in the group (joined or joining) and the
        application has been out of ``poll`` for more than ``max_poll_interval_ms``."""
        member = bool(self.member_id) and self.state is not MemberState.UNJOINED
        return member and self.poll_idle_ms(now_ms) > self.settings.max_poll_interval_ms

    def leave_for_poll_timeout(self) -> LeaveGroup | None:
        """Leave the group because ``poll`` was not called in time: owned partitions become
        lost, the member must rejoin (at the next ``poll``) with a fresh member id. Returns
        the LeaveGroup to send, None for a static member (its session timeout expires it)."""
        assert self.member_id and self.state is not MemberState.UNJOINED
        request = None
        if self.settings.group_instance_id is None:
            member = LeaveGroupMember(self.member_id, None)
            request = LeaveGroup(self.settings.group_id, (member,))
        self._lost = self._lost | self.owned
        self.owned = frozenset()
        self._previous = frozenset()
        self.member_id = ""
        self.generation = NO_GENERATION
        self.state = MemberState.UNJOINED
        self._rejoin = True
        return request

    # --- fencing -------------------------------------------------------------------------

    def _current(self, generation: int, member_id: str) -> bool:
        return generation == self.generation and member_id == self.member_id

    def _fenced(self, code: ErrorCode) -> None:
        self._rejoin = True
        if code == ErrorCode.REBALANCE_IN_PROGRESS:
            return
        if code == ErrorCode.FENCED_INSTANCE_ID:
            self.fatal = error_for(code, f"another consumer took group instance id "
                                         f"{self.settings.group_instance_id!r}")
            return
        self._lost = self._lost | self.owned  # ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID
        self.owned = frozenset()
        self.generation = NO_GENERATION
        self.state = MemberState.UNJOINED
        if code == ErrorCode.UNKNOWN_MEMBER_ID:
            self.member_id = ""

    def check_invariants(self) -> None:
        assert not (self._lost & self.owned)
        assert self.state is not MemberState.STABLE or self.generation >= 0
