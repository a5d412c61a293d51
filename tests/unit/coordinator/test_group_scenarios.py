"""Whole-group scenarios on the pure coordinator with fake consumers running real assignors.

Method: ``harness.Driver`` feeds the coordinator at a virtual time and acknowledges its
persists; ``harness.Consumer`` behaves like a client (MEMBER_ID_REQUIRED, leader assignment
with ``protocol.assignors``, sync, heartbeats, eager or cooperative revocation). Each test
builds the situation the issue names and checks ownership: three members over six partitions
own two each; a silent member loses its partitions after its session timeout; a fourth
cooperative-sticky member moves only what it takes; a static member restarting gets its
partitions back with no rebalance; offsets survive a coordinator restart.
"""

from __future__ import annotations

import pytest

from rivven_broker.protocol import assignors
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.group_messages import (
    DescribeGroup,
    Heartbeat,
    ListGroups,
    OffsetFetch,
    OffsetFetchTopic,
)
from tests.unit.coordinator.harness import Consumer, Driver, ownership, settle

TOPIC = "orders"
ALL = [(TOPIC, p) for p in range(6)]


def _group(driver: Driver, count: int, assignor: str, **kwargs) -> list[Consumer]:
    consumers = [
        Consumer(driver, "billing", [TOPIC], assignor, name=f"c{i}", **kwargs)
        for i in range(count)
    ]
    settle(consumers)
    return consumers


@pytest.mark.parametrize("assignor", assignors.ASSIGNOR_NAMES)
def test_three_members_own_two_partitions_each(assignor):
    driver = Driver()
    driver.topic(TOPIC, 6)
    consumers = _group(driver, 3, assignor)
    owners = ownership(consumers)
    assert sorted(owners) == ALL
    assert sorted(len(c.owned) for c in consumers) == [2, 2, 2]
    assert len({c.generation for c in consumers}) == 1
    described = driver.call(DescribeGroup("billing"))
    assert described.state == "Stable" and described.protocol == assignor
    assert sorted(m.client_id for m in described.members) == ["c0", "c1", "c2"]


def test_a_silent_member_loses_its_partitions_after_the_session_timeout():
    driver = Driver()
    driver.topic(TOPIC, 6)
    consumers = _group(driver, 3, assignors.RANGE)
    silent, alive = consumers[0], consumers[1:]
    lost = set(silent.owned)
    generation = alive[0].generation
    for _ in range(3):  # 9 s: the silent member is still a member
        driver.advance(3_000)
        assert all(c.heartbeat() == ErrorCode.NONE for c in alive)
    driver.advance(1_500)  # 10.5 s after its last sign of life: expired
    assert alive[0].heartbeat() == ErrorCode.REBALANCE_IN_PROGRESS
    settle(alive)
    assert sorted(ownership(alive)) == ALL
    assert lost <= {tp for c in alive for tp in c.owned}
    assert all(c.generation == generation + 1 for c in alive)
    stale = Heartbeat("billing", generation, silent.member_id)
    assert driver.call(stale).error_code == ErrorCode.UNKNOWN_MEMBER_ID


def test_a_fourth_cooperative_member_moves_only_what_it_takes():
    driver = Driver()
    driver.topic(TOPIC, 6)
    consumers = _group(driver, 3, assignors.COOPERATIVE_STICKY)
    before = ownership(consumers)
    newcomer = Consumer(driver, "billing", [TOPIC], name="c3")
    consumers.append(newcomer)
    settle(consumers)
    after = ownership(consumers)
    assert sorted(after) == ALL
    assert sorted(len(c.owned) for c in consumers) == [1, 1, 2, 2]
    moved = {tp for tp in ALL if before[tp] != after[tp]}
    assert moved == set(newcomer.owned) and len(moved) == 1
    # Nobody but the giver revoked anything, and the giver revoked exactly what moved.
    revoked = [tp for c in consumers[:3] for tp in c.revocations]
    assert sorted(revoked) == sorted(moved)


def test_a_restarted_static_member_gets_its_partitions_back_without_a_rebalance():
    driver = Driver()
    driver.topic(TOPIC, 6)
    consumers = [
        Consumer(
            driver, "billing", [TOPIC], assignors.RANGE, instance_id=f"host-{i}", name=f"c{i}"
        )
        for i in range(3)
    ]
    settle(consumers)
    generation = consumers[0].generation
    old = consumers[1]
    restarted = Consumer(
        driver, "billing", [TOPIC], assignors.RANGE, instance_id="host-1", name="c1-again"
    )
    settle([consumers[0], restarted, consumers[2]])
    assert restarted.owned == old.owned and restarted.member_id != old.member_id
    assert all(c.generation == generation for c in (consumers[0], restarted, consumers[2]))
    assert consumers[0].revocations == [] and consumers[2].revocations == []
    # The old incarnation is fenced.
    fenced = Heartbeat("billing", generation, old.member_id, "host-1")
    assert driver.call(fenced).error_code == ErrorCode.FENCED_INSTANCE_ID
    # And the replacement is durable: a coordinator restart keeps it.
    driver.restart()
    again = Heartbeat("billing", generation, restarted.member_id, "host-1")
    assert driver.call(again).error_code == ErrorCode.NONE


def test_offsets_and_membership_survive_a_coordinator_restart():
    driver = Driver()
    driver.topic(TOPIC, 6)
    consumers = _group(driver, 2, assignors.ROUND_ROBIN)
    for c in consumers:
        token = c.commit({tp: 10 + tp[1] for tp in c.owned})
        answer = driver.answer(token)
        assert all(p.error_code == ErrorCode.NONE for t in answer.topics for p in t.partitions)
    driver.restart()
    fetched = driver.call(OffsetFetch("billing", [OffsetFetchTopic(TOPIC, list(range(6)))]))
    assert [p.offset for p in fetched.topics[0].partitions] == [10, 11, 12, 13, 14, 15]
    # The group came back Stable: members keep heartbeating without rejoining.
    assert all(c.heartbeat() == ErrorCode.NONE for c in consumers)
    listing = driver.call(ListGroups())
    assert [(g.group_id, g.state, g.protocol_type) for g in listing.groups] == [
        ("billing", "Stable", "consumer")
    ]


def test_everyone_leaving_empties_the_group_and_offsets_expire_later():
    driver = Driver()
    driver.topic(TOPIC, 6)
    consumers = _group(driver, 2, assignors.RANGE)
    token = consumers[0].commit({tp: 1 for tp in consumers[0].owned})
    assert driver.answer(token) is not None
    for c in consumers:
        c.leave()
    assert driver.call(DescribeGroup("billing")).state == "Empty"
    driver.advance(driver.config.offsets_retention_ms - 60_000)
    assert driver.call(ListGroups()).groups[0].state == "Empty"
    driver.advance(20 * 60_000)  # past retention and at least one expiry sweep
    assert driver.call(ListGroups()).groups == ()
    driver.restart()  # the tombstones are durable too
    assert driver.call(ListGroups()).groups == ()
