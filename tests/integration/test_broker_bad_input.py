"""Bad input over real sockets: every kind is answered or cut off, and nothing else suffers.

Method: an in-process broker on loopback (real files) receives hand-made frames through a raw
trio stream: an oversized length prefix, undecodable payloads, foreign format bytes, batches
with a broken CRC, half frames from stalling clients, a thousand abandoned connections. Each
test checks the documented answer (error code and correlation id, or the connection closing)
and that the broker goes on serving other clients. Timeouts (``fail_after``) only bound a
hang; nothing asserts on elapsed time.
"""

from __future__ import annotations

import struct

import pytest
import trio

from rivven_broker.protocol import codec, limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.framing import (
    FORMAT_MSGPACK,
    FORMAT_POSTCARD,
    FORMAT_PROTOBUF,
    encode_frame,
)
from rivven_broker.protocol.messages import (
    CreateTopic,
    ErrorResponse,
    Fetch,
    FetchPartition,
    FetchTopic,
    ListOffsets,
    ListOffsetsPartition,
    ListOffsetsTopic,
    Ping,
    Pong,
    Produce,
    ProducePartition,
    ProduceTopic,
)
from rivven_broker.records import BatchBuilder

_BOUND_S = 20


def request_frame(request, correlation_id: int) -> bytes:
    return encode_frame(FORMAT_MSGPACK, correlation_id, codec.encode_request(request))


def batch(value: bytes = b"v") -> bytes:
    builder = BatchBuilder(batch_bytes_max=1 << 20)
    builder.append(1_000, b"k", value)
    return builder.build()


async def read_answer(client, expected_id: int):
    frame = await client.receive_raw_frame()
    assert frame is not None, "the broker closed the connection"
    assert frame.correlation_id == expected_id
    assert frame.format == FORMAT_MSGPACK
    return codec.decode_response(frame.payload)


async def log_end(client, topic: str, partition: int = 0) -> int:
    response = await client.call(ListOffsets(topics=(ListOffsetsTopic(topic, (ListOffsetsPartition(partition, -1),)),)))
    return response.topics[0].partitions[0].offset


async def test_a_frame_over_the_limit_gets_an_error_and_the_connection_closes(broker, connect):
    client = await connect(broker.port)
    with trio.fail_after(_BOUND_S):
        await client.send_raw(request_frame(Ping(), 5))  # answered first, in order
        await client.send_raw(struct.pack(">IBI", limits.frame_bytes_max + 1, FORMAT_MSGPACK, 6))
        assert isinstance(await read_answer(client, 5), Pong)
        error = await read_answer(client, 0)  # the connection-level channel
        assert isinstance(error, ErrorResponse)
        assert error.error_code == ErrorCode.MESSAGE_TOO_LARGE
        assert await client.receive_raw_frame() is None  # closed
    other = await connect(broker.port)
    assert isinstance(await other.call(Ping()), Pong)


async def test_a_length_below_the_header_is_fatal_too(broker, connect):
    client = await connect(broker.port)
    with trio.fail_after(_BOUND_S):
        await client.send_raw(struct.pack(">I", 2) + b"\x02\x00")
        error = await read_answer(client, 0)
        assert error.error_code == ErrorCode.INVALID_REQUEST
        assert await client.receive_raw_frame() is None


async def test_undecodable_payloads_get_invalid_request_and_the_connection_stays(broker, connect):
    client = await connect(broker.port)
    bad_payloads = [
        b"",  # nothing
        b"\xc1",  # a byte msgpack never uses
        b"\x93\x01",  # an array cut short
        b"\x93\x08\x00\x81\xa4acks\x07",  # Produce with acks=7
        b"\x92\x01\x00",  # wrong arity
        b"\xa5hello",  # not an array at all
    ]
    with trio.fail_after(_BOUND_S):
        for index, payload in enumerate(bad_payloads):
            await client.send_raw(encode_frame(FORMAT_MSGPACK, 100 + index, payload))
        await client.send_raw(request_frame(Ping(), 999))
        for index, _ in enumerate(bad_payloads):
            answer = await read_answer(client, 100 + index)
            assert isinstance(answer, ErrorResponse)
            assert answer.error_code in (ErrorCode.INVALID_REQUEST, ErrorCode.UNSUPPORTED_VERSION)
        assert isinstance(await read_answer(client, 999), Pong)


