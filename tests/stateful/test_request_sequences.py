"""Random valid request sequences from several clients never stop the broker.

Goal (issue 16): no client input may reach an assertion, and every request is answered. The
codec fuzzing checks single frames; the defect that let any client stop the broker needed a
*sequence* (JoinGroup, the client gone, its session expired, then DeleteGroup). So this test
draws whole sequences.

Method: Hypothesis draws a list of steps: requests of every family — topics (create, delete,
add partitions, metadata), records (produce plain, idempotent and transactional; fetch; list
offsets; delete records), groups (join with or without a member id, sync, heartbeat, leave,
commit, fetch offsets, list, describe, delete), transactions (init producer id, add partitions
and offsets, transactional offset commit, end) — from three clients, plus a client dropping
its connection and virtual time passing (so sessions, rebalances, transactions and pending
members expire). Steps name what they need symbolically ("the member id client 1 was last
given", "the producer id of transactional id t1"); the interpreter fills in what earlier
answers said, so most requests are valid and reach deep states, and the rest are valid
requests the broker must refuse with an error code.

The broker is the real ``Broker`` on the simulator's ``SimEnv`` (in-memory network and disk,
a virtual clock, trio's scheduler seeded): every step runs in virtual time, so a 10-second
session expiry costs nothing. After each step: the broker's ``serve`` is still running, the
request got its answer within a bounded virtual time, and no answer is
``UNKNOWN_SERVER_ERROR`` (a handler bug answered rather than fatal is still a bug). At the end
the broker shuts down gracefully and its storage invariants hold.
"""

from __future__ import annotations

import random
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rivven_broker.protocol import messages as m
from rivven_broker.protocol.connection import ClientConnection
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.records import BatchBuilder
from rivven_broker.server.broker import Broker, BrokerState
from rivven_broker.server.config import BrokerConfig, HostPort
from sim.clock import SimClock
from sim.disk import DiskConfig, SimDisk
from sim.env import SimEnv
from sim.net import NetworkConfig, SimNetwork
from sim.trace import Trace
from sim.world import seeded_trio_scheduler

CLIENTS = 3
TOPICS = ("a", "b")
GROUPS = ("g1", "g2")
TXN_IDS = ("t1", "t2")
ANSWER_BOUND_S = 120.0  # virtual seconds: longer than any rebalance or long poll here
IDLE_TIMEOUT_S = 100.0  # the broker's is 120 s: a client idle this long reconnects first

client_index = st.integers(0, CLIENTS - 1)
topic = st.sampled_from(TOPICS)
partition = st.integers(0, 3)
group = st.sampled_from(GROUPS)
txn_id = st.sampled_from(TXN_IDS)

STEPS = st.one_of(
    st.tuples(st.just("create_topic"), client_index, topic, st.integers(1, 3)),
    st.tuples(st.just("delete_topic"), client_index, topic),
    st.tuples(st.just("create_partitions"), client_index, topic, st.integers(1, 5)),
    st.tuples(st.just("metadata"), client_index),
    st.tuples(st.just("produce"), client_index, topic, partition, st.sampled_from([1, -1]),
              st.sampled_from(["plain", "idempotent", "transactional"]), txn_id),
    st.tuples(st.just("fetch"), client_index, topic, partition, st.integers(0, 5),
              st.sampled_from([0, 1])),
    st.tuples(st.just("list_offsets"), client_index, topic, partition),
    st.tuples(st.just("delete_records"), client_index, topic, partition, st.integers(-1, 5)),
    st.tuples(st.just("join"), client_index, group, st.booleans(), st.sampled_from([1_000, 6_000])),
    st.tuples(st.just("sync"), client_index, group),
    st.tuples(st.just("heartbeat"), client_index, group),
    st.tuples(st.just("leave"), client_index, group),
    st.tuples(st.just("commit"), client_index, group, topic, partition, st.integers(0, 5),
              st.booleans()),
    st.tuples(st.just("offset_fetch"), client_index, group, st.booleans()),
    st.tuples(st.just("list_groups"), client_index),
    st.tuples(st.just("describe_group"), client_index, group),
    st.tuples(st.just("delete_group"), client_index, group),
    st.tuples(st.just("find_coordinator"), client_index, group),
    st.tuples(st.just("init_producer_id"), client_index, st.none() | txn_id),
    st.tuples(st.just("add_partitions"), client_index, txn_id, topic, partition),
    st.tuples(st.just("add_offsets"), client_index, txn_id, group),
    st.tuples(st.just("txn_commit_offsets"), client_index, txn_id, group, topic, partition),
    st.tuples(st.just("end_txn"), client_index, txn_id, st.booleans()),
    st.tuples(st.just("disconnect"), client_index),
    st.tuples(st.just("wait"), st.sampled_from([100, 1_500, 7_000, 65_000])),
)


