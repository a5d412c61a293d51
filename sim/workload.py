"""Workload processes: producers and consumers that record what they saw, and the final read.

Theory of operation
-------------------
Each process is a simulated endpoint (``p1``, ``c1`` ...) with its own ``SimNet`` and seeded
random stream, talking to a node through ``RpcConnection`` and recording a ``History``.

*Producers* run ``in_flight`` sender tasks on one pipelined connection. Each send is one
Produce request with one batch of 1..``records_per_send_max`` records whose values are unique
(``p1-17``), to a random partition: ``invoke`` before, then ``ok`` with the base offset,
``fail`` when the broker's error code guarantees nothing was appended, ``info`` otherwise
(timeout, reset, ``acks=0``, an error after which the data may be in the log). A producer
never resends a value, so any duplicate in a log is the broker's doing. When the connection
fails, every sender stops, and the producer reconnects after a jittered backoff.

*Consumers* are assigned partitions (all of a topic by default) and fetch from their
positions, starting at 0. A poll that returns records is recorded (``from``, ``to``, the
records, the control offsets): every offset in ``[from, to)`` must be accounted for, which
is what the gap checker verifies. ``to`` comes from the headers of the whole batches
returned, so a broker that skips an offset shows as a missing one. A corrupt batch is recorded
as such. ``OFFSET_OUT_OF_RANGE`` (a log that shrank under the reader) is recorded and the
position moved to the high watermark.

The *final read* (``read_logs``), after the workload has stopped and every node is up, reads
each partition from its log start to its high watermark: the ground truth the checkers
compare the history with.

Values are the unique ids themselves, or with a producer's ``value_bytes`` the id padded to
that size (``padded_value``: ``#`` and the id repeated), so a cluster scenario can move
replica fetch answers of 64 KiB and more (the replica link hands those out as views of its
receive buffer). Every reader takes values back through ``read_value``, which returns the id
only when the filler is exactly what that id's padding is — a corrupted byte anywhere in a
large value makes it a value nobody sent, which the checkers report.

Test switch ``fetch_skip_probability`` makes a consumer drop one record of a poll: a fetch
that skips an offset, for the tests that prove the gap checker bites.
"""

from __future__ import annotations

import random
from typing import Any, Callable

import attrs
import trio

from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.message_base import Response
from rivven_broker.protocol.messages import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    CreateTopic,
    CreateTopicResponse,
    Fetch,
    FetchPartition,
    FetchResponse,
    FetchTopic,
    ListOffsets,
    ListOffsetsPartition,
    ListOffsetsResponse,
    ListOffsetsTopic,
    Metadata,
    MetadataResponse,
    Produce,
    ProducePartition,
    ProduceResponse,
    ProduceTopic,
)
from rivven_broker.records import BatchBuilder, BatchError, decode_records, iter_batches
from rivven_broker.records.header import ATTR_CONTROL
from sim.clock import WALL_EPOCH_MS
from sim.history import FAIL, INFO, OK, History
from sim.log_context import ACTOR
from sim.net import SimNet
from sim.rpc import ConnectionLost, RpcConnection, open_rpc
from sim.scenario import ConsumerSpec, ProducerSpec, TopicSpec
from sim.trace import Trace

__all__ = ["Target", "ProducerProcess", "ConsumerProcess", "create_topics", "read_logs",
           "PartitionLog", "ReadFailed"]

#: Broker answers after which the data is certainly not in the log.
_DEFINITE_FAILURES = frozenset({
    ErrorCode.CORRUPT_MESSAGE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.INVALID_TOPIC_NAME,
    ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE, ErrorCode.INVALID_REQUIRED_ACKS,
    ErrorCode.NOT_LEADER, ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.NOT_ENOUGH_REPLICAS,
    ErrorCode.UNSUPPORTED_VERSION, ErrorCode.INVALID_REQUEST, ErrorCode.THROTTLED,
    ErrorCode.OUT_OF_ORDER_SEQUENCE, ErrorCode.INVALID_PRODUCER_EPOCH,
})
#: Told of every recorded poll: (process, topic, partition, last offset read, entry index).
PollObserver = Callable[[str, str, int, int, int], None]
_BACKOFF_MIN_S = 0.05
_BACKOFF_MAX_S = 1.0
_BATCH_BYTES_MAX = 1 << 16
#: A value's padding starts with this (never in an id: ``p1-17``).
_PAD_MARK = "#"
_FETCH_BYTES_MAX = 1 << 20
_PARTITION_FETCH_BYTES_MAX = 1 << 18


def _now_ms() -> float:
    return trio.current_time() * 1000


