"""The produce lane over real sockets (``rivven_broker/server/produce_lane.py``).

What must hold whatever the lane does: every request is answered, in request order, with
offsets in request order; a connection moves between the lane and its own task as its
requests change (another api, a partial frame, the in-flight limit) and loses nothing on the
way; a client that does not read its answers gets them all when it does. Each test also
checks, from the lane's counters, that the lane really served what it claims to (so a broker
that silently stopped using it fails here).
"""

from __future__ import annotations

import os
import socket
import threading
import traceback

import pytest
import trio

from rivven_broker.protocol import codec
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.messages import (
    CreateTopic,
    Fetch,
    FetchPartition,
    FetchResponse,
    FetchTopic,
    ListOffsets,
    ListOffsetsPartition,
    ListOffsetsTopic,
    ListOffsetsResponse,
    Ping,
    Pong,
    Produce,
    ProducePartition,
    ProduceResponse,
    ProduceTopic,
)
from rivven_broker.protocol.connection import ClientConnection
from rivven_broker.records import BatchBuilder, decode_records
from rivven_broker.server import env as env_module
from rivven_broker.server import sync_thread
from rivven_broker.storage.file_store import OsFileStore
from rivven_broker.storage.staged_appends import AppendPass

from tests.integration.conftest import RawClient


def batch(value: bytes) -> bytes:
    builder = BatchBuilder(batch_bytes_max=1 << 20)
    assert builder.append(1_000, None, value)
    return builder.build()


def produce(value: bytes, acks: int = -1, topic: str = "t") -> Produce:
    return Produce(acks=acks, timeout_ms=10_000,
                   topics=(ProduceTopic(topic, (ProducePartition(0, batch(value)),)),))


def fetch(offset: int, max_wait_ms: int = 0) -> Fetch:
    return Fetch(max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20,
                 topics=(FetchTopic("t", (FetchPartition(0, offset, 1 << 20),)),))


def base_offset(response: ProduceResponse) -> int:
    (topic,) = response.topics
    (partition,) = topic.partitions
    assert partition.error_code == 0, partition
    return partition.base_offset


def lane_counts(broker) -> tuple[int, int]:
    stats = broker.broker.lane.statistics()
    return stats.requests, stats.handbacks


async def everything_in(client: RawClient, first: int = 0) -> list[bytes]:
    response = await client.call(fetch(first))
    (topic,) = response.topics
    (partition,) = topic.partitions
    return [record.value for record in decode_records(partition.records)]


async def test_one_record_producers_are_served_by_the_lane(broker, connect):
    setup = await connect(broker.port)
    await setup.call(CreateTopic("t", 1))
    clients = [await connect(broker.port) for _ in range(4)]
    offsets: list[int] = []

    async def one_at_a_time(client: RawClient, name: bytes) -> None:
        for index in range(50):
            offsets.append(base_offset(await client.call(produce(b"%s-%d" % (name, index)))))

    async with trio.open_nursery() as nursery:
        for number, client in enumerate(clients):
            nursery.start_soon(one_at_a_time, client, b"c%d" % number)
    assert sorted(offsets) == list(range(200))
    values = await everything_in(setup)
    assert len(values) == 200
    for number in range(4):  # each producer's records in its order
        mine = [v for v in values if v.startswith(b"c%d-" % number)]
        assert mine == [b"c%d-%d" % (number, i) for i in range(50)]
    requests, _ = lane_counts(broker)
    assert requests >= 190  # all but each connection's first (read before the lane had it)
    metrics = broker.broker.metrics  # staged appends count their records once written
    assert metrics.records_in_total == 200 and metrics.topic_records_in["t"] == 200


async def test_the_lane_counts_every_byte_read_and_written(broker, connect):
    """The lane counts socket bytes once per poll and once per answering round, not per
    connection: the totals still equal what the clients sent and received."""
    setup = await connect(broker.port)
    await setup.call(CreateTopic("t", 1))
    clients = [await connect(broker.port) for _ in range(4)]
    metrics = broker.broker.metrics
    in_before, out_before = metrics.bytes_in_total, metrics.bytes_out_total
    sent = received = 0

    async def one_at_a_time(client: RawClient, name: bytes) -> None:
        nonlocal sent, received
        for index in range(30):
            correlation_id, data = client.core.send_request(produce(b"%s-%d" % (name, index)))
            await client.stream.send_all(data)
            sent += len(data)
            while True:
                event = client.core.next_event()
                if event is not None:
                    break
                data = await client.stream.receive_some(1 << 20)
                assert data
                received += len(data)
                client.core.receive_data(data)
            assert event.correlation_id == correlation_id
            base_offset(event.response)

    async with trio.open_nursery() as nursery:
        for number, client in enumerate(clients):
            nursery.start_soon(one_at_a_time, client, b"c%d" % number)
    requests, _ = lane_counts(broker)
    assert requests >= 110  # (the lane served them)
    assert metrics.bytes_in_total - in_before == sent
    assert metrics.bytes_out_total - out_before == received


