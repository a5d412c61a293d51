"""Rivven load generators: raw batched produce, raw fetch consume, e2e, the client lines, and
the final loss/duplicate read.

Theory of operation
-------------------
To measure the broker rather than Python's per-record client cost, the raw producers build
one record batch ONCE (``BatchTemplate``: ``BatchBuilder``, ``batch`` records of
``record_bytes``) and, per request, copy it, write the unit's ``ledger.MARK`` into the first
record's value (at a fixed position: records of one shape have a fixed layout) and recompute
the batch CRC (crc32c runs at tens of GB/s, so this is about a microsecond). The request
around it is built once too (``RequestTemplate``: the whole ``Produce`` frame of that batch
to one partition, as the codec encodes it), so a request costs a copy and three fields
written, as the peers' templates do (``peer_protocol``); encoding the ``Produce`` and decoding
its answer into message objects cost 21 us of Python per request here against the peers'
1 us, on the core the load shares with itself (2026-11-29). Answers are cut by the
protocol's ``FrameDecoder``, matched to the correlation ids sent, in order, and checked for an
error code by ``ProduceAnswers``; one that is not a plain success is decoded by the codec for
its message. ``window`` requests in flight per connection (``workers.run_producers``). One
request carries one batch for one partition; connections rotate over the partitions.

The raw consumer sends ``Fetch`` requests, one in flight (the next offset comes from the
answer), and counts records and bytes from batch *headers* only: the broker-side figure.
In ``consume`` mode it wraps to offset 0 at the end of the log, so a run of any length reads
the filled log from the page cache again and again; in ``e2e`` mode it long-polls the tail
and takes each batch's latency from the send time in its mark.

The *client* lines go through the public API: ``Producer.send`` one record at a time (every
record carries its own mark) and ``Consumer.poll`` decoding every record. They report the
throughput a Python application sees.

``verify_log`` reads every partition from offset 0 to its end and feeds each unit's mark to
a ``Ledger``: one mark per batch for the raw producers, one per record for the client line.
"""

from __future__ import annotations

import functools
import socket
import struct
import time
from collections import deque
from concurrent.futures import Future
from typing import Callable

import attrs
import crc32c
import msgpack

from rivven_broker.bench.ledger import MARK, MARK_BYTES, Ledger
from rivven_broker.bench.stats import Buckets, Latency
from rivven_broker.bench.workers import (
    Channel,
    Window,
    WorkerResult,
    WorkerSpec,
    connect,
    run_producers,
)
from rivven_broker.client import Consumer, Producer, TopicPartition
from rivven_broker.protocol import codec, limits
from rivven_broker.protocol.connection import ClientConnection
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.framing import FORMAT_MSGPACK, FrameDecoder, encode_frame_parts
from rivven_broker.protocol.messages import (
    ErrorResponse,
    Fetch,
    FetchPartition,
    FetchResponse,
    FetchTopic,
    Produce,
    ProducePartition,
    ProduceResponse,
    ProduceTopic,
)
from rivven_broker.records import BatchBuilder, decode_records, iter_batches

__all__ = [
    "BatchTemplate",
    "batch_template",
    "RequestTemplate",
    "request_template",
    "ProduceAnswers",
    "RivvenProduceChannel",
    "prepare_produce",
    "prepare_consume",
    "prepare_client_produce",
    "prepare_client_consume",
    "verify_log",
    "fetch_once",
]

_CRC = struct.Struct(">I")
_CRC_AT = 17
_CRC_START = 21
_CORRELATION_ID = struct.Struct(">I")
_CORRELATION_ID_AT = 5  # after the frame's u32 length and u8 format (protocol/framing.py)
_U32_MAX = 2**32 - 1
_TIMESTAMP_MS = 1_700_000_000_000
_PROBE = bytes(range(0xA0, 0xA0 + MARK_BYTES))
_CLIENT_SAMPLE = 100  # the client line times every 100th record


@attrs.frozen
class BatchTemplate:
    """A built batch and where its first record's value (the mark) starts."""

    data: bytes
    mark_at: int
    records: int

    def fill(self, producer: int, sequence: int, send_ns: int) -> bytearray:
        """A copy marked ``(producer, sequence, send_ns)`` with its CRC recomputed."""
        buf = bytearray(self.data)
        MARK.pack_into(buf, self.mark_at, producer, sequence, send_ns)
        _CRC.pack_into(buf, _CRC_AT, crc32c.crc32c(memoryview(buf)[_CRC_START:]))
        return buf


