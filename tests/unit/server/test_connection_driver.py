"""The connection driver over in-memory streams: order, coalescing, backpressure, timeouts.

Method: ``serve_client_connection`` runs against one end of ``trio.testing``'s memory stream
pair with a scripted stand-in for ``Handlers`` (answers now, later when the test says, or
raises); the test drives the other end with the protocol's ``ClientConnection``. Time is
trio's ``MockClock`` with autojump, so idle timeouts pass in virtual time and nothing sleeps.
"""

from __future__ import annotations

import os
import struct

import pytest
import trio
import trio.testing

from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import RemoteProtocolError

from rivven_broker.protocol.connection import ClientConnection
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.messages import (
    DescribeTopic,
    DescribeTopicResponse,
    ErrorResponse,
    Fetch,
    FetchPartitionResponse,
    FetchResponse,
    FetchTopicResponse,
    Ping,
    Pong,
    Produce,
    ProduceResponse,
)
from rivven_broker.file_region import FileRegion
from rivven_broker.server.connection import (
    ClientConnections,
    ConnectionSettings,
    serve_client_connection,
)
from rivven_broker.server.context import Pending
from rivven_broker.server.env import RealClock
from rivven_broker.server.metrics import BrokerMetrics


class ScriptedHandlers:
    """``DescribeTopic(name)``: "now-X" answers at once, "later-X" when ``release(X)``,
    "boom" raises; Ping answers Pong; Produce (acks=0) answers nothing."""

    def __init__(self) -> None:
        self.begun: list[str] = []
        self.events: dict[str, trio.Event] = {}

    def gate(self, request):
        return None

    def release(self, key: str) -> None:
        self.events.setdefault(key, trio.Event()).set()

    def begin(self, request, call):
        if isinstance(request, Ping):
            self.begun.append("ping")
            return Pong()
        if isinstance(request, Produce):
            self.begun.append("produce")
            return None
        name = request.name
        self.begun.append(name)
        if name == "boom":
            raise RuntimeError("a handler bug")
        if name.startswith("later-"):
            event = self.events.setdefault(name[6:], trio.Event())

            async def wait() -> DescribeTopicResponse:
                await event.wait()
                return DescribeTopicResponse(name)

            return Pending(wait)
        return DescribeTopicResponse(name)


