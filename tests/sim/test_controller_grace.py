"""A controller does not act on a liveness view it has not had time to build.

Method: ``controller-blind-restart.toml`` at seed 3 makes n1 the controller 0.8 s after it
restarted, while its peers' datagrams to it are lost, so its SWIM view holds nobody but
itself (the test first checks that this happened: otherwise it would prove nothing). The
controller monitor is extended to replay every committed command, in log order, through a
``MetadataMachine`` and to note each command that takes a broker out of a partition's ISR or
away from its leadership, with the virtual time and the Raft leader of the moment. Broker 2
never stops and nothing cuts it off from anyone but n1's inbound datagrams: while n1's
controller has had less than its grace, nothing may be taken from broker 2. Before the grace
(the old election loop) n1 took broker 2 out of every ISR and its leaderships away within
0.3 s of winning the election, leaving ``__consumer_offsets`` partitions offline.
"""

from __future__ import annotations

import pathlib
from typing import Any

import trio

from rivven_cluster.membership import MembershipConfig
from rivven_cluster.metadata import (
    ElectLeader,
    MetadataMachine,
    Outcome,
    UpdateIsr,
    decode_command,
)
from sim.controller_check import ControllerMonitor
from sim.scenario import load
from sim.world import World

SCENARIO = pathlib.Path(__file__).resolve().parents[2] / "sim" / "scenarios" / \
    "controller-blind-restart.toml"
BLIND_SEED = 3
#: The grace the brokers of a three-node cluster run with (``Broker._cluster_control``).
GRACE_S = MembershipConfig().dead_within_ms(3) / 1000


class DecisionWatch(ControllerMonitor):
    """The controller monitor, plus: what each committed command took from whom, and when."""

    def __init__(self) -> None:
        super().__init__()
        self.world: Any = None
        self.machine = MetadataMachine()
        self.last_index = 0
        #: (time s, term winner) in order
        self.wins: list[tuple[float, int]] = []
        #: at each win: the winner's SWIM view (node ids it knows besides itself)
        self.view_at_win: list[set[int]] = []
        #: (time s, command kind, topic/partition, brokers taken out)
        self.taken: list[tuple[float, str, str, tuple[int, ...]]] = []

    def elected(self, node_id: int, term: int) -> None:
        super().elected(node_id, term)
        self.wins.append((trio.current_time(), node_id))
        broker = self.world.nodes[f"n{node_id}"].broker
        members = broker.membership.members() if broker and broker.membership else []
        self.view_at_win.append({m.node_id for m in members} - {node_id})

    def applied(self, node_id: int, index: int, document: bytes, outcome: Outcome) -> None:
        super().applied(node_id, index, document, outcome)
        if index <= self.last_index:
            return  # every node applies in log order: the first to apply an index is next
        self.last_index = index
        command = decode_command(document)
        before = None
        if isinstance(command, (ElectLeader, UpdateIsr)):
            before = self.machine.image().partition(command.topic, command.partition)
        self.machine.apply(command, index)
        if before is None:
            return
        after = self.machine.image().partition(command.topic, command.partition)
        out = set(before.isr) - set(after.isr)
        if before.leader != after.leader and before.leader >= 0:
            out.add(before.leader)
        if out:
            self.taken.append((trio.current_time(), type(command).__name__,
                               f"{command.topic}/{command.partition}", tuple(sorted(out))))


def _run_blind() -> tuple[Any, DecisionWatch]:
    world = World(load(str(SCENARIO)), BLIND_SEED)
    watch = DecisionWatch()
    watch.world = world
    world.controller_monitor = watch
    return world.run(), watch


def test_a_controller_with_an_unbuilt_view_takes_nothing_from_a_live_broker() -> None:
    result, watch = _run_blind()
    assert result.ok, "\n".join(f"{v.invariant}: {v.message}" for v in result.violations)
    # the situation under test happened: n1, restarted at 6.1 s, won the election after the
    # controller's crash at 6.3 s knowing nobody
    blind = [(t, n, view) for (t, n), view in zip(watch.wins, watch.view_at_win)
             if 6.3 <= t < 8 and n == 1]
    assert blind, f"n1 did not become the controller after its restart: {watch.wins}"
    won_s, _, view = blind[0]
    assert view == set(), f"n1's view was already built when it won: {view}"
    assert any(2 not in entry[3] for entry in watch.taken), "the watch saw no failover at all"
    within_grace = [entry for entry in watch.taken
                    if won_s <= entry[0] < won_s + GRACE_S and 2 in entry[3]]
    assert not within_grace, (
        f"the controller elected at {won_s:.3f}s took broker 2 (up throughout) out of "
        f"{len(within_grace)} partitions before its grace of {GRACE_S}s: {within_grace[:6]}")
