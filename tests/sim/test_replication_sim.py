"""Replication in the simulator: the replication checkers catch replication bugs.

Method: the shipped ``replication-*`` and ``cluster-*`` scenarios run in ``test_scenarios``'
sweep (and must pass). Here the aggressive one (``replication-nemesis``: a broker loses power
every 1-3 s, acks=all at min.insync.replicas 1) runs with each deliberate replication bug of
the simulator's ``[test] replication_bug`` switch, and the invariant that bug breaks must be
reported within 20 seeds (today: seeds 1, 1, 3, 1 and 1):

- the high watermark advanced before the followers have the data (over slower links, so a
  crash falls between the early acknowledgement and the followers' fetch): acknowledged
  writes are lost (``no_lost_acked_writes``; the sampling replication monitor sees the
  divergence only when a sample fell in that window);
- followers truncating to the high watermark instead of by epoch, a leader elected outside
  the ISR: the replicas no longer agree below the high watermark
  (``replication_replicas_agree``; the data checkers usually see the lost writes too);
- a restarted broker deciding from the epochs its log still holds whether it led an epoch
  before: two processes lead one epoch (``replication_one_leader_per_epoch``);
- a leader that leaves quiet partitions out of its answers even when their high watermark
  moved: at the end the followers hold the data but not the high watermark
  (``replication_high_watermark_told``).

A leader stamping its batches with the first epoch its process led the partition at needs a
process that leads, loses the leadership and leads again without a restart, which a crash
nemesis never gives: it runs in ``cluster-partitions`` (leaders cut off, then moved back to
their preferred replica) and must be reported as ``replication_epochs_grow`` (today: seed 2).
"""

from __future__ import annotations

import pathlib

import pytest

from sim.replication_check import ReplicationMonitor
from sim.scenario import loads
from tests.sim.pool import first_seeds_reporting

SCENARIO = pathlib.Path(__file__).resolve().parents[2] / "sim" / "scenarios" / \
    "replication-nemesis.toml"
BITES = {
    "hw_ignores_followers": "no_lost_acked_writes",
    "truncate_to_hw": "replication_replicas_agree",
    "elect_outside_isr": "replication_replicas_agree",
    "lead_same_epoch_again": "replication_one_leader_per_epoch",
    "hw_untold": "replication_high_watermark_told",
}


#: Slower links for the acknowledgement that outruns the followers: the window between the
#: early acknowledgement and the followers' fetch must be wide enough for a crash to fall in.
EXTRA = {"hw_ignores_followers": '\n[network]\nlatency = { min = "5ms", max = "30ms" }\n'}


@pytest.mark.slow
@pytest.mark.parametrize("bug", sorted(BITES))
def test_each_replication_bug_is_caught_within_20_seeds(bug: str) -> None:
    text = SCENARIO.read_text().replace("[checks]", f'[test]\nreplication_bug = "{bug}"\n\n[checks]')
    text += EXTRA.get(bug, "")
    found = first_seeds_reporting(loads(text.encode(), name=f"bite-{bug}"), range(1, 21),
                                  {BITES[bug]})
    assert BITES[bug] in found, f"{bug} was not caught as {BITES[bug]} in 20 seeds"


@pytest.mark.slow
def test_a_leader_stamping_a_stale_epoch_is_caught_within_20_seeds() -> None:
    text = (SCENARIO.parent / "cluster-partitions.toml").read_text().replace(
        "\n[checks]", '\n[test]\nreplication_bug = "stamp_first_epoch"\n\n[checks]'
        '\nstop_at = ["replication_epochs_grow"]')
    scenario = loads(text.encode(), name="bite-stamp_first_epoch")
    assert scenario.test.replication_bug == "stamp_first_epoch"
    found = first_seeds_reporting(scenario, range(1, 21), {"replication_epochs_grow"})
    assert "replication_epochs_grow" in found, "a stale epoch stamp was not caught in 20 seeds"


class _Header:
    def __init__(self, base: int, last_delta: int, epoch: int, crc: int) -> None:
        self.base_offset, self.last_offset_delta = base, last_delta
        self.partition_leader_epoch, self.crc = epoch, crc


class _Log:
    def __init__(self, batches: list[tuple[int, int, int, int]]) -> None:
        self.headers = [_Header(*b) for b in batches]
        self.log_end_offset = self.headers[-1].base_offset + self.headers[-1].last_offset_delta + 1

    def iter_headers(self, start: int):
        return iter([h for h in self.headers if h.base_offset + h.last_offset_delta >= start])


class _World:
    def __init__(self) -> None:
        self.reported: list[str] = []

    def online(self, violation) -> None:
        self.reported.append(violation.invariant)


