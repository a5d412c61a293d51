"""The four assignors against their promises, by property and by brute force.

Method: Hypothesis generates groups (members with subscriptions over a few topics, owned
partitions with generations, possibly conflicting or stale) and partition counts. For every
assignor: every partition of a subscribed topic is assigned exactly once, only to a member
subscribed to its topic, every member appears, and the output does not depend on the order
members are given in. With equal subscriptions sizes differ by at most one. Sticky ones are
*balanced* in the general case (no partition could move to an eligible member without that
member ending up larger than the giver) and, with equal subscriptions, move exactly the
minimum any balanced assignment must move - computed by formula and, for small cases, by
enumerating every assignment. Cooperative-sticky never hands out a partition another member
still owns; the follow-up round completes the assignment without revoking anything more, and
(when no partition had a stale or double claim) both rounds together move the minimum.
"""

from __future__ import annotations

import itertools

import hypothesis.strategies as st
from hypothesis import example, given, settings

from rivven_broker.protocol import assignors
from rivven_broker.protocol.assignors import MemberSubscription

TOPICS = ("a", "b", "c")


@st.composite
def groups(draw, equal: bool = False, members_max: int = 6, partitions_max: int = 7):
    counts = {t: draw(st.integers(0, partitions_max)) for t in TOPICS}
    count = draw(st.integers(1, members_max))
    shared = draw(st.sets(st.sampled_from(TOPICS), min_size=1))
    members = {}
    for i in range(count):
        topics = shared if equal else draw(st.sets(st.sampled_from(TOPICS + ("gone",))))
        universe = [(t, p) for t in TOPICS + ("gone",) for p in range(counts.get(t, 0) + 1)]
        owned = draw(st.lists(st.sampled_from(universe), max_size=6)) if universe else []
        instance = draw(st.none() | st.sampled_from([f"host-{i}"]))
        members[f"m{draw(st.integers(0, 99)):02d}-{i}"] = MemberSubscription(
            topics, owned, draw(st.integers(-1, 3)), instance
        )
    return members, counts


def _eligible(members, counts):
    return {
        (t, p): {m for m, s in members.items() if t in s.topics}
        for t in TOPICS
        for p in range(counts[t])
        if any(t in s.topics for s in members.values())
    }


def _check_valid(members, counts, result, complete=True):
    assert set(result) == set(members)
    eligible = _eligible(members, counts)
    seen = [tp for parts in result.values() for tp in parts]
    assert len(seen) == len(set(seen)), "a partition was assigned twice"
    if complete:
        assert set(seen) == set(eligible)
    for member_id, parts in result.items():
        assert list(parts) == sorted(parts)
        for tp in parts:
            assert member_id in eligible[tp]


def _sizes(result):
    return [len(parts) for parts in result.values()]


@settings(max_examples=150, deadline=None)
@given(groups(), st.sampled_from(assignors.ASSIGNOR_NAMES), st.randoms(use_true_random=False))
def test_valid_and_deterministic(group, name, rnd):
    members, counts = group
    result = assignors.assign(name, members, counts)
    _check_valid(members, counts, result, complete=name != assignors.COOPERATIVE_STICKY)
    shuffled = list(members.items())
    rnd.shuffle(shuffled)
    assert assignors.assign(name, dict(shuffled), counts) == result


@settings(max_examples=150, deadline=None)
@given(groups(equal=True), st.sampled_from([assignors.ROUND_ROBIN, assignors.STICKY]))
def test_equal_subscriptions_balance_within_one(group, name):
    members, counts = group
    sizes = _sizes(assignors.assign(name, members, counts))
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=100, deadline=None)
@given(groups(equal=True))
def test_range_balances_each_topic_within_one(group):
    members, counts = group
    result = assignors.assign(assignors.RANGE, members, counts)
    for topic in TOPICS:
        per_member = [sum(1 for t, _ in parts if t == topic) for parts in result.values()]
        if any(topic in s.topics for s in members.values()):
            assert max(per_member) - min(per_member) <= 1


def _claims(members, counts):
    """The claims the sticky assignors honour (same rule as the module's, restated)."""
    best = {}
    order = sorted(members, key=lambda m: (members[m].group_instance_id is None,
                                           members[m].group_instance_id or m, m))
    for rank, member_id in enumerate(order):
        sub = members[member_id]
        for topic, partition in sub.owned_partitions:
            if topic in sub.topics and partition < counts.get(topic, 0):
                claim = (-sub.generation, rank, member_id)
                if (topic, partition) not in best or claim < best[(topic, partition)]:
                    best[(topic, partition)] = claim
    return {tp: c[2] for tp, c in best.items()}


def _moves(claims, result):
    owner = {tp: m for m, parts in result.items() for tp in parts}
    return sum(1 for tp, m in claims.items() if owner.get(tp) != m)


def _minimum_moves(members, counts, claims):
    """With equal subscriptions: the larger sizes go to the members owning the most."""
    total = len(_eligible(members, counts))
    each, extra = divmod(total, len(members))
    owned = sorted((sum(1 for m in claims.values() if m == member) for member in members),
                   reverse=True)
    targets = [each + 1] * extra + [each] * (len(members) - extra)
    return sum(max(0, o - t) for o, t in zip(owned, targets))