async def test_an_unknown_api_key_is_unsupported_version(broker, connect):
    client = await connect(broker.port)
    with trio.fail_after(_BOUND_S):
        await client.send_raw(encode_frame(FORMAT_MSGPACK, 3, b"\x93\x7f\x00\x80"))  # api 127
        answer = await read_answer(client, 3)
        assert answer.error_code == ErrorCode.UNSUPPORTED_VERSION
        await client.send_raw(request_frame(Ping(), 4))
        assert isinstance(await read_answer(client, 4), Pong)


async def test_foreign_formats_get_unsupported_format_in_their_correlation_id(broker, connect):
    client = await connect(broker.port)
    with trio.fail_after(_BOUND_S):
        for format, correlation_id in ((FORMAT_POSTCARD, 10), (FORMAT_PROTOBUF, 11), (0x7F, 12)):
            await client.send_raw(encode_frame(format, correlation_id, b"\x01\x02\x03"))
        for correlation_id in (10, 11, 12):
            answer = await read_answer(client, correlation_id)
            assert answer.error_code == ErrorCode.UNSUPPORTED_FORMAT
        await client.send_raw(request_frame(Ping(), 13))
        assert isinstance(await read_answer(client, 13), Pong)


async def test_a_crc_mismatch_is_corrupt_message_and_nothing_is_appended(broker, connect):
    client = await connect(broker.port)
    await client.call(CreateTopic("t", 1))
    good = batch(b"good")
    broken = bytearray(batch(b"evil"))
    broken[-1] ^= 0x01  # inside the CRC-covered records
    for records in (bytes(broken), good + bytes(broken), bytes(broken) + good):
        request = Produce(acks=-1, topics=(ProduceTopic("t", (ProducePartition(0, records),)),))
        answer = (await client.call(request)).topics[0].partitions[0]
        assert answer.error_code == ErrorCode.CORRUPT_MESSAGE
        assert answer.base_offset == -1
    assert await log_end(client, "t") == 0
    truncated = Produce(acks=-1, topics=(ProduceTopic("t", (ProducePartition(0, good[:-3]),)),))
    assert (await client.call(truncated)).topics[0].partitions[0].error_code == ErrorCode.CORRUPT_MESSAGE
    garbage = Produce(acks=-1, topics=(ProduceTopic("t", (ProducePartition(0, b"\x00" * 80),)),))
    assert (await client.call(garbage)).topics[0].partitions[0].error_code == ErrorCode.CORRUPT_MESSAGE
    assert await log_end(client, "t") == 0
    fetched = await client.call(Fetch(max_wait_ms=0, topics=(FetchTopic("t", (FetchPartition(0, 0),)),)))
    assert fetched.topics[0].partitions[0].records == b""


async def test_a_stalled_half_frame_is_closed_after_the_idle_timeout(start_broker, connect):
    broker = await start_broker(idle_timeout_ms=200)
    staller = await connect(broker.port)
    silent = await connect(broker.port)
    polite = await connect(broker.port)
    waiting = await connect(broker.port)
    await polite.call(CreateTopic("t", 1))
    with trio.fail_after(_BOUND_S):
        await staller.send_raw(request_frame(Ping(), 1)[:6])  # half a frame, then nothing
        # A client inside a long poll longer than the idle timeout is not idle.
        await waiting.send(Fetch(max_wait_ms=1_000, topics=(FetchTopic("t", (FetchPartition(0, 0),)),)))
        async with trio.open_nursery() as nursery:
            async def keep_pinging() -> None:
                while True:
                    assert isinstance(await polite.call(Ping()), Pong)

            nursery.start_soon(keep_pinging)
            assert await staller.closed_by_peer()
            assert await silent.closed_by_peer()
            answer = await waiting.receive()  # the long poll ran its course and was answered
            assert answer.response.error_code == ErrorCode.NONE
            nursery.cancel_scope.cancel()  # (may leave a ping of ``polite`` unanswered)
    fresh = await connect(broker.port)
    assert isinstance(await fresh.call(Ping()), Pong)
    registry = broker.broker.metrics.registry
    assert registry.get_sample_value("rivven_connections_idle_closed_total") >= 2