async def test_produce_and_other_apis_pipelined_on_one_connection_are_answered_in_order(
        broker, connect):
    client = await connect(broker.port)
    await client.call(CreateTopic("t", 1))
    await client.call(produce(b"first"))  # now idle: its reader rests in the lane
    before, handbacks_before = lane_counts(broker)
    plan = ["p", "p", "fetch", "p", "ping", "p", "p", "offsets", "p", "p0", "p"]
    data = bytearray()
    expected: list[tuple[int, str]] = []
    for step, kind in enumerate(plan):
        if kind == "fetch":
            request = fetch(0, max_wait_ms=100)
        elif kind == "ping":
            request = Ping()
        elif kind == "offsets":
            request = ListOffsets(topics=(ListOffsetsTopic("t", (ListOffsetsPartition(0, -1),)),))
        elif kind == "p0":
            request = produce(b"step-%d" % step, acks=0)
        else:
            request = produce(b"step-%d" % step)
        correlation_id, frame = client.core.send_request(request)
        data += frame
        if kind != "p0":
            expected.append((correlation_id, kind))
    await client.send_raw(bytes(data))  # one write: the lane reads them in one receive
    offsets = []
    for correlation_id, kind in expected:
        event = await client.receive()
        assert event.correlation_id == correlation_id
        if kind == "p":
            offsets.append(base_offset(event.response))
        elif kind == "fetch":
            assert isinstance(event.response, FetchResponse)
        elif kind == "ping":
            assert isinstance(event.response, Pong)
        else:
            assert isinstance(event.response, ListOffsetsResponse)
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    values = await everything_in(client)
    assert values == [b"first"] + [b"step-%d" % i for i, kind in enumerate(plan)
                                   if kind in ("p", "p0")]
    requests, handbacks = lane_counts(broker)
    assert requests > before  # the lane took the leading produces ...
    assert handbacks > handbacks_before  # ... and gave the connection back at the fetch


async def test_a_partial_frame_moves_the_connection_to_its_task_and_back(broker, connect):
    client = await connect(broker.port)
    await client.call(CreateTopic("t", 1))
    await client.call(produce(b"warm"))
    for round_ in range(3):
        before, handbacks_before = lane_counts(broker)
        correlation_id, frame = client.core.send_request(produce(b"split-%d" % round_))
        await client.send_raw(frame[:7])  # half a frame: the reader's request clock owns it
        await trio.sleep(0.05)
        await client.send_raw(frame[7:])
        event = await client.receive()
        assert event.correlation_id == correlation_id
        base_offset(event.response)
        assert lane_counts(broker)[1] > handbacks_before
        # Whole frames again: back in the lane.
        for index in range(3):
            await client.call(produce(b"whole-%d-%d" % (round_, index)))
        assert lane_counts(broker)[0] >= before + 2
    values = await everything_in(client)
    assert values[0] == b"warm" and len(values) == 1 + 3 * 4