def batch_template(record_bytes: int, records: int) -> BatchTemplate:
    """One uncompressed batch of ``records`` keyless records of ``record_bytes`` bytes."""
    assert record_bytes >= MARK_BYTES and records >= 1
    builder = BatchBuilder(batch_bytes_max=limits.batch_bytes_max)
    builder.append(_TIMESTAMP_MS, None, _PROBE + bytes(record_bytes - MARK_BYTES))
    filler = bytes(record_bytes)
    for _ in range(records - 1):
        assert builder.append(_TIMESTAMP_MS, None, filler)
    data = builder.build()
    mark_at = data.find(_PROBE)
    assert mark_at > 0 and data.find(_PROBE, mark_at + 1) < 0
    return BatchTemplate(data, mark_at, records)


@attrs.frozen
class RequestTemplate:
    """A whole ``Produce`` frame carrying a ``BatchTemplate``'s batch to one partition, and where
    in it the batch and its mark sit (module docstring)."""

    frame: bytes
    batch_at: int
    batch_end: int
    mark_at: int

    def fill(self, correlation_id: int, producer: int, sequence: int, send_ns: int) -> bytearray:
        """A copy numbered ``correlation_id`` whose batch is marked ``(producer, sequence,
        send_ns)``, its CRC recomputed."""
        buf = bytearray(self.frame)
        _CORRELATION_ID.pack_into(buf, _CORRELATION_ID_AT, correlation_id)
        MARK.pack_into(buf, self.mark_at, producer, sequence, send_ns)
        batch_at = self.batch_at
        _CRC.pack_into(buf, batch_at + _CRC_AT,
                       crc32c.crc32c(memoryview(buf)[batch_at + _CRC_START:self.batch_end]))
        return buf


def request_template(template: BatchTemplate, topic: str, partition: int,
                     acks: int) -> RequestTemplate:
    """The frame of ``Produce(acks, 30 s, topic: partition: template's batch)`` at the newest
    version, correlation id 0 (``fill`` numbers each copy)."""
    request = Produce(acks=acks, timeout_ms=30_000, topics=(
        ProduceTopic(topic, (ProducePartition(partition, template.data),)),))
    frame = encode_frame_parts(FORMAT_MSGPACK, 0, codec.encode_parts(request))
    assert type(frame) is bytes
    batch_at = frame.find(template.data)
    assert batch_at > 0 and frame.find(template.data, batch_at + 1) < 0
    return RequestTemplate(frame, batch_at, batch_at + len(template.data),
                           batch_at + template.mark_at)


class ProduceAnswers:
    """The answers of one connection's ``Produce`` requests: framed by the protocol's
    ``FrameDecoder``, each matched to the oldest correlation id ``sent`` (in order, as the
    broker must answer), and read for an error code (module docstring).

    ``feed(data) -> [error or None, ...]``, one per answer completed, in order.
    Raises ``ConnectionError`` when the broker answers out of order or not as a ``Produce``.
    """

    def __init__(self) -> None:
        self._decoder = FrameDecoder()
        self._expected: deque[int] = deque()
        self._next_id = 1

    def number(self, answered: bool = True) -> int:
        """The correlation id of the next request, expected back when ``answered`` (acks=0
        requests are not). Never blocks."""
        correlation_id = self._next_id
        self._next_id = correlation_id + 1 if correlation_id < _U32_MAX else 1
        if answered:
            self._expected.append(correlation_id)
        return correlation_id

    def feed(self, data: bytes) -> list[str | None]:
        decoder, expected = self._decoder, self._expected
        decoder.feed(data)
        outcomes: list[str | None] = []
        while (frame := decoder.next_frame()) is not None:
            wanted = expected.popleft() if expected else None
            if frame.correlation_id != wanted or frame.format != FORMAT_MSGPACK:
                raise ConnectionError(f"answer in correlation id {frame.correlation_id} "
                                      f"(format {frame.format}), expected {wanted}")
            outcomes.append(_answer_error(frame.payload))
        return outcomes


