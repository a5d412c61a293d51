"""Consumer-group administration, the pure half: result types and answer readers.

Theory of operation
-------------------
``Admin.list_groups``/``describe_group``/``delete_group``/``reset_offsets`` (blocking and
trio) send ListGroups, DescribeGroup, OffsetFetch, ListOffsets, DeleteGroup and OffsetCommit
requests; this module turns the answers into the plain result types below and parses the
``--to`` of ``reset-offsets``. In a cluster a group's coordinator is the leader of its
``__consumer_offsets`` partition and moves with it: ``coordinator_code`` says when an answer
means "ask FindCoordinator again" (the drivers retry within ``COORDINATOR_WAIT_MS``), and
``merged_listings`` joins the ListGroups answers of every broker (each lists the groups it
coordinates). A description joins three answers: the members (with their
assignments decoded from the consumer protocol), the committed offsets, and the partitions'
log end offsets (high watermarks), giving the lag per partition. Pure: no I/O.
"""

from __future__ import annotations

import random
from typing import Any, Iterable, Mapping, NamedTuple

from rivven_broker.client.errors import RivvenError, error_for
from rivven_broker.client.requests import raise_for
from rivven_broker.client.retry import RetryPolicy
from rivven_broker.client.types import TopicPartition
from rivven_broker.protocol.consumer_protocol import Assignment, ConsumerProtocolError
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.group_messages import CONSUMER_PROTOCOL_TYPE

__all__ = [
    "COORDINATOR_WAIT_MS",
    "coordinator_code",
    "CoordinatorSearch",
    "merged_listings",
    "GroupListing",
    "GroupMemberInfo",
    "GroupPartitionOffset",
    "GroupDescription",
    "group_listings",
    "group_description",
    "ResetTarget",
    "parse_reset_target",
]


class GroupListing(NamedTuple):
    """One group: its protocol type ("" for offsets-only groups) and state."""

    group_id: str
    protocol_type: str
    state: str


class GroupMemberInfo(NamedTuple):
    """One member and the partitions assigned to it (empty unless the group is Stable)."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    assignment: tuple[TopicPartition, ...]


class GroupPartitionOffset(NamedTuple):
    """A partition of a group: committed offset (None: none), log end offset (the high
    watermark; None: unknown), lag (None unless both are known) and owner ("" if none)."""

    topic: str
    partition: int
    committed_offset: int | None
    log_end_offset: int | None
    lag: int | None
    member_id: str


class GroupDescription(NamedTuple):
    """What ``describe_group`` reports."""

    group_id: str
    state: str
    protocol_type: str
    protocol: str
    members: tuple[GroupMemberInfo, ...]
    partitions: tuple[GroupPartitionOffset, ...]


def group_listings(response: Any) -> list[GroupListing]:
    """The groups of a ListGroupsResponse, sorted. Raises the answer's error."""
    if response.error_code != ErrorCode.NONE:
        raise error_for(response.error_code, "list groups")
    return sorted(GroupListing(g.group_id, g.protocol_type, g.state) for g in response.groups)


def merged_listings(responses: Iterable[Any]) -> list[GroupListing]:
    """The groups of every broker's ListGroupsResponse, each once, sorted. Raises the first
    answer's error."""
    return sorted({item for response in responses for item in group_listings(response)})


#: How long an Admin group call keeps finding a coordinator that moved or is loading.
COORDINATOR_WAIT_MS = 15_000

_COORDINATOR_CODES = frozenset({ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR,
                                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS})


class CoordinatorSearch:
    """When an Admin group call asks for its coordinator again: the decisions both drivers
    follow (they only call and sleep). Pure: ``now_ms`` is passed in, the jitter comes from
    the driver's ``rng``."""

    def __init__(self, group_id: str, now_ms: int, rng: random.Random,
                 policy: RetryPolicy = RetryPolicy()) -> None:
        self.group_id = group_id
        self._deadline_ms = now_ms + COORDINATOR_WAIT_MS
        self._rng = rng
        self._policy = policy
        self._attempts = 0

    def answered(self, response: Any, what: str) -> RivvenError | None:
        """None when ``response`` (to FindCoordinator or the call) is final; the error to
        retry on when it says the coordinator moved. Raises a final error answer of a
        FindCoordinator."""
        code = coordinator_code(response)
        if code is not None:
            return error_for(code, f"the coordinator of {self.group_id!r}")
        if what == "find":
            raise_for(response.error_code, None, f"find the coordinator of {self.group_id!r}")
        return None

    def retry_in_ms(self, failure: RivvenError, now_ms: int) -> int:
        """How long to wait before trying again. Raises ``failure`` when it is not
        retriable or the search is out of time."""
        if not failure.retriable:
            raise failure
        self._attempts += 1
        wait_ms = self._policy.backoff_ms(self._attempts, self._rng)
        if now_ms + wait_ms >= self._deadline_ms:
            raise failure
        return wait_ms


