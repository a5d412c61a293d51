"""The trio client driver on memory streams and a virtual clock (no sockets, no waiting).

Method: an ``env`` whose ``net.open_tcp_stream`` returns one end of a
``trio.testing.memory_stream_pair`` and serves the other end with a tiny broker task built on
``ServerConnection``. Under pytest-trio's ``autojump_clock`` every timeout elapses instantly
and deterministically, so time-driven behaviour is tested exactly: a request that gets no
answer times out after ``request_timeout_ms``, breaks its connection, and the batch is retried
on a new one; records that cannot be delivered fail at ``delivery_timeout_ms``.
"""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from rivven_broker.client import ConnectionFailedError, DeliveryTimeoutError
from rivven_broker.client.trio import open_admin, open_producer
from rivven_broker.protocol import messages as m
from rivven_broker.protocol.txn_messages import InitProducerId, InitProducerIdResponse
from rivven_broker.protocol.connection import RequestReceived, ServerConnection


class Clock:
    def monotonic_ms(self) -> int:
        return int(trio.current_time() * 1000)

    def wall_ms(self) -> int:
        return 1_000_000 + int(trio.current_time() * 1000)


class MemoryBroker:
    """Answers Handshake, Metadata and Produce; can swallow Produce requests or refuse dials."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.clock = Clock()
        self.net = self
        self.swallow_produces = 0
        self.refuse_dials = False
        self.dials = 0
        self.next_offset = 0
        self.produces = 0

    def rng(self, name: str) -> random.Random:
        return random.Random(name)

    async def open_tcp_stream(self, host: str, port: int):
        self.dials += 1
        if self.refuse_dials:
            raise ConnectionRefusedError(111, "refused")
        client, server = trio.testing.memory_stream_pair()
        self.nursery.start_soon(self.serve, server)
        return client

    async def serve(self, stream) -> None:
        core = ServerConnection()
        try:
            while data := await stream.receive_some(1 << 16):
                core.receive_data(data)
                while (event := core.next_event()) is not None:
                    assert isinstance(event, RequestReceived)
                    response = self.answer(event.request)
                    if response is not None:
                        await stream.send_all(core.send_response(event.correlation_id, response))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    def answer(self, request):
        if isinstance(request, m.Handshake):
            return m.HandshakeResponse(api_versions=m.supported_api_versions())
        if isinstance(request, m.Metadata):
            partition = m.PartitionMetadata(partition=0, leader=1, leader_epoch=0)
            return m.MetadataResponse(
                brokers=(m.BrokerMetadata(node_id=1, host="memory", port=1),),
                topics=tuple(m.TopicMetadata(name=n, partitions=(partition,))
                             for n in request.topics or ()),
            )
        if isinstance(request, InitProducerId):  # the producer is idempotent by default
            return InitProducerIdResponse(producer_id=1, producer_epoch=0)
        assert isinstance(request, m.Produce)
        self.produces += 1
        if self.swallow_produces:
            self.swallow_produces -= 1
            return None  # never answered: the client's request timeout must fire
        base = self.next_offset
        self.next_offset += 1
        return m.ProduceResponse(topics=tuple(
            m.ProduceTopicResponse(name=t.name, partitions=tuple(
                m.ProducePartitionResponse(partition=p.partition, base_offset=base)
                for p in t.partitions))
            for t in request.topics))


async def test_an_unanswered_request_times_out_and_is_retried(autojump_clock):
    async with trio.open_nursery() as nursery:
        env = MemoryBroker(nursery)
        env.swallow_produces = 1
        async with open_producer("memory:1", env=env, request_timeout_ms=30_000,
                                 retry_backoff_ms=100) as producer:
            start = trio.current_time()
            meta = await producer.send("t", value=b"x")
            elapsed = trio.current_time() - start
        nursery.cancel_scope.cancel()
    assert meta.offset == 0 and meta.timestamp_ms >= 1_000_000
    assert env.produces == 2 and env.dials == 2  # the timeout broke the first connection
    assert 30 <= elapsed < 32  # one request timeout plus a backoff, on the virtual clock


async def test_a_request_waits_for_a_dial_in_progress_instead_of_backing_off(autojump_clock):
    """The first send's metadata refresh and the idempotent producer's InitProducerId both
    want "any broker" while the first dial is still handshaking: the second waits for that
    dial (as a request queues behind a Handshake) instead of failing and waiting out a retry
    backoff (1 s here; it was every first send's 100 ms)."""
    async with trio.open_nursery() as nursery:
        env = MemoryBroker(nursery)
        async with open_producer("memory:1", env=env, retry_backoff_ms=1_000) as producer:
            start = trio.current_time()
            meta = await producer.send("t", value=b"x")
            elapsed = trio.current_time() - start
        nursery.cancel_scope.cancel()
    assert meta.offset == 0 and env.dials == 1
    assert elapsed < 1  # on the virtual clock: no backoff was waited out


async def test_undeliverable_records_fail_at_the_delivery_timeout(autojump_clock):
    async with trio.open_nursery() as nursery:
        env = MemoryBroker(nursery)
        env.swallow_produces = 1000
        async with open_producer("memory:1", env=env, request_timeout_ms=1_000,
                                 delivery_timeout_ms=5_000) as producer:
            start = trio.current_time()
            with pytest.raises(DeliveryTimeoutError):
                await producer.send("t", value=b"x")
            elapsed = trio.current_time() - start
        nursery.cancel_scope.cancel()
    assert 4 <= elapsed <= 6.5
    assert env.produces >= 3


async def test_refused_dials_end_an_admin_call_quickly(autojump_clock):
    async with trio.open_nursery() as nursery:
        env = MemoryBroker(nursery)
        env.refuse_dials = True
        async with open_admin("memory:1", env=env, connect_attempts_max=3) as admin:
            with pytest.raises(ConnectionFailedError):
                await admin.list_topics()
        nursery.cancel_scope.cancel()
    assert env.dials == 3


async def test_an_answer_arriving_after_the_connection_failed_is_dropped_not_a_crash():
    """A request timed out (the connection failed, its waiters were answered) while its answer
    was already on the way: the read loop drops those bytes and ends instead of pairing them
    with a waiter that is gone. The failing connection's nursery is closed here, so the
    stream is not closed under the reader and the late bytes certainly arrive."""
    from rivven_broker.client._aio_net import Connection, _Waiter
    from rivven_broker.client.errors import RequestTimedOutError

    client_end, server_end = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as gone:
        pass
    connection = Connection(("memory", 1), client_end, 8, gone)
    _, request_bytes = connection.core.send_request(m.Ping())
    waiter = _Waiter()
    connection.waiters.append(waiter)
    server = ServerConnection()
    server.receive_data(request_bytes)
    event = server.next_event()
    assert isinstance(event, RequestReceived)
    answer = server.send_response(event.correlation_id, m.Pong())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(connection.read_loop)
        await trio.testing.wait_all_tasks_blocked()  # the reader waits for bytes
        connection.fail(RequestTimedOutError("no answer in time"))
        await server_end.send_all(answer)
    assert isinstance(waiter.error, RequestTimedOutError) and waiter.response is None


def _answered_pings(connection, count: int) -> tuple[list, bytes]:
    """``count`` Pings "sent" on ``connection`` (waiters with callbacks recording their
    outcome) and the bytes answering all of them."""
    from rivven_broker.client._aio_net import _Waiter

    server = ServerConnection()
    outcomes: list = []
    answers = b""
    for _ in range(count):
        _, request_bytes = connection.core.send_request(m.Ping())
        connection.waiters.append(_Waiter(0, lambda r, e: outcomes.append((r, e))))
        server.receive_data(request_bytes)
        event = server.next_event()
        answers += server.send_response(event.correlation_id, m.Pong())
    return outcomes, answers


async def test_the_reader_steps_its_client_once_per_receive_of_answers():
    """Three answers in one receive: three callbacks, then one ``after_answers``."""
    from rivven_broker.client._aio_net import Connection

    client_end, server_end = trio.testing.memory_stream_pair()
    steps: list[int] = []
    async with trio.open_nursery() as nursery:
        connection = Connection(("memory", 1), client_end, 8, nursery,
                                after_answers=lambda: steps.append(len(outcomes)))
        outcomes, answers = _answered_pings(connection, 3)
        nursery.start_soon(connection.read_loop)
        await server_end.send_all(answers)
        await trio.testing.wait_all_tasks_blocked()
        assert [type(r).__name__ for r, _ in outcomes] == ["Pong"] * 3
        assert steps == [3]
        nursery.cancel_scope.cancel()


async def test_an_answer_whose_callback_breaks_the_connection_ends_the_reader():
    """The first answer's callback fails the connection (as a request sent from the
    producer's step does when the stream is gone): the second answer, already received, is
    not paired with a waiter that is gone (it was failed), and the client still gets its
    step, after the failure."""
    from rivven_broker.client._aio_net import Connection
    from rivven_broker.client.errors import ConnectionFailedError as Lost

    client_end, server_end = trio.testing.memory_stream_pair()
    seen: list = []
    async with trio.open_nursery() as nursery:
        connection = Connection(("memory", 1), client_end, 8, nursery,
                                after_answers=lambda: seen.append(connection.error))
        outcomes, answers = _answered_pings(connection, 2)
        first = connection.waiters[0]
        first.on_answer = lambda r, e: connection.fail(Lost("the stream is gone"))
        nursery.start_soon(connection.read_loop)
        await server_end.send_all(answers)
        await trio.testing.wait_all_tasks_blocked()
    assert len(outcomes) == 1 and isinstance(outcomes[0][1], Lost)  # the second: failed
    assert len(seen) == 1 and isinstance(seen[0], Lost)
