"""The group coordinator against a dict model: joins, leaves, crashes, commits, restarts.

Method: a Hypothesis ``RuleBasedStateMachine`` drives the pure ``GroupCoordinator`` through
the test harness (``tests/unit/coordinator/harness.py``: a fake driver holding the durable
``__consumer_offsets`` log, and fake consumers running the real assignors). Two groups share
a four-partition topic: one of dynamic cooperative-sticky members, one of static range
members. The model is two dicts: which consumers are alive in each group, and the committed
offset of each (group, partition). Rules add consumers, make them leave, crash them (time runs
past their session timeout while the others heartbeat), bounce static members, commit (as a
member, simply, beyond the log end, with a failing persist), delete groups and restart the
coordinator from the log (also with a commit still in flight, which must then be forgotten),
and let departed consumers (zombies) heartbeat, sync and commit, which must all be fenced.
After every step: the coordinator's own ``check_invariants``, OffsetFetch equals the model,
the described membership equals the model, and every partition is owned by exactly one live
consumer of each settled group.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rivven_broker.protocol import assignors
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.group_messages import (
    DeleteGroup,
    DescribeGroup,
    Heartbeat,
    OffsetFetch,
    SyncGroup,
)
from tests.unit.coordinator.harness import Consumer, Driver, ownership, settle

TOPIC = "t"
PARTITIONS = 4
LOG_END = 100
GROUPS = {"dyn": assignors.COOPERATIVE_STICKY, "static": assignors.RANGE}
SLOTS = 4


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.driver = Driver()
        self.driver.topic(TOPIC, PARTITIONS, LOG_END)
        self.consumers: dict[str, dict[int, Consumer]] = {g: {} for g in GROUPS}
        self.offsets: dict[str, dict[int, int]] = {g: {} for g in GROUPS}
        self.zombies: list[Consumer] = []  # consumers that left, crashed or were replaced

    # --- helpers -----------------------------------------------------------------------

    def _new_consumer(self, group: str, slot: int) -> Consumer:
        instance = f"host-{slot}" if group == "static" else None
        return Consumer(
            self.driver, group, [TOPIC], GROUPS[group], instance_id=instance,
            name=f"{group}-{slot}",
        )

    def _settle(self, group: str) -> None:
        if self.consumers[group]:
            settle(list(self.consumers[group].values()))

    def _settle_all(self) -> None:
        for group in GROUPS:
            self._settle(group)

    def _run_for(self, ms: int, silent: Consumer | None = None) -> None:
        """Let time pass in 2 s steps; every live consumer but ``silent`` heartbeats."""
        for _ in range(ms // 2_000):
            self.driver.advance(2_000)
            for group in GROUPS:
                for consumer in self.consumers[group].values():
                    if consumer is not silent:
                        consumer.heartbeat()
        self._settle_all()

    def _expect_commit(self, token: int, code: ErrorCode) -> bool:
        answer = self.driver.answer(token)
        assert answer is not None
        codes = {p.error_code for t in answer.topics for p in t.partitions}
        assert codes == {code}, codes
        return code == ErrorCode.NONE

    # --- membership rules --------------------------------------------------------------

    @rule(group=st.sampled_from(sorted(GROUPS)), count=st.integers(1, 3))
    def add(self, group: str, count: int) -> None:
        """Up to ``count`` consumers start together (one round, if the coordinator can)."""
        free = [slot for slot in range(SLOTS) if slot not in self.consumers[group]]
        for slot in free[:count]:
            self.consumers[group][slot] = self._new_consumer(group, slot)
        self._settle(group)

    @rule(group=st.sampled_from(sorted(GROUPS)), slot=st.integers(0, SLOTS - 1))
    def leave(self, group: str, slot: int) -> None:
        consumer = self.consumers[group].pop(slot, None)
        if consumer is not None:
            consumer.leave()
            self.zombies.append(consumer)
            self._settle(group)

    @rule(group=st.sampled_from(sorted(GROUPS)), slot=st.integers(0, SLOTS - 1))
    def crash(self, group: str, slot: int) -> None:
        consumer = self.consumers[group].pop(slot, None)
        if consumer is not None:
            self.zombies.append(consumer)
            self._run_for(12_000, silent=consumer)

    @rule(slot=st.integers(0, SLOTS - 1))
    def bounce_static_member(self, slot: int) -> None:
        old = self.consumers["static"].get(slot)
        if old is None:
            return
        new = self._new_consumer("static", slot)
        self.consumers["static"][slot] = new
        self.zombies.append(old)
        self._settle("static")
        assert new.owned == old.owned and new.generation == old.generation

    @precondition(lambda self: self.zombies)
    @rule(data=st.data())
    def zombie_is_fenced(self, data) -> None:
        """A consumer that is gone (left, expired, replaced) heartbeats, syncs and commits
        with what it last knew: all refused, nothing changes."""
        zombie = data.draw(st.sampled_from(self.zombies))
        fenced = {
            ErrorCode.UNKNOWN_MEMBER_ID,
            ErrorCode.ILLEGAL_GENERATION,
            ErrorCode.FENCED_INSTANCE_ID,
        }
        beat = Heartbeat(zombie.group_id, zombie.generation, zombie.member_id, zombie.instance_id)
        assert self.driver.call(beat).error_code in fenced
        sync = SyncGroup(zombie.group_id, zombie.generation, zombie.member_id, zombie.instance_id)
        assert self.driver.call(sync).error_code in fenced
        token = zombie.commit({(TOPIC, 0): 1})
        answer = self.driver.answer(token)
        assert {p.error_code for t in answer.topics for p in t.partitions} <= fenced

    @rule()
    def time_passes(self) -> None:
        self._run_for(6_000)

    # --- offsets rules -----------------------------------------------------------------

    @rule(group=st.sampled_from(sorted(GROUPS)), data=st.data())
    def member_commit(self, group: str, data) -> None:
        owners = [c for c in self.consumers[group].values() if c.owned]
        if not owners:
            return
        consumer = data.draw(st.sampled_from(owners))
        offsets = {tp: data.draw(st.integers(0, LOG_END)) for tp in consumer.owned}
        if self._expect_commit(consumer.commit(offsets), ErrorCode.NONE):
            for (_, partition), offset in offsets.items():
                self.offsets[group][partition] = offset

    @rule(group=st.sampled_from(sorted(GROUPS)), partition=st.integers(0, PARTITIONS - 1),
          offset=st.integers(0, LOG_END))
    def simple_commit(self, group: str, partition: int, offset: int) -> None:
        token = self.driver.commit(group, {(TOPIC, partition): offset})
        expected = ErrorCode.UNKNOWN_MEMBER_ID if self.consumers[group] else ErrorCode.NONE
        if self._expect_commit(token, expected):
            self.offsets[group][partition] = offset

    @rule(group=st.sampled_from(sorted(GROUPS)), partition=st.integers(0, PARTITIONS - 1))
    def commit_beyond_log_end(self, group: str, partition: int) -> None:
        if self.consumers[group]:
            return
        token = self.driver.commit(group, {(TOPIC, partition): LOG_END + 1})
        self._expect_commit(token, ErrorCode.OFFSET_OUT_OF_RANGE)

    @rule(group=st.sampled_from(sorted(GROUPS)), partition=st.integers(0, PARTITIONS - 1))
    def commit_fails_to_persist(self, group: str, partition: int) -> None:
        if self.consumers[group]:
            return
        self.driver.auto_persist = False
        token = self.driver.commit(group, {(TOPIC, partition): 7})
        assert self.driver.answer(token) is None
        self.driver.release(fail=ErrorCode.KAFKA_STORAGE_ERROR)
        self.driver.auto_persist = True
        self._expect_commit(token, ErrorCode.KAFKA_STORAGE_ERROR)

    @rule(group=st.sampled_from(sorted(GROUPS)))
    def delete(self, group: str) -> None:
        answer = self.driver.call(DeleteGroup(group))
        exists = bool(self.consumers[group] or self.offsets[group]) or (
            self.driver.call(DescribeGroup(group)).error_code == ErrorCode.NONE
        )
        if self.consumers[group]:
            assert answer.error_code == ErrorCode.NON_EMPTY_GROUP
        elif answer.error_code == ErrorCode.NONE:
            self.offsets[group].clear()
        else:
            assert answer.error_code == ErrorCode.GROUP_ID_NOT_FOUND and not exists

    # --- restarts ----------------------------------------------------------------------

    @rule()
    def restart(self) -> None:
        self.driver.restart()
        self._settle_all()

    @precondition(lambda self: not self.consumers["dyn"])
    @rule(partition=st.integers(0, PARTITIONS - 1))
    def restart_with_a_commit_in_flight(self, partition: int) -> None:
        self.driver.auto_persist = False
        self.driver.commit("dyn", {(TOPIC, partition): 3})
        self.driver.restart()  # the commit was never durable, never answered: forgotten
        self.driver.auto_persist = True
        self._settle_all()

    # --- invariants --------------------------------------------------------------------

    @invariant()
    def offsets_match_the_model(self) -> None:
        for group in GROUPS:
            fetched = self.driver.call(OffsetFetch(group, all_topics=True))
            seen = {p.partition: p.offset for t in fetched.topics for p in t.partitions}
            assert seen == self.offsets[group]

    @invariant()
    def membership_matches_the_model(self) -> None:
        self.driver.coordinator.check_invariants()
        for group in GROUPS:
            live = self.consumers[group]
            described = self.driver.call(DescribeGroup(group))
            names = sorted(m.client_id for m in described.members)
            assert names == sorted(c.name for c in live.values())
            if live:
                assert described.state == "Stable"
                assert sorted(ownership(list(live.values()))) == [
                    (TOPIC, p) for p in range(PARTITIONS)
                ]


GroupMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestGroupCoordinatorMachine = pytest.mark.slow(GroupMachine.TestCase)
