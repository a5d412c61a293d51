"""The SWIM core's rules one at a time, on the deterministic harness (virtual milliseconds).

Method: ``SwimHarness`` runs real cores over sealed frames; each test sets up one situation
(a crash, a pause, a partition, a leave, a restart) and checks the views and counters the rule
predicts. Claim precedence is checked on its own, exhaustively over small values.
"""

from __future__ import annotations

import itertools

from rivven_cluster.membership import (
    Claim,
    MembershipConfig,
    MemberState,
    make_boot_id,
    supersedes,
)
from rivven_cluster.membership.harness import SwimHarness
from rivven_cluster.membership.messages import (
    Alive,
    PushPull,
    Record,
    Suspect,
    pack,
    split_records,
    unpack,
)
from rivven_cluster.membership.members import Address

ALIVE, SUSPECT, DEAD, LEFT = MemberState


def _all_see(harness: SwimHarness, observers, node: int, state: MemberState) -> bool:
    return all(harness.view(o).get(node) is state for o in observers)


def test_claim_precedence_newer_boot_then_incarnation_then_state():
    for boot, inc, state in itertools.product((1, 2), (0, 1), MemberState):
        known = Claim(9, 1, 0, ALIVE)
        claim = Claim(9, boot, inc, state)
        expected = boot > 1 or (boot == 1 and (inc > 0 or state > ALIVE))
        assert supersedes(claim, known) is expected, claim
    assert not supersedes(Claim(9, 1, 5, ALIVE), Claim(9, 2, 0, DEAD))  # an older process
    assert supersedes(Claim(9, 1, 0, DEAD), None)
    assert make_boot_id(2, 0) > make_boot_id(1, 65_535)


def test_payloads_pack_to_fit_and_unpack_exactly():
    claims = [Alive(n, 10**15, 3, Address("n%d" % n, 9093), Address("n%d" % n, 9092), "rack-a")
              for n in range(200)]
    payload, taken = pack(None, claims, 1300)
    assert len(payload) <= 1300 and 0 < taken < 200
    assert unpack(payload) == claims[:taken]
    records = [Record(n, 7, 0, MemberState(n % 4), Address("host-%d" % n, 1),
                      Address("host-%d" % n, 2), None)
               for n in range(100)]
    chunks = split_records(records, True, 1300)
    assert len(chunks) > 1 and [r for c in chunks for r in c.records] == records
    for chunk in chunks:
        payload, _ = pack(chunk, [], 1300)
        assert len(payload) <= 1300 and unpack(payload) == [chunk]
    assert unpack(b"\x91\x92\x07\x01") is None  # a dead claim missing fields
    assert unpack(b"\xc1") is None and unpack(b"") is None
    assert unpack(pack(PushPull(False, ()), [], 1300)[0]) == [PushPull(False, ())]


def test_members_join_through_a_seed_and_all_see_each_other():
    harness = SwimHarness(5, seed=1)
    harness.run_until(3_000)
    for observer in range(1, 6):
        assert harness.view(observer) == {n: ALIVE for n in range(1, 6)}


def test_a_crashed_member_is_suspected_then_declared_dead_by_everyone():
    harness = SwimHarness(5, seed=2, loss=0.01, jitter_ms=10)
    harness.run_until(3_000)
    harness.crash(4)
    harness.run_until(3_600)
    assert any(harness.view(o)[4] is SUSPECT for o in (1, 2, 3, 5))
    harness.run_until(8_000)
    assert _all_see(harness, (1, 2, 3, 5), 4, DEAD)
    stats = [harness.cores[o].statistics() for o in (1, 2, 3, 5)]
    assert sum(s.suspicions for s in stats) >= 1 and sum(s.declared_dead for s in stats) >= 1


