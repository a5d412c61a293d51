"""A fake driver and fake consumers around the pure group coordinator, for scenario tests.

``Driver`` plays the broker: it feeds events at a virtual time, keeps the durable
``__consumer_offsets`` log as a list (acknowledging persists at once unless told to hold
them), collects responses by token, and can restart the coordinator from the log.
``Consumer`` plays a client: it joins (answering MEMBER_ID_REQUIRED), runs the assignor when
it leads, syncs, heartbeats, and follows the eager or cooperative protocol.
``settle`` drives a set of consumers until the group is stable and nobody needs to rejoin.
"""

from __future__ import annotations

import itertools
import random

from rivven_broker.coordinator import (
    GroupCoordinator,
    GroupCoordinatorConfig,
    GroupRequest,
    Persist,
    Persisted,
    PersistFailed,
    Respond,
    Tick,
)
from rivven_broker.protocol import assignors
from rivven_broker.protocol.consumer_protocol import Assignment, Subscription
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.group_messages import (
    Heartbeat,
    JoinGroup,
    JoinGroupProtocol,
    LeaveGroup,
    LeaveGroupMember,
    OffsetCommit,
    OffsetCommitPartition,
    OffsetCommitTopic,
    SyncGroup,
    SyncGroupAssignment,
)

FAST = GroupCoordinatorConfig(initial_rebalance_delay_ms=0)


class Driver:
    """The broker side: time, the log, responses."""

    def __init__(self, config: GroupCoordinatorConfig = FAST, seed: int = 0) -> None:
        self.config = config
        self.seed = seed
        self.now_ms = 1_000_000
        self.log: list[tuple[bytes, bytes | None]] = []
        self.log_ends: dict[tuple[str, int], int] = {}
        self.responses: dict[object, object] = {}
        self.held_persists: list[Persist] = []
        self.auto_persist = True
        self._tokens = itertools.count()
        self.coordinator = self._new_coordinator()

    def _new_coordinator(self) -> GroupCoordinator:
        rng = random.Random(self.seed)
        self.seed += 1
        return GroupCoordinator(rng, lambda t, p: self.log_ends.get((t, p)), self.config)

    def topic(self, name: str, partitions: int, log_end: int = 1000) -> None:
        for p in range(partitions):
            self.log_ends[(name, p)] = log_end

    def _feed(self, event, now_ms: int | None = None) -> None:
        out = self.coordinator.handle(event, self.now_ms if now_ms is None else now_ms)
        for instruction in out:
            if isinstance(instruction, Respond):
                assert instruction.token not in self.responses, instruction
                self.responses[instruction.token] = instruction.response
            else:
                assert isinstance(instruction, Persist)
                self.held_persists.append(instruction)
        self.coordinator.check_invariants()
        if self.auto_persist:
            self.release()

    def send(self, request, client_id: str = "client", client_host: str = "10.0.0.1") -> int:
        token = next(self._tokens)
        self._feed(GroupRequest(token, request, client_id, client_host))
        return token

    def call(self, request, **kwargs):
        """Send and return the answer, which must come at once."""
        token = self.send(request, **kwargs)
        return self.responses.pop(token)

    def answer(self, token: int):
        return self.responses.pop(token, None)

    def release(self, fail: ErrorCode | None = None) -> None:
        """Make every held persist durable (or fail them all with ``fail``)."""
        while self.held_persists:
            persist = self.held_persists.pop(0)
            if fail is None:
                self.log.extend(persist.records)
                self._feed(Persisted(persist.persist_id))
            else:
                self._feed(PersistFailed(persist.persist_id, fail))

    def advance(self, ms: int) -> None:
        """Move time forward, ticking at every deadline on the way."""
        target = self.now_ms + ms
        while True:
            deadline = self.coordinator.next_deadline_ms()
            if deadline is None or deadline > target:
                break
            self.now_ms = max(self.now_ms, deadline)
            self._feed(Tick())
        self.now_ms = target
        self._feed(Tick())

    def restart(self) -> None:
        """A new coordinator rebuilt from the durable log (held persists are lost)."""
        self.held_persists.clear()
        self.responses.clear()
        self.coordinator = self._new_coordinator()
        self.coordinator.load(list(self.log), self.now_ms)
        self.coordinator.check_invariants()

    def commit(self, group_id: str, offsets: dict[tuple[str, int], int], **fencing):
        topics: dict[str, list[OffsetCommitPartition]] = {}
        for (topic, partition), offset in sorted(offsets.items()):
            topics.setdefault(topic, []).append(OffsetCommitPartition(partition, offset))
        request = OffsetCommit(
            group_id, topics=[OffsetCommitTopic(t, ps) for t, ps in topics.items()], **fencing
        )
        return self.send(request)


