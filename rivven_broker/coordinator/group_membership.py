"""The group coordinator's membership half: SyncGroup, Heartbeat, LeaveGroup and fencing.

Theory of operation
-------------------
A mixin of ``GroupCoordinator`` (``group_coordinator.py`` has the joins and rounds, and the
plumbing this uses: ``_respond``, ``_persist``, ``_renew``, ``_fence_held``,
``_remove_members``, ``_prepare_rebalance``, ``_join_response``, ``_rename``).

- **Fencing** (``_check_member``), shared with commits: an unknown group or member is
  UNKNOWN_MEMBER_ID, a Dead group COORDINATOR_NOT_AVAILABLE, a known instance id presented
  with another member id FENCED_INSTANCE_ID; callers then check the generation
  (ILLEGAL_GENERATION).
- **SyncGroup**: refused with REBALANCE_IN_PROGRESS while a round is open; in a Stable group
  it answers the stored assignment at once; in CompletingRebalance it is held, and the
  leader's assignment is persisted as the group record (``_SyncPersist``). Only when that is
  durable does the group turn Stable and every held sync get its share. If the persist fails,
  the held syncs get its error and a new round opens.
- **Static takeover** (``_StaticPersist``): the record naming the new member id must be
  durable before the new member hears it is in; if it fails and the group is still Stable,
  the old member is put back.
- **Heartbeat** renews the session; during PreparingRebalance it answers
  REBALANCE_IN_PROGRESS so the member rejoins.
- **LeaveGroup** removes members (a static one may be named by instance id alone; a pending
  KIP-394 id is simply forgotten) and rebalances the rest at once.
"""

from __future__ import annotations

from typing import Hashable

import attrs

from rivven_broker.coordinator.group_state import Group, GroupState, Member, PersistOutcome
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.group_messages import (
    Heartbeat,
    JoinGroupResponse,
    LeaveGroup,
    LeaveGroupMemberResponse,
    LeaveGroupResponse,
    SyncGroup,
    SyncGroupResponse,
)
from rivven_broker.protocol.names import group_id_error

__all__ = ["MembershipMixin"]

_PREPARING = GroupState.PREPARING_REBALANCE
_COMPLETING = GroupState.COMPLETING_REBALANCE


@attrs.frozen
class _SyncPersist:
    group: Group
    generation: int
    assignments: dict[str, bytes]


@attrs.frozen
class _StaticPersist:
    group: Group
    token: Hashable
    old_member: Member
    new_member_id: str