_TWO_BIG_OWNERS = (  # found by Hypothesis: giving from one big owner until it is small is wrong
    {f"m{i}": MemberSubscription({"b", "c"}) for i in range(4)}
    | {"m4": MemberSubscription({"b", "c"}, [("b", 0), ("b", 1), ("b", 5)], 0),
       "m5": MemberSubscription({"b", "c"}, [("b", 2), ("b", 3), ("b", 4)], 0)},
    {"a": 0, "b": 6, "c": 2},
)


@settings(max_examples=200, deadline=None)
@given(groups(equal=True))
@example(_TWO_BIG_OWNERS)
def test_sticky_moves_the_minimum(group):
    members, counts = group
    result = assignors.assign(assignors.STICKY, members, counts)
    claims = _claims(members, counts)
    assert _moves(claims, result) == _minimum_moves(members, counts, claims)


@settings(max_examples=60, deadline=None)
@given(groups(equal=True, members_max=3, partitions_max=3))
def test_sticky_matches_brute_force_on_small_groups(group):
    members, counts = group
    claims = _claims(members, counts)
    partitions = sorted(_eligible(members, counts))
    ids = sorted(members)
    best = None
    for owners in itertools.product(ids, repeat=len(partitions)):
        sizes = [owners.count(m) for m in ids]
        if max(sizes) - min(sizes) > 1:
            continue
        moves = sum(1 for tp, m in zip(partitions, owners) if tp in claims and claims[tp] != m)
        best = moves if best is None else min(best, moves)
    result = assignors.assign(assignors.STICKY, members, counts)
    assert _moves(claims, result) == (best or 0)


@settings(max_examples=150, deadline=None)
@given(groups())
def test_sticky_is_balanced_with_unequal_subscriptions(group):
    members, counts = group
    result = assignors.assign(assignors.STICKY, members, counts)
    size = {m: len(parts) for m, parts in result.items()}
    eligible = _eligible(members, counts)
    for member_id, parts in result.items():
        for tp in parts:
            assert all(size[member_id] <= size[other] + 1 for other in eligible[tp])


@settings(max_examples=150, deadline=None)
@given(groups(equal=True))
def test_cooperative_revokes_first_then_completes(group):
    members, counts = group
    target = assignors.assign(assignors.STICKY, members, counts)
    first = assignors.assign(assignors.COOPERATIVE_STICKY, members, counts)
    _check_valid(members, counts, first, complete=False)
    holders = {}
    for member_id, sub in members.items():
        for tp in sub.owned_partitions:
            holders.setdefault(tp, set()).add(member_id)
    for member_id, parts in first.items():
        assert set(parts) <= set(target[member_id])
        for tp in parts:
            assert holders.get(tp, set()) <= {member_id}, "given while another still owns it"
    # Follow-up round: everyone now owns exactly what round one gave them.
    generation = max(s.generation for s in members.values()) + 1
    second_members = {
        m: MemberSubscription(s.topics, first[m], generation, s.group_instance_id)
        for m, s in members.items()
    }
    second = assignors.assign(assignors.COOPERATIVE_STICKY, second_members, counts)
    _check_valid(members, counts, second, complete=True)
    assert max(_sizes(second)) - min(_sizes(second)) <= 1
    for member_id in members:  # nothing more is revoked in the follow-up
        assert set(first[member_id]) <= set(second[member_id])
    claims = _claims(members, counts)
    if all(owners == {claims.get(tp)} for tp, owners in holders.items()):
        # No stale or double claims: the two rounds together move no more than sticky does.
        assert _moves(claims, second) == _moves(claims, target)


def test_range_and_round_robin_examples():
    members = {m: MemberSubscription({"t", "u"}) for m in ("c1", "c2")}
    members["c3"] = MemberSubscription({"t"})
    counts = {"t": 4, "u": 3}
    assert assignors.assign(assignors.RANGE, members, counts) == {
        "c1": (("t", 0), ("t", 1), ("u", 0), ("u", 1)),
        "c2": (("t", 2), ("u", 2)),
        "c3": (("t", 3),),
    }
    assert assignors.assign(assignors.ROUND_ROBIN, members, counts) == {
        "c1": (("t", 0), ("t", 3), ("u", 1)),  # c3 does not read u: skipped in turn
        "c2": (("t", 1), ("u", 0), ("u", 2)),
        "c3": (("t", 2),),
    }
    assert assignors.rebalance_protocol(assignors.COOPERATIVE_STICKY) == assignors.COOPERATIVE
    assert assignors.rebalance_protocol(assignors.RANGE) == assignors.EAGER


def test_static_members_are_ordered_by_instance_id():
    counts = {"t": 2}
    first = {"zzz": MemberSubscription({"t"}, group_instance_id="a"),
             "aaa": MemberSubscription({"t"}, group_instance_id="b")}
    second = {"mmm": MemberSubscription({"t"}, group_instance_id="a"),
              "aaa": MemberSubscription({"t"}, group_instance_id="b")}
    r1 = assignors.assign(assignors.RANGE, first, counts)
    r2 = assignors.assign(assignors.RANGE, second, counts)
    assert r1["zzz"] == r2["mmm"] == (("t", 0),)