def padded_value(value: str, value_bytes: int) -> bytes:
    """``value`` (an ASCII id) padded to ``value_bytes`` with ``#`` and the id repeated;
    itself when it is that long already."""
    data = value.encode()
    fill = value_bytes - len(data) - len(_PAD_MARK)
    if fill < 0:
        return data
    return data + _PAD_MARK.encode() + (data * (fill // len(data) + 1))[:fill]


def read_value(data: bytes | None) -> str | None:
    """The id a stored value carries: ``padded_value`` undone when its filler is intact;
    otherwise the whole value as text (a value nobody sent)."""
    if data is None:
        return None
    head, mark, _ = data.partition(_PAD_MARK.encode())
    if mark and head and padded_value(head.decode("utf-8", "replace"), len(data)) == data:
        return head.decode("utf-8", "replace")
    return data.decode("utf-8", "replace")


@attrs.frozen
class Target:
    """Where a process connects: the node's endpoint name and client port."""

    host: str
    port: int


class _Process:
    """What producers and consumers share: identity, network, randomness, reconnects."""

    def __init__(self, name: str, net: SimNet, target: Target, history: History,
                 rng: random.Random, trace: Trace) -> None:
        self.name = name
        self.net = net
        self.target = target
        self.history = history
        self.rng = rng
        self.trace = trace
        self._backoff_s = _BACKOFF_MIN_S
        self.sessions = 0

    async def run(self) -> None:
        """Connect, run sessions, reconnect after failures. Runs until cancelled."""
        ACTOR.set(self.name)
        while True:
            try:
                async with open_rpc(self.net, self.target.host, self.target.port) as rpc:
                    self.trace.event("client.connected", self.name)
                    self._backoff_s = _BACKOFF_MIN_S
                    self.sessions += 1
                    await self.session(rpc)
            except OSError as exc:
                self.trace.event("client.connect_failed", self.name, type(exc).__name__)
            await trio.sleep(self._backoff_s * self.rng.uniform(0.5, 1.5))
            self._backoff_s = min(self._backoff_s * 2, _BACKOFF_MAX_S)

    async def session(self, rpc: RpcConnection) -> None:
        raise NotImplementedError


class ProducerProcess(_Process):
    """Sends unique values and records each send's outcome."""

    def __init__(self, name: str, spec: ProducerSpec, partitions: int, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.spec = spec
        self.partitions = partitions
        self._sequence = 0

    async def session(self, rpc: RpcConnection) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(self.spec.in_flight):
                nursery.start_soon(self._sender, rpc)

    async def _sender(self, rpc: RpcConnection) -> None:
        interval_s = self.spec.in_flight / self.spec.rate_per_s
        while not rpc.failed:
            await trio.sleep(interval_s * self.rng.uniform(0.5, 1.5))
            try:
                await self._send_one(rpc)
            except ConnectionLost:
                return

    async def _send_one(self, rpc: RpcConnection) -> None:
        spec = self.spec
        partition = self.rng.randrange(self.partitions)
        count = self.rng.randint(1, spec.records_per_send_max)
        values = []
        for _ in range(count):
            self._sequence += 1
            values.append(f"{self.name}-{self._sequence}")
        builder = BatchBuilder(batch_bytes_max=max(_BATCH_BYTES_MAX,
                                                   count * (spec.value_bytes + 64) + 128))
        timestamp_ms = WALL_EPOCH_MS + int(_now_ms())
        for value in values:
            builder.append(timestamp_ms, None, padded_value(value, spec.value_bytes))
        request = Produce(
            acks=spec.acks, timeout_ms=spec.request_timeout_ms,
            topics=(ProduceTopic(spec.topic, (ProducePartition(partition, builder.build()),)),),
        )
        invocation = self.history.invoke(self.name, "send", {
            "topic": spec.topic, "partition": partition, "values": values, "acks": spec.acks,
            "idempotent": spec.idempotent, "session": self.sessions,
        })
        outcome: tuple[str, dict[str, Any]] = (INFO, {"error": "cancelled"})
        try:
            response = await rpc.call(request, spec.request_timeout_ms / 1000 + 1.0)
            outcome = _produce_outcome(response, spec.topic, partition)
        except ConnectionLost as exc:
            outcome = (INFO, {"error": type(exc).__name__})
            raise
        finally:
            self.history.complete(invocation, *outcome)


def _produce_outcome(response: Response | None, topic: str, partition: int) -> tuple[str, dict[str, Any]]:
    if response is None:
        return INFO, {"error": "acks=0"}
    if not isinstance(response, ProduceResponse):
        code = ErrorCode.from_wire(getattr(response, "error_code", -1))
        return (FAIL if code in _DEFINITE_FAILURES else INFO), {"error": code.name}
    for topic_response in response.topics:
        for result in topic_response.partitions:
            if topic_response.name == topic and result.partition == partition:
                if result.error_code == ErrorCode.NONE:
                    return OK, {"offset": result.base_offset}
                code = ErrorCode.from_wire(result.error_code)
                return (FAIL if code in _DEFINITE_FAILURES else INFO), {"error": code.name}
    return INFO, {"error": "partition missing from response"}


class ConsumerProcess(_Process):
    """Fetches assigned partitions in a loop and records every non-empty poll."""

    def __init__(self, name: str, spec: ConsumerSpec, partitions: tuple[int, ...],
                 skip_probability: float = 0.0, *, observer: PollObserver | None = None,
                 **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.spec = spec
        self.positions = {p: 0 for p in partitions}
        self.skip_probability = skip_probability
        self.observer = observer

    async def session(self, rpc: RpcConnection) -> None:
        spec = self.spec
        isolation = READ_COMMITTED if spec.isolation == "read_committed" else READ_UNCOMMITTED
        while True:
            request = Fetch(
                max_wait_ms=spec.max_wait_ms, min_bytes=1, max_bytes=_FETCH_BYTES_MAX,
                isolation_level=isolation,
                topics=(FetchTopic(spec.topic, tuple(
                    FetchPartition(p, position, _PARTITION_FETCH_BYTES_MAX)
                    for p, position in self.positions.items()
                )),),
            )
            invoke_ms = _now_ms()
            try:
                response = await rpc.call(request, (spec.max_wait_ms + spec.request_timeout_ms) / 1000)
            except ConnectionLost:
                return
            if not isinstance(response, FetchResponse) or response.error_code != ErrorCode.NONE:
                code = getattr(response, "error_code", -1)
                self.history.note(self.name, "poll_error", {"error": ErrorCode.from_wire(code).name})
                await trio.sleep(0.1)
                continue
            for topic_response in response.topics:
                for result in topic_response.partitions:
                    if result.partition in self.positions:
                        self._absorb(topic_response.name, result, invoke_ms)

    def _absorb(self, topic: str, result: Any, invoke_ms: float) -> None:
        partition = result.partition
        position = self.positions[partition]
        if result.error_code != ErrorCode.NONE:
            code = ErrorCode.from_wire(result.error_code)
            value = {"topic": topic, "partition": partition, "from": position, "error": code.name,
                     "high_watermark": result.high_watermark}
            self.history.note(self.name, "poll_error", value)
            if code == ErrorCode.OFFSET_OUT_OF_RANGE and result.high_watermark >= 0:
                self.positions[partition] = result.high_watermark
            return
        try:
            records, control, end = parse_fetched(result.records, position)
        except BatchError as exc:
            self.history.note(self.name, "corrupt_batch", {
                "topic": topic, "partition": partition, "from": position, "error": str(exc)})
            return
        if end == position:
            return
        if self.skip_probability and len(records) > 1 and self.rng.random() < self.skip_probability:
            del records[self.rng.randrange(len(records))]  # test-only: a fetch that skips one
        _, done = self.history.record(self.name, "poll", {
            "topic": topic, "partition": partition, "from": position, "to": end,
            "records": records, "control": control, "isolation": self.spec.isolation,
            "high_watermark": result.high_watermark,
        }, invoke_ms=invoke_ms)
        self.positions[partition] = end
        if self.observer is not None:
            self.observer(self.name, topic, partition, end - 1, done.index)


def parse_fetched(data: bytes, position: int) -> tuple[list[list[Any]], list[int], int]:
    """Records ``[[offset, value], ...]`` at or after ``position`` in the whole batches of
    ``data``, the offsets of control records among them, and the next position.

    Raises ``BatchError`` when a whole batch is malformed or fails its CRC.
    """
    control: list[int] = []
    end = position
    for _, header in iter_batches(data):
        last = header.base_offset + header.last_offset_delta
        if last < position:
            continue
        if header.attributes & ATTR_CONTROL:
            control.extend(range(max(header.base_offset, position), last + 1))
        end = max(end, last + 1)
    records = [
        [record.offset, read_value(record.value)]
        for record in decode_records(data, min_offset=position)
    ]
    return records, control, end


async def create_topics(net: SimNet, target: Target, topics: tuple[TopicSpec, ...],
                        history: History, rng: random.Random) -> None:
    """Create every topic, retrying through faults until each exists. Blocks."""
    pending = list(topics)
    while pending:
        try:
            async with open_rpc(net, target.host, target.port) as rpc:
                while pending:
                    spec = pending[0]
                    response = await rpc.call(CreateTopic(spec.name, spec.partitions, 1), 10.0)
                    code = getattr(response, "error_code", -1)
                    if isinstance(response, CreateTopicResponse) and code in (
                        ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS
                    ):
                        history.note("admin", "create_topic", {"topic": spec.name,
                                                               "partitions": spec.partitions})
                        pending.pop(0)
                    else:
                        await trio.sleep(0.2)
        except (OSError, ConnectionLost):
            pass
        if pending:
            await trio.sleep(rng.uniform(0.1, 0.3))


@attrs.define
class PartitionLog:
    """A partition as the final read found it."""

    topic: str
    partition: int
    log_start_offset: int = 0
    high_watermark: int = 0
    records: dict[int, Any] = attrs.field(factory=dict)
    control: set[int] = attrs.field(factory=set)
    #: Reads whose returned offsets did not cover [from, to): (from, to, missing offsets).
    holes: list[tuple[int, int, list[int]]] = attrs.field(factory=list)
    corrupt: list[str] = attrs.field(factory=list)


class ReadFailed(Exception):
    """The final read could not finish in time."""


async def read_logs(net: SimNet, target: Target, topics: tuple[TopicSpec, ...],
                    deadline_s: float) -> dict[tuple[str, int], PartitionLog]:
    """Read every partition from log start to high watermark. Blocks.

    Raises ``ReadFailed`` when the node cannot be read completely before ``deadline_s``.
    """
    logs = {(t.name, p): PartitionLog(t.name, p) for t in topics for p in range(t.partitions)}
    done: set[tuple[str, int]] = set()
    with trio.move_on_at(deadline_s):
        while len(done) < len(logs):
            try:
                async with open_rpc(net, target.host, target.port) as rpc:
                    leaders = await _leaders(rpc, target)
                for leader in sorted(set(leaders.values()), key=lambda t: (t.host, t.port)):
                    async with open_rpc(net, leader.host, leader.port) as rpc:
                        for key, log in logs.items():
                            if key not in done and leaders.get(key) == leader:
                                await _read_partition(rpc, log)
                                done.add(key)
            except (OSError, ConnectionLost, trio.TooSlowError):
                await trio.sleep(0.2)
    if len(done) < len(logs):
        raise ReadFailed(f"read {len(done)} of {len(logs)} partitions before the deadline")
    return logs


async def _leaders(rpc: RpcConnection, target: Target) -> dict[tuple[str, int], Target]:
    """Every partition's leader as ``target`` knows it (a single node: the target itself);
    partitions without a live leader are left out (read on the next round)."""
    response = await rpc.call(Metadata(), 10.0)
    if not isinstance(response, MetadataResponse):
        raise ConnectionLost("no metadata")
    brokers = {b.node_id: Target(b.host, b.port) for b in response.brokers}
    leaders = {}
    for topic in response.topics:
        for part in topic.partitions:
            leader = brokers.get(part.leader)
            if leader is not None:
                leaders[(topic.name, part.partition)] = leader
    return leaders


async def _list_offset(rpc: RpcConnection, log: PartitionLog, timestamp: int) -> int:
    request = ListOffsets(topics=(ListOffsetsTopic(log.topic, (ListOffsetsPartition(log.partition, timestamp),)),))
    for _ in range(50):
        response = await rpc.call(request, 10.0)
        if isinstance(response, ListOffsetsResponse):
            result = response.topics[0].partitions[0]
            if result.error_code == ErrorCode.NONE:
                return result.offset
        await trio.sleep(0.2)
    raise ConnectionLost(f"{log.topic}/{log.partition}: no offsets (the leader moved?)")


async def _read_partition(rpc: RpcConnection, log: PartitionLog) -> None:
    log.log_start_offset = max(await _list_offset(rpc, log, EARLIEST_TIMESTAMP), 0)
    log.high_watermark = max(await _list_offset(rpc, log, LATEST_TIMESTAMP), 0)
    position = log.log_start_offset
    while position < log.high_watermark:
        request = Fetch(max_wait_ms=0, min_bytes=0, max_bytes=_FETCH_BYTES_MAX, topics=(
            FetchTopic(log.topic, (FetchPartition(log.partition, position, _FETCH_BYTES_MAX),)),))
        response = await rpc.call(request, 10.0)
        if not isinstance(response, FetchResponse) or response.error_code != ErrorCode.NONE:
            await trio.sleep(0.2)
            continue
        result = response.topics[0].partitions[0]
        if result.error_code in (ErrorCode.NOT_LEADER, ErrorCode.LEADER_NOT_AVAILABLE):
            raise ConnectionLost(f"{log.topic}/{log.partition}: the leader moved")  # ask again
        if result.error_code != ErrorCode.NONE:
            log.corrupt.append(f"fetch at {position}: {ErrorCode.from_wire(result.error_code).name}")
            return
        try:
            records, control, end = parse_fetched(result.records, position)
        except BatchError as exc:
            log.corrupt.append(f"fetch at {position}: {exc}")
            return
        if end == position:
            log.corrupt.append(f"fetch at {position} below the high watermark returned nothing")
            return
        seen = {offset for offset, _ in records} | set(control)
        missing = [o for o in range(position, end) if o not in seen]
        if missing:
            log.holes.append((position, end, missing[:20]))
        for offset, value in records:
            log.records[offset] = value
        log.control.update(control)
        position = end
