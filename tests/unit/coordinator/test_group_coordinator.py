"""The coordinator's rules one at a time: validation, fencing, held answers, durability.

Method: drive ``GroupCoordinator`` through ``harness.Driver`` with hand-written requests and
check the exact error codes and the moment answers appear. Persists are held where the test
is about durability (an answer must not appear before ``Persisted``; ``PersistFailed`` must
surface its code and leave the state a restart would rebuild). Time is virtual.
"""

from __future__ import annotations

import random

import pytest

from rivven_broker.coordinator import (
    GroupCoordinator,
    GroupCoordinatorConfig,
    GroupRequest,
    Persist,
    Tick,
    TxnOffsetsCommitted,
)
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.group_messages import (
    DeleteGroup,
    DescribeGroup,
    Heartbeat,
    JoinGroup,
    JoinGroupProtocol,
    LeaveGroup,
    LeaveGroupMember,
    ListGroups,
    OffsetCommit,
    OffsetCommitPartition,
    OffsetCommitTopic,
    OffsetFetch,
    OffsetFetchTopic,
    SyncGroup,
    SyncGroupAssignment,
)
from tests.unit.coordinator.harness import FAST, Driver

PROTOCOLS = [JoinGroupProtocol("range", b"sub")]
CODES = ErrorCode


def _join(driver: Driver, member_id: str = "", group: str = "g", **kwargs) -> int:
    kwargs.setdefault("protocols", PROTOCOLS)
    return driver.send(JoinGroup(group, member_id, **kwargs))


def _member(driver: Driver, group: str = "g", **kwargs) -> str:
    """A member id the coordinator handed out (MEMBER_ID_REQUIRED)."""
    answer = driver.answer(_join(driver, group=group, **kwargs))
    assert answer.error_code == CODES.MEMBER_ID_REQUIRED and answer.member_id
    return answer.member_id


def _stable_single(driver: Driver, group: str = "g") -> tuple[str, int]:
    member_id = _member(driver, group)
    joined = driver.answer(_join(driver, member_id, group))
    assert joined.error_code == CODES.NONE and joined.leader == member_id
    assert [m.member_id for m in joined.members] == [member_id]
    synced = driver.answer(
        driver.send(
            SyncGroup(group, joined.generation_id, member_id, None,
                      [SyncGroupAssignment(member_id, b"all")])
        )
    )
    assert synced.error_code == CODES.NONE and synced.assignment == b"all"
    return member_id, joined.generation_id


def test_join_validation():
    driver = Driver()
    for bad in ("", "a/b", "x" * 300):
        assert driver.answer(_join(driver, group=bad)).error_code == CODES.INVALID_GROUP_ID
    for timeout in (999, 300_001, 0):
        answer = driver.answer(_join(driver, session_timeout_ms=timeout))
        assert answer.error_code == CODES.INVALID_SESSION_TIMEOUT
    for protocols in ([], [JoinGroupProtocol("a"), JoinGroupProtocol("a")]):
        answer = driver.answer(_join(driver, protocols=protocols))
        assert answer.error_code == CODES.INCONSISTENT_GROUP_PROTOCOL
    answer = driver.answer(_join(driver, "made-up-id"))
    assert answer.error_code == CODES.UNKNOWN_MEMBER_ID
    assert driver.call(ListGroups()).groups == ()  # nothing was created by refusals


def test_member_ids_come_from_the_injected_rng_and_pending_ids_expire():
    ids = []
    for _ in range(2):
        driver = Driver(seed=7)
        ids.append(_member(driver))
    assert ids[0] == ids[1] and ids[0].startswith("client-")
    driver.advance(10_001)  # the pending id is forgotten after one session timeout
    assert driver.answer(_join(driver, ids[1])).error_code == CODES.UNKNOWN_MEMBER_ID


def test_protocols_must_match_the_group():
    driver = Driver()
    _stable_single(driver)
    other = _member(driver)
    answer = driver.answer(_join(driver, other, protocols=[JoinGroupProtocol("roundrobin")]))
    assert answer.error_code == CODES.INCONSISTENT_GROUP_PROTOCOL
    answer = driver.answer(_join(driver, other, protocol_type="connect"))
    assert answer.error_code == CODES.INCONSISTENT_GROUP_PROTOCOL


def test_group_size_is_bounded():
    driver = Driver(GroupCoordinatorConfig(initial_rebalance_delay_ms=0, group_members_max=2))
    _member(driver)
    _member(driver)
    assert driver.answer(_join(driver)).error_code == CODES.GROUP_MAX_SIZE_REACHED