def _answer_error(payload: bytes) -> str | None:
    """None for a ``Produce`` answer whose partitions all say NONE, else its error. A plain
    answer is read as msgpack; anything else goes through the codec's full decode, which has
    the last word (a valid answer the quick read did not expect is still a success)."""
    try:
        api_key, _, body = msgpack.unpackb(payload)
        if api_key == Produce.API_KEY and not any(
                partition["error_code"] for topic in body["topics"]
                for partition in topic["partitions"]):
            return None
    except (ValueError, TypeError, KeyError):
        pass  # not plain: the codec says what it is
    response = codec.decode_response(payload)
    if type(response) is not ProduceResponse and type(response) is not ErrorResponse:
        raise ConnectionError(f"{type(response).__name__} answers a Produce")
    return _produce_error(response)


class RivvenProduceChannel(Channel):
    """One raw producer connection: marked template batches in ``Produce`` requests."""

    def __init__(
        self, sock: socket.socket, producer: int, spec: WorkerSpec, template: BatchTemplate,
        partitions: tuple[int, ...] | None = None,
    ) -> None:
        super().__init__(sock, producer)
        self.answers = ProduceAnswers()
        self.requests = [request_template(template, spec.topic, partition, spec.options.acks)
                         for partition in (spec.partitions if partitions is None else partitions)]
        self.records = template.records
        self.fire_and_forget = spec.options.acks == 0
        self.first_error: str | None = None

    def build(self, sequence: int, send_ns: int) -> tuple[bytearray, int, int]:
        requests = self.requests
        request = requests[(self.producer + sequence) % len(requests)]
        correlation_id = self.answers.number(answered=not self.fire_and_forget)
        return request.fill(correlation_id, self.producer, sequence, send_ns), 1, self.records

    def feed(self, data: bytes) -> int:
        outcomes = self.answers.feed(data)
        for done, error in enumerate(outcomes):
            if error is not None:
                self.failed.append(self.acked + done)
                if self.first_error is None:
                    self.first_error = error
        return len(outcomes)


def _produce_error(response: object) -> str | None:
    if type(response) is ErrorResponse:
        return f"{response.error_code.name}: {response.message}"
    assert type(response) is ProduceResponse
    for topic in response.topics:
        for partition in topic.partitions:
            if partition.error_code != ErrorCode.NONE:
                return f"{partition.error_code.name}: {partition.error_message}"
    return None


def prepare_produce(spec: WorkerSpec) -> Callable[[Window, WorkerResult], None]:
    """Connect ``connections`` raw producers; return the run function."""
    options = spec.options
    template = batch_template(options.record_bytes, options.batch)
    channels = []
    for number in range(options.connections):
        producer = spec.producer_base + number
        if spec.leaders:  # one partition per connection, at its leader
            partition = spec.partitions[producer % len(spec.partitions)]
            channels.append(RivvenProduceChannel(connect(spec.leaders[partition]), producer,
                                                 spec, template, (partition,)))
        else:
            channels.append(RivvenProduceChannel(connect(spec.address), producer, spec,
                                                 template))

    def run(window: Window, result: WorkerResult) -> None:
        try:
            run_producers(channels, window, options, spec.rate_per_channel, result)
        finally:
            for channel in channels:
                if channel.first_error:
                    result.errors.append(f"producer {channel.producer}: {channel.first_error}")
                channel.close()

    return run


# --- consumers ------------------------------------------------------------------------------------


def _fetch_request(spec: WorkerSpec, offsets: dict[int, int], wait_ms: int) -> Fetch:
    fetch_bytes = spec.options.fetch_bytes
    parts = tuple(FetchPartition(p, offsets[p], fetch_bytes) for p in spec.partitions)
    return Fetch(
        max_wait_ms=wait_ms,
        min_bytes=1,
        max_bytes=min(limits.fetch_bytes_max, fetch_bytes * len(parts)),
        topics=(FetchTopic(spec.topic, parts),),
    )


def fetch_once(sock: socket.socket, core: ClientConnection, request: Fetch) -> FetchResponse:
    """Send one Fetch and block for its answer. Raises ``ConnectionError`` / protocol errors."""
    sock.sendall(core.send_request(request)[1])
    while True:
        event = core.next_event()
        if event is not None:
            response = event.response
            if type(response) is ErrorResponse:
                raise ConnectionError(f"fetch failed: {response.error_code.name} {response.message}")
            return response
        data = sock.recv(4 * 1024 * 1024)
        if not data:
            raise ConnectionError("the broker closed the connection")
        core.receive_data(data)


