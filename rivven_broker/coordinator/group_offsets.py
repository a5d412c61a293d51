"""The group coordinator's offsets half: commits, fetches, administration, expiry, loading.

Theory of operation
-------------------
A mixin of ``GroupCoordinator`` (which supplies the plumbing: ``_persist``, ``_respond``,
``_renew``, ``_check_member``, the group table), kept apart so each file stays one subject.

- **Commit.** Fencing first: a commit with ``generation_id`` -1 and no member id is a
  *simple* commit, allowed only while the group has no members (it creates the group if
  needed); any other commit must come from a current member of the current generation, and
  is refused during CompletingRebalance (REBALANCE_IN_PROGRESS) but allowed in
  PreparingRebalance (a cooperative member commits what it revokes). Then per partition:
  metadata longer than ``offset_metadata_bytes_max`` is INVALID_COMMIT_OFFSET_SIZE, a
  partition ``log_end_offset`` does not know is UNKNOWN_TOPIC_OR_PARTITION, an offset past
  its log end is OFFSET_OUT_OF_RANGE. The accepted ones become one ``Persist``; only on
  ``Persisted`` are they applied and answered NONE (on ``PersistFailed``, its code).
- **Transactional commit fencing** (``check_txn_member``, asked by the transaction driver
  before a TxnOffsetCommit enters its transaction; KIP-447): generation -1 with no member id
  is not checked (a plain group id); otherwise the committer must be a current member
  (``_check_member``: UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID when an instance id is given) of
  the current generation (ILLEGAL_GENERATION). Unlike OffsetCommit, a rebalance in progress is no refusal (the offsets
  only land when the transaction commits) and nothing is renewed: the check only reads.
- **Fetch** reads the applied offsets only (never one whose commit is still in flight).
- **Delete** (Empty groups only): the group turns Dead, tombstones for its record and every
  offset (also those in flight) are persisted, and on ``Persisted`` the group is gone. If
  that fails the group is Empty again, as the log still says.
- **Expiry** (every ``offsets_retention_check_interval_ms``): in an Empty group an offset
  expires ``offsets_retention_ms`` after the later of its commit and the moment the group
  became empty (KIP-211). Offsets with a commit in flight never expire. An Empty group left
  with nothing is removed (its record tombstoned). Expiry tombstones are fire-and-forget: if
  they are lost, a restart revives the offsets and the next sweep expires them again.
- **Load** replays ``__consumer_offsets`` (latest record per key wins; tombstones delete):
  groups with members come back Stable with their generation and assignments, their sessions
  restarting at load time; groups without members come back Empty; offsets without a group
  record make an Empty group without protocol.

Why memory always equals a replay of the log: every change that a restart must reproduce
is applied either after its record is durable (commits, assignments) or together with the
emission of its record when the record only removes (expiry), and ``Persist`` instructions
are appended in emission order, so the log's order is the order of the changes.
"""

from __future__ import annotations

from typing import Hashable, Iterable

import attrs

from rivven_broker.coordinator.group_events import TxnOffsetsCommitted
from rivven_broker.coordinator.group_state import (
    Group,
    GroupState,
    Member,
    PersistOutcome,
    TimerKind,
    TopicPartitionKey,
)
from rivven_broker.coordinator.offsets_codec import (
    GroupKey,
    GroupValue,
    OffsetKey,
    OffsetValue,
    decode_group_value,
    decode_key,
    decode_offset_value,
    encode_key,
    encode_offset_value,
)
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.group_messages import (
    NO_GENERATION,
    DeleteGroup,
    DeleteGroupResponse,
    DescribeGroup,
    DescribeGroupResponse,
    GroupListing,
    GroupMemberDescription,
    ListGroups,
    ListGroupsResponse,
    OffsetCommit,
    OffsetCommitPartitionResponse,
    OffsetCommitResponse,
    OffsetCommitTopicResponse,
    OffsetFetch,
    OffsetFetchPartitionResponse,
    OffsetFetchResponse,
    OffsetFetchTopicResponse,
)
from rivven_broker.protocol.names import group_id_error

__all__ = ["OffsetsMixin"]

#: Per topic of a commit request: (name, [(partition, code or None while in flight)]).
_Layout = list[tuple[str, list[tuple[int, ErrorCode | None]]]]


@attrs.frozen
class _CommitPersist:
    group: Group
    token: Hashable
    layout: _Layout
    entries: tuple[tuple[TopicPartitionKey, OffsetValue], ...]