async def test_a_client_that_does_not_read_gets_every_answer_when_it_does(
        start_broker, connect):
    running = await start_broker()
    setup = await connect(running.port)
    await setup.call(CreateTopic("t", 1))
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    await sock.connect(("127.0.0.1", running.port))
    client = RawClient(trio.SocketStream(sock))
    client.core = ClientConnection(in_flight_max=1 << 30)  # more than the broker allows
    await client.call(produce(b"warm"))
    count = 3_000
    correlation_ids = []

    async def send_all() -> None:
        for index in range(count):
            correlation_ids.append(await client.send(produce(b"%d" % index)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_all)
        await trio.sleep(0.5)  # not reading: answers back up into the broker
        offsets = []
        for position in range(count):
            event = await client.receive()
            while len(correlation_ids) <= position:
                await trio.sleep(0)
            assert event.correlation_id == correlation_ids[position]
            offsets.append(base_offset(event.response))
    assert offsets == list(range(1, count + 1))


class _TrickleReadiness(env_module.RealReadiness):
    """The real epoll set, with a socket that takes at most a few bytes per send."""

    def send_now(self, stream, data: bytes) -> int:
        return super().send_now(stream, data[:5])


async def test_an_answer_the_socket_takes_in_part_is_finished_by_the_writer(
        start_broker, connect, monkeypatch):
    monkeypatch.setattr(env_module.RealNet, "readiness", lambda self: _TrickleReadiness())
    running = await start_broker()
    client = await connect(running.port)
    await client.call(CreateTopic("t", 1))
    await client.call(produce(b"warm"))
    for index in range(20):
        assert base_offset(await client.call(produce(b"%d" % index))) == index + 1
    pipelined = [await client.send(produce(b"p%d" % index)) for index in range(20)]
    for position, correlation_id in enumerate(pipelined):
        event = await client.receive()
        assert event.correlation_id == correlation_id
        assert base_offset(event.response) == 21 + position
    assert running.broker.lane.statistics().requests >= 20


@pytest.mark.parametrize("lane", [True, False])
async def test_the_lane_can_be_switched_off(start_broker, connect, lane):
    running = await start_broker(produce_lane=lane)
    assert (running.broker.lane is not None) is lane
    client = await connect(running.port)
    await client.call(CreateTopic("t", 1))
    for index in range(10):
        assert base_offset(await client.call(produce(b"%d" % index))) == index
    assert await everything_in(client) == [b"%d" % i for i in range(10)]


async def test_a_produce_not_durable_by_its_deadline_is_answered_timed_out(
        start_broker, connect, monkeypatch):
    original = env_module.RealEnv.run_fsync

    async def slow_fsync(self, fn, *args):
        await trio.sleep(0.3)  # a disk far slower than the request's timeout
        return await original(self, fn, *args)

    monkeypatch.setattr(env_module.RealEnv, "run_fsync", slow_fsync)
    running = await start_broker()
    client = await connect(running.port)
    await client.call(CreateTopic("t", 1))
    await client.call(produce(b"warm"))
    hurried = Produce(acks=-1, timeout_ms=20,
                      topics=(ProduceTopic("t", (ProducePartition(0, batch(b"late")),)),))
    requests_before = running.broker.lane.statistics().requests
    response = await client.call(hurried)
    (topic,) = response.topics
    (partition,) = topic.partitions
    assert partition.error_code == ErrorCode.REQUEST_TIMED_OUT
    assert running.broker.lane.statistics().requests == requests_before + 1  # the lane took it
    assert base_offset(await client.call(produce(b"next"))) == 2  # the late one stays appended


async def test_a_connection_that_only_fetches_stays_out_of_the_lane(broker, connect):
    producer = await connect(broker.port)
    await producer.call(CreateTopic("t", 1))
    for index in range(5):
        await producer.call(produce(b"%d" % index))
    consumer = await connect(broker.port)
    requests, handbacks = lane_counts(broker)
    for offset in range(5):
        response = await consumer.call(fetch(offset))
        assert isinstance(response, FetchResponse)
    assert lane_counts(broker) == (requests, handbacks)  # never handed back: never adopted
    # The producer's connection rests in the lane; a fetch on it is handed back, and after
    # it the connection reads in its own task until it produces again.
    await producer.call(fetch(0))
    assert lane_counts(broker)[1] == handbacks + 1
    await producer.call(fetch(0))
    assert lane_counts(broker)[1] == handbacks + 1
    await producer.call(produce(b"again"))  # read by its task; then it rests in the lane
    await producer.call(produce(b"and again"))
    assert lane_counts(broker)[0] == requests + 1


def idempotent(sequence: int, value: bytes, timeout_ms: int = 10_000) -> Produce:
    builder = BatchBuilder(batch_bytes_max=1 << 20, producer_id=7, producer_epoch=0,
                           base_sequence=sequence)
    assert builder.append(1_000, None, value)
    return Produce(acks=-1, timeout_ms=timeout_ms,
                   topics=(ProduceTopic("t", (ProducePartition(0, builder.build()),)),))


async def test_retries_in_the_lane_are_answered_as_duplicates_without_waiting(broker, connect):
    """A retry of a batch already durable needs no commit: the lane must answer it without
    waiting for progress (a wait that only progress settles would hold it to its timeout,
    here far beyond the test's guard). Retries pipelined with their original in one pass
    share its offsets (staged appends: a duplicate within the pass)."""
    setup = await connect(broker.port)
    await setup.call(CreateTopic("t", 1))
    client = await connect(broker.port)
    first = (await client.call(idempotent(0, b"a"))).topics[0].partitions[0]
    assert first.error_code == 0 and not first.duplicate
    with trio.fail_after(20):  # a hang guard: the retry's own timeout is ten minutes
        again = (await client.call(idempotent(0, b"a", 600_000))).topics[0].partitions[0]
    assert again.duplicate and again.base_offset == first.base_offset
    requests_before, _ = lane_counts(broker)
    data = b""
    for request in (idempotent(1, b"b"), idempotent(1, b"b"), idempotent(2, b"c")) * 2:
        data += client.core.send_request(request)[1]
    await client.send_raw(data)  # one write: the lane takes them in one pass, or a few
    with trio.fail_after(20):
        answers = [(await client.receive()).response.topics[0].partitions[0]
                   for _ in range(6)]
    offsets = [(answer.error_code, answer.base_offset, answer.duplicate) for answer in answers]
    b, c = offsets[0][1], offsets[2][1]
    assert offsets == [(0, b, False), (0, b, True), (0, c, False),
                       (0, b, True), (0, b, True), (0, c, True)]
    assert c == b + 1 == first.base_offset + 2
    assert await everything_in(setup) == [b"a", b"b", b"c"]
    assert lane_counts(broker)[0] > requests_before


class _RecordingReadiness(env_module.RealReadiness):
    """The real epoll set, logging each read and answer by the client's port, with a hook
    run after each read (``on_receive``)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, int]] = []
        self.on_receive = lambda port: None

    def receive_now(self, stream, max_bytes: int):
        data = super().receive_now(stream, max_bytes)
        if data:
            port = stream.socket.getpeername()[1]
            self.log.append(("receive", port))
            self.on_receive(port)
        return data

    def send_now(self, stream, data: bytes) -> int:
        self.log.append(("send", stream.socket.getpeername()[1]))
        return super().send_now(stream, data)


def _port(client: RawClient) -> int:
    return client.stream.socket.getsockname()[1]


def _send_now(client: RawClient, request: Produce) -> None:
    """Put ``request`` on ``client``'s socket at once, from synchronous code."""
    _, data = client.core.send_request(request)
    assert os.write(client.stream.socket.fileno(), data) == len(data)


async def _two_clients_in_the_lane(start_broker, connect, monkeypatch, readiness):
    monkeypatch.setattr(env_module.RealNet, "readiness", lambda self: readiness)
    running = await start_broker()
    setup = await connect(running.port)
    await setup.call(CreateTopic("t", 1))
    first, second = await connect(running.port), await connect(running.port)
    for client in (first, second):  # the first request is the reader's; then it rests here
        await client.call(produce(b"warm"))
        await client.call(produce(b"warm"))
    return first, second


async def test_a_request_arriving_while_the_lane_reads_joins_the_pass(
        start_broker, connect, monkeypatch):
    readiness = _RecordingReadiness()
    closes: list[int] = []  # the log's length at each close of a pass's staging
    real_close = AppendPass.close
    monkeypatch.setattr(AppendPass, "close",
                        lambda self: (closes.append(len(readiness.log)), real_close(self))[1])
    first, second = await _two_clients_in_the_lane(
        start_broker, connect, monkeypatch, readiness)

    def second_sends(port: int) -> None:  # while the lane reads the first client's request
        if port == _port(first):
            readiness.on_receive = lambda port: None
            _send_now(second, produce(b"two"))

    readiness.on_receive = second_sends
    start, closed_before = len(readiness.log), len(closes)
    with trio.fail_after(10):
        await first.send(produce(b"one"))
        one = base_offset((await first.receive()).response)
        two = base_offset((await second.receive()).response)
    assert (one, two) == (4, 5)
    reads = [i for i, (kind, _) in enumerate(readiness.log) if kind == "receive" and i >= start]
    assert [readiness.log[i][1] for i in reads[:2]] == [_port(first), _port(second)]
    # Both read before the pass wrote what it staged: one pwritev, one group commit.
    assert not [c for c in closes[closed_before:] if reads[0] < c <= reads[1]]


async def test_after_a_commit_the_lane_answers_before_it_reads(
        start_broker, connect, monkeypatch):
    # Inline fsyncs (as on a fast disk): the commit and the progress pass follow each other.
    monkeypatch.setattr(sync_thread.InlineWhileFast, "_note", lambda self, seconds: None)
    armed: list[RawClient] = []
    real_fsync = OsFileStore.fsync

    def fsync_then_second_sends(self, *args, **kwargs):
        result = real_fsync(self, *args, **kwargs)
        if armed:  # the second client's request is waiting when the commit's pass begins
            _send_now(armed.pop(), produce(b"two"))
        return result

    monkeypatch.setattr(OsFileStore, "fsync", fsync_then_second_sends)
    readiness = _RecordingReadiness()
    first, second = await _two_clients_in_the_lane(
        start_broker, connect, monkeypatch, readiness)
    start = len(readiness.log)
    armed.append(second)
    with trio.fail_after(10):
        await first.send(produce(b"one"))
        assert base_offset((await first.receive()).response) == 4
        assert base_offset((await second.receive()).response) == 5
    log = readiness.log[start:]
    assert log.index(("send", _port(first))) < log.index(("receive", _port(second)))


@pytest.mark.parametrize("disk", ["fast", "slow"])
async def test_the_lane_commits_its_groups_itself_only_while_fsyncs_run_on_the_loop(
        start_broker, connect, monkeypatch, disk):
    # Fast: every fsync counts as fast and runs on the loop; slow: every one moves them to
    # the sync thread (``InlineWhileFast``), where the worker must commit again.
    moves = "slow" == disk

    def note(self, seconds: float) -> None:
        if moves:
            self.inline = False
    monkeypatch.setattr(sync_thread.InlineWhileFast, "_note", note)
    committers: list[tuple[bool, bool]] = []  # (on the loop's thread, in write_then_commit)
    real_fsync = OsFileStore.fsync

    def recording_fsync(self, *args, **kwargs):
        frames = {frame.name for frame in traceback.extract_stack()}
        committers.append((threading.current_thread() is threading.main_thread(),
                           "write_then_commit" in frames))
        return real_fsync(self, *args, **kwargs)

    monkeypatch.setattr(OsFileStore, "fsync", recording_fsync)
    running = await start_broker()
    setup = await connect(running.port)
    await setup.call(CreateTopic("t", 1))
    clients = [await connect(running.port) for _ in range(3)]
    with trio.fail_after(20):
        for client in clients:  # the first request is the reader's; then it rests in the lane
            await client.call(produce(b"warm"))
        requests_before, _ = lane_counts(running)
        committers.clear()
        offsets: list[int] = []

        async def produce_ten(client: RawClient) -> None:
            for index in range(10):
                offsets.append(base_offset(await client.call(produce(b"%d" % index))))

        async with trio.open_nursery() as nursery:
            for client in clients:
                nursery.start_soon(produce_ten, client)
    assert sorted(offsets) == list(range(3, 33))  # every one answered, each offset once
    assert lane_counts(running)[0] - requests_before == 30  # all served by the lane
    if disk == "fast":  # the lane's own task ran every group, on the loop
        assert committers and all(on_loop and in_lane for on_loop, in_lane in committers)
    else:  # the worker ran them, on the sync thread
        assert committers and not any(on_loop or in_lane for on_loop, in_lane in committers)


async def test_a_clients_repeated_produce_is_taken_by_its_shape(broker, connect, monkeypatch):
    """After the first, a client's produces of one shape (``protocol/produce_shape.py``) are
    not decoded again; produces of another topic or partition in between are, and every
    answer still comes in order with the right offsets."""
    client = await connect(broker.port)
    await client.call(CreateTopic("t", 1))
    await client.call(CreateTopic("u", 1))
    decodes = []
    decode = codec.decode_request_and_version

    def counting(payload: bytes) -> object:
        decodes.append(payload)
        return decode(payload)

    monkeypatch.setattr(codec, "decode_request_and_version", counting)
    for index in range(40):
        assert base_offset(await client.call(produce(b"one-%d" % index))) == index
    assert len(decodes) <= 3  # the first (and the shape's proof); none of the others
    data = bytearray()
    expected = []
    for index in range(40):  # pipelined, topics alternating in runs
        topic = "t" if (index // 5) % 2 == 0 else "u"
        correlation_id, frame = client.core.send_request(produce(b"two-%d" % index, topic=topic))
        data += frame
        expected.append((correlation_id, topic))
    await client.send_raw(bytes(data))
    offsets = {"t": 40, "u": 0}
    for correlation_id, topic in expected:
        event = await client.receive()
        assert event.correlation_id == correlation_id
        assert base_offset(event.response) == offsets[topic]
        offsets[topic] += 1
    assert offsets == {"t": 60, "u": 20}
    values = await everything_in(client, 40)
    assert values == [b"two-%d" % i for i in range(40) if (i // 5) % 2 == 0]
