"""ClusterControl on a one-voter controller (real loopback TCP and files): fencing, readiness."""

from __future__ import annotations

import functools

import trio

from rivven_broker.server.cluster.cluster_control import ClusterControl
from rivven_broker.server.env import RealEnv
from rivven_cluster.membership import DEVELOPMENT_KEY, Address, KeyRing, Member, MemberState
from rivven_cluster.metadata import RegisterBroker
from tests.integration.cluster_ports import free_cluster_ports

RING = KeyRing((DEVELOPMENT_KEY.encode(),))


class NoLocalTopics:
    def topics(self):
        return {}


def _member(node_id: int, boot_id: int) -> Member:
    return Member(node_id, boot_id, 0, MemberState.ALIVE, Address("127.0.0.1", 1),
                  Address("127.0.0.1", 2), None, 0)


async def test_a_registration_older_than_the_member_swim_knows_is_fenced(tmp_path):
    (port,) = free_cluster_ports(1)
    members = [_member(1, 100)]
    control = ClusterControl(RealEnv(str(tmp_path)), node_id=1, rack=None, voters={},
                             ring=lambda: RING, local=NoLocalTopics(), members=lambda: members)
    assert control.image().brokers == {} and not control.ready  # before it runs
    async with trio.open_nursery() as nursery:
        await nursery.start(functools.partial(
            control.run, boot_id=100, advertised=("127.0.0.1", 9092),
            listen=("127.0.0.1", port)))
        with trio.fail_after(10):
            while not control.ready:
                await trio.sleep(0.02)
        assert (await control.propose(
            RegisterBroker(2, 5, "127.0.0.1", 9093))).ok
        await trio.sleep(1.2)
        assert not control.image().broker(2).fenced  # SWIM knows no newer process
        members.append(_member(2, 7))  # broker 2 restarted: a newer boot
        with trio.fail_after(5):
            while not control.image().broker(2).fenced:
                await trio.sleep(0.05)
        assert 2 not in control.live_brokers()
        assert not control.image().broker(1).fenced
        nursery.cancel_scope.cancel()