class CountingStream(trio.abc.Stream):
    """Wraps a stream and counts ``send_all`` calls."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.sends = 0

    async def send_all(self, data) -> None:
        self.sends += 1
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes=None) -> bytes:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


class Peer:
    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.core = ClientConnection()

    async def send(self, request) -> int:
        correlation_id, data = self.core.send_request(request)
        await self.stream.send_all(data)
        return correlation_id

    async def receive(self):
        while True:
            event = self.core.next_event()
            if event is not None:
                return event
            data = await self.stream.receive_some()
            if not data:
                raise EOFError
            self.core.receive_data(data)


async def start(nursery, handlers, *, idle_timeout_ms=60_000, in_flight=64,
                request_timeout_ms=30_000):
    client_end, server_end = trio.testing.memory_stream_pair()
    counting = CountingStream(server_end)
    settings = ConnectionSettings(idle_timeout_ms, in_flight, request_timeout_ms)
    done = trio.Event()

    async def run() -> None:
        await serve_client_connection(
            counting, handlers, settings=settings, clock=RealClock(), metrics=BrokerMetrics(1),
            registry=ClientConnections(),
        )
        done.set()

    nursery.start_soon(run)
    return Peer(client_end), counting, done


async def test_answers_come_in_request_order_and_ready_runs_leave_together(nursery):
    handlers = ScriptedHandlers()
    peer, counting, _ = await start(nursery, handlers)
    ids = [await peer.send(DescribeTopic(name)) for name in ("later-a", "now-1", "now-2", "now-3")]
    await trio.testing.wait_all_tasks_blocked()
    assert handlers.begun == ["later-a", "now-1", "now-2", "now-3"]  # all begun, in order
    assert counting.sends == 0  # the head is not ready: nothing may go out yet
    handlers.release("a")
    answers = [await peer.receive() for _ in ids]
    assert [a.correlation_id for a in answers] == ids
    assert [a.response.name for a in answers] == ["later-a", "now-1", "now-2", "now-3"]
    assert counting.sends == 1  # four answers, one send_all


async def test_reading_stops_at_the_in_flight_bound(nursery):
    handlers = ScriptedHandlers()
    peer, _, _ = await start(nursery, handlers, in_flight=2)
    ids = [await peer.send(DescribeTopic(f"later-{i}")) for i in range(5)]
    await trio.testing.wait_all_tasks_blocked()
    assert len(handlers.begun) == 2  # backpressure: the rest waits in the socket
    for i in range(5):
        handlers.release(str(i))
    answers = [await peer.receive() for _ in ids]
    assert [a.correlation_id for a in answers] == ids
    assert len(handlers.begun) == 5


async def test_acks_zero_gets_no_answer(nursery):
    handlers = ScriptedHandlers()
    peer, _, _ = await start(nursery, handlers)
    await peer.send(Produce(acks=0))
    ping_id = await peer.send(Ping())
    answer = await peer.receive()
    assert answer.correlation_id == ping_id and isinstance(answer.response, Pong)
    assert handlers.begun == ["produce", "ping"]


async def test_a_handler_bug_is_answered_and_the_connection_goes_on(nursery, caplog):
    handlers = ScriptedHandlers()
    peer, _, _ = await start(nursery, handlers)
    await peer.send(DescribeTopic("boom"))
    answer = await peer.receive()
    assert isinstance(answer.response, ErrorResponse)
    assert answer.response.error_code == ErrorCode.UNKNOWN_SERVER_ERROR
    await peer.send(Ping())
    assert isinstance((await peer.receive()).response, Pong)
    assert "handler failed" in caplog.text


@pytest.mark.parametrize("sent", [b"", b"\x00\x00\x00\x20\x02"])  # nothing; half a frame
async def test_an_idle_client_is_closed_after_the_timeout(nursery, autojump_clock, sent):
    handlers = ScriptedHandlers()
    peer, _, done = await start(nursery, handlers, idle_timeout_ms=200)
    before = trio.current_time()
    if sent:
        await peer.stream.send_all(sent)
    await done.wait()
    assert trio.current_time() - before >= 0.2
    with pytest.raises(EOFError):
        await peer.receive()


async def test_a_client_waiting_for_an_answer_is_not_idle(nursery, autojump_clock):
    handlers = ScriptedHandlers()
    peer, _, done = await start(nursery, handlers, idle_timeout_ms=200)
    correlation_id = await peer.send(DescribeTopic("later-x"))
    await trio.sleep(5)  # virtual: far past the idle timeout, with a request open
    assert not done.is_set()
    handlers.release("x")
    assert (await peer.receive()).correlation_id == correlation_id
    await done.wait()  # then, idle again, it is closed after the timeout


async def test_a_trickled_frame_is_closed_at_the_request_timeout_from_its_first_byte(
    nursery, autojump_clock
):
    """One byte every 100 ms (virtual) keeps the idle clock fresh; the request timeout of
    1 s counts from the frame's first byte, so the connection closes after ten bytes."""
    handlers = ScriptedHandlers()
    peer, _, done = await start(nursery, handlers, idle_timeout_ms=500, request_timeout_ms=1_000)
    await peer.send(Ping())  # a whole frame first: answered, and its clock ends
    await peer.receive()
    await trio.sleep(0.4)
    first_byte_at = trio.current_time()
    for byte in b"\x00\x00\x01\x00" + b"\x02" * 100:
        if done.is_set():
            break
        await peer.stream.send_all(bytes([byte]))
        await trio.sleep(0.1)
    assert done.is_set()
    assert 1.0 <= trio.current_time() - first_byte_at <= 1.2
    assert not handlers.begun or handlers.begun == ["ping"]


