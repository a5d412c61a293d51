"""Consumer-group messages: membership (join, sync, heartbeat, leave), offsets, administration.

Theory of operation
-------------------
A consumer group is run by one broker, its *coordinator* (``FindCoordinator`` says which).
Members join (``JoinGroup``), the coordinator closes the round and names a leader, the leader
computes the assignment with an assignor of the chosen protocol and hands it back
(``SyncGroup``), every member receives its share, and all of them keep their session alive with
``Heartbeat`` until they ``LeaveGroup`` or stop. Offsets are committed (``OffsetCommit``) and
read back (``OffsetFetch``) per group; ``ListGroups``, ``DescribeGroup`` and ``DeleteGroup``
are for operators. The coordinator's behaviour is in ``rivven_broker/coordinator/``; this
module only declares the wire shapes.

The broker never looks inside a member's protocol ``metadata`` (its subscription) or an
``assignment``: both are opaque bytes, encoded by the consumer protocol
(``consumer_protocol.py``) on the client side. Like every message, these validate their
structure on construction (sizes, types, ranges) and nothing more; a bad group id or session
timeout is answered by the coordinator with an error code.

Special values: ``member_id`` "" on a first join (the broker assigns one); ``generation_id``
-1 in ``OffsetCommit`` for a commit without group membership; ``offset`` -1 in
``OffsetFetch`` answers for "nothing committed"; ``group_instance_id`` None for dynamic
members.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.message_base import (
    ApiKey,
    Request,
    Response,
    Struct,
    blob,
    boolean,
    choice,
    error_code,
    i32,
    i64,
    ints,
    structs,
    text,
)

__all__ = [
    "CONSUMER_PROTOCOL_TYPE",
    "NO_GENERATION",
    "COORDINATOR_KEY_GROUP",
    "COORDINATOR_KEY_TRANSACTION",
    "GROUP_STATES",
    "JoinGroup",
    "JoinGroupProtocol",
    "JoinGroupResponse",
    "JoinGroupMember",
    "SyncGroup",
    "SyncGroupAssignment",
    "SyncGroupResponse",
    "Heartbeat",
    "HeartbeatResponse",
    "LeaveGroup",
    "LeaveGroupMember",
    "LeaveGroupResponse",
    "LeaveGroupMemberResponse",
    "OffsetCommit",
    "OffsetCommitTopic",
    "OffsetCommitPartition",
    "OffsetCommitResponse",
    "OffsetCommitTopicResponse",
    "OffsetCommitPartitionResponse",
    "OffsetFetch",
    "OffsetFetchTopic",
    "OffsetFetchResponse",
    "OffsetFetchTopicResponse",
    "OffsetFetchPartitionResponse",
    "ListGroups",
    "ListGroupsResponse",
    "GroupListing",
    "DescribeGroup",
    "DescribeGroupResponse",
    "GroupMemberDescription",
    "DeleteGroup",
    "DeleteGroupResponse",
    "FindCoordinator",
    "FindCoordinatorResponse",
]

#: The protocol type of Kafka-style consumers (the only one our clients speak).
CONSUMER_PROTOCOL_TYPE = "consumer"
#: ``generation_id`` of a commit made outside group membership (admin tools, manual assign).
NO_GENERATION = -1
COORDINATOR_KEY_GROUP = 0
COORDINATOR_KEY_TRANSACTION = 1
#: The names a group's ``state`` may have in ListGroups and DescribeGroup answers.
GROUP_STATES = ("Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead")

_NAME = limits.wire_name_bytes_max
_MEMBER = limits.member_id_bytes_max
_INSTANCE = limits.group_instance_id_bytes_max
_PROTOCOL = limits.group_protocol_name_bytes_max
_METADATA = limits.offset_metadata_bytes_max


# --- JoinGroup -------------------------------------------------------------------------------


@attrs.frozen
class JoinGroupProtocol(Struct):
    """One assignor the member can use, most preferred first, with its subscription bytes."""

    name: str = text(_PROTOCOL)
    metadata: bytes = blob(b"")


@attrs.frozen
class JoinGroup(Request):
    """Join (or rejoin) a group. The answer may wait until the rebalance round closes."""

    API_KEY: ClassVar[ApiKey] = ApiKey.JOIN_GROUP
    group_id: str = text(_NAME)
    member_id: str = text(_MEMBER, "")
    group_instance_id: str | None = text(_INSTANCE, None, nullable=True)
    session_timeout_ms: int = i32(limits.session_timeout_ms_default, lo=0)
    rebalance_timeout_ms: int = i32(limits.rebalance_timeout_ms_default, lo=0)
    protocol_type: str = text(_PROTOCOL, CONSUMER_PROTOCOL_TYPE)
    protocols: tuple[JoinGroupProtocol, ...] = structs(JoinGroupProtocol)


@attrs.frozen
class JoinGroupMember(Struct):
    """A member as the leader sees it: its ids and its subscription for the chosen protocol."""

    member_id: str = text(_MEMBER)
    group_instance_id: str | None = text(_INSTANCE, None, nullable=True)
    metadata: bytes = blob(b"")


@attrs.frozen
class JoinGroupResponse(Response):
    """The closed round: generation, chosen protocol, leader, this member's id, and (to the
    leader only) every member with its subscription."""

    API_KEY: ClassVar[ApiKey] = ApiKey.JOIN_GROUP
    error_code: ErrorCode = error_code()
    generation_id: int = i32(-1)
    protocol_type: str | None = text(_PROTOCOL, None, nullable=True)
    protocol_name: str | None = text(_PROTOCOL, None, nullable=True)
    leader: str = text(_MEMBER, "")
    member_id: str = text(_MEMBER, "")
    members: tuple[JoinGroupMember, ...] = structs(JoinGroupMember)


# --- SyncGroup -------------------------------------------------------------------------------


@attrs.frozen
class SyncGroupAssignment(Struct):
    """The leader's assignment for one member (consumer-protocol bytes)."""

    member_id: str = text(_MEMBER)
    assignment: bytes = blob(b"")


