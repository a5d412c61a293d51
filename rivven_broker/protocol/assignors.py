"""Partition assignors: pure functions the group leader runs to share partitions among members.

Theory of operation
-------------------
After a rebalance round the coordinator hands the leader every member's subscription; the
leader calls ``assign(name, members, partitions_per_topic)`` and sends the result back in
SyncGroup. Every assignor gives each partition of a subscribed, existing topic to exactly one
member subscribed to that topic (topics missing from ``partitions_per_topic`` are skipped).
Members are ordered by ``group_instance_id`` when they have one, else by member id, so static
members keep their place across restarts. (The module lives in ``protocol`` rather than
``coordinator`` because the client runs it, and the client may import only protocol and
records.)

- **range** (``range``): per topic, the subscribed members in order take contiguous runs;
  the first ``P % n`` take one extra.
- **round-robin** (``roundrobin``): all partitions sorted by (topic, partition) are dealt in
  turn to the subscribed members, skipping members not subscribed to a partition's topic.
- **sticky** (``sticky``): balance first, then move as little as possible. (1) Every member
  keeps what it owns, when it still subscribes to the topic and the partition exists; two
  members claiming one partition: the higher ``generation`` wins, then the lower order.
  (2) Unowned partitions go, in order, to the eligible member with the fewest. (3) While some
  partition sits on a member with at least two more partitions than another member subscribed
  to its topic, one moves there, always from the largest such member (partitions new to the
  owner move first). Each move lowers the sum of squared sizes, so this ends, and it ends
  *balanced*: no partition can move to an eligible member without leaving that member larger
  than the giver. With equal subscriptions that means sizes differ by at most one and the
  number of moved partitions is the least any balanced assignment needs (the tests check
  both against brute force).
- **cooperative-sticky** (``cooperative-sticky``): the sticky target, but a partition that
  another member owns now is *withheld* (assigned to nobody) this round. Its owner, whose new
  assignment lacks it, revokes it and rejoins; in that follow-up round nobody owns it and it
  goes to its target. Members keep consuming the partitions they keep throughout (KIP-429).

``rebalance_protocol(name)`` says which of the two protocols an assignor needs: ``"eager"``
(members revoke everything before rejoining) or ``"cooperative"``. Pure: no I/O, no clocks,
no randomness; the output depends only on the input.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

import attrs

from rivven_broker.protocol.consumer_protocol import Subscription, TopicPartitions

__all__ = [
    "RANGE",
    "ROUND_ROBIN",
    "STICKY",
    "COOPERATIVE_STICKY",
    "EAGER",
    "COOPERATIVE",
    "ASSIGNOR_NAMES",
    "MemberSubscription",
    "Assignor",
    "assign",
    "rebalance_protocol",
    "range_assign",
    "round_robin_assign",
    "sticky_assign",
    "cooperative_sticky_assign",
    "members_from_subscriptions",
]

RANGE = "range"
ROUND_ROBIN = "roundrobin"
STICKY = "sticky"
COOPERATIVE_STICKY = "cooperative-sticky"
EAGER = "eager"
COOPERATIVE = "cooperative"

TopicPartition = tuple[str, int]


@attrs.frozen
class MemberSubscription:
    """One member as an assignor sees it."""

    topics: frozenset[str] = attrs.field(converter=frozenset)
    owned_partitions: TopicPartitions = attrs.field(
        default=(), converter=lambda v: tuple(sorted(set(v)))
    )
    generation: int = -1
    group_instance_id: str | None = None


Members = Mapping[str, MemberSubscription]
Assignor = Callable[[Members, Mapping[str, int]], dict[str, TopicPartitions]]


def members_from_subscriptions(
    members: Iterable[tuple[str, str | None, Subscription]],
) -> dict[str, MemberSubscription]:
    """Assignor input from (member id, group instance id, decoded subscription) triples."""
    return {
        member_id: MemberSubscription(
            sub.topics, sub.owned_partitions, sub.generation, instance_id
        )
        for member_id, instance_id, sub in members
    }


def _order(members: Members) -> list[str]:
    """Member ids in assignment order: static members by instance id, then the rest by id."""

    def key(member_id: str) -> tuple[int, str, str]:
        instance = members[member_id].group_instance_id
        return (0, instance, member_id) if instance is not None else (1, member_id, member_id)

    return sorted(members, key=key)


def _eligible(members: Members, order: list[str], partitions_per_topic: Mapping[str, int]):
    """Topic -> members subscribed to it, in order (existing topics only)."""
    eligible: dict[str, list[str]] = {}
    for member_id in order:
        for topic in members[member_id].topics:
            if partitions_per_topic.get(topic, 0) > 0:
                eligible.setdefault(topic, []).append(member_id)
    return dict(sorted(eligible.items()))


def _finish(order: list[str], assigned: Mapping[str, Iterable[TopicPartition]]):
    return {member_id: tuple(sorted(assigned.get(member_id, ()))) for member_id in order}


def range_assign(members: Members, partitions_per_topic: Mapping[str, int]):
    """The range assignor. Pure; returns member id -> sorted (topic, partition) pairs."""
    order = _order(members)
    assigned: dict[str, list[TopicPartition]] = {m: [] for m in order}
    for topic, subscribers in _eligible(members, order, partitions_per_topic).items():
        count = partitions_per_topic[topic]
        each, extra = divmod(count, len(subscribers))
        start = 0
        for index, member_id in enumerate(subscribers):
            size = each + (1 if index < extra else 0)
            assigned[member_id].extend((topic, p) for p in range(start, start + size))
            start += size
        assert start == count
    return _finish(order, assigned)


def round_robin_assign(members: Members, partitions_per_topic: Mapping[str, int]):
    """The round-robin assignor. Pure; returns member id -> sorted (topic, partition) pairs."""
    order = _order(members)
    assigned: dict[str, list[TopicPartition]] = {m: [] for m in order}
    if not order:
        return {}
    cursor = 0
    for topic, subscribers in _eligible(members, order, partitions_per_topic).items():
        subscribed = set(subscribers)
        for partition in range(partitions_per_topic[topic]):
            while order[cursor % len(order)] not in subscribed:
                cursor += 1
            assigned[order[cursor % len(order)]].append((topic, partition))
            cursor += 1
    return _finish(order, assigned)


def _valid_claims(
    members: Members, order: list[str], partitions_per_topic: Mapping[str, int]
) -> dict[TopicPartition, str]:
    """Partition -> the member that keeps it: subscribed, existing, highest generation."""
    claims: dict[TopicPartition, tuple[int, int, str]] = {}
    for rank, member_id in enumerate(order):
        member = members[member_id]
        for topic, partition in member.owned_partitions:
            if topic not in member.topics:
                continue
            if not 0 <= partition < partitions_per_topic.get(topic, 0):
                continue
            claim = (-member.generation, rank, member_id)
            previous = claims.get((topic, partition))
            if previous is None or claim < previous:
                claims[(topic, partition)] = claim
    return {tp: claim[2] for tp, claim in claims.items()}


class _Sizes:
    """Assignment under construction, with each member's rank for tie-breaking."""

    def __init__(self, order: list[str]) -> None:
        self.rank = {member_id: i for i, member_id in enumerate(order)}
        self.assigned: dict[str, set[TopicPartition]] = {m: set() for m in order}

    def size(self, member_id: str) -> int:
        return len(self.assigned[member_id])

    def smallest(self, candidates: list[str]) -> str:
        return min(candidates, key=lambda m: (len(self.assigned[m]), self.rank[m]))