def prepare_consume(spec: WorkerSpec) -> Callable[[Window, WorkerResult], None]:
    """A raw fetching consumer: re-reads the log (consume) or follows it (e2e)."""
    sock = connect(spec.address)
    core = ClientConnection()
    e2e = spec.options.mode == "e2e"

    def run(window: Window, result: WorkerResult) -> None:
        latency = Latency()
        buckets = Buckets(spec.options.duration_s)
        offsets = {p: 0 for p in spec.partitions}
        passes = 0
        try:
            while True:
                now = time.monotonic()
                if now >= window.end:
                    break
                response = fetch_once(sock, core, _fetch_request(spec, offsets, 200 if e2e else 0))
                now = time.monotonic()
                now_ns = time.monotonic_ns()
                in_window = window.start <= now < window.end
                for topic in response.topics:
                    for part in topic.partitions:
                        if part.error_code != ErrorCode.NONE:
                            raise ConnectionError(f"fetch partition {part.partition}: {part.error_code.name}")
                        records = part.records
                        count = size = 0
                        next_offset = offsets[part.partition]
                        for pos, header in iter_batches(records):
                            count += header.record_count
                            size += header.batch_length + 12
                            next_offset = header.base_offset + header.last_offset_delta + 1
                            if e2e and in_window:
                                send_ns = MARK.unpack_from(records, pos + _mark_at(spec))[2]
                                latency.record_us((now_ns - send_ns) / 1000)
                        offsets[part.partition] = next_offset
                        if in_window:
                            result.records += count
                            result.wire_bytes += size
                            buckets.add(now - window.start, count)
                        if not e2e and next_offset >= part.high_watermark > 0:
                            offsets[part.partition] = 0  # wrap: read the log again
                            passes += 1
                if in_window:
                    result.requests += 1
        finally:
            sock.close()
        result.payload_bytes = result.records * spec.options.record_bytes
        result.latency = latency.encode()
        result.buckets = buckets.counts
        result.seconds = spec.options.duration_s
        result.extra["passes"] = passes

    return run


_MARK_AT: dict[tuple[int, int], int] = {}


def _mark_at(spec: WorkerSpec) -> int:
    key = (spec.options.record_bytes, spec.options.batch)
    if key not in _MARK_AT:
        _MARK_AT[key] = batch_template(*key).mark_at
    return _MARK_AT[key]


# --- the client lines -------------------------------------------------------------------------


def prepare_client_produce(spec: WorkerSpec) -> Callable[[Window, WorkerResult], None]:
    """One public ``Producer`` sending one record per ``send`` call, for the window."""
    options = spec.options
    batch_size_bytes = min(limits.batch_bytes_max, max(16 * 1024, options.batch * (options.record_bytes + 40) + 61))
    producer = Producer(
        f"{spec.address[0]}:{spec.address[1]}",
        acks={-1: "all", 1: 1, 0: 0}[options.acks],
        linger_ms=options.linger_ms,
        batch_size_bytes=batch_size_bytes,
        buffer_memory_bytes=2 * 1024 * 1024,  # bounded queue: latency, not buffering
    )
    producer.partitions_for(spec.topic)  # metadata before the clock starts
    pad = bytes(options.record_bytes - MARK_BYTES)

    def run(window: Window, result: WorkerResult) -> None:
        samples: list[float] = []  # acknowledged sampled records: their latency
        refusals: list[str] = []  # the first error of a sampled record (one kept)
        refused = [0]  # sampled records answered with an error
        pid = spec.producer_base
        sequence = 0
        send = producer.send
        topic = spec.topic
        pack = MARK.pack

        def settled(future: Future, sent_at: float) -> None:  # (on the client's I/O thread)
            error = future.exception()
            if error is None:
                samples.append(time.monotonic() - sent_at)
            else:
                refused[0] += 1
                if not refusals:
                    refusals.append(f"{type(error).__name__}: {error}")

        try:
            _sleep_until(window.t0)
            now = time.monotonic()
            while now < window.end:
                for _ in range(_CLIENT_SAMPLE - 1):
                    send(topic, pack(pid, sequence, 0) + pad)
                    sequence += 1
                sent_at = time.monotonic()
                future = send(topic, pack(pid, sequence, 0) + pad)
                sequence += 1
                if sent_at >= window.start:
                    future.add_done_callback(functools.partial(settled, sent_at=sent_at))
                now = time.monotonic()
            producer.flush(60.0)
        finally:
            producer.close(10.0)
        latency = Latency()
        for value in samples:
            latency.record_us(value * 1e6)
        # Every sampled record stands for the _CLIENT_SAMPLE sent with it; one answered with
        # an error counts for none of them (as a refused request in ``run_producers``).
        counted = len(samples) * _CLIENT_SAMPLE
        if refused[0]:
            result.errors.append(f"{refused[0]} sampled records failed (not counted), "
                                 f"the first: {refusals[0]}")
        result.records = counted
        result.payload_bytes = counted * options.record_bytes
        result.latency = latency.encode()
        result.seconds = options.duration_s
        result.producers.append((pid, sequence, sequence, ()))

    return run