@attrs.define
class _Known:
    """What earlier answers said, for filling in later requests."""

    member_ids: dict[tuple[int, str], str] = attrs.Factory(dict)
    generations: dict[tuple[int, str], int] = attrs.Factory(dict)
    leaders: dict[tuple[int, str], bool] = attrs.Factory(dict)
    members: dict[tuple[int, str], tuple[str, ...]] = attrs.Factory(dict)
    producers: dict[str | None, tuple[int, int]] = attrs.Factory(dict)
    sequences: dict[tuple[int, str, int], int] = attrs.Factory(dict)


def _batch(producer: tuple[int, int] | None = None, sequence: int = -1,
           transactional: bool = False) -> bytes:
    pid, epoch = producer if producer is not None else (-1, -1)
    builder = BatchBuilder(batch_bytes_max=1 << 16, producer_id=pid, producer_epoch=epoch,
                           base_sequence=sequence, transactional=transactional)
    builder.append(1_000, b"k", b"value")
    return builder.build()


def _request(step: tuple[Any, ...], known: _Known) -> m.Request | None:
    """The request a step stands for (None: the step sends nothing)."""
    kind, client = step[0], step[1]
    if kind == "create_topic":
        return m.CreateTopic(step[2], step[3])
    if kind == "delete_topic":
        return m.DeleteTopic(step[2])
    if kind == "create_partitions":
        return m.CreatePartitions(step[2], step[3])
    if kind == "metadata":
        return m.Metadata()
    if kind == "produce":
        _, _, name, number, acks, mode, txn = step
        producer = known.producers.get(txn if mode == "transactional" else None)
        if mode == "plain" or producer is None:
            records, transactional_id = _batch(), None
        else:
            key = (producer[0], name, number)
            sequence = known.sequences.get(key, 0)
            known.sequences[key] = sequence + 1
            records = _batch(producer, sequence, mode == "transactional")
            transactional_id = txn if mode == "transactional" else None
        part = m.ProducePartition(number, records)
        return m.Produce(acks=acks, timeout_ms=5_000, topics=(m.ProduceTopic(name, (part,)),),
                         transactional_id=transactional_id)
    if kind == "fetch":
        _, _, name, number, offset, isolation = step
        fetch_part = m.FetchPartition(number, offset, 1 << 16)
        return m.Fetch(max_wait_ms=200, isolation_level=isolation,
                       topics=(m.FetchTopic(name, (fetch_part,)),))
    if kind == "list_offsets":
        offsets_part = m.ListOffsetsPartition(step[3], -1)
        return m.ListOffsets(topics=(m.ListOffsetsTopic(step[2], (offsets_part,)),))
    if kind == "delete_records":
        delete_part = m.DeleteRecordsPartition(step[3], step[4])
        return m.DeleteRecords(timeout_ms=5_000,
                               topics=(m.DeleteRecordsTopic(step[2], (delete_part,)),))
    if kind in ("join", "sync", "heartbeat", "leave", "commit", "offset_fetch",
                "describe_group", "delete_group", "find_coordinator"):
        return _group_request(step, known)
    if kind == "list_groups":
        return m.ListGroups()
    return _txn_request(step, known)