@attrs.frozen
class _DeletePersist:
    group: Group
    token: Hashable


def _commit_response(layout: _Layout, code: ErrorCode | None = None) -> OffsetCommitResponse:
    """The answer; partitions still None get ``code`` (NONE by default)."""
    fill = ErrorCode.NONE if code is None else code
    topics = []
    for name, parts in layout:
        answers = tuple(
            OffsetCommitPartitionResponse(p, fill if c is None else c) for p, c in parts
        )
        topics.append(OffsetCommitTopicResponse(name, answers))
    return OffsetCommitResponse(tuple(topics))


class OffsetsMixin:
    """Offsets, administration, expiry and loading for ``GroupCoordinator``."""

    # Supplied by GroupCoordinator (declared for readers and type checkers).
    _groups: dict[str, Group]
    _persists: dict[int, object]

    def _dispatch_offsets(self, token: Hashable, request, now_ms: int) -> None:
        if isinstance(request, OffsetCommit):
            self._commit(token, request, now_ms)
        elif isinstance(request, OffsetFetch):
            self._respond(token, self._fetch(request))
        elif isinstance(request, ListGroups):
            self._respond(token, self._list())
        elif isinstance(request, DescribeGroup):
            self._respond(token, self._describe(request.group_id))
        else:
            assert isinstance(request, DeleteGroup), request
            self._delete(token, request.group_id, now_ms)

    # --- commit --------------------------------------------------------------------------

    def _commit_fencing(self, request: OffsetCommit, now_ms: int) -> ErrorCode | None:
        group = self._groups.get(request.group_id)
        code = group_id_error(request.group_id)
        if code is not None:
            return code
        if group is not None and group.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        simple = (
            request.generation_id == NO_GENERATION
            and not request.member_id
            and request.group_instance_id is None
        )
        if simple:
            return None if group is None or not group.members else ErrorCode.UNKNOWN_MEMBER_ID
        code = self._check_member(group, request.member_id, request.group_instance_id)
        if code is not None:
            return code
        assert group is not None
        if request.generation_id != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        if group.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        self._renew(group, group.members[request.member_id], now_ms)
        return None

    def check_txn_member(
        self, group_id: str, generation_id: int, member_id: str,
        group_instance_id: str | None = None,
    ) -> ErrorCode | None:
        """Why a transactional offset commit of this membership must be refused, or None.
        Generation -1 with member id "" and no instance id: never refused here. No instance
        id (TxnOffsetCommit v0 carries none) checks the member by its id alone, so a static
        member passes and a replaced one is UNKNOWN_MEMBER_ID. Pure."""
        if generation_id == NO_GENERATION and not member_id and group_instance_id is None:
            return None
        group = self._groups.get(group_id)
        if group_instance_id is None and group is not None and member_id in group.members:
            group_instance_id = group.members[member_id].group_instance_id
        code = group_id_error(group_id) or self._check_member(group, member_id, group_instance_id)
        if code is not None:
            return code
        assert group is not None
        if generation_id != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        return None

    def _commit(self, token: Hashable, request: OffsetCommit, now_ms: int) -> None:
        fenced = self._commit_fencing(request, now_ms)
        layout: _Layout = []
        entries: list[tuple[TopicPartitionKey, OffsetValue]] = []
        metadata_max = self.config.offset_metadata_bytes_max
        for topic in request.topics:
            parts: list[tuple[int, ErrorCode | None]] = []
            for item in topic.partitions:
                code = fenced
                if code is None:
                    code = self._partition_error(topic.name, item.partition, item.offset)
                if code is None and item.metadata is not None:
                    if len(item.metadata.encode("utf-8")) > metadata_max:
                        code = ErrorCode.INVALID_COMMIT_OFFSET_SIZE
                if code is None:
                    value = OffsetValue(item.offset, item.metadata, now_ms)
                    entries.append(((topic.name, item.partition), value))
                parts.append((item.partition, code))
            layout.append((topic.name, parts))
        if not entries:
            return self._respond(token, _commit_response(layout))
        group = self._groups.get(request.group_id)
        if group is None:
            group = self._groups[request.group_id] = Group(request.group_id, now_ms)
        records = []
        for key, value in entries:
            group.pending_commits[key] = group.pending_commits.get(key, 0) + 1
            offset_key = OffsetKey(group.group_id, key[0], key[1])
            records.append((encode_key(offset_key), encode_offset_value(value)))
        self._persist(group, records, _CommitPersist(group, token, layout, tuple(entries)))

    def _partition_error(self, topic: str, partition: int, offset: int) -> ErrorCode | None:
        log_end = self._log_end_offset(topic, partition)
        if log_end is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if offset > log_end:
            return ErrorCode.OFFSET_OUT_OF_RANGE
        return None

    def _commit_persisted(self, context: _CommitPersist, error: ErrorCode | None) -> None:
        group = context.group
        for key, value in context.entries:
            count = group.pending_commits[key] - 1
            if count:
                group.pending_commits[key] = count
            else:
                del group.pending_commits[key]
            if error is None and self._groups.get(group.group_id) is group:
                group.offsets[key] = value
        self._respond(context.token, _commit_response(context.layout, error))

    def _txn_offsets_committed(self, event: TxnOffsetsCommitted, now_ms: int) -> None:
        group = self._groups.get(event.group_id)
        if group is None:
            group = self._groups[event.group_id] = Group(event.group_id, now_ms)
        for topic, partition, offset, metadata in event.offsets:
            value = OffsetValue(offset, metadata, event.commit_timestamp_ms)
            group.offsets[(topic, partition)] = value

    # --- fetch, list, describe ------------------------------------------------------------

    def _fetch(self, request: OffsetFetch) -> OffsetFetchResponse:
        code = group_id_error(request.group_id)
        if code is not None:
            return OffsetFetchResponse(code)
        group = self._groups.get(request.group_id)
        offsets = group.offsets if group is not None else {}
        if request.all_topics:
            wanted: dict[str, list[int]] = {}
            for topic, partition in sorted(offsets):
                wanted.setdefault(topic, []).append(partition)
            asked = list(wanted.items())
        else:
            asked = [(t.name, list(t.partitions)) for t in request.topics]
        topics = []
        for name, partitions in asked:
            answers = []
            for partition in partitions:
                value = offsets.get((name, partition))
                if value is None:
                    answers.append(OffsetFetchPartitionResponse(partition))
                else:
                    answers.append(
                        OffsetFetchPartitionResponse(partition, value.offset, value.metadata)
                    )
            topics.append(OffsetFetchTopicResponse(name, tuple(answers)))
        return OffsetFetchResponse(ErrorCode.NONE, tuple(topics))

    def _list(self) -> ListGroupsResponse:
        listings = tuple(
            GroupListing(group_id, group.protocol_type or "", group.state.value)
            for group_id, group in sorted(self._groups.items())
        )
        return ListGroupsResponse(ErrorCode.NONE, listings)

    def _describe(self, group_id: str) -> DescribeGroupResponse:
        code = group_id_error(group_id)
        group = self._groups.get(group_id)
        if code is not None or group is None:
            return DescribeGroupResponse(group_id, code or ErrorCode.GROUP_ID_NOT_FOUND)
        stable = group.state is GroupState.STABLE
        members = tuple(
            GroupMemberDescription(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.metadata_for(group.protocol_name) if group.protocol_name else b"",
                m.assignment if stable else b"",
            )
            for m in group.members.values()
        )
        return DescribeGroupResponse(
            group_id,
            ErrorCode.NONE,
            group.state.value,
            group.protocol_type or "",
            group.protocol_name or "",
            members,
        )

    # --- delete and expiry ----------------------------------------------------------------

    def _delete(self, token: Hashable, group_id: str, now_ms: int) -> None:
        code = group_id_error(group_id)
        group = self._groups.get(group_id)
        if code is None and (group is None or group.state is GroupState.DEAD):
            code = ErrorCode.GROUP_ID_NOT_FOUND
        if code is None and group.state is not GroupState.EMPTY:
            code = ErrorCode.NON_EMPTY_GROUP
        if code is not None:
            return self._respond(token, DeleteGroupResponse(group_id, code))
        keys = set(group.offsets) | set(group.pending_commits)
        records = [self._tombstone(group_id, key) for key in sorted(keys)]
        if group.has_group_record:
            records.append((encode_key(GroupKey(group_id)), None))
        group.pending_members.clear()
        if not records:  # never persisted (a member joined and left, nothing committed)
            del self._groups[group_id]
            return self._respond(token, DeleteGroupResponse(group_id, ErrorCode.NONE))
        group.transition(GroupState.DEAD, now_ms)
        group.delete_persist_id = self._persist(group, records, _DeletePersist(group, token))

    def _delete_persisted(self, context: _DeletePersist, error: ErrorCode | None, now_ms: int):
        group = context.group
        group.delete_persist_id = None
        if error is not None:
            group.transition(GroupState.EMPTY, now_ms)
            return self._respond(context.token, DeleteGroupResponse(group.group_id, error))
        del self._groups[group.group_id]
        self._respond(context.token, DeleteGroupResponse(group.group_id, ErrorCode.NONE))

    @staticmethod
    def _tombstone(group_id: str, key: TopicPartitionKey) -> tuple[bytes, None]:
        return encode_key(OffsetKey(group_id, key[0], key[1])), None

    def _expire_offsets(self, now_ms: int) -> None:
        retention_ms = self.config.offsets_retention_ms
        for group_id, group in list(self._groups.items()):
            if group.state is not GroupState.EMPTY:
                continue
            expired = [
                key
                for key, value in group.offsets.items()
                if key not in group.pending_commits
                and max(value.commit_timestamp_ms, group.state_timestamp_ms) + retention_ms
                <= now_ms
            ]
            records = [self._tombstone(group_id, key) for key in sorted(expired)]
            for key in expired:
                del group.offsets[key]
            if group.is_removable():
                if group.has_group_record:
                    records.append((encode_key(GroupKey(group_id)), None))
                del self._groups[group_id]
            if records:
                self._persist(group, records, None)

    def _offsets_outcomes(self) -> dict[type, PersistOutcome]:
        """Who settles each offsets persist's outcome, by its context's type (see
        ``_membership_outcomes``)."""
        return {
            _CommitPersist: lambda context, _, error, now_ms: self._commit_persisted(
                context, error),
            _DeletePersist: lambda context, _, error, now_ms: self._delete_persisted(
                context, error, now_ms),
        }

    # --- load ----------------------------------------------------------------------------

    def load(self, records: Iterable[tuple[bytes, bytes | None]], now_ms: int) -> None:
        """Rebuild every group from ``__consumer_offsets`` records, oldest first (records of
        aborted transactions already left out). Call once, before any event. Pure; blocks
        only as long as the iteration does.

        Raises:
            CorruptOffsetsRecordError: a key or value does not decode.
        """
        assert not self._groups and not self._persists, "load() runs once, on a fresh coordinator"
        offsets: dict[str, dict[TopicPartitionKey, OffsetValue]] = {}
        groups: dict[str, GroupValue] = {}
        for key_bytes, value_bytes in records:
            key = decode_key(key_bytes)
            if isinstance(key, OffsetKey):
                by_group = offsets.setdefault(key.group_id, {})
                if value_bytes is None:
                    by_group.pop((key.topic, key.partition), None)
                else:
                    by_group[(key.topic, key.partition)] = decode_offset_value(value_bytes)
            elif value_bytes is None:
                groups.pop(key.group_id, None)
            else:
                groups[key.group_id] = decode_group_value(value_bytes)
        for group_id, value in groups.items():
            self._groups[group_id] = self._loaded_group(group_id, value, now_ms)
        for group_id, by_group in offsets.items():
            if by_group:
                group = self._groups.get(group_id)
                if group is None:
                    group = self._groups[group_id] = Group(group_id, 0)
                group.offsets.update(by_group)

    def _loaded_group(self, group_id: str, value: GroupValue, now_ms: int) -> Group:
        group = Group(group_id, value.state_timestamp_ms, has_group_record=True)
        group.protocol_type = value.protocol_type
        group.generation = max(0, value.generation)
        for item in value.members:
            member = Member(
                item.member_id,
                item.group_instance_id,
                item.client_id,
                item.client_host,
                item.session_timeout_ms,
                item.rebalance_timeout_ms,
                item.protocols,
                now_ms + item.session_timeout_ms,
                item.assignment,
            )
            group.members[member.member_id] = member
            if member.group_instance_id is not None:
                group.static_members[member.group_instance_id] = member.member_id
            self._schedule(member.session_deadline_ms, TimerKind.SESSION, group_id, member.member_id)
        protocol = value.protocol_name
        usable = protocol is not None and all(
            protocol in m.protocol_names() for m in group.members.values()
        )
        if group.members and usable:
            group.state = GroupState.STABLE
            group.protocol_name = protocol
            group.leader_id = value.leader if value.leader in group.members else None
            group.leader_id = group.leader_id or next(iter(group.members))
        else:  # nobody, or a record this code cannot make sense of: members must rejoin
            group.members.clear()
            group.static_members.clear()
        return group