def prepare_client_consume(spec: WorkerSpec) -> Callable[[Window, WorkerResult], None]:
    """One public ``Consumer`` reading the filled log once, decoding every record."""
    options = spec.options
    consumer = Consumer(
        f"{spec.address[0]}:{spec.address[1]}",
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=options.fetch_bytes,
        enable_auto_commit=False,
        pause_gc_while_decoding=True,  # the opt-in a throughput-bound reader would take
    )

    def run(window: Window, result: WorkerResult) -> None:
        count = 0
        try:
            consumer.assign([TopicPartition(spec.topic, p) for p in spec.partitions])
            _sleep_until(window.t0)
            started = time.monotonic()
            deadline = window.end + 60.0
            poll = consumer.poll
            while count < spec.expected_units and time.monotonic() < deadline:
                count += len(poll(timeout_ms=500, max_records=200_000))
            elapsed = time.monotonic() - started
        finally:
            consumer.close()
        result.records = count
        result.payload_bytes = count * options.record_bytes
        result.seconds = elapsed
        if count < spec.expected_units:
            result.errors.append(f"client consumer read {count} of {spec.expected_units} records")

    return run


def _sleep_until(at: float) -> None:
    delay = at - time.monotonic()
    if delay > 0:
        time.sleep(delay)


# --- verification ---------------------------------------------------------------------------------


def verify_log(
    address: tuple[str, int],
    topic: str,
    partitions: int,
    ledger: Ledger,
    *,
    mark_at: int | None,
    leaders: tuple[tuple[str, int], ...] = (),
) -> int:
    """Read every partition from 0 to its end; ``observe`` each unit. Returns records read.

    ``mark_at``: the mark's position in each batch (raw producers), or None to decode every
    record (the client line). ``leaders``: each partition's broker, by partition (else all
    at ``address``). Blocks. Raises ``ConnectionError`` on a broker error.
    """
    total = 0
    for partition in range(partitions):
        total += _verify_partition(leaders[partition] if leaders else address, topic,
                                   partition, ledger, mark_at)
    return total


def _verify_partition(address: tuple[str, int], topic: str, partition: int, ledger: Ledger,
                      mark_at: int | None) -> int:
    sock = connect(address)
    core = ClientConnection()
    total = offset = 0
    try:
        while True:
            request = Fetch(
                max_wait_ms=0,
                min_bytes=0,
                max_bytes=limits.fetch_partition_bytes_max,
                topics=(FetchTopic(topic, (FetchPartition(
                    partition, offset, limits.fetch_partition_bytes_max),)),),
            )
            part = fetch_once(sock, core, request).topics[0].partitions[0]
            if part.error_code != ErrorCode.NONE:
                raise ConnectionError(f"verify partition {partition}: {part.error_code.name}")
            records = part.records
            start = offset
            for pos, header in iter_batches(records):
                if mark_at is not None:
                    ledger.observe_value(records, pos + mark_at)
                    total += header.record_count
                offset = header.base_offset + header.last_offset_delta + 1
            if mark_at is None:
                for record in decode_records(records, min_offset=start):
                    ledger.observe_value(record.value)
                    total += 1
            if offset >= part.high_watermark or not records:
                break
    finally:
        sock.close()
    return total