def _group_request(step: tuple[Any, ...], known: _Known) -> m.Request:
    kind, client, name = step[0], step[1], step[2]
    member = known.member_ids.get((client, name), "")
    generation = known.generations.get((client, name), -1)
    if kind == "join":
        protocols = (m.JoinGroupProtocol("range", b"sub"),)
        return m.JoinGroup(name, member if step[3] else "", None, step[4], step[4],
                           "consumer", protocols)
    if kind == "sync":
        assignments: tuple[m.SyncGroupAssignment, ...] = ()
        if known.leaders.get((client, name)):
            assignments = tuple(m.SyncGroupAssignment(peer, b"x")
                                for peer in known.members.get((client, name), ()))
        return m.SyncGroup(name, generation, member, None, assignments)
    if kind == "heartbeat":
        return m.Heartbeat(name, generation, member)
    if kind == "leave":
        return m.LeaveGroup(name, (m.LeaveGroupMember(member),))
    if kind == "commit":
        _, _, _, topic_name, number, offset, as_member = step
        part = m.OffsetCommitPartition(number, offset)
        topics = (m.OffsetCommitTopic(topic_name, (part,)),)
        if as_member:
            return m.OffsetCommit(name, generation, member, None, topics)
        return m.OffsetCommit(name, topics=topics)
    if kind == "offset_fetch":
        if step[3]:
            return m.OffsetFetch(name, all_topics=True)
        return m.OffsetFetch(name, (m.OffsetFetchTopic(TOPICS[0], (0, 1)),))
    if kind == "describe_group":
        return m.DescribeGroup(name)
    if kind == "delete_group":
        return m.DeleteGroup(name)
    assert kind == "find_coordinator"
    return m.FindCoordinator(name)


def _txn_request(step: tuple[Any, ...], known: _Known) -> m.Request | None:
    kind = step[0]
    if kind == "init_producer_id":
        return m.InitProducerId(step[2], 5_000)
    if kind in ("disconnect",):
        return None
    txn = step[2]
    pid, epoch = known.producers.get(txn, (0, 0))
    if kind == "add_partitions":
        topics = (m.AddPartitionsToTxnTopic(step[3], (step[4],)),)
        return m.AddPartitionsToTxn(txn, pid, epoch, topics)
    if kind == "add_offsets":
        return m.AddOffsetsToTxn(txn, pid, epoch, step[3])
    if kind == "txn_commit_offsets":
        part = m.TxnOffsetCommitPartition(step[5], 1)
        return m.TxnOffsetCommit(txn, step[3], pid, epoch,
                                 topics=(m.TxnOffsetCommitTopic(step[4], (part,)),))
    assert kind == "end_txn", kind
    return m.EndTxn(txn, pid, epoch, step[3])


def _learn(step: tuple[Any, ...], response: m.Response, known: _Known) -> None:
    """Remember what later steps will need from ``response``."""
    kind = step[0]
    if kind == "join" and isinstance(response, m.JoinGroupResponse):
        key = (step[1], step[2])
        if response.member_id:
            known.member_ids[key] = response.member_id
        if response.error_code == ErrorCode.NONE:
            known.generations[key] = response.generation_id
            known.leaders[key] = response.leader == response.member_id
            known.members[key] = tuple(member.member_id for member in response.members)
    elif kind == "init_producer_id" and isinstance(response, m.InitProducerIdResponse):
        if response.error_code == ErrorCode.NONE:
            known.producers[step[2]] = (response.producer_id, response.producer_epoch)