class MembershipMixin:
    """SyncGroup, Heartbeat, LeaveGroup and fencing for ``GroupCoordinator``."""

    _groups: dict[str, Group]

    # --- sync, heartbeat, leave -----------------------------------------------------------

    def _check_member(
        self, group: Group | None, member_id: str, instance_id: str | None
    ) -> ErrorCode | None:
        """Fencing common to sync, heartbeat and commit."""
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if group.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if instance_id is not None:
            known = group.static_members.get(instance_id)
            if known is not None and known != member_id:
                return ErrorCode.FENCED_INSTANCE_ID
        member = group.members.get(member_id)
        if member is None or member.group_instance_id != instance_id:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return None

    def _sync(self, token: Hashable, request: SyncGroup, now_ms: int) -> None:
        group = self._groups.get(request.group_id)
        code = group_id_error(request.group_id) or self._check_member(
            group, request.member_id, request.group_instance_id
        )
        if code is None:
            assert group is not None
            if request.generation_id != group.generation:
                code = ErrorCode.ILLEGAL_GENERATION
            elif group.state is _PREPARING:
                code = ErrorCode.REBALANCE_IN_PROGRESS
        if code is not None:
            return self._respond(token, SyncGroupResponse(code))
        assert group is not None
        member = group.members[request.member_id]
        self._renew(group, member, now_ms)
        if group.state is GroupState.STABLE:
            return self._respond(token, SyncGroupResponse(ErrorCode.NONE, member.assignment))
        assert group.state is _COMPLETING
        if member.sync_token is not None:
            self._respond(member.sync_token, SyncGroupResponse(ErrorCode.REBALANCE_IN_PROGRESS))
        member.sync_token = token
        if member.member_id == group.leader_id and group.sync_persist_id is None:
            assignments = {
                a.member_id: bytes(a.assignment)
                for a in request.assignments
                if a.member_id in group.members
            }
            context = _SyncPersist(group, group.generation, assignments)
            record = self._group_record(group, assignments)
            group.sync_persist_id = self._persist(group, [record], context)

    def _sync_persisted(self, context: _SyncPersist, persist_id: int, error, now_ms: int):
        group = context.group
        if self._groups.get(group.group_id) is not group or group.sync_persist_id != persist_id:
            return  # the round was abandoned meanwhile
        group.sync_persist_id = None
        if error is not None:
            for member in group.members.values():
                self._fence_held(member, error)
            self._prepare_rebalance(group, now_ms)
            return
        group.transition(GroupState.STABLE, now_ms)
        for member in group.members.values():
            member.assignment = context.assignments.get(member.member_id, b"")
            if member.sync_token is not None:
                token, member.sync_token = member.sync_token, None
                self._renew(group, member, now_ms)
                self._respond(token, SyncGroupResponse(ErrorCode.NONE, member.assignment))

    def _persist_takeover(
        self, group: Group, token: Hashable, old_member: Member, new_member_id: str
    ) -> None:
        """Persist the group naming a static member's new id; answer its join when durable."""
        context = _StaticPersist(group, token, old_member, new_member_id)
        self._persist(group, [self._group_record(group)], context)

    def _static_persisted(self, context: _StaticPersist, error, now_ms: int) -> None:
        group = context.group
        member = group.members.get(context.new_member_id)
        if error is None:
            if member is not None and group.state is GroupState.STABLE:
                self._respond(context.token, self._join_response(group, member))
                return
            error = ErrorCode.REBALANCE_IN_PROGRESS
        if member is not None and group.state is GroupState.STABLE:
            self._rename(group, member.member_id, context.old_member)  # undo the takeover
            self._renew(group, context.old_member, now_ms)
        self._respond(context.token, JoinGroupResponse(error, member_id=context.new_member_id))

    def _heartbeat(self, request: Heartbeat, now_ms: int) -> ErrorCode:
        group = self._groups.get(request.group_id)
        code = group_id_error(request.group_id) or self._check_member(
            group, request.member_id, request.group_instance_id
        )
        if code is not None:
            return code
        assert group is not None
        if request.generation_id != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        self._renew(group, group.members[request.member_id], now_ms)
        if group.state is _PREPARING:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def _leave(self, request: LeaveGroup, now_ms: int) -> LeaveGroupResponse:
        code = group_id_error(request.group_id)
        if code is not None:
            return LeaveGroupResponse(code)
        group = self._groups.get(request.group_id)
        answers, leaving = [], []
        for item in request.members:
            code, member = self._leaving_member(group, item.member_id, item.group_instance_id)
            if member is not None and member not in leaving:
                leaving.append(member)
            answers.append(LeaveGroupMemberResponse(item.member_id, item.group_instance_id, code))
        if leaving:
            assert group is not None
            self._remove_members(group, leaving, ErrorCode.UNKNOWN_MEMBER_ID, now_ms)
        return LeaveGroupResponse(ErrorCode.NONE, tuple(answers))

    def _leaving_member(
        self, group: Group | None, member_id: str, instance_id: str | None
    ) -> tuple[ErrorCode, Member | None]:
        if group is None or group.state is GroupState.DEAD:
            return ErrorCode.UNKNOWN_MEMBER_ID, None
        if instance_id is not None:
            known = group.static_members.get(instance_id)
            if known is None:
                return ErrorCode.UNKNOWN_MEMBER_ID, None
            if member_id and member_id != known:
                return ErrorCode.FENCED_INSTANCE_ID, None
            return ErrorCode.NONE, group.members[known]
        if group.pending_members.pop(member_id, None) is not None:
            return ErrorCode.NONE, None
        member = group.members.get(member_id)
        if member is None or member.group_instance_id is not None:
            return ErrorCode.UNKNOWN_MEMBER_ID, None
        return ErrorCode.NONE, member

    def _membership_outcomes(self) -> dict[type, PersistOutcome]:
        """Who settles each membership persist's outcome, by its context's type (the host
        builds one table from every mixin's)."""
        return {
            _SyncPersist: self._sync_persisted,
            _StaticPersist: lambda context, _, error, now_ms: self._static_persisted(
                context, error, now_ms),
        }