def test_a_round_waits_for_every_member_then_times_out_the_missing():
    driver = Driver()
    first, generation = _stable_single(driver)
    second = _member(driver)
    held = _join(driver, second, rebalance_timeout_ms=20_000)
    assert driver.answer(held) is None  # waiting for the first member to rejoin
    beat = Heartbeat("g", generation, first)
    assert driver.call(beat).error_code == CODES.REBALANCE_IN_PROGRESS
    assert driver.call(SyncGroup("g", generation, first)).error_code == CODES.REBALANCE_IN_PROGRESS
    for _ in range(3):  # heartbeats keep the first alive, but it never rejoins...
        driver.advance(9_000)
        assert driver.call(beat).error_code == CODES.REBALANCE_IN_PROGRESS
    driver.advance(2_999)
    assert driver.answer(held) is None
    driver.advance(1)  # ...so at the longest rebalance timeout (30 s) the round closes without it
    answer = driver.answer(held)
    assert answer.error_code == CODES.NONE and answer.leader == second
    assert answer.generation_id == generation + 1
    assert driver.call(beat).error_code == CODES.UNKNOWN_MEMBER_ID


def test_initial_delay_gathers_a_starting_fleet_into_one_generation():
    driver = Driver(GroupCoordinatorConfig(initial_rebalance_delay_ms=3_000))
    members = [_member(driver) for _ in range(3)]
    held = [_join(driver, m) for m in members]
    assert all(driver.answer(t) is None for t in held)
    driver.advance(3_000)
    answers = [driver.answer(t) for t in held]
    assert {a.generation_id for a in answers} == {1}
    assert [len(a.members) for a in answers] == [3, 0, 0]  # only the leader sees members


def test_fencing_of_stale_generations_and_unknown_members():
    driver = Driver()
    member, generation = _stable_single(driver)
    assert driver.call(Heartbeat("g", generation, member)).error_code == CODES.NONE
    for request, field in (
        (Heartbeat("g", generation - 1, member), "error_code"),
        (SyncGroup("g", generation + 1, member), "error_code"),
    ):
        assert getattr(driver.call(request), field) == CODES.ILLEGAL_GENERATION
    assert driver.call(Heartbeat("g", generation, "nobody")).error_code == CODES.UNKNOWN_MEMBER_ID
    assert driver.call(Heartbeat("nope", 1, member)).error_code == CODES.UNKNOWN_MEMBER_ID
    commit = _commit_request(member_id=member, generation_id=generation + 1)
    assert _codes(driver.call(commit)) == [CODES.ILLEGAL_GENERATION]
    simple = _commit_request()  # generation -1 into a group with members
    assert _codes(driver.call(simple)) == [CODES.UNKNOWN_MEMBER_ID]


def _commit_request(group: str = "g", offset: int = 5, metadata=None, **fencing) -> OffsetCommit:
    part = OffsetCommitPartition(0, offset, metadata)
    return OffsetCommit(group, topics=[OffsetCommitTopic("t", [part])], **fencing)


def _codes(response) -> list[ErrorCode]:
    return [p.error_code for t in response.topics for p in t.partitions]


def _fetch(driver: Driver, group: str = "g") -> int:
    answer = driver.call(OffsetFetch(group, [OffsetFetchTopic("t", [0])]))
    return answer.topics[0].partitions[0].offset


def test_a_commit_is_answered_only_once_durable():
    driver = Driver()
    driver.topic("t", 1, log_end=100)
    driver.auto_persist = False
    token = driver.send(_commit_request(offset=42, metadata="m"))
    assert driver.answer(token) is None and _fetch(driver) == -1
    driver.release()
    assert _codes(driver.answer(token)) == [CODES.NONE] and _fetch(driver) == 42
    token = driver.send(_commit_request(offset=43))
    driver.release(fail=CODES.KAFKA_STORAGE_ERROR)
    assert _codes(driver.answer(token)) == [CODES.KAFKA_STORAGE_ERROR] and _fetch(driver) == 42
    everything = driver.call(OffsetFetch("g", all_topics=True))
    assert [(t.name, p.partition, p.offset, p.metadata) for t in everything.topics
            for p in t.partitions] == [("t", 0, 42, "m")]