@attrs.frozen
class SyncGroup(Request):
    """Fetch this member's assignment; the leader also sends everyone's."""

    API_KEY: ClassVar[ApiKey] = ApiKey.SYNC_GROUP
    group_id: str = text(_NAME)
    generation_id: int = i32()
    member_id: str = text(_MEMBER)
    group_instance_id: str | None = text(_INSTANCE, None, nullable=True)
    assignments: tuple[SyncGroupAssignment, ...] = structs(SyncGroupAssignment)


@attrs.frozen
class SyncGroupResponse(Response):
    """This member's assignment for the generation, or why not."""

    API_KEY: ClassVar[ApiKey] = ApiKey.SYNC_GROUP
    error_code: ErrorCode = error_code()
    assignment: bytes = blob(b"")


# --- Heartbeat -------------------------------------------------------------------------------


@attrs.frozen
class Heartbeat(Request):
    """Keep the session alive; the answer says whether a rebalance is under way."""

    API_KEY: ClassVar[ApiKey] = ApiKey.HEARTBEAT
    group_id: str = text(_NAME)
    generation_id: int = i32()
    member_id: str = text(_MEMBER)
    group_instance_id: str | None = text(_INSTANCE, None, nullable=True)


@attrs.frozen
class HeartbeatResponse(Response):
    """NONE, or REBALANCE_IN_PROGRESS (rejoin), or a fencing error."""

    API_KEY: ClassVar[ApiKey] = ApiKey.HEARTBEAT
    error_code: ErrorCode = error_code()


# --- LeaveGroup ------------------------------------------------------------------------------


@attrs.frozen
class LeaveGroupMember(Struct):
    """A member leaving; a static member may be named by its instance id alone."""

    member_id: str = text(_MEMBER, "")
    group_instance_id: str | None = text(_INSTANCE, None, nullable=True)


@attrs.frozen
class LeaveGroup(Request):
    """Members leave at once (the rest rebalance without waiting for a session timeout)."""

    API_KEY: ClassVar[ApiKey] = ApiKey.LEAVE_GROUP
    group_id: str = text(_NAME)
    members: tuple[LeaveGroupMember, ...] = structs(LeaveGroupMember)


