"""The blocking client's driver over real loopback sockets, against a fake broker with faults.

Method: ``FakeBroker`` (tests/unit/client/fake_broker.py) speaks the real protocol from a
thread and can be told to answer the next request of a kind with an error, to drop the
connection, or to hold the answer until the test releases it. Each test drives the public
``Producer``/``Consumer``/``Admin`` and checks futures, errors and what the broker stored.
No sleeps: waits are futures, flushes and polls with timeouts.
"""

from __future__ import annotations

import socket
import threading

import pytest

from rivven_broker.client import (
    Admin,
    BufferExhaustedError,
    ClientTimeoutError,
    ClosedError,
    ConnectionFailedError,
    Consumer,
    DeliveryTimeoutError,
    InvalidTopicNameError,
    OffsetOutOfRangeError,
    Producer,
    RivvenError,
    TopicAlreadyExistsError,
    TopicPartition,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
)
from rivven_broker.client.blocking import SyncClient
from rivven_broker.client.config import ConnectionConfig
from rivven_broker.protocol import messages as m
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.records import partition_for_key
from tests.unit.client.fake_broker import FakeBroker, drop_connection, produce_error

FAST = dict(retry_backoff_ms=5, retry_backoff_max_ms=20, reconnect_backoff_ms=5,
            reconnect_backoff_max_ms=20)


@pytest.fixture
def broker():
    fake = FakeBroker().start()
    yield fake
    fake.stop()


def dead_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def consume_all(bootstrap, tps, count, **options):
    with Consumer(bootstrap, auto_offset_reset="earliest", **options) as consumer:
        consumer.assign(tps)
        out = []
        while len(out) < count:
            batch = consumer.poll(timeout_ms=5000)
            assert batch, f"stalled after {len(out)} records"
            out += batch
        return out


def test_round_trip_with_keys_and_headers(broker):
    broker.create_topic("t", 3)
    with Producer(broker.bootstrap, linger_ms=2) as producer:
        futures = [
            producer.send("t", value=b"v%d" % i, key=b"k%d" % (i % 17), headers={"i": b"%d" % i})
            for i in range(3000)
        ]
        producer.flush()
        metas = [f.result() for f in futures]
    for i, meta in enumerate(metas):
        assert meta.partition == partition_for_key(b"k%d" % (i % 17), 3)
    records = consume_all(broker.bootstrap, [TopicPartition("t", p) for p in range(3)], 3000)
    by_value = {r.value: r for r in records}
    assert len(by_value) == 3000
    for i, meta in enumerate(metas):
        record = by_value[b"v%d" % i]
        assert (record.partition, record.offset, record.key) == (meta.partition, meta.offset,
                                                                 b"k%d" % (i % 17))
        assert record.headers == (("i", b"%d" % i),)
        assert record.timestamp_ms == meta.timestamp_ms


def test_retriable_errors_and_dropped_connections_are_retried(broker):
    broker.create_topic("t", 1)
    broker.inject("Produce", produce_error(ErrorCode.NOT_LEADER))
    broker.inject("Produce", drop_connection)
    with Producer(broker.bootstrap, **FAST) as producer:
        meta = producer.send("t", value=b"x").result(timeout=10)
    assert meta.offset == 0
    assert broker.requests.count("Produce") == 3
    assert broker.requests.count("Metadata") >= 2  # NOT_LEADER refreshed the metadata
    assert broker.end_offset("t", 0) == 1


def test_non_retriable_errors_fail_the_future_without_retry(broker):
    broker.create_topic("t", 1)
    broker.inject("Produce", produce_error(ErrorCode.INVALID_TOPIC_NAME))
    calls = []
    with Producer(broker.bootstrap, **FAST) as producer:
        future = producer.send("t", value=b"x", on_delivery=lambda e, m: calls.append((e, m)))
        with pytest.raises(InvalidTopicNameError):
            future.result(timeout=10)
    assert broker.requests.count("Produce") == 1
    [(error, meta)] = calls
    assert isinstance(error, InvalidTopicNameError) and meta is None


def test_retries_stop_at_the_delivery_timeout(broker):
    broker.create_topic("t", 1)
    for _ in range(1000):
        broker.inject("Produce", produce_error(ErrorCode.REQUEST_TIMED_OUT))
    with Producer(broker.bootstrap, delivery_timeout_ms=200, **FAST) as producer:
        with pytest.raises(DeliveryTimeoutError):
            producer.send("t", value=b"x").result(timeout=10)
    assert broker.requests.count("Produce") > 1


def test_a_full_buffer_blocks_send_then_raises(broker):
    broker.create_topic("t", 1)
    release = threading.Event()

    def hold(request):
        release.wait(10)
        return produce_error(ErrorCode.NONE)(request)

    broker.inject("Produce", hold)
    producer = Producer(broker.bootstrap, buffer_memory_bytes=4096, max_block_ms=100, linger_ms=0)
    try:
        with pytest.raises(BufferExhaustedError):
            for _ in range(1000):
                producer.send("t", value=b"x" * 500)
    finally:
        release.set()
        producer.close()


def test_flush_and_close_time_out_and_fail_pending_records(broker):
    broker.create_topic("t", 1)
    release = threading.Event()
    broker.inject("Produce", lambda request: (release.wait(10), produce_error(0)(request))[1])
    producer = Producer(broker.bootstrap, linger_ms=0)
    future = producer.send("t", value=b"x")
    with pytest.raises(ClientTimeoutError):
        producer.flush(timeout=0.1)
    producer.close(timeout=0.1)
    release.set()
    with pytest.raises(ClosedError):
        future.result(timeout=10)
    with pytest.raises(ClosedError):
        producer.send("t", value=b"y")


