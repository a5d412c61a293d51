"""Random bytes never crash the broker or change its log, and never store a damaged batch.

Method: a real ``rivven-broker`` subprocess holds a topic ``fuzzed`` with known contents.
Hypothesis generates byte streams of three kinds mixed together: raw garbage, well-framed
frames with random format bytes and payloads, and real encoded requests (a Produce to another
topic, ``sink``, carrying a valid batch, a Fetch, a Metadata, a Ping) with bytes flipped, cut
or spliced. Each example is sent on a fresh connection, which is then half-closed; the test
reads until the broker closes it (so the broker has handled every byte before the next
example). Afterwards the process must be alive and answer a ping, ``fuzzed`` must be exactly as
before (end offset, bytes), and whatever a mutated Produce managed to store elsewhere must be
intact batches of the original record (a mutation that survives every check is a valid
request, and storing it is right; storing a damaged batch never is).
"""

from __future__ import annotations

import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rivven_broker.protocol import codec
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.framing import FORMAT_MSGPACK, encode_frame
from rivven_broker.protocol.messages import (
    CreateTopic,
    Fetch,
    FetchPartition,
    FetchTopic,
    Metadata,
    Ping,
    Pong,
    Produce,
    ProducePartition,
    ProduceTopic,
)
from rivven_broker.records import BatchBuilder, decode_records, iter_batches, validate


def _batch(value: bytes) -> bytes:
    builder = BatchBuilder(batch_bytes_max=1 << 20)
    builder.append(1_000, b"key", value)
    return builder.build()


_VALID_REQUESTS = [
    codec.encode_request(Produce(acks=-1, topics=(ProduceTopic("sink", (ProducePartition(0, _batch(b"x")),)),))),
    codec.encode_request(Fetch(max_wait_ms=0, topics=(FetchTopic("fuzzed", (FetchPartition(0, 0),)),))),
    codec.encode_request(Metadata(("fuzzed",))),
    codec.encode_request(Ping()),
]


def _mutate(payload: bytes, data: st.DataObject) -> bytes:
    buffer = bytearray(payload)
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "cut", "splice"]))
        if not buffer:
            break
        position = data.draw(st.integers(0, len(buffer) - 1))
        if kind == "flip":
            buffer[position] ^= data.draw(st.integers(1, 255))
        elif kind == "cut":
            del buffer[position:]
        else:
            buffer[position:position] = data.draw(st.binary(max_size=16))
    return bytes(buffer)


@st.composite
def fuzz_streams(draw: st.DrawFn) -> bytes:
    data = draw(st.data())
    parts = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["garbage", "frame", "mutated"]))
        correlation_id = draw(st.integers(0, 2**32 - 1))
        if kind == "garbage":
            parts.append(draw(st.binary(max_size=200)))
        elif kind == "frame":
            format = draw(st.sampled_from([0, 1, 2, 2, 2, draw(st.integers(0, 255))]))
            parts.append(encode_frame(format, correlation_id, draw(st.binary(max_size=200))))
        else:
            payload = _mutate(draw(st.sampled_from(_VALID_REQUESTS)), data)
            parts.append(encode_frame(FORMAT_MSGPACK, correlation_id, payload))
    return b"".join(parts)


def _log_snapshot(client) -> list:
    request = Fetch(max_wait_ms=0, topics=(FetchTopic("fuzzed", (FetchPartition(0, 0, 1 << 20),)),))
    answer = client.call(request).topics[0].partitions[0]
    assert answer.error_code == ErrorCode.NONE
    return [answer.high_watermark, answer.log_start_offset, answer.records]


def _check_everything_else_is_intact(client) -> None:
    for topic in client.call(Metadata()).topics:
        if topic.name == "fuzzed":
            continue
        for partition in topic.partitions:
            request = Fetch(max_wait_ms=0, topics=(FetchTopic(topic.name, (FetchPartition(partition.partition, 0, 1 << 20),)),))
            records = client.call(request).topics[0].partitions[0].records
            for position, header in iter_batches(records):
                validate(records, position, header.size)
            assert all((r.key, r.value) == (b"key", b"x") for r in decode_records(records))


@pytest.fixture
def fuzz_target(broker_process, connect_blocking):
    process = broker_process()
    client = connect_blocking(process.port)
    assert client.call(CreateTopic("fuzzed", 1)).error_code == ErrorCode.NONE
    request = Produce(acks=-1, topics=(ProduceTopic("fuzzed", (ProducePartition(0, _batch(b"known")),)),))
    assert client.call(request).topics[0].partitions[0].error_code == ErrorCode.NONE
    return process, client, _log_snapshot(client)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=fuzz_streams())
def test_random_bytes_never_crash_the_broker_or_change_the_log(fuzz_target, stream):
    process, client, before = fuzz_target
    sock = socket.create_connection(("127.0.0.1", process.port), timeout=20)
    try:
        sock.sendall(stream)
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):  # until the broker has answered everything and closed
            pass
    except ConnectionResetError:
        pass  # the broker may cut a connection whose framing it lost
    finally:
        sock.close()
    assert process.popen.poll() is None, "the broker died"
    assert isinstance(client.call(Ping()), Pong)
    assert _log_snapshot(client) == before
    _check_everything_else_is_intact(client)
