"""The client over real loopback sockets, against the fault-injecting fake broker.

Method: the fake broker (tests/unit/client/fake_broker.py) runs on its own threads; each test
body runs through every front end (``on_each_front``: the blocking classes, and the async
client under trio and under asyncio; one driver behind all three). Each test checks one
behaviour: round trip and key partitioning, retries after injected errors and dropped
connections, non-retriable failures, fast failure when nothing listens, consumer positions.
The driver's own connection pool (``Cluster``) is tested on both loops (``on_each_loop``).
Waits are bounded with ``anyio.fail_after``; nothing sleeps.
"""

from __future__ import annotations

import socket
import threading

import anyio
import pytest

from rivven_broker.client import (
    BufferExhaustedError,
    ConnectionFailedError,
    DeliveryTimeoutError,
    InvalidTopicNameError,
    OffsetOutOfRangeError,
    RivvenError,
    TopicAlreadyExistsError,
    TopicPartition,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
)
from rivven_broker.client._aio_net import ClientEnv, Cluster, SocketStream, open_socket_stream
from rivven_broker.client.config import ConnectionConfig
from rivven_broker.client.requests import metadata_request
from rivven_broker.protocol import messages as m
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.records import partition_for_key
from tests.frontends import on_each_front
from tests.loops import on_each_loop
from tests.unit.client.fake_broker import FakeBroker, drop_connection, produce_error

FAST = dict(retry_backoff_ms=5, retry_backoff_max_ms=20, reconnect_backoff_ms=5,
            reconnect_backoff_max_ms=20)


def dead_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def fake():
    broker = FakeBroker().start()
    yield broker
    broker.stop()


@on_each_front
async def test_round_trip(front, fake):
    async with front.open_admin(fake.bootstrap) as admin:
        await admin.create_topic("t", partitions=3)
        with pytest.raises(TopicAlreadyExistsError):
            await admin.create_topic("t")
        assert [t.name for t in await admin.list_topics()] == ["t"]
    with anyio.fail_after(20):
        async with front.open_producer(fake.bootstrap, linger_ms=1) as producer:
            first = await producer.send("t", value=b"first", key=b"k")
            handles = [await producer.enqueue("t", value=b"%d" % i, key=b"k%d" % (i % 17),
                                              headers={"i": b"%d" % i})
                       for i in range(3000)]
            await producer.flush()
            metas = [await handle for handle in handles]
        assert first.partition == partition_for_key(b"k", 3)
        for i, meta in enumerate(metas):
            assert meta.partition == partition_for_key(b"k%d" % (i % 17), 3)
        async with front.open_consumer(fake.bootstrap, auto_offset_reset="earliest") as consumer:
            consumer.assign([TopicPartition("t", p) for p in range(3)])
            records = []
            while len(records) < 3001:
                records += await consumer.poll(timeout_ms=1000)
    by_value = {r.value: r for r in records}
    assert len(by_value) == 3001
    for i, meta in enumerate(metas):
        record = by_value[b"%d" % i]
        assert (record.partition, record.offset, record.key) == (
            meta.partition, meta.offset, b"k%d" % (i % 17))
        assert record.headers == (("i", b"%d" % i),)
        assert record.timestamp_ms == meta.timestamp_ms


@on_each_front
async def test_retries_after_errors_and_dropped_connections(front, fake):
    fake.create_topic("t", 1)
    fake.inject("Produce", produce_error(ErrorCode.NOT_LEADER))
    fake.inject("Produce", drop_connection)
    with anyio.fail_after(20):
        async with front.open_producer(fake.bootstrap, **FAST) as producer:
            meta = await producer.send("t", value=b"x")
    assert meta.offset == 0 and fake.requests.count("Produce") == 3
    assert fake.requests.count("Metadata") >= 2  # NOT_LEADER refreshed the metadata
    assert fake.end_offset("t", 0) == 1


@on_each_front
async def test_non_retriable_error_is_raised(front, fake):
    fake.create_topic("t", 1)
    fake.inject("Produce", produce_error(ErrorCode.INVALID_TOPIC_NAME))
    with anyio.fail_after(20):
        async with front.open_producer(fake.bootstrap, **FAST) as producer:
            with pytest.raises(InvalidTopicNameError):
                await producer.send("t", value=b"x")
    assert fake.requests.count("Produce") == 1


