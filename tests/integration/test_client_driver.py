"""What only the blocking front has, over real loopback sockets, against a fake broker.

Method: ``FakeBroker`` (tests/unit/client/fake_broker.py) speaks the real protocol from a
thread and can be told to answer the next request of a kind with an error or to hold the
answer until the test releases it. Behaviour every front shares is tested once for all three
in test_client_fake_broker.py; here: ``on_delivery`` callbacks, ``flush``/``close`` timeouts
that fail pending futures, and blocking clients used from inside an event loop. No sleeps:
waits are futures, flushes and polls with timeouts.
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