def _sticky_target(members: Members, partitions_per_topic: Mapping[str, int]):
    """The balanced, minimally-moving assignment (sets) and the claims it started from."""
    order = _order(members)
    eligible = _eligible(members, order, partitions_per_topic)
    claims = _valid_claims(members, order, partitions_per_topic)
    state = _Sizes(order)
    for (topic, partition), member_id in claims.items():
        if topic in eligible:
            state.assigned[member_id].add((topic, partition))
    for topic, subscribers in eligible.items():
        for partition in range(partitions_per_topic[topic]):
            if (topic, partition) not in claims:
                state.assigned[state.smallest(subscribers)].add((topic, partition))
    _balance(state, order, eligible, claims)
    return order, state.assigned, claims


def _balance(
    state: _Sizes,
    order: list[str],
    eligible: dict[str, list[str]],
    claims: Mapping[TopicPartition, str],
) -> None:
    """One move at a time, always from the largest member that can give to an eligible
    member at least two smaller, until no such move exists."""
    while _move_one(state, order, eligible, claims):
        pass


def _move_one(
    state: _Sizes,
    order: list[str],
    eligible: dict[str, list[str]],
    claims: Mapping[TopicPartition, str],
) -> bool:
    for giver in sorted(order, key=lambda m: (-state.size(m), state.rank[m])):
        # Partitions new to the giver move before the ones it owned.
        candidates = sorted(state.assigned[giver], key=lambda tp: (claims.get(tp) == giver, tp))
        for tp in candidates:
            taker = state.smallest(eligible[tp[0]])
            if state.size(giver) > state.size(taker) + 1:
                state.assigned[giver].remove(tp)
                state.assigned[taker].add(tp)
                return True
    return False


def sticky_assign(members: Members, partitions_per_topic: Mapping[str, int]):
    """The sticky assignor (eager protocol). Pure; member id -> sorted pairs."""
    order, assigned, _ = _sticky_target(members, partitions_per_topic)
    return _finish(order, assigned)


def cooperative_sticky_assign(members: Members, partitions_per_topic: Mapping[str, int]):
    """The cooperative-sticky assignor: the sticky target minus partitions that another
    member still owns (they are assigned in the follow-up round). Pure."""
    order, assigned, _ = _sticky_target(members, partitions_per_topic)
    holders: dict[TopicPartition, set[str]] = {}
    for member_id in order:
        for tp in members[member_id].owned_partitions:
            holders.setdefault(tp, set()).add(member_id)
    result = {}
    for member_id in order:
        result[member_id] = tuple(
            sorted(tp for tp in assigned[member_id] if holders.get(tp, set()) <= {member_id})
        )
    return result


_ASSIGNORS: dict[str, tuple[Assignor, str]] = {
    RANGE: (range_assign, EAGER),
    ROUND_ROBIN: (round_robin_assign, EAGER),
    STICKY: (sticky_assign, EAGER),
    COOPERATIVE_STICKY: (cooperative_sticky_assign, COOPERATIVE),
}
#: Every assignor name, the default (cooperative-sticky) first.
ASSIGNOR_NAMES = (COOPERATIVE_STICKY, RANGE, ROUND_ROBIN, STICKY)
assert set(ASSIGNOR_NAMES) == set(_ASSIGNORS)


def assign(
    name: str, members: Members, partitions_per_topic: Mapping[str, int]
) -> dict[str, TopicPartitions]:
    """Run the assignor called ``name``: member id -> sorted (topic, partition) pairs, with
    every member present (possibly with nothing). Pure.

    Raises:
        KeyError: no assignor has that name.
    """
    return _ASSIGNORS[name][0](members, partitions_per_topic)


def rebalance_protocol(name: str) -> str:
    """``EAGER`` or ``COOPERATIVE`` for the assignor ``name``. Raises KeyError if unknown."""
    return _ASSIGNORS[name][1]
