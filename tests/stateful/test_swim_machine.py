"""Hypothesis state machine: SWIM cores under crashes, restarts, partitions and loss, against
a model of who is really up.

Method: the system under test is ``SwimHarness`` (N real cores over sealed frames on a seeded
datagram network); the model is the set of processes actually running and whether the network
is whole. Rules crash, restart, partition, heal, change the loss rate and let time pass. After
every step each running core's ``check_invariants`` holds. The ``settle`` rule heals
everything, stops loss and runs a quiet minute; then the model decides the views: every
running member sees every running member alive, and every crashed one dead (or left).
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rivven_cluster.membership import MemberState
from rivven_cluster.membership.harness import SwimHarness

NODES = 5
QUIET_MS = 60_000


class SwimMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.harness: SwimHarness | None = None

    @rule(seed=st.integers(0, 10_000))
    @precondition(lambda self: self.harness is None)
    def start(self, seed: int) -> None:
        self.harness = SwimHarness(NODES, seed=seed, jitter_ms=10)
        self.harness.run_until(3_000)

    @rule(ms=st.integers(1, 5_000))
    @precondition(lambda self: self.harness is not None)
    def wait(self, ms: int) -> None:
        self.harness.run_until(self.harness.now_ms + ms)

    @rule(node=st.integers(1, NODES))
    @precondition(lambda self: self.harness is not None and len(self.harness.up) > 2)
    def crash(self, node: int) -> None:
        self.harness.crash(node)

    @rule(node=st.integers(1, NODES))
    @precondition(lambda self: self.harness is not None)
    def restart(self, node: int) -> None:
        if node not in self.harness.up:
            self.harness.start(node)

    @rule(split=st.sets(st.integers(1, NODES), min_size=1, max_size=NODES - 1))
    @precondition(lambda self: self.harness is not None)
    def partition(self, split: set[int]) -> None:
        self.harness.partition(split, set(range(1, NODES + 1)) - split)

    @rule()
    @precondition(lambda self: self.harness is not None)
    def heal(self) -> None:
        self.harness.heal()

    @rule(loss=st.sampled_from([0.0, 0.02, 0.1]), duplicate=st.sampled_from([0.0, 0.05]))
    @precondition(lambda self: self.harness is not None)
    def network(self, loss: float, duplicate: float) -> None:
        self.harness.loss, self.harness.duplicate = loss, duplicate

    @rule()
    @precondition(lambda self: self.harness is not None)
    def settle(self) -> None:
        harness = self.harness
        harness.heal()
        harness.loss = harness.duplicate = 0.0
        harness.run_until(harness.now_ms + QUIET_MS)
        running = sorted(harness.up)
        for observer in running:
            view = harness.view(observer)
            for node in range(1, NODES + 1):
                state = view.get(node)
                if node in running:
                    assert state is MemberState.ALIVE, (observer, node, view)
                    assert harness.cores[observer].member(node).boot_id == harness.boots[node]
                elif state is not None:  # a crashed member, if known, is known gone
                    assert state in (MemberState.DEAD, MemberState.LEFT), (observer, node, view)

    @invariant()
    def cores_are_consistent(self) -> None:
        if self.harness is not None:
            for node in self.harness.up:
                self.harness.cores[node].check_invariants()


SwimMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
TestSwimMachine = SwimMachine.TestCase
