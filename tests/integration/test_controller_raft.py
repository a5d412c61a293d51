"""Three controllers on real loopback TCP and real files: election, commit, failover, restart."""

from __future__ import annotations

import socket

import pytest
import trio

from rivven_broker.server.cluster.controller_host import ControllerHost, RaftConfig
from rivven_broker.server.env import RealEnv
from rivven_cluster.membership import DEVELOPMENT_KEY, KeyRing
from rivven_cluster.metadata import CreateTopic, RegisterBroker, Status

RING = KeyRing((DEVELOPMENT_KEY.encode(),))


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


class Cluster:
    def __init__(self, tmp_path, nursery: trio.Nursery, size: int = 3) -> None:
        self.tmp_path = tmp_path
        self.nursery = nursery
        self.voters = {i + 1: ("127.0.0.1", port) for i, port in enumerate(_free_ports(size))}
        self.hosts: dict[int, ControllerHost] = {}
        self.scopes: dict[int, trio.CancelScope] = {}
        self.boots = 0

    async def start(self, node_id: int) -> ControllerHost:
        self.boots += 1
        directory = self.tmp_path / f"n{node_id}"
        directory.mkdir(exist_ok=True)
        host = ControllerHost(RealEnv(str(directory)), node_id=node_id, boot_id=self.boots,
                              voters=self.voters, ring=lambda: RING, directory="raft",
                              config=RaftConfig(propose_timeout_s=8.0))
        scope = trio.CancelScope()

        async def run(task_status=trio.TASK_STATUS_IGNORED):
            with scope:
                await host.run(task_status=task_status)

        await self.nursery.start(run)
        self.hosts[node_id], self.scopes[node_id] = host, scope
        return host

    def stop(self, node_id: int) -> None:
        self.scopes.pop(node_id).cancel()
        self.hosts.pop(node_id)

    async def leader(self) -> int:
        with trio.fail_after(10):
            while True:
                leaders = {h.status().leader for h in self.hosts.values() if h.running}
                if len(leaders) == 1 and None not in leaders and leaders <= set(self.hosts):
                    return leaders.pop()
                await trio.sleep(0.05)


def _register(broker_id: int) -> RegisterBroker:
    return RegisterBroker(broker_id, boot_id=1, host="127.0.0.1", port=9000 + broker_id)


async def _settled(cluster: Cluster, index: int) -> None:
    with trio.fail_after(10):
        while any(h.image().applied_index < index for h in cluster.hosts.values()):
            await trio.sleep(0.02)


async def test_three_controllers_agree_fail_over_and_recover(tmp_path):
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        for node_id in cluster.voters:
            await cluster.start(node_id)
        leader = await cluster.leader()
        # a command proposed on any node (followers forward to the leader) applies everywhere
        for node_id in cluster.voters:
            outcome = await cluster.hosts[node_id].propose(_register(node_id))
            assert outcome.status is Status.APPLIED
        create = CreateTopic("t", "id-1", ((1, 2, 3), (2, 3, 1)))
        assert (await cluster.hosts[leader].propose(create)).status is Status.APPLIED
        # proposing it again, as a retry, changes nothing
        assert (await cluster.hosts[leader].propose(create)).status is Status.UNCHANGED
        index = cluster.hosts[leader].image().applied_index
        await _settled(cluster, index)
        images = [h.image() for h in cluster.hosts.values()]
        assert all(i.topics == images[0].topics and i.brokers == images[0].brokers for i in images)

        # the leader goes away: another is elected and commands keep committing
        cluster.stop(leader)
        new_leader = await cluster.leader()
        assert new_leader != leader
        survivor = next(iter(cluster.hosts.values()))
        assert (await survivor.propose(CreateTopic("u", "id-2", ((1,),)))).ok

        # the old leader restarts from its journal and catches up
        back = await cluster.start(leader)
        with trio.fail_after(10):
            await back.ready.wait()
        await _settled(cluster, survivor.image().applied_index)
        assert set(back.image().topics) == {"t", "u"}
        assert back.image().brokers == survivor.image().brokers
        nursery.cancel_scope.cancel()


async def test_a_lone_controller_commits_alone(tmp_path):
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery, size=1)
        host = await cluster.start(1)
        assert await cluster.leader() == 1
        assert (await host.propose(_register(1))).status is Status.APPLIED
        nursery.cancel_scope.cancel()


async def test_a_peer_with_another_key_is_never_connected(tmp_path):
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery, size=2)
        await cluster.start(1)
        other = KeyRing((b"another-cluster-key-0123456789",))
        stranger = ControllerHost(RealEnv(str(tmp_path)), node_id=2, boot_id=9,
                                  voters=cluster.voters, ring=lambda: other, directory="x")
        nursery.start_soon(stranger.run)
        await trio.sleep(1.0)
        assert cluster.hosts[1].links.connected_peers() == []
        assert cluster.hosts[1].links.faults.get("unknown_key", 0) >= 1
        assert cluster.hosts[1].status().leader is None
        nursery.cancel_scope.cancel()


@pytest.fixture(autouse=True)
def _quiet_pysyncobj_logs(caplog):
    caplog.set_level("WARNING", logger="pysyncobj")
