"""ClusterControl on a one-voter controller (real loopback TCP and files): fencing, readiness."""

from __future__ import annotations

import functools

import trio

from rivven_broker.server.cluster.cluster_control import ClusterControl
from rivven_broker.server.env import RealEnv
from rivven_broker.storage.checkpoint import read_checkpoint, write_checkpoint
from rivven_broker.storage.file_store import OsFileStore
from rivven_cluster.membership import DEVELOPMENT_KEY, Address, KeyRing, Member, MemberState
from rivven_cluster.metadata import CreateTopic, RegisterBroker
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


class RecordingLocalTopics:
    """Local topics that only remember what the reconciliation asked of them."""

    def __init__(self) -> None:
        self.created: list[str] = []

    def topics(self):
        return {}

    def create(self, name, partitions, replication_factor, configs, now_ms, *, topic_id):
        self.created.append(name)


async def _started(tmp_path, port: int, local: RecordingLocalTopics,
                   nursery: trio.Nursery) -> ClusterControl:
    """A one-voter ClusterControl of broker 1 (boot 100) on ``tmp_path``, running."""
    members = [_member(1, 100)]
    control = ClusterControl(RealEnv(str(tmp_path)), node_id=1, rack=None, voters={},
                             ring=lambda: RING, local=local, members=lambda: members)
    await nursery.start(functools.partial(
        control.run, boot_id=100, advertised=("127.0.0.1", 9092),
        listen=("127.0.0.1", port)))
    return control


async def test_a_restarted_broker_reconciles_no_image_older_than_its_last_one(tmp_path):
    """The reconciled floor: each image's applied index is written durably before its changes
    reach the local logs, and a restarted broker (whose log may be applied only up to a commit
    index a new Raft leader announced lagging) acts on no image below it."""
    (port,) = free_cluster_ports(1)
    first = RecordingLocalTopics()
    async with trio.open_nursery() as nursery:
        control = await _started(tmp_path, port, first, nursery)
        with trio.fail_after(10):
            while not control.ready:
                await trio.sleep(0.02)
        assert (await control.propose(CreateTopic("t", "id-t", ((1,),)))).ok
        with trio.fail_after(5):
            while "t" not in first.created:
                await trio.sleep(0.02)
        applied = control.image().applied_index
        nursery.cancel_scope.cancel()
    floor = read_checkpoint(OsFileStore(str(tmp_path)), ".controller", "reconciled.checkpoint")
    assert floor == applied
    # As if the previous process had reconciled five commands more than this log holds yet.
    write_checkpoint(OsFileStore(str(tmp_path)), ".controller", "reconciled.checkpoint",
                     applied + 5)
    second = RecordingLocalTopics()
    async with trio.open_nursery() as nursery:
        control = await _started(tmp_path, port, second, nursery)
        with trio.fail_after(10):
            while control.image().applied_index < applied:
                await trio.sleep(0.02)
        await trio.sleep(0.5)
        gated = 0
        while control.image().applied_index < applied + 5:
            assert second.created == [] and not control.reconciled.is_set()
            broker = 2 + gated
            assert (await control.propose(RegisterBroker(broker, 5, "127.0.0.1", 9090 + broker))).ok
            gated += 1
            await trio.sleep(0.1)
        assert gated >= 2  # the log was below the floor for a while
        with trio.fail_after(5):
            while not control.reconciled.is_set():
                await trio.sleep(0.02)
        assert second.created == ["t"]
        nursery.cancel_scope.cancel()