def test_commit_checks_each_partition():
    driver = Driver(GroupCoordinatorConfig(offset_metadata_bytes_max=4))
    driver.topic("t", 1, log_end=100)
    assert _codes(driver.call(_commit_request(offset=100))) == [CODES.NONE]  # == log end
    assert _codes(driver.call(_commit_request(offset=101))) == [CODES.OFFSET_OUT_OF_RANGE]
    too_long = _commit_request(metadata="12345")
    assert _codes(driver.call(too_long)) == [CODES.INVALID_COMMIT_OFFSET_SIZE]
    unknown = OffsetCommit("g", topics=[OffsetCommitTopic("u", [OffsetCommitPartition(0, 1)])])
    assert _codes(driver.call(unknown)) == [CODES.UNKNOWN_TOPIC_OR_PARTITION]
    assert _codes(driver.call(_commit_request(group="bad/id"))) == [CODES.INVALID_GROUP_ID]
    assert _fetch(driver) == 100


def test_sync_waits_for_the_durable_assignment_and_a_failure_restarts_the_round():
    driver = Driver()
    member = _member(driver)
    joined = driver.answer(_join(driver, member))
    driver.auto_persist = False
    sync = SyncGroup("g", joined.generation_id, member, None, [SyncGroupAssignment(member, b"a")])
    token = driver.send(sync)
    assert driver.answer(token) is None and len(driver.held_persists) == 1
    driver.release(fail=CODES.NOT_COORDINATOR)
    assert driver.answer(token).error_code == CODES.NOT_COORDINATOR
    assert driver.call(DescribeGroup("g")).state == "PreparingRebalance"


def test_a_leader_that_never_syncs_is_dropped_at_the_rebalance_deadline():
    driver = Driver()
    leader = _member(driver)
    joined = driver.answer(_join(driver, leader))
    driver.advance(9_000)
    assert driver.call(Heartbeat("g", joined.generation_id, leader)).error_code == CODES.NONE
    driver.advance(9_000)
    assert driver.call(Heartbeat("g", joined.generation_id, leader)).error_code == CODES.NONE
    driver.advance(12_000)  # 30 s after the round closed, heartbeats notwithstanding
    answer = driver.call(Heartbeat("g", joined.generation_id, leader))
    assert answer.error_code == CODES.UNKNOWN_MEMBER_ID
    assert driver.call(DescribeGroup("g")).state == "Empty"


def test_static_members_are_fenced_by_instance_id():
    driver = Driver()
    answer = driver.answer(_join(driver, group_instance_id="host-a"))
    assert answer.error_code == CODES.NONE  # static members get their id at once
    member = answer.member_id
    fenced = driver.answer(_join(driver, "someone-else", group_instance_id="host-a"))
    assert fenced.error_code == CODES.FENCED_INSTANCE_ID
    sync = SyncGroup("g", answer.generation_id, "someone-else", "host-a")
    assert driver.call(sync).error_code == CODES.FENCED_INSTANCE_ID
    leave = driver.call(LeaveGroup("g", [LeaveGroupMember("", "host-a")]))
    assert [m.error_code for m in leave.members] == [CODES.NONE]
    assert driver.call(Heartbeat("g", answer.generation_id, member, "host-a")).error_code == (
        CODES.UNKNOWN_MEMBER_ID
    )


def test_a_failed_static_takeover_is_undone():
    driver = Driver()
    first = driver.answer(_join(driver, group_instance_id="host-a"))
    sync = SyncGroup("g", first.generation_id, first.member_id, "host-a",
                     [SyncGroupAssignment(first.member_id, b"p")])
    assert driver.call(sync).error_code == CODES.NONE
    driver.auto_persist = False
    token = _join(driver, group_instance_id="host-a")
    driver.release(fail=CODES.COORDINATOR_NOT_AVAILABLE)
    assert driver.answer(token).error_code == CODES.COORDINATOR_NOT_AVAILABLE
    beat = Heartbeat("g", first.generation_id, first.member_id, "host-a")
    assert driver.call(beat).error_code == CODES.NONE  # the old member is back


def test_leave_answers_per_member():
    driver = Driver()
    member, _ = _stable_single(driver)
    answer = driver.call(LeaveGroup("g", [LeaveGroupMember(member), LeaveGroupMember("ghost")]))
    assert answer.error_code == CODES.NONE
    assert [m.error_code for m in answer.members] == [CODES.NONE, CODES.UNKNOWN_MEMBER_ID]
    assert driver.call(LeaveGroup("bad/id")).error_code == CODES.INVALID_GROUP_ID