def test_a_paused_member_refutes_its_suspicion_with_a_higher_incarnation():
    """Cut one member off for a moment (a GC pause, a frozen VM): it is suspected, then it
    hears the suspicion (piggybacked on a probe: the buddy system) and refutes it."""
    config = MembershipConfig(suspicion_multiplier=6)  # a long suspicion: time to refute
    harness = SwimHarness(5, seed=3, config=config)
    harness.run_until(3_000)
    harness.partition({3}, {1, 2, 4, 5})
    harness.run_until(3_700)
    assert any(harness.view(o)[3] is SUSPECT for o in (1, 2, 4, 5))
    harness.heal()
    harness.run_until(8_000)
    assert _all_see(harness, (1, 2, 4, 5), 3, ALIVE)
    assert harness.cores[3].incarnation >= 1
    assert harness.cores[3].statistics().refutations >= 1


def test_after_a_partition_heals_the_views_converge():
    harness = SwimHarness(5, seed=4)
    harness.run_until(3_000)
    harness.partition({1, 2}, {3, 4, 5})
    harness.run_until(15_000)
    assert _all_see(harness, (1, 2), 4, DEAD) and _all_see(harness, (3, 4, 5), 1, DEAD)
    harness.heal()
    harness.run_until(60_000)  # push-pull and refutation bring everyone back
    for observer in range(1, 6):
        assert harness.view(observer) == {n: ALIVE for n in range(1, 6)}, observer


def test_a_member_that_leaves_is_left_not_dead():
    harness = SwimHarness(4, seed=5)
    harness.run_until(3_000)
    harness.leave(2)
    harness.run_until(3_500)
    harness.crash(2)  # the process exits after announcing it
    harness.run_until(10_000)
    assert _all_see(harness, (1, 3, 4), 2, LEFT)


def test_a_restarted_member_is_alive_again_under_its_new_boot():
    harness = SwimHarness(4, seed=6)
    harness.run_until(3_000)
    harness.crash(3)
    harness.run_until(9_000)
    assert _all_see(harness, (1, 2, 4), 3, DEAD)
    harness.start(3)
    harness.run_until(12_000)
    assert _all_see(harness, (1, 2, 4), 3, ALIVE)
    assert all(harness.cores[o].member(3).boot_id == harness.boots[3] for o in (1, 2, 4))


def test_lifeguard_suspicion_timeout_shrinks_with_confirmations():
    config = MembershipConfig()
    harness = SwimHarness(6, seed=7, config=config)
    harness.run_until(3_000)
    core = harness.cores[1]
    low, high = config.suspicion_bounds_ms(6)
    assert core._suspicion_timeout_ms(0) == high
    assert low < core._suspicion_timeout_ms(1) < high
    assert core._suspicion_timeout_ms(2) == low
    plain = MembershipConfig(lifeguard=False)
    assert plain.suspicion_bounds_ms(6) == (low, low)


def test_local_health_slows_a_node_that_misses_its_own_deadlines():
    """A node whose datagrams are all lost (its own network is the problem) gets no nacks
    back from its helpers: its awareness rises, and it probes less often instead of
    accusing the healthy members quickly."""
    harness = SwimHarness(5, seed=8)
    harness.run_until(3_000)
    harness.blocked |= {(1, n) for n in range(2, 6)}  # node 1 can hear but not speak
    harness.run_until(4_500)
    assert harness.cores[1].statistics().awareness >= 2


def test_a_suspected_member_hears_of_it_on_the_next_probe_buddy_system():
    harness = SwimHarness(3, seed=9)
    harness.run_until(3_000)
    core = harness.cores[2]
    target = core.member(3)
    core._apply(Suspect(3, target.boot_id, target.incarnation, 2), harness.now_ms)
    harness.run_until(4_000)
    assert harness.cores[3].incarnation == target.incarnation + 1
    assert _all_see(harness, (1, 2), 3, ALIVE)


def test_every_core_keeps_its_invariants_through_faults():
    harness = SwimHarness(6, seed=10, loss=0.05, duplicate=0.05, jitter_ms=20)
    for step in range(40):
        harness.run_until(harness.now_ms + 500)
        if step == 10:
            harness.crash(6)
        if step == 15:
            harness.partition({1, 2}, {3, 4, 5})
        if step == 25:
            harness.heal()
            harness.start(6)
        for node in harness.up:
            harness.cores[node].check_invariants()
