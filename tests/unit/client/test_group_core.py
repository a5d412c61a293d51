"""The consumer's pure membership core against the real, pure group coordinator.

Goal: ``GroupCore.rebalance()`` makes members converge on a correct assignment and follows
the cooperative and eager protocols; heartbeat and commit answers fence as documented.
Method: no sockets and no clock. Each member's ``rebalance()`` generator is pumped by a tiny
scheduler; its ``Send`` actions go straight into a ``GroupCoordinator`` whose (possibly held)
answers are routed back by token, and whose ``Persist`` instructions are acknowledged at
once; when no member can move, virtual time advances and the coordinator ticks.
"""

from __future__ import annotations

import itertools
import random

import pytest

from rivven_broker.client.group_core import (
    Assign,
    GroupCore,
    GroupSettings,
    MemberState,
    PartitionCounts,
    Revoke,
    Send,
    Sleep,
)
from rivven_broker.client.types import TopicPartition
from rivven_broker.coordinator import (
    GroupCoordinator,
    GroupCoordinatorConfig,
    GroupRequest,
    Persist,
    Persisted,
    Respond,
    Tick,
)
from rivven_broker.protocol.errors import ErrorCode

PARTITIONS = 6
ALL = {TopicPartition("t", p) for p in range(PARTITIONS)}


class Broker:
    """The pure coordinator, answering immediately or later (held joins and syncs)."""

    def __init__(self) -> None:
        self.now_ms = 0
        self.answers: dict[int, object] = {}
        self.tokens = itertools.count(1)
        config = GroupCoordinatorConfig(initial_rebalance_delay_ms=0)
        self.coordinator = GroupCoordinator(random.Random(7), self._log_end, config)

    @staticmethod
    def _log_end(topic: str, partition: int) -> int | None:
        return 1000 if topic == "t" and partition < PARTITIONS else None

    def send(self, request) -> int:
        token = next(self.tokens)
        self._run(self.coordinator.handle(GroupRequest(token, request, "c", "h"), self.now_ms))
        return token

    def call(self, request):
        token = self.send(request)
        return self.answers.pop(token)

    def tick(self, ms: int) -> None:
        self.now_ms += ms
        self._run(self.coordinator.handle(Tick(), self.now_ms))

    def _run(self, out) -> None:
        for instruction in out:
            if isinstance(instruction, Respond):
                self.answers[instruction.token] = instruction.response
            else:
                assert isinstance(instruction, Persist)
                self._run(self.coordinator.handle(Persisted(instruction.persist_id), self.now_ms))


class Member:
    def __init__(self, name: str, broker: Broker, assignors=("cooperative-sticky",)) -> None:
        self.name = name
        self.broker = broker
        self.core = GroupCore(GroupSettings("g", None, 10_000, 30_000, 3_000, assignors))
        self.core.subscribe(["t"])
        self.events: list[tuple[str, frozenset]] = []
        self.steps = None
        self.reply = None
        self.waiting: int | None = None

    def step(self) -> bool:
        """One move of the rebalance; False when it waits for a held answer or is done."""
        if self.steps is None:
            if not self.core.needs_attention():
                return False
            self.steps, self.reply = self.core.rebalance(), None
        if self.waiting is not None:
            if self.waiting not in self.broker.answers:
                return False
            self.reply, self.waiting = (self.broker.answers.pop(self.waiting), None), None
        try:
            action = self.steps.send(self.reply)
        except StopIteration:
            self.steps = None
            return True
        self.reply = None
        if isinstance(action, Send):
            self.waiting = self.broker.send(action.request)
        elif isinstance(action, PartitionCounts):
            self.reply = {t: PARTITIONS for t in action.topics if t == "t"}
        elif isinstance(action, Revoke):
            self.events.append(("lost" if action.lost else "revoke", action.partitions))
        elif isinstance(action, Assign):
            assert action.added <= self.core.owned
            self.events.append(("assign", action.added))
        else:
            assert isinstance(action, Sleep)
        return True

    def heartbeat(self) -> ErrorCode:
        request = self.core.heartbeat_request()
        if request is None:
            return ErrorCode.NONE
        code = self.broker.call(request).error_code
        self.core.on_heartbeat(request, code)
        return code