def test_delete_group():
    driver = Driver()
    driver.topic("t", 1)
    assert driver.call(DeleteGroup("g")).error_code == CODES.GROUP_ID_NOT_FOUND
    member, generation = _stable_single(driver)
    assert driver.call(DeleteGroup("g")).error_code == CODES.NON_EMPTY_GROUP
    assert _codes(driver.call(_commit_request(member_id=member, generation_id=generation))) == [
        CODES.NONE
    ]
    driver.call(LeaveGroup("g", [LeaveGroupMember(member)]))
    driver.auto_persist = False
    token = driver.send(DeleteGroup("g"))
    assert driver.answer(token) is None
    assert driver.call(DescribeGroup("g")).state == "Dead"
    assert driver.answer(_join(driver)).error_code == CODES.COORDINATOR_NOT_AVAILABLE
    driver.release(fail=CODES.KAFKA_STORAGE_ERROR)
    assert driver.answer(token).error_code == CODES.KAFKA_STORAGE_ERROR
    assert driver.call(DescribeGroup("g")).state == "Empty" and _fetch(driver) == 5
    driver.auto_persist = True
    assert driver.call(DeleteGroup("g")).error_code == CODES.NONE
    assert driver.call(DescribeGroup("g")).error_code == CODES.GROUP_ID_NOT_FOUND
    driver.restart()
    assert driver.call(ListGroups()).groups == () and _fetch(driver) == -1


def test_deleting_a_group_that_never_persisted_anything_needs_no_records():
    """Found by probing the broker: a JoinGroup answered MEMBER_ID_REQUIRED, the client gone,
    the pending member expired; the group was empty with nothing to tombstone, and DeleteGroup
    emitted a Persist of no records, an assertion that stopped the broker."""
    driver = Driver()
    _member(driver)
    driver.advance(10_001)
    assert driver.call(DescribeGroup("g")).state == "Empty"
    assert driver.call(DeleteGroup("g")).error_code == CODES.NONE
    assert driver.call(DescribeGroup("g")).error_code == CODES.GROUP_ID_NOT_FOUND
    assert driver.call(DeleteGroup("g")).error_code == CODES.GROUP_ID_NOT_FOUND
    assert driver.call(ListGroups()).groups == ()
    assert driver.answer(_join(driver)).error_code == CODES.MEMBER_ID_REQUIRED  # usable again


def test_deadlines_and_statistics():
    coordinator = GroupCoordinator(random.Random(1), lambda t, p: None, FAST)
    assert coordinator.handle(Tick(), 0) == []
    assert coordinator.next_deadline_ms() == FAST.offsets_retention_check_interval_ms
    out = coordinator.handle(GroupRequest("tok", JoinGroup("g", protocols=PROTOCOLS)), 0)
    assert [type(i).__name__ for i in out] == ["Respond"]
    assert coordinator.next_deadline_ms() == 10_000  # the pending member id's expiry
    stats = coordinator.statistics()
    assert stats.groups == 1 and stats.pending_members == 1 and stats.groups_by_state == {
        "Empty": 1
    }


def test_transactional_offsets_become_visible():
    driver = Driver()
    driver.coordinator.handle(TxnOffsetsCommitted("g", (("t", 0, 9, "x"),), 5), driver.now_ms)
    assert _fetch(driver) == 9


@pytest.mark.parametrize("retention_ms", [60_000])
def test_offsets_of_a_simple_group_expire_and_are_tombstoned(retention_ms):
    config = GroupCoordinatorConfig(
        initial_rebalance_delay_ms=0,
        offsets_retention_ms=retention_ms,
        offsets_retention_check_interval_ms=10_000,
    )
    driver = Driver(config)
    driver.topic("t", 1)
    assert _codes(driver.call(_commit_request())) == [CODES.NONE]
    driver.advance(retention_ms - 10_000)
    assert _fetch(driver) == 5
    driver.advance(20_000)
    assert _fetch(driver) == -1 and driver.call(ListGroups()).groups == ()
    assert driver.log[-1][1] is None  # a tombstone
    driver.restart()
    assert _fetch(driver) == -1


def test_persist_instructions_name_the_group():
    coordinator = GroupCoordinator(random.Random(1), lambda t, p: 10, FAST)
    out = coordinator.handle(GroupRequest(1, _commit_request(group="orders-app")), 0)
    assert len(out) == 1 and isinstance(out[0], Persist) and out[0].group_id == "orders-app"