@attrs.frozen
class LeaveGroupMemberResponse(Struct):
    """The outcome for one leaving member."""

    member_id: str = text(_MEMBER, "")
    group_instance_id: str | None = text(_INSTANCE, None, nullable=True)
    error_code: ErrorCode = error_code()


@attrs.frozen
class LeaveGroupResponse(Response):
    """A group-level error (e.g. INVALID_GROUP_ID), else per-member outcomes."""

    API_KEY: ClassVar[ApiKey] = ApiKey.LEAVE_GROUP
    error_code: ErrorCode = error_code()
    members: tuple[LeaveGroupMemberResponse, ...] = structs(LeaveGroupMemberResponse)


# --- OffsetCommit ----------------------------------------------------------------------------


@attrs.frozen
class OffsetCommitPartition(Struct):
    """The next offset to read in one partition, with optional application metadata."""

    partition: int = i32()
    offset: int = i64(lo=0)
    metadata: str | None = text(_METADATA, None, nullable=True)


@attrs.frozen
class OffsetCommitTopic(Struct):
    """The partitions committed in one topic."""

    name: str = text(_NAME)
    partitions: tuple[OffsetCommitPartition, ...] = structs(OffsetCommitPartition)


@attrs.frozen
class OffsetCommit(Request):
    """Commit offsets. A member sends its generation and ids; ``generation_id`` -1 with an
    empty ``member_id`` commits without membership (the group must have no members)."""

    API_KEY: ClassVar[ApiKey] = ApiKey.OFFSET_COMMIT
    group_id: str = text(_NAME)
    generation_id: int = i32(NO_GENERATION)
    member_id: str = text(_MEMBER, "")
    group_instance_id: str | None = text(_INSTANCE, None, nullable=True)
    topics: tuple[OffsetCommitTopic, ...] = structs(OffsetCommitTopic)


@attrs.frozen
class OffsetCommitPartitionResponse(Struct):
    """The outcome for one partition (answered only once the commit is durable)."""

    partition: int = i32()
    error_code: ErrorCode = error_code()


@attrs.frozen
class OffsetCommitTopicResponse(Struct):
    """Per-partition outcomes in one topic."""

    name: str = text(_NAME)
    partitions: tuple[OffsetCommitPartitionResponse, ...] = structs(OffsetCommitPartitionResponse)


@attrs.frozen
class OffsetCommitResponse(Response):
    """The answer to ``OffsetCommit``; group-level errors are repeated on every partition."""

    API_KEY: ClassVar[ApiKey] = ApiKey.OFFSET_COMMIT
    topics: tuple[OffsetCommitTopicResponse, ...] = structs(OffsetCommitTopicResponse)


# --- OffsetFetch -----------------------------------------------------------------------------


@attrs.frozen
class OffsetFetchTopic(Struct):
    """The partitions asked about in one topic."""

    name: str = text(_NAME)
    partitions: tuple[int, ...] = ints()


@attrs.frozen
class OffsetFetch(Request):
    """Committed offsets of a group. ``all_topics``: every committed partition (``topics`` is
    then ignored)."""

    API_KEY: ClassVar[ApiKey] = ApiKey.OFFSET_FETCH
    group_id: str = text(_NAME)
    topics: tuple[OffsetFetchTopic, ...] = structs(OffsetFetchTopic)
    all_topics: bool = boolean(False)


@attrs.frozen
class OffsetFetchPartitionResponse(Struct):
    """The committed offset (-1: none) and metadata of one partition."""

    partition: int = i32()
    offset: int = i64(-1, lo=-1)
    metadata: str | None = text(_METADATA, None, nullable=True)
    error_code: ErrorCode = error_code()


@attrs.frozen
class OffsetFetchTopicResponse(Struct):
    """Per-partition answers in one topic."""

    name: str = text(_NAME)
    partitions: tuple[OffsetFetchPartitionResponse, ...] = structs(OffsetFetchPartitionResponse)


