"""The controller's liveness judgement (``rivven_cluster.replication.liveness``) and its grace.

Method: the three-way judgement of one registration against one SWIM sighting is a table
covering every case; ``ControllerLiveness`` is driven through leadership changes and
re-registrations on a plain clock; a Hypothesis property checks against a direct restatement
that a broker SWIM calls dead, or fenced, or replaced by a newer process, is never kept, that
only LIVE brokers may be given leadership, and that nothing unknown is kept once the grace
has run. The election rule's use of the spared set is checked beside it.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rivven_cluster.membership import MembershipConfig, MemberState
from rivven_cluster.replication import (
    NO_LEADER,
    ControllerLiveness,
    Liveness,
    Registration,
    Sighting,
    judge,
    leader_after_failure,
)

ALIVE, SUSPECT, DEAD, LEFT = (MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD,
                              MemberState.LEFT)
GRACE_MS = 5_000


@pytest.mark.parametrize(("registration", "seen", "verdict"), [
    (Registration(2, 10, False), Sighting(10, ALIVE), Liveness.LIVE),
    (Registration(2, 10, False), Sighting(10, SUSPECT), Liveness.LIVE),
    (Registration(2, 10, False), Sighting(10, DEAD), Liveness.GONE),
    (Registration(2, 10, False), Sighting(10, LEFT), Liveness.GONE),
    (Registration(2, 10, True), Sighting(10, ALIVE), Liveness.GONE),  # fenced
    (Registration(2, 10, False), Sighting(11, ALIVE), Liveness.GONE),  # replaced by a newer
    (Registration(2, 10, False), Sighting(9, ALIVE), Liveness.UNKNOWN),  # news not here yet
    (Registration(2, 10, False), Sighting(9, DEAD), Liveness.UNKNOWN),  # the old one died
    (Registration(2, 10, False), None, Liveness.UNKNOWN),  # never heard of
])
def test_a_registration_is_live_gone_or_unknown(registration, seen, verdict) -> None:
    assert judge(registration, seen) is verdict


def _controller(now_ms: int = 1_000, term: int = 7) -> ControllerLiveness:
    liveness = ControllerLiveness(node_id=1, boot_id=100, grace_ms=GRACE_MS)
    liveness.leads(term, now_ms)
    return liveness


REGISTERED = [Registration(1, 100, False), Registration(2, 200, False),
              Registration(3, 300, False)]


def test_a_new_controller_spares_whom_its_view_has_not_heard_of_for_the_grace() -> None:
    liveness = _controller()
    judged = liveness.judge(REGISTERED, {}, 1_000)
    assert judged.live == {1} and judged.spared == {2, 3}
    assert liveness.judge(REGISTERED, {}, 1_000 + GRACE_MS - 1).spared == {2, 3}
    late = liveness.judge(REGISTERED, {}, 1_000 + GRACE_MS)
    assert late.live == {1} and late.spared == frozenset()


def test_a_dead_broker_is_gone_at_once_even_within_the_grace() -> None:
    liveness = _controller()
    judged = liveness.judge(REGISTERED, {2: Sighting(200, DEAD), 3: Sighting(300, ALIVE)}, 1_001)
    assert judged.live == {1, 3} and judged.spared == frozenset()
    assert 2 not in judged.kept


def test_a_new_term_restarts_the_grace_and_the_same_term_does_not() -> None:
    liveness = _controller(now_ms=0, term=7)
    assert liveness.judge(REGISTERED, {}, 0).spared == {2, 3}  # registrations seen at 0
    liveness.leads(7, 4_000)
    assert liveness.judge(REGISTERED, {}, GRACE_MS).spared == frozenset()
    liveness.leads(8, GRACE_MS)
    assert liveness.judge(REGISTERED, {}, GRACE_MS + 1).spared == {2, 3}
    liveness.follows()
    liveness.leads(8, 3 * GRACE_MS)  # led again after following: a new grace
    assert liveness.judge(REGISTERED, {}, 3 * GRACE_MS + 1).spared == {2, 3}


def test_a_re_registration_gets_its_own_grace_from_when_it_is_first_seen() -> None:
    liveness = _controller(now_ms=0)
    seen = {2: Sighting(200, ALIVE), 3: Sighting(300, ALIVE)}
    assert liveness.judge(REGISTERED, seen, 10_000).live == {1, 2, 3}
    restarted = [REGISTERED[0], Registration(2, 201, False), REGISTERED[2]]
    judged = liveness.judge(restarted, seen, 20_000)  # SWIM has not heard of boot 201 yet
    assert judged.spared == {2} and judged.live == {1, 3}
    assert liveness.judge(restarted, seen, 20_000 + GRACE_MS - 1).spared == {2}
    assert liveness.judge(restarted, seen, 20_000 + GRACE_MS).spared == frozenset()
    assert liveness.judge(restarted, {**seen, 2: Sighting(201, ALIVE)},
                          20_000 + GRACE_MS).live == {1, 2, 3}


def test_the_controller_itself_is_live_only_as_its_registered_process() -> None:
    liveness = _controller()
    assert 1 in liveness.judge(REGISTERED, {}, 1_000).live
    older = [Registration(1, 99, False), *REGISTERED[1:]]  # this process not registered yet
    assert 1 not in liveness.judge(older, {1: Sighting(100, ALIVE)}, 1_000).kept
    fenced = [Registration(1, 100, True), *REGISTERED[1:]]
    assert 1 not in liveness.judge(fenced, {}, 1_000).kept


def test_only_the_controller_judges() -> None:
    liveness = ControllerLiveness(node_id=1, boot_id=100, grace_ms=GRACE_MS)
    with pytest.raises(AssertionError):
        liveness.judge(REGISTERED, {}, 0)


SIGHTINGS = st.one_of(st.none(), st.builds(Sighting, st.integers(0, 4),
                                           st.sampled_from(list(MemberState))))


@given(boots=st.lists(st.tuples(st.integers(0, 4), st.booleans(), SIGHTINGS),
                      min_size=1, max_size=5),
       elapsed_ms=st.integers(0, 2 * GRACE_MS))
def test_the_judgement_matches_its_statement(boots, elapsed_ms) -> None:
    liveness = _controller(now_ms=0)
    registrations = [Registration(i + 2, boot, fenced) for i, (boot, fenced, _) in
                     enumerate(boots)]
    seen = {i + 2: sighting for i, (_, _, sighting) in enumerate(boots) if sighting is not None}
    liveness.judge(registrations, seen, 0)  # registrations first seen at 0
    judged = liveness.judge(registrations, seen, elapsed_ms)
    assert not judged.live & judged.spared
    for registration in registrations:
        sighting = seen.get(registration.broker_id)
        dead = sighting is not None and sighting.boot_id == registration.boot_id \
            and sighting.state in (DEAD, LEFT)
        replaced = sighting is not None and sighting.boot_id > registration.boot_id
        up = sighting is not None and sighting.boot_id == registration.boot_id \
            and sighting.state in (ALIVE, SUSPECT)
        broker = registration.broker_id
        if registration.fenced or dead or replaced:
            assert broker not in judged.kept
        elif up:
            assert broker in judged.live
        else:  # no word on the registered process
            assert broker not in judged.live
            assert (broker in judged.spared) == (elapsed_ms < GRACE_MS)


def test_failover_keeps_spared_isr_members_but_never_elects_one() -> None:
    # leader 3 gone, 2 unknown within its grace, 1 live: 1 leads, 2 keeps its ISR place
    assert leader_after_failure((3, 2, 1), (3, 2, 1), live={1}, spared={2}) == (1, (2, 1))
    # nobody positively live in the ISR: offline, the last ISR kept
    assert leader_after_failure((3, 2, 1), (3, 2), live={1}, spared={2}) == (NO_LEADER, (3, 2))


def test_the_grace_is_as_long_as_swim_takes_to_call_a_crashed_member_dead() -> None:
    config = MembershipConfig()
    for members in (1, 3, 5, 30):
        low, high = config.suspicion_bounds_ms(members)
        assert config.dead_within_ms(members) == config.probe_interval_ms * members + high
    assert config.dead_within_ms(5) > config.dead_within_ms(3)