def test_the_comparison_judges_only_below_the_committed_view() -> None:
    world = _World()
    monitor = ReplicationMonitor(world)
    key = ("t", 0)
    leader = _Log([(0, 4, 1, 0xA), (5, 4, 1, 0xB), (10, 4, 2, 0xC)])
    monitor._compare("n1", key, leader, 10)  # committed: the first two batches
    diverged_above = _Log([(0, 4, 1, 0xA), (5, 4, 1, 0xB), (10, 4, 1, 0xD)])
    monitor._compare("n2", key, diverged_above, 10)
    assert world.reported == []  # a difference above the high watermark is allowed
    diverged_below = _Log([(0, 4, 1, 0xA), (5, 4, 1, 0xE)])
    monitor._compare("n3", key, diverged_below, 10)
    assert world.reported == ["replication_replicas_agree"]
    cut = _Log([(0, 4, 1, 0xA)])
    monitor._compare("n1", key, cut, 5)  # n1 had shown offsets below 10 as committed
    assert world.reported[-1] == "replication_replicas_agree"
    backwards = _Log([(0, 4, 3, 0xF), (5, 4, 2, 0xB)])
    monitor._compare("n4", ("u", 0), backwards, 10)
    assert world.reported[-1] == "replication_epochs_grow"


def test_a_partition_nobody_leads_at_the_end_is_a_liveness_failure() -> None:
    from types import SimpleNamespace

    from rivven_broker.server.broker import BrokerState
    from rivven_broker.server.cluster.replica_manager import ReplicaView

    def host(views: dict) -> SimpleNamespace:
        replicas = SimpleNamespace(views=lambda: views)
        broker = SimpleNamespace(state=BrokerState.SERVING, cluster=SimpleNamespace(replicas=replicas))
        return SimpleNamespace(up=True, broker=broker)

    world = _World()
    world.nodes = {
        "n1": host({("t", 0): ReplicaView(True, 1, 3, 10), ("t", 1): ReplicaView(False, 3, 2, 5)}),
        "n2": host({("t", 0): ReplicaView(False, 1, 3, 10), ("t", 1): ReplicaView(False, 3, 2, 5)}),
    }
    ReplicationMonitor(world).check_led()
    assert world.reported == ["liveness"]  # t/1's leader n3 is not serving


def test_a_follower_that_holds_the_data_must_know_the_steady_high_watermark() -> None:
    from types import SimpleNamespace

    from rivven_broker.server.broker import BrokerState
    from rivven_broker.server.cluster.replica_manager import ReplicaConfig, ReplicaView
    from rivven_broker.storage.errors import UnknownTopicOrPartitionError

    def host(node_id: int, views: dict, durable: dict) -> SimpleNamespace:
        def get_log(topic: str, partition: int) -> SimpleNamespace:
            if (topic, partition) not in durable:
                raise UnknownTopicOrPartitionError(topic, partition)
            return SimpleNamespace(durable_offset=durable[(topic, partition)])

        replicas = SimpleNamespace(views=lambda: views, config=ReplicaConfig())
        broker = SimpleNamespace(state=BrokerState.SERVING,
                                 cluster=SimpleNamespace(replicas=replicas, node_id=node_id),
                                 context=SimpleNamespace(logs=SimpleNamespace(get_log=get_log)))
        return SimpleNamespace(up=True, broker=broker, incarnation=0)

    world = _World()
    world.nodes = {
        "n1": host(1, {("t", 0): ReplicaView(True, 1, 3, 10), ("t", 1): ReplicaView(True, 1, 3, 8)},
                   {("t", 0): 10, ("t", 1): 8}),
        # t/0: holds all 10 but was told 6; t/1: holds only 7 (not caught up: not judged)
        "n2": host(2, {("t", 0): ReplicaView(False, 1, 3, 6), ("t", 1): ReplicaView(False, 1, 3, 2)},
                   {("t", 0): 10, ("t", 1): 7}),
        "n3": host(3, {("t", 0): ReplicaView(False, 1, 3, 10)}, {("t", 0): 10}),
    }
    monitor = ReplicationMonitor(world)
    settled = ReplicaConfig().fetch_wait_ms + 2 * monitor.sample_ms
    monitor._steady = {("n1", 0, ("t", 0), 3): (10, 1000.0), ("n1", 0, ("t", 1), 3): (8, 1000.0)}
    monitor.check_told(1000.0 + settled - 1)  # the high watermarks moved too recently
    assert world.reported == []
    monitor.check_told(1000.0 + settled)
    assert world.reported == ["replication_high_watermark_told"]  # n2 on t/0 only
    assert monitor.followers_judged == 2  # n2 and n3 on t/0 (n2 on t/1 is behind)
