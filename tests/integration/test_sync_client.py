"""``SyncClient``: raw blocking calls whose I/O runs on the caller's thread.

Goal: the request/response layer under the Spark executors does its socket I/O on the thread
that calls (no loop thread to start per client, no hand-off of answers between threads), stays
usable from any thread (one that runs an asyncio loop, or one inside trio), and recovers from a
lost connection between calls. Method: real loopback sockets to the fake broker
(``tests/unit/client/fake_broker.py``), which can drop a connection on cue.
"""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest
import trio

from rivven_broker.client.blocking import SyncClient
from rivven_broker.client.config import ConnectionConfig
from rivven_broker.protocol import messages as m
from tests.unit.client.fake_broker import FakeBroker, drop_connection

FAST = ConnectionConfig(client_id="sync-test", retry_backoff_ms=5, retry_backoff_max_ms=20,
                        reconnect_backoff_ms=5, reconnect_backoff_max_ms=20,
                        request_timeout_ms=5_000)


@pytest.fixture
def broker():
    fake = FakeBroker().start()
    fake.create_topic("t", 2)
    yield fake
    fake.stop()


def test_calls_run_on_the_callers_thread_and_start_no_thread(broker):
    before = set(threading.enumerate())
    client = SyncClient(broker.bootstrap, FAST)
    try:
        assert client.leader_for("t", 1) == broker.node_id
        assert isinstance(client.call(m.Ping()), m.Pong)
        started = [t.name for t in set(threading.enumerate()) - before]
        assert [name for name in started if "_serve" not in name] == []  # the fake's only
    finally:
        client.close()
    with pytest.raises(Exception, match="closed"):
        client.call(m.Ping())


def test_connections_lost_in_and_between_calls_are_dialled_again(broker):
    """Nothing runs between calls: the next call finds a connection the broker closed
    meanwhile, and retries on a new one, as it does for one lost during a call."""
    client = SyncClient(broker.bootstrap, FAST)
    try:
        assert isinstance(client.call(m.Ping()), m.Pong)
        broker.inject("Ping", drop_connection)  # the next Ping loses its connection
        assert isinstance(client.call(m.Ping()), m.Pong)
        assert len(broker._conns) == 2
        live = broker._conns[-1]  # closed by the broker while no call runs
        live.shutdown(socket.SHUT_RDWR)
        assert isinstance(client.call(m.Ping()), m.Pong)
        assert len(broker._conns) == 3
    finally:
        client.close()


def test_usable_from_a_thread_running_an_event_loop_and_from_trio(broker):
    client = SyncClient(broker.bootstrap, FAST)
    try:
        async def in_asyncio():
            return client.call(m.Ping())  # a blocking call inside a running loop

        async def in_trio():
            return client.call(m.Ping())  # sniffio says "trio" on this thread

        assert isinstance(asyncio.run(in_asyncio()), m.Pong)
        assert isinstance(trio.run(in_trio), m.Pong)
        assert client.leader_for("t", 0) == broker.node_id
    finally:
        client.close()
