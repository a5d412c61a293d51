"""The pure core's ``max_poll_interval_ms`` rule (KIP-62).

Goal: a member whose application stays out of ``poll`` for longer than
``max_poll_interval_ms`` leaves (LeaveGroup for a dynamic member, silence for a static one),
its partitions become *lost* rather than revoked, the coordinator hands them to the others,
and the next poll rejoins; time spent inside ``poll`` never counts. Method: the members of
test_group_core (pure ``GroupCore`` against the pure ``GroupCoordinator``, no sockets, no
clock) with poll times passed in by hand, plus a Hypothesis check of the expiry arithmetic.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rivven_broker.client.config import ConsumerConfig
from rivven_broker.client.group_core import GroupCore, GroupSettings, MemberState, Revoke
from rivven_broker.protocol.errors import ErrorCode
from tests.unit.client.test_group_core import ALL, Broker, Member, assert_partitioned, settle

LIMIT_MS = 5_000


def member(name: str, broker: Broker, instance: str | None = None) -> Member:
    out = Member(name, broker)
    out.core = GroupCore(GroupSettings("g", instance, 10_000, 30_000, 3_000,
                                       ("cooperative-sticky",), 100, LIMIT_MS))
    out.core.subscribe(["t"])
    return out


def test_no_expiry_before_the_first_poll_inside_poll_or_within_the_limit():
    broker = Broker()
    a = member("a", broker)
    settle(broker, [a])
    assert not a.core.poll_timeout_expired(10**9)  # never polled
    a.core.on_poll(1_000)
    assert not a.core.poll_timeout_expired(1_000 + 10 * LIMIT_MS)  # still inside poll
    a.core.on_poll_end(2_000)
    assert a.core.poll_idle_ms(2_000 + LIMIT_MS) == LIMIT_MS
    assert not a.core.poll_timeout_expired(2_000 + LIMIT_MS)
    assert a.core.poll_timeout_expired(2_001 + LIMIT_MS)
    a.core.on_poll(3_000)  # polling again resets it
    a.core.on_poll_end(3_000)
    assert not a.core.poll_timeout_expired(2_001 + LIMIT_MS)


def test_a_dynamic_member_leaves_loses_its_partitions_and_rejoins_at_the_next_poll():
    broker = Broker()
    a, b = member("a", broker), member("b", broker)
    settle(broker, [a, b])
    assert_partitioned([a, b])
    owned = a.core.owned
    a.core.on_poll_end(0)
    assert a.core.poll_timeout_expired(LIMIT_MS + 1)
    old_member_id = a.core.member_id
    leave = a.core.leave_for_poll_timeout()
    assert [m.member_id for m in leave.members] == [old_member_id]
    assert a.core.state is MemberState.UNJOINED and a.core.owned == frozenset()
    assert a.core.heartbeat_request() is None  # heartbeats stop
    assert not a.core.poll_timeout_expired(LIMIT_MS + 2)  # leaves once
    assert a.core.needs_attention()
    a.core.check_invariants()
    assert broker.call(leave).error_code == ErrorCode.NONE
    settle(broker, [b])  # only b polls: it takes everything
    assert b.core.owned == ALL
    a.events.clear()
    a.core.on_poll(LIMIT_MS * 3)  # a polls again
    assert next(a.core.rebalance()) == Revoke(owned, lost=True)
    a.steps = None
    settle(broker, [a, b])
    assert_partitioned([a, b])
    assert a.core.member_id != old_member_id


def test_a_static_member_goes_silent_instead_of_sending_leave_group():
    broker = Broker()
    a = member("a", broker, instance="a-1")
    settle(broker, [a])
    a.core.on_poll_end(0)
    assert a.core.poll_timeout_expired(LIMIT_MS + 1)
    assert a.core.leave_for_poll_timeout() is None
    assert a.core.heartbeat_request() is None
    steps = a.core.rebalance()
    assert next(steps) == Revoke(frozenset(ALL), lost=True)


@given(
    last=st.integers(0, 10**12),
    idle=st.integers(0, 10**7),
    limit=st.integers(3_000, 10**7),
    inside=st.booleans(),
)
def test_expiry_is_exactly_idle_time_over_the_limit_outside_poll(last, idle, limit, inside):
    core = GroupCore(GroupSettings("g", None, 10_000, 30_000, 3_000,
                                   ("cooperative-sticky",), 100, limit))
    core.member_id, core.generation, core.state = "m", 1, MemberState.STABLE
    (core.on_poll if inside else core.on_poll_end)(last)
    assert core.poll_timeout_expired(last + idle) == (not inside and idle > limit)


def test_the_option_is_checked():
    assert ConsumerConfig().max_poll_interval_ms == 300_000
    for bad in (0, -1, 2_999, "1000"):
        with pytest.raises(ValueError, match="max_poll_interval_ms"):
            ConsumerConfig(heartbeat_interval_ms=3_000, max_poll_interval_ms=bad)
    assert ConsumerConfig(heartbeat_interval_ms=100, max_poll_interval_ms=100)