def test_nothing_listening_is_a_connection_failure():
    address = dead_address()
    with Admin(address, **FAST) as admin:
        with pytest.raises(ConnectionFailedError):
            admin.list_topics()
    with Producer(address, max_block_ms=200, **FAST) as producer:
        with pytest.raises(ConnectionFailedError):
            producer.send("t", value=b"x")


def test_bootstrap_failover_skips_a_dead_address(broker):
    with Admin(f"{dead_address()},{broker.bootstrap}", **FAST) as admin:
        admin.create_topic("t", partitions=2)
        assert [t.name for t in admin.list_topics()] == ["t"]


def test_admin_errors_and_groups(broker):
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("t", partitions=2)
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topic("t")
        status = admin.cluster_status()
        assert status.partitions == 2 and status.brokers[0].port == broker.port
        assert admin.list_offsets({TopicPartition("t", 0): -1}) == {
            TopicPartition("t", 0): (0, -1)
        }
        with pytest.raises(UnsupportedVersionError):
            admin.list_groups()  # the fake broker has no group coordinator


def test_unknown_partition_is_refused_by_send(broker):
    broker.create_topic("t", 2)
    with Producer(broker.bootstrap) as producer:
        with pytest.raises(UnknownTopicOrPartitionError):
            producer.send("t", value=b"x", partition=5)


def test_consumer_positions_seek_and_latest(broker):
    broker.create_topic("t", 1)
    tp = TopicPartition("t", 0)
    with Producer(broker.bootstrap) as producer:
        for i in range(10):
            producer.send("t", value=b"%d" % i)
    with Consumer(broker.bootstrap) as consumer:  # auto_offset_reset="latest"
        consumer.assign([tp])
        assert consumer.position(tp) == 10
        consumer.seek(tp, 4)
        records = consumer.poll(timeout_ms=5000, max_records=3)
        assert [r.offset for r in records] == [4, 5, 6]
        assert consumer.position(tp) == 7
        consumer.seek_to_beginning()
        assert consumer.position(tp) == 0
        assert consumer.end_offsets([tp]) == {tp: 10}
        assert consumer.partitions_for_topic("t") == [0]
        with pytest.raises(RivvenError) as refused:
            consumer.subscribe(["t"])  # no group_id
        assert refused.value.code == "INVALID_GROUP_ID"


def test_consumer_out_of_range_with_policy_none_raises(broker):
    broker.create_topic("t", 1)
    tp = TopicPartition("t", 0)
    with Consumer(broker.bootstrap, auto_offset_reset="none") as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 50)
        with pytest.raises(OffsetOutOfRangeError):
            for _ in range(100):
                consumer.poll(timeout_ms=100)


def test_consumer_iterates_until_idle(broker):
    broker.create_topic("t", 1)
    with Producer(broker.bootstrap) as producer:
        for i in range(25):
            producer.send("t", value=b"%d" % i)
    with Consumer(broker.bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=300,
                  max_poll_records=7) as consumer:
        consumer.assign([TopicPartition("t", 0)])
        assert [r.value for r in consumer] == [b"%d" % i for i in range(25)]


def test_a_large_answer_arriving_in_pieces_is_whole_and_small_ones_follow_at_once(broker):
    """A fetch answer of MiBs is received straight into its own buffer while the socket wakes
    the driver per MiB (SO_RCVLOWAT); then the socket wakes per byte again, or the next small
    answer would wait for bytes that never come (the request would time out)."""
    records = bytes(range(256)) * (12 * 1024)  # 3 MiB
    broker.inject("Fetch", lambda request: m.FetchResponse(topics=(m.FetchTopicResponse(
        "t", (m.FetchPartitionResponse(0, ErrorCode.NONE, records=records),)),)))
    broker.trickle(48 * 1024, 0.0005)
    client = SyncClient(broker.bootstrap, ConnectionConfig(request_timeout_ms=10_000))
    try:
        fetch = m.Fetch(topics=(m.FetchTopic("t", (m.FetchPartition(0, 0, 8 << 20),)),))
        response = client.call(fetch)
        assert response.topics[0].partitions[0].records == records
        (conn,) = client._cluster._connections.values()
        assert conn.stream.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
        client.fetch_metadata(None, timeout_ms=2000)
    finally:
        client.close()


def test_a_call_to_a_broker_the_metadata_no_longer_lists_fails_at_once_retriably(broker):
    """The same contract as the trio driver's (test_client_trio_fake): a node id the metadata
    does not list is a retriable ConnectionFailedError that asks for a refresh, not an
    UnknownTopicOrPartitionError (which a Kafka user reads as "no such topic")."""
    client = SyncClient(broker.bootstrap, ConnectionConfig(request_timeout_ms=60_000))
    try:
        client.fetch_metadata([])
        assert client.metadata.brokers and 99 not in client.metadata.brokers
        with pytest.raises(ConnectionFailedError) as failed:
            client.call(m.Ping(), node_id=99)
        assert failed.value.retriable and "not in the metadata" in str(failed.value)
        assert not isinstance(failed.value, UnknownTopicOrPartitionError)
        assert client.metadata.needs_update(10**12)
    finally:
        client.close()