@attrs.frozen
class OffsetFetchResponse(Response):
    """The answer to ``OffsetFetch``; ``error_code`` is for group-level errors."""

    API_KEY: ClassVar[ApiKey] = ApiKey.OFFSET_FETCH
    error_code: ErrorCode = error_code()
    topics: tuple[OffsetFetchTopicResponse, ...] = structs(OffsetFetchTopicResponse)


# --- ListGroups, DescribeGroup, DeleteGroup ---------------------------------------------------


@attrs.frozen
class ListGroups(Request):
    """Every group this coordinator runs."""

    API_KEY: ClassVar[ApiKey] = ApiKey.LIST_GROUPS


@attrs.frozen
class GroupListing(Struct):
    """One group: its protocol type ("" for offsets-only groups) and state name."""

    group_id: str = text(_NAME)
    protocol_type: str = text(_PROTOCOL, "")
    state: str = text(_PROTOCOL, "Empty")


@attrs.frozen
class ListGroupsResponse(Response):
    """Groups sorted by id."""

    API_KEY: ClassVar[ApiKey] = ApiKey.LIST_GROUPS
    error_code: ErrorCode = error_code()
    groups: tuple[GroupListing, ...] = structs(GroupListing)


@attrs.frozen
class DescribeGroup(Request):
    """One group's state, protocol and members."""

    API_KEY: ClassVar[ApiKey] = ApiKey.DESCRIBE_GROUP
    group_id: str = text(_NAME)


@attrs.frozen
class GroupMemberDescription(Struct):
    """One member: ids, where it connects from, subscription and (when Stable) assignment."""

    member_id: str = text(_MEMBER)
    group_instance_id: str | None = text(_INSTANCE, None, nullable=True)
    client_id: str = text(limits.client_id_bytes_max, "")
    client_host: str = text(limits.host_bytes_max, "")
    metadata: bytes = blob(b"")
    assignment: bytes = blob(b"")


@attrs.frozen
class DescribeGroupResponse(Response):
    """The answer to ``DescribeGroup``; an unknown group is GROUP_ID_NOT_FOUND, state Dead."""

    API_KEY: ClassVar[ApiKey] = ApiKey.DESCRIBE_GROUP
    group_id: str = text(_NAME)
    error_code: ErrorCode = error_code()
    state: str = text(_PROTOCOL, "Dead")
    protocol_type: str = text(_PROTOCOL, "")
    protocol: str = text(_PROTOCOL, "")
    members: tuple[GroupMemberDescription, ...] = structs(GroupMemberDescription)


@attrs.frozen
class DeleteGroup(Request):
    """Delete a group without members, with all its committed offsets."""

    API_KEY: ClassVar[ApiKey] = ApiKey.DELETE_GROUP
    group_id: str = text(_NAME)


@attrs.frozen
class DeleteGroupResponse(Response):
    """NONE once the deletion is durable; NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND ..."""

    API_KEY: ClassVar[ApiKey] = ApiKey.DELETE_GROUP
    group_id: str = text(_NAME)
    error_code: ErrorCode = error_code()


# --- FindCoordinator -------------------------------------------------------------------------


@attrs.frozen
class FindCoordinator(Request):
    """Which broker coordinates a group (``key_type`` 0) or a transactional id (1)."""

    API_KEY: ClassVar[ApiKey] = ApiKey.FIND_COORDINATOR
    key: str = text(_NAME)
    key_type: int = choice((COORDINATOR_KEY_GROUP, COORDINATOR_KEY_TRANSACTION), 0)


@attrs.frozen
class FindCoordinatorResponse(Response):
    """Where the coordinator is: a single-node broker names itself; in a cluster a group's
    coordinator is the leader of its ``__consumer_offsets`` partition."""

    API_KEY: ClassVar[ApiKey] = ApiKey.FIND_COORDINATOR
    error_code: ErrorCode = error_code()
    node_id: int = i32(-1)
    host: str = text(limits.host_bytes_max, "")
    port: int = i32(0, lo=0, hi=65535)