@pytest.mark.slow
async def test_a_thousand_abandoned_connections_leave_the_broker_serving(start_broker, connect):
    broker = await start_broker(idle_timeout_ms=500)
    half = request_frame(Ping(), 1)[:7]
    streams = []
    with trio.fail_after(60):
        for index in range(1_000):
            stream = await trio.open_tcp_stream("127.0.0.1", broker.port)
            if index % 3 == 0:
                await stream.send_all(half)
            elif index % 3 == 1:
                await stream.send_all(request_frame(Ping(), 1))  # answered into the void
            streams.append(stream)
        for stream in streams:
            await trio.aclose_forcefully(stream)
        client = await connect(broker.port)
        assert isinstance(await client.call(Ping()), Pong)
        await client.call(CreateTopic("still-works", 1))
        answer = await client.call(Produce(acks=-1, topics=(ProduceTopic("still-works", (ProducePartition(0, batch()),)),)))
        assert answer.topics[0].partitions[0].error_code == ErrorCode.NONE


async def test_connections_over_the_limit_are_closed_at_once(start_broker, connect):
    broker = await start_broker(connections_max=3)
    clients = [await connect(broker.port) for _ in range(3)]
    for client in clients:
        assert isinstance(await client.call(Ping()), Pong)
    with trio.fail_after(_BOUND_S):
        extra = await connect(broker.port)
        assert await extra.closed_by_peer()
    await trio.aclose_forcefully(clients[0].stream)
    with trio.fail_after(_BOUND_S):
        while True:  # the broker notices the close on its own schedule; then there is room
            late = await connect(broker.port)
            try:
                if isinstance(await late.call(Ping()), Pong):
                    break
            except (EOFError, trio.BrokenResourceError):
                continue


async def test_a_request_naming_a_partition_twice_is_refused_whole(broker, connect):
    """Found by probing: both batches were stored and both entries got the second answer (a
    stored batch reported failed, a corrupt one reported stored)."""
    client = await connect(broker.port)
    await client.call(CreateTopic("t", 2))
    good = batch(b"good")
    broken = bytearray(batch(b"evil"))
    broken[-1] ^= 0x01
    twice = (ProducePartition(0, good), ProducePartition(1, good), ProducePartition(0, bytes(broken)))
    split = (ProduceTopic("t", (ProducePartition(0, good),)), ProduceTopic("t", (ProducePartition(0, good),)))
    for topics in ((ProduceTopic("t", twice),), split):
        answer = await client.call(Produce(acks=-1, topics=topics))
        assert isinstance(answer, ErrorResponse)
        assert answer.error_code == ErrorCode.INVALID_REQUEST
        assert "partition 0 of topic 't' more than once" in answer.message
    assert await log_end(client, "t", 0) == 0 and await log_end(client, "t", 1) == 0
    fetch_twice = Fetch(max_wait_ms=0, topics=(FetchTopic("t", (FetchPartition(0, 0), FetchPartition(0, 5))),))
    assert (await client.call(fetch_twice)).error_code == ErrorCode.INVALID_REQUEST
    once = Produce(acks=-1, topics=(ProduceTopic("t", (ProducePartition(0, good), ProducePartition(1, good))),))
    answers = (await client.call(once)).topics[0].partitions
    assert [(a.partition, a.error_code, a.base_offset) for a in answers] == [(0, 0, 0), (1, 0, 0)]