@on_each_front
async def test_retries_stop_at_the_delivery_timeout(front, fake):
    fake.create_topic("t", 1)
    for _ in range(1000):
        fake.inject("Produce", produce_error(ErrorCode.REQUEST_TIMED_OUT))
    with anyio.fail_after(20):
        async with front.open_producer(fake.bootstrap, delivery_timeout_ms=200,
                                       **FAST) as producer:
            with pytest.raises(DeliveryTimeoutError):
                await producer.send("t", value=b"x")
    assert fake.requests.count("Produce") > 1


@on_each_front
async def test_a_full_buffer_blocks_then_raises(front, fake):
    fake.create_topic("t", 1)
    release = threading.Event()

    def hold(request):
        release.wait(10)
        return produce_error(ErrorCode.NONE)(request)

    fake.inject("Produce", hold)
    try:
        with anyio.fail_after(20):
            async with front.open_producer(fake.bootstrap, buffer_memory_bytes=4096,
                                           max_block_ms=100, linger_ms=0) as producer:
                assert await producer.partitions_for("t") == [0]  # metadata, before the hold
                with pytest.raises(BufferExhaustedError):
                    for _ in range(1000):
                        await producer.enqueue("t", value=b"x" * 500)
                release.set()
    finally:
        release.set()


@on_each_front
async def test_nothing_listening(front):
    address = dead_address()
    with anyio.fail_after(20):
        async with front.open_admin(address, **FAST) as admin:
            with pytest.raises(ConnectionFailedError):
                await admin.list_topics()
        async with front.open_producer(address, max_block_ms=200, **FAST) as producer:
            with pytest.raises(ConnectionFailedError):
                await producer.send("t", value=b"x")


@on_each_front
async def test_bootstrap_failover_skips_a_dead_address(front, fake):
    with anyio.fail_after(20):
        async with front.open_admin(f"{dead_address()},{fake.bootstrap}", **FAST) as admin:
            await admin.create_topic("t", partitions=2)
            assert [t.name for t in await admin.list_topics()] == ["t"]


@on_each_front
async def test_admin_errors_and_groups(front, fake):
    with anyio.fail_after(20):
        async with front.open_admin(fake.bootstrap) as admin:
            await admin.create_topic("t", partitions=2)
            with pytest.raises(TopicAlreadyExistsError):
                await admin.create_topic("t")
            status = await admin.cluster_status()
            assert status.partitions == 2 and status.brokers[0].port == fake.port
            assert await admin.list_offsets({TopicPartition("t", 0): -1}) == {
                TopicPartition("t", 0): (0, -1)}
            with pytest.raises(UnsupportedVersionError):
                await admin.list_groups()  # the fake broker has no group coordinator


@on_each_front
async def test_unknown_partition_is_refused_by_send(front, fake):
    fake.create_topic("t", 2)
    with anyio.fail_after(20):
        async with front.open_producer(fake.bootstrap) as producer:
            with pytest.raises(UnknownTopicOrPartitionError):
                await producer.send("t", value=b"x", partition=5)


@on_each_front
async def test_consumer_positions_seek_and_latest(front, fake):
    fake.create_topic("t", 1)
    tp = TopicPartition("t", 0)
    with anyio.fail_after(20):
        async with front.open_producer(fake.bootstrap) as producer:
            for i in range(10):
                await producer.enqueue("t", value=b"%d" % i)
        async with front.open_consumer(fake.bootstrap) as consumer:  # "latest"
            consumer.assign([tp])
            assert await consumer.position(tp) == 10
            assert await consumer.end_offsets([tp]) == {tp: 10}
            consumer.seek(tp, 4)
            records = []
            while len(records) < 3:
                records += await consumer.poll(timeout_ms=1000, max_records=3 - len(records))
            assert [r.offset for r in records] == [4, 5, 6]
            assert await consumer.position(tp) == 7
            consumer.seek_to_beginning()
            assert await consumer.position(tp) == 0
            assert await consumer.partitions_for_topic("t") == [0]
            with pytest.raises(RivvenError) as refused:
                consumer.subscribe(["t"])  # no group_id
            assert refused.value.code == "INVALID_GROUP_ID"