def settle(broker: Broker, members: list[Member], rounds: int = 2000) -> None:
    """Pump every member (heartbeating the stable ones) until nobody has work left."""
    for _ in range(rounds):
        moved = any([member.step() for member in members])
        for member in members:
            if member.steps is None:
                member.heartbeat()
        if not moved and all(m.steps is None and not m.core.needs_attention() for m in members):
            return
        if not moved:
            broker.tick(100)
        broker.coordinator.check_invariants()
        for member in members:
            member.core.check_invariants()
    raise AssertionError("the group did not settle")


def assert_partitioned(members: list[Member]) -> None:
    owned = [m.core.owned for m in members]
    assert set().union(*owned) == ALL
    assert sum(len(o) for o in owned) == PARTITIONS  # nobody shares a partition
    assert max(len(o) for o in owned) - min(len(o) for o in owned) <= 1


def test_three_members_converge_and_a_fourth_moves_only_what_it_takes():
    broker = Broker()
    members = [Member(f"m{i}", broker) for i in range(3)]
    settle(broker, members)
    assert_partitioned(members)
    assert all(m.core.state is MemberState.STABLE for m in members)
    before = {m.name: m.core.owned for m in members}
    for member in members:
        member.events.clear()
    members.append(Member("m3", broker))
    settle(broker, members)
    assert_partitioned(members)
    taken = members[3].core.owned
    for member in members[:3]:
        assert member.core.owned <= before[member.name]
        revoked = set().union(*(p for kind, p in member.events if kind == "revoke"), set())
        assert revoked == before[member.name] - member.core.owned
        assert not [e for e in member.events if e[0] == "assign"]  # nobody else gains
    assert sum(len(before[m.name] - m.core.owned) for m in members[:3]) == len(taken)


def test_an_eager_member_revokes_everything_before_it_rejoins():
    broker = Broker()
    members = [Member("a", broker, ("range",)), Member("b", broker, ("range",))]
    settle(broker, members[:1])
    assert members[0].core.owned == ALL
    settle(broker, members)
    assert_partitioned(members)
    kinds = [kind for kind, _ in members[0].events]
    assert kinds == ["assign", "revoke", "assign"]
    assert members[0].events[1][1] == ALL


def test_fencing_answers_lose_partitions_or_stop_the_member():
    broker = Broker()
    member = Member("a", broker)
    settle(broker, [member])
    request = member.core.heartbeat_request()
    stale = request.__class__(request.group_id, request.generation_id - 1, request.member_id)
    member.core.on_heartbeat(stale, ErrorCode.ILLEGAL_GENERATION)  # an older generation's
    assert not member.core.needs_attention()
    member.core.on_heartbeat(request, ErrorCode.UNKNOWN_MEMBER_ID)
    assert member.core.owned == frozenset() and member.core.member_id == ""
    steps = member.core.rebalance()
    assert next(steps) == Revoke(frozenset(ALL), lost=True)
    other = Member("b", broker)
    other.core._fenced(ErrorCode.FENCED_INSTANCE_ID)
    with pytest.raises(Exception) as fatal:
        next(other.core.rebalance())
    assert fatal.value.code == "FENCED_INSTANCE_ID"


def test_commits_are_member_commits_when_stable_and_simple_otherwise():
    broker = Broker()
    member = Member("a", broker)
    simple = member.core.commit_request({TopicPartition("t", 0): (5, None)})
    assert (simple.generation_id, simple.member_id) == (-1, "")
    settle(broker, [member])
    commit = member.core.commit_request({TopicPartition("t", 0): (5, "m")})
    assert commit.generation_id == member.core.generation and commit.member_id
    answer = broker.call(commit)
    outcome = member.core.on_commit_response(commit, answer)
    assert outcome == {TopicPartition("t", 0): ErrorCode.NONE}
    too_far = member.core.commit_request({TopicPartition("t", 1): (5000, None)})
    outcome = member.core.on_commit_response(too_far, broker.call(too_far))
    assert outcome == {TopicPartition("t", 1): ErrorCode.OFFSET_OUT_OF_RANGE}
    leave = member.core.leave_request()
    assert leave.members[0].member_id and member.core.state is MemberState.UNJOINED