class Consumer:
    """A consumer client: membership and assignment, no records."""

    def __init__(
        self,
        driver: Driver,
        group_id: str,
        topics: list[str],
        assignor: str = assignors.COOPERATIVE_STICKY,
        instance_id: str | None = None,
        name: str = "consumer",
        session_timeout_ms: int = 10_000,
    ) -> None:
        self.driver = driver
        self.group_id = group_id
        self.topics = topics
        self.assignor = assignor
        self.instance_id = instance_id
        self.name = name
        self.session_timeout_ms = session_timeout_ms
        self.member_id = ""
        self.generation = -1
        self.owned: tuple[tuple[str, int], ...] = ()
        self.owned_generation = -1
        self.needs_join = True
        self.join_token: int | None = None
        self.sync_token: int | None = None
        self.join_answer = None
        self.revocations: list[tuple[str, int]] = []
        self.history: list[tuple[tuple[str, int], ...]] = []

    def subscription(self) -> Subscription:
        owned = self.owned if self.assignor == assignors.COOPERATIVE_STICKY else ()
        return Subscription(self.topics, owned, self.owned_generation)

    def start_join(self) -> None:
        assert self.join_token is None
        if assignors.rebalance_protocol(self.assignor) == assignors.EAGER:
            self._own((), self.owned_generation)
        request = JoinGroup(
            self.group_id,
            self.member_id,
            self.instance_id,
            self.session_timeout_ms,
            30_000,
            protocols=[JoinGroupProtocol(self.assignor, self.subscription().encode())],
        )
        self.needs_join = False
        self.join_token = self.driver.send(request, client_id=self.name)

    def _own(self, partitions, generation: int) -> None:
        revoked = sorted(set(self.owned) - set(partitions))
        self.revocations.extend(revoked)
        self.owned = tuple(sorted(partitions))
        self.owned_generation = generation
        self.history.append(self.owned)
        if revoked and self.assignor == assignors.COOPERATIVE_STICKY:
            self.needs_join = True  # the follow-up round

    def poll(self) -> bool:
        """React to answers that arrived; True if something happened."""
        progressed = False
        if self.join_token is not None and self.join_token in self.driver.responses:
            answer = self.driver.answer(self.join_token)
            self.join_token = None
            progressed = True
            self._on_join(answer)
        if self.sync_token is not None and self.sync_token in self.driver.responses:
            answer = self.driver.answer(self.sync_token)
            self.sync_token = None
            progressed = True
            if answer.error_code == ErrorCode.NONE:
                self._own(Assignment.decode(answer.assignment).partitions, self.generation)
            else:
                self.needs_join = True
        if self.needs_join and self.join_token is None and self.sync_token is None:
            self.start_join()
            progressed = True
        return progressed

    def _on_join(self, answer) -> None:
        if answer.error_code == ErrorCode.MEMBER_ID_REQUIRED:
            self.member_id = answer.member_id
            self.needs_join = True
            return
        if answer.error_code != ErrorCode.NONE:
            if answer.error_code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID):
                self.member_id = ""
            self.needs_join = True
            return
        self.member_id = answer.member_id
        self.generation = answer.generation_id
        self.join_answer = answer
        assignments = ()
        if answer.leader == self.member_id and answer.members:
            members = assignors.members_from_subscriptions(
                (m.member_id, m.group_instance_id, Subscription.decode(m.metadata))
                for m in answer.members
            )
            topics = {t for m in members.values() for t in m.topics}
            counts = {t: _partition_count(self.driver, t) for t in topics}
            result = assignors.assign(answer.protocol_name, members, counts)
            assignments = [
                SyncGroupAssignment(member_id, Assignment(parts).encode())
                for member_id, parts in result.items()
            ]
        request = SyncGroup(
            self.group_id, self.generation, self.member_id, self.instance_id, assignments
        )
        self.sync_token = self.driver.send(request, client_id=self.name)

    def heartbeat(self) -> ErrorCode:
        if self.join_token is not None or self.sync_token is not None or self.needs_join:
            return ErrorCode.NONE
        request = Heartbeat(self.group_id, self.generation, self.member_id, self.instance_id)
        code = self.driver.call(request).error_code
        if code != ErrorCode.NONE:
            self.needs_join = True
            if code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION):
                if code == ErrorCode.UNKNOWN_MEMBER_ID:
                    self.member_id = ""
                self._own((), -1)
        return code

    def leave(self) -> None:
        request = LeaveGroup(self.group_id, [LeaveGroupMember(self.member_id, self.instance_id)])
        assert self.driver.call(request).error_code == ErrorCode.NONE

    def commit(self, offsets: dict[tuple[str, int], int]) -> int:
        return self.driver.commit(
            self.group_id,
            offsets,
            generation_id=self.generation,
            member_id=self.member_id,
            group_instance_id=self.instance_id,
        )

    @property
    def settled(self) -> bool:
        return not self.needs_join and self.join_token is None and self.sync_token is None


def _partition_count(driver: Driver, topic: str) -> int:
    return sum(1 for (t, _p) in driver.log_ends if t == topic)


def settle(consumers: list[Consumer], rounds_max: int = 50) -> None:
    """Drive joins, syncs and heartbeats until every consumer is settled and heartbeats
    all answer NONE."""
    for _ in range(rounds_max):
        progressed = True
        while progressed:
            progressed = any([c.poll() for c in consumers])
        if all(c.settled for c in consumers):
            codes = [c.heartbeat() for c in consumers]
            if all(code == ErrorCode.NONE for code in codes):
                return
        else:
            # Someone is waiting for a round to close: the others learn it from a heartbeat.
            for c in consumers:
                if c.settled:
                    c.heartbeat()
    raise AssertionError("the group did not settle")


def ownership(consumers: list[Consumer]) -> dict[tuple[str, int], str]:
    """Partition -> owner name; asserts nobody shares a partition."""
    owners: dict[tuple[str, int], str] = {}
    for c in consumers:
        for tp in c.owned:
            assert tp not in owners, (tp, owners[tp], c.name)
            owners[tp] = c.name
    return owners