@on_each_front
async def test_consumer_out_of_range_with_policy_none_raises(front, fake):
    fake.create_topic("t", 1)
    tp = TopicPartition("t", 0)
    with anyio.fail_after(20):
        async with front.open_consumer(fake.bootstrap, auto_offset_reset="none") as consumer:
            consumer.assign([tp])
            consumer.seek(tp, 50)
            with pytest.raises(OffsetOutOfRangeError):
                for _ in range(100):
                    await consumer.poll(timeout_ms=100)


@on_each_front
async def test_consumer_iterates_until_idle(front, fake):
    fake.create_topic("t", 1)
    with anyio.fail_after(20):
        async with front.open_producer(fake.bootstrap) as producer:
            for i in range(25):
                await producer.enqueue("t", value=b"%d" % i)
        async with front.open_consumer(fake.bootstrap, auto_offset_reset="earliest",
                                       consumer_timeout_ms=2_000,
                                       max_poll_records=7) as consumer:
            consumer.assign([TopicPartition("t", 0)])
            assert [r.value async for r in consumer] == [b"%d" % i for i in range(25)]


@on_each_loop
async def test_a_call_to_a_broker_the_metadata_no_longer_lists_fails_at_once(fake):
    """Found by the simulator (cluster-groups-txn seed 11): a broker with a stale view
    answered a refresh without the group's coordinator, and the member's SyncGroup (then its
    LeaveGroup) retried every millisecond until its timeout (60 s) with no refresh asked for.
    Now such a call fails at once, retriably, and asks for a refresh: the group finds its
    coordinator again."""
    async with anyio.create_task_group() as nursery:
        cluster = Cluster(fake.bootstrap, ConnectionConfig(request_timeout_ms=60_000),
                          ClientEnv(), nursery, in_flight_max=4)
        await cluster.refresh()
        assert cluster.metadata.brokers and 99 not in cluster.metadata.brokers
        with anyio.fail_after(10):  # a hang guard, far below the call's own timeout
            with pytest.raises(ConnectionFailedError) as failed:
                await cluster.call(metadata_request([], False), node_id=99)
        assert failed.value.retriable and "not in the metadata" in str(failed.value)
        assert cluster.metadata.needs_update(cluster.now_ms() + 60_000)
        cluster.close()
        nursery.cancel_scope.cancel()


@on_each_loop
async def test_a_large_answer_arriving_in_pieces_is_whole_and_small_ones_follow_at_once(fake):
    """As the blocking driver's test: a fetch answer of MiBs is received straight into its own
    buffer (``receive_into``) while the socket wakes the reader per MiB (SO_RCVLOWAT); then
    the socket wakes per byte again, or the next small answer would wait for bytes that never
    come (its request would time out)."""
    records = bytes(range(256)) * (12 * 1024)  # 3 MiB
    fake.inject("Fetch", lambda request: m.FetchResponse(topics=(m.FetchTopicResponse(
        "t", (m.FetchPartitionResponse(0, ErrorCode.NONE, records=records),)),)))
    fake.trickle(48 * 1024, 0.0005)
    received_into: list[int] = []

    class CountingStream(SocketStream):
        __slots__ = ()

        async def receive_into(self, view: memoryview) -> int:
            received_into.append(len(view))
            return await super().receive_into(view)

    class CountingNet:
        async def open_tcp_stream(self, host: str, port: int) -> SocketStream:
            stream = await open_socket_stream(host, port)
            stream.__class__ = CountingStream
            return stream

    env = ClientEnv()
    env.net = CountingNet()
    async with anyio.create_task_group() as nursery:
        cluster = Cluster(fake.bootstrap, ConnectionConfig(request_timeout_ms=10_000), env,
                          nursery, in_flight_max=4)
        with anyio.fail_after(20):
            fetch = m.Fetch(topics=(m.FetchTopic("t", (m.FetchPartition(0, 0, 8 << 20),)),))
            response = await cluster.call(fetch)
            assert response.topics[0].partitions[0].records == records
            assert received_into and max(received_into) > 1 << 20  # the body's own buffer
            (conn,) = cluster._connections.values()
            assert conn.stream.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
            await cluster.call(metadata_request(None, False))
        cluster.close()
        nursery.cancel_scope.cancel()