def coordinator_code(response: Any) -> ErrorCode | None:
    """The coordinator error a group answer carries (the coordinator moved, is loading or is
    not there yet: find it again), else None. OffsetCommit answers carry it per partition."""
    code = getattr(response, "error_code", None)
    if code is None:
        code = next((p.error_code for t in getattr(response, "topics", ())
                     for p in t.partitions), None)
    return code if code in _COORDINATOR_CODES else None


def _assignment(protocol_type: str, data: bytes) -> tuple[TopicPartition, ...]:
    if protocol_type != CONSUMER_PROTOCOL_TYPE or not data:
        return ()
    try:
        pairs = Assignment.decode(data).partitions
    except ConsumerProtocolError:
        return ()
    return tuple(TopicPartition(topic, partition) for topic, partition in pairs)


def group_members(describe: Any) -> tuple[GroupMemberInfo, ...]:
    """Members of a DescribeGroupResponse (raises its error, e.g. GROUP_ID_NOT_FOUND)."""
    if describe.error_code != ErrorCode.NONE:
        raise error_for(describe.error_code, f"describe group {describe.group_id!r}")
    return tuple(
        GroupMemberInfo(
            m.member_id, m.group_instance_id, m.client_id, m.client_host,
            _assignment(describe.protocol_type, m.assignment),
        )
        for m in describe.members
    )


def group_description(
    describe: Any,
    committed: Mapping[TopicPartition, int | None],
    log_ends: Mapping[TopicPartition, int],
) -> GroupDescription:
    """Join a DescribeGroupResponse, committed offsets and log end offsets."""
    members = group_members(describe)
    owner = {tp: m.member_id for m in members for tp in m.assignment}
    rows = []
    for tp in sorted(set(committed) | set(owner)):
        offset = committed.get(tp)
        end = log_ends.get(tp)
        lag = None if offset is None or end is None else max(end - offset, 0)
        rows.append(GroupPartitionOffset(tp.topic, tp.partition, offset, end, lag,
                                         owner.get(tp, "")))
    return GroupDescription(
        describe.group_id, describe.state, describe.protocol_type, describe.protocol,
        members, tuple(rows),
    )


def partitions_of(members: Iterable[GroupMemberInfo]) -> set[TopicPartition]:
    return {tp for m in members for tp in m.assignment}


class ResetTarget(NamedTuple):
    """Where ``reset_offsets`` moves a group: ``kind`` is earliest, latest, offset, timestamp
    or shift; ``value`` the offset, the timestamp in ms, or the shift (may be negative)."""

    kind: str
    value: int = 0


def parse_reset_target(to: Any) -> ResetTarget:
    """``"earliest"``, ``"latest"``, an offset (int or digits), ``"timestamp=MS"`` or
    ``"shift=N"`` (N may be negative).

    Raises:
        ValueError: anything else.
    """
    if isinstance(to, int) and not isinstance(to, bool):
        if to < 0:
            raise ValueError("an offset to reset to must be >= 0")
        return ResetTarget("offset", to)
    if isinstance(to, str):
        text = to.strip().lower()
        if text in ("earliest", "latest"):
            return ResetTarget(text)
        if text.isdigit():
            return ResetTarget("offset", int(text))
        kind, _, value = text.partition("=")
        if kind in ("timestamp", "shift") and value.lstrip("-").isdigit():
            return ResetTarget(kind, int(value))
    raise ValueError(f"reset to earliest, latest, OFFSET, timestamp=MS or shift=N, not {to!r}")


def plan_reset(target: ResetTarget, partitions: Iterable[TopicPartition],
               committed: Mapping[TopicPartition, int | None],
               earliest: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int],
               at_timestamp: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
    """The new committed offset of each partition (both admin drivers gather the offsets,
    this decides). ``at_timestamp``: the ListOffsets answer for a timestamp target (-1: no
    record at or after it, so the log end). A shift moves from the committed offset (the
    earliest when there is none) and stays within ``[earliest, latest]``, as Kafka's tool."""
    plan = {}
    for tp in sorted(partitions):
        if target.kind == "earliest":
            plan[tp] = earliest[tp]
        elif target.kind == "latest":
            plan[tp] = latest[tp]
        elif target.kind == "timestamp":
            found = at_timestamp.get(tp, -1)
            plan[tp] = found if found >= 0 else latest[tp]
        elif target.kind == "shift":
            start = committed.get(tp)
            start = earliest[tp] if start is None else start
            plan[tp] = min(max(start + target.value, earliest[tp]), latest[tp])
        else:
            plan[tp] = target.value
    return plan