async def test_a_fatal_frame_closes_at_once_even_with_requests_open(nursery, autojump_clock):
    handlers = ScriptedHandlers()
    peer, _, done = await start(nursery, handlers)
    await peer.send(DescribeTopic("later-never"))
    await peer.send(DescribeTopic("now-1"))
    await peer.stream.send_all(struct.pack(">IBI", limits.frame_bytes_max + 1, 2, 9))
    with pytest.raises(RemoteProtocolError) as info:
        await peer.receive()  # the connection-level error, in correlation id 0
    assert info.value.code == ErrorCode.MESSAGE_TOO_LARGE
    with trio.fail_after(10):  # virtual seconds: far more than an immediate close needs
        await done.wait()  # closed without waiting for "later-never"
    assert trio.current_time() == 0  # no virtual time passed: nobody waited for a timeout


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


class DurableProduceHandlers:
    """Produce (acks=1) waits for a shared "durable" flag, like a group commit: ``wait`` parks
    until it is set, ``ready`` answers at once once it is."""

    def __init__(self) -> None:
        self.durable = False
        self.committed = trio.Event()
        self.waits = self.readies = 0

    def gate(self, request):
        return None

    def commit(self) -> None:
        self.durable = True
        self.committed.set()

    def begin(self, request, call):
        async def wait() -> ProduceResponse:
            self.waits += 1
            await self.committed.wait()
            return ProduceResponse([])

        def ready() -> ProduceResponse | None:
            self.readies += 1
            return ProduceResponse([]) if self.durable else None

        return Pending(wait, ready=ready)


async def test_produces_made_durable_by_one_commit_are_answered_in_one_write(nursery):
    handlers = DurableProduceHandlers()
    peer, counting, _ = await start(nursery, handlers)
    ids = [await peer.send(Produce(acks=1)) for _ in range(6)]
    await trio.testing.wait_all_tasks_blocked()
    assert counting.sends == 0 and handlers.waits == 1  # only the head waits
    handlers.commit()
    answers = [await peer.receive() for _ in ids]
    assert [a.correlation_id for a in answers] == ids
    assert handlers.waits == 1  # the other five were answered by ready(), without waiting
    assert counting.sends == 1  # and all six left together


class RegionHandlers(ScriptedHandlers):
    """``Fetch`` answers with ``region`` as the records of its one partition."""

    def __init__(self, region: FileRegion) -> None:
        super().__init__()
        self.region = region

    def begin(self, request, call):
        if not isinstance(request, Fetch):
            return super().begin(request, call)
        self.begun.append("fetch")
        part = FetchPartitionResponse(0, ErrorCode.NONE, 9, 9, 0, self.region)
        return FetchResponse(ErrorCode.NONE, (FetchTopicResponse("t", (part,)),))


class SendFileStream(CountingStream):
    """A stream that can send a ``FileRegion`` (as ``EagerStream`` can), counting regions."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        super().__init__(inner)
        self.regions = 0

    async def send_file(self, region: FileRegion) -> None:
        self.regions += 1
        await self.inner.send_all(region.read())


@pytest.mark.parametrize("can_send_files", [False, True])
async def test_a_file_region_answer_goes_out_in_its_place_and_is_closed(
    nursery, tmp_path, can_send_files
):
    data = bytes(range(256)) * 1024
    path = tmp_path / "segment"
    path.write_bytes(b"head" + data + b"tail")
    handle = os.open(path, os.O_RDONLY)
    region = FileRegion.of(handle, 4, len(data))
    os.close(handle)
    handlers = RegionHandlers(region)
    client_end, server_end = trio.testing.memory_stream_pair()
    stream = SendFileStream(server_end) if can_send_files else CountingStream(server_end)

    async def run() -> None:
        await serve_client_connection(
            stream, handlers, settings=ConnectionSettings(60_000, 64), clock=RealClock(),
            metrics=BrokerMetrics(1), registry=ClientConnections())

    nursery.start_soon(run)
    peer = Peer(client_end)
    ids = [await peer.send(DescribeTopic("later-a")),
           await peer.send(Fetch(max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, topics=())),
           await peer.send(DescribeTopic("now-1"))]
    await trio.testing.wait_all_tasks_blocked()
    handlers.release("a")  # all three leave in one write: bytes, the region, bytes
    answers = [await peer.receive() for _ in ids]
    assert [a.correlation_id for a in answers] == ids
    assert answers[0].response.name == "later-a" and answers[2].response.name == "now-1"
    assert answers[1].response.topics[0].partitions[0].records == data
    assert region.closed
    assert getattr(stream, "regions", 1) == 1
