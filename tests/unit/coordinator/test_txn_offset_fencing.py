"""``GroupCoordinator.check_txn_member``: the KIP-447 membership check of a TxnOffsetCommit.

Method: build groups through ``harness.Driver`` with real JoinGroup/SyncGroup/LeaveGroup
requests, then ask the check about current, stale, unknown, static-replaced and plain
(generation -1, no member) memberships and compare the exact codes with OffsetCommit's.
The check only reads: asking it must not change what the group answers afterwards.
"""

from __future__ import annotations

from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.group_messages import (
    Heartbeat,
    JoinGroup,
    JoinGroupProtocol,
    LeaveGroup,
    LeaveGroupMember,
    SyncGroup,
    SyncGroupAssignment,
)
from tests.unit.coordinator.harness import Driver

PROTOCOLS = [JoinGroupProtocol("range", b"sub")]


def _stable_single(driver: Driver, group: str = "g") -> tuple[str, int]:
    first = driver.answer(driver.send(JoinGroup(group, "", protocols=PROTOCOLS)))
    assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED
    joined = driver.answer(driver.send(JoinGroup(group, first.member_id, protocols=PROTOCOLS)))
    assert joined.error_code == ErrorCode.NONE
    member, generation = joined.member_id, joined.generation_id
    sync = SyncGroup(group, generation, member, None, [SyncGroupAssignment(member, b"all")])
    assert driver.answer(driver.send(sync)).error_code == ErrorCode.NONE
    return member, generation


def test_current_member_of_current_generation_passes():
    driver = Driver()
    member, generation = _stable_single(driver)
    assert driver.coordinator.check_txn_member("g", generation, member) is None


def test_stale_generation_and_unknown_member_are_refused():
    driver = Driver()
    member, generation = _stable_single(driver)
    check = driver.coordinator.check_txn_member
    assert check("g", generation - 1, member) == ErrorCode.ILLEGAL_GENERATION
    assert check("g", generation + 1, member) == ErrorCode.ILLEGAL_GENERATION
    assert check("g", generation, "nobody") == ErrorCode.UNKNOWN_MEMBER_ID
    assert check("g", generation, "") == ErrorCode.UNKNOWN_MEMBER_ID  # generation, no member
    assert check("other", generation, member) == ErrorCode.UNKNOWN_MEMBER_ID
    assert check("a/b", generation, member) == ErrorCode.INVALID_GROUP_ID


def test_a_member_that_left_is_unknown():
    driver = Driver()
    member, generation = _stable_single(driver)
    leave = driver.call(LeaveGroup("g", [LeaveGroupMember(member, None)]))
    assert [m.error_code for m in leave.members] == [ErrorCode.NONE]
    assert driver.coordinator.check_txn_member("g", generation, member) == (
        ErrorCode.UNKNOWN_MEMBER_ID
    )


def test_plain_group_id_is_never_checked():
    driver = Driver()
    _stable_single(driver)  # a group with members (an OffsetCommit would be refused)
    check = driver.coordinator.check_txn_member
    assert check("g", -1, "") is None
    assert check("no-such-group", -1, "") is None


def test_a_replaced_static_member_is_fenced():
    driver = Driver()
    joined = driver.answer(driver.send(JoinGroup("g", "", protocols=PROTOCOLS,
                                                 group_instance_id="host-a")))
    assert joined.error_code == ErrorCode.NONE
    check = driver.coordinator.check_txn_member
    member, generation = joined.member_id, joined.generation_id
    assert check("g", generation, member, "host-a") is None
    assert check("g", generation, "someone-else", "host-a") == ErrorCode.FENCED_INSTANCE_ID
    # TxnOffsetCommit v0 carries no instance id: the member id alone decides
    assert check("g", generation, member) is None
    assert check("g", generation, "someone-else") == ErrorCode.UNKNOWN_MEMBER_ID


def test_the_check_only_reads():
    driver = Driver()
    member, generation = _stable_single(driver)
    before = driver.coordinator.statistics()
    for _ in range(3):
        driver.coordinator.check_txn_member("g", generation - 1, member)
        driver.coordinator.check_txn_member("g", generation, member)
    assert driver.coordinator.statistics() == before
    assert driver.call(Heartbeat("g", generation, member)).error_code == ErrorCode.NONE