class _Clients:
    """Raw protocol clients on the simulated network, reconnected on demand."""

    def __init__(self, network: SimNetwork) -> None:
        self._network = network
        self._streams: dict[int, tuple[trio.abc.Stream, ClientConnection]] = {}
        self._connections = 0
        self._used: dict[int, float] = {}

    async def call(self, client: int, request: m.Request) -> m.Response | None:
        if trio.current_time() - self._used.get(client, 0.0) >= IDLE_TIMEOUT_S:
            await self.drop(client)  # the broker has closed it, rightly: it was idle
        if client not in self._streams:
            self._connections += 1
            endpoint = self._network.endpoint(f"c{client}-{self._connections}")
            stream = await endpoint.open_tcp_stream("n1", 9092)
            self._streams[client] = (stream, ClientConnection())
        stream, core = self._streams[client]
        _, data = core.send_request(request)
        await stream.send_all(data)
        if not request.expects_response():
            return None
        while (event := core.next_event()) is None:
            data = await stream.receive_some()
            assert data, f"the broker closed the connection of client {client} on {request!r}"
            core.receive_data(data)
        self._used[client] = trio.current_time()
        return event.response

    async def drop(self, client: int) -> None:
        entry = self._streams.pop(client, None)
        if entry is not None:
            await entry[0].aclose()


def _error_codes(response: m.Response) -> list[int]:
    """Every error code an answer carries, at any depth."""
    codes: list[int] = []

    def walk(value: Any) -> None:
        if attrs.has(type(value)):
            for field in attrs.fields(type(value)):
                item = getattr(value, field.name)
                if field.name == "error_code":
                    codes.append(int(item))
                else:
                    walk(item)
        elif isinstance(value, tuple):
            for item in value:
                walk(item)

    walk(response)
    return codes


def _run(steps: list[tuple[Any, ...]], seed: int) -> None:
    async def main() -> None:
        trace = Trace()
        network = SimNetwork(NetworkConfig(), random.Random(f"{seed}/net"), trace)
        disk = SimDisk("n1", DiskConfig(), random.Random(f"{seed}/disk"), trace)
        config = BrokerConfig(
            data_dir=".", listen=HostPort("n1", 9092), http=None, sync_policy="always",
            group_initial_rebalance_delay_ms=500, offsets_topic_partitions=2,
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(network.run)
            env = SimEnv(seed=seed, identity="n1", clock=SimClock(), net=network.endpoint("n1"),
                         disk=disk)
            broker = Broker(env, config)
            served = trio.Event()

            async def serve() -> None:
                await broker.serve()
                served.set()

            nursery.start_soon(serve)
            while broker.state != BrokerState.SERVING:
                await trio.sleep(0.01)
            clients = _Clients(network)
            known = _Known()
            for number, step in enumerate(steps):
                assert broker.state == BrokerState.SERVING, f"the broker stopped before step {number}"
                if step[0] == "wait":
                    await trio.sleep(step[1] / 1000)
                    continue
                if step[0] == "disconnect":
                    await clients.drop(step[1])
                    continue
                request = _request(step, known)
                assert request is not None
                with trio.fail_after(ANSWER_BOUND_S):
                    response = await clients.call(step[1], request)
                if response is None:
                    continue
                assert ErrorCode.UNKNOWN_SERVER_ERROR not in _error_codes(response), (
                    f"step {number} {step}: {response!r}")
                _learn(step, response, known)
            assert broker.state == BrokerState.SERVING
            broker.context.logs.check_invariants()
            broker.request_shutdown()
            with trio.fail_after(ANSWER_BOUND_S):
                await served.wait()
            nursery.cancel_scope.cancel()

    with seeded_trio_scheduler(seed):
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(STEPS, min_size=5, max_size=40), seed=st.integers(0, 1000))
def test_random_request_sequences_never_stop_the_broker(steps, seed):
    _run(steps, seed)


def test_the_sequence_that_once_stopped_the_broker():
    """Issue 16, defect 1: JoinGroup without a member id, the client gone, the pending member
    expired, DeleteGroup on the empty group. It stopped the broker with an assertion."""
    _run([("join", 0, "g1", False, 1_000), ("disconnect", 0), ("wait", 7_000),
          ("delete_group", 1, "g1"), ("list_groups", 1)], seed=1)
