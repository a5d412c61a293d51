"""Peer load generators: Redis Streams and NATS JetStream over thin raw-protocol clients.

Theory of operation
-------------------
The same workload as Rivven's raw producers, on the peer's own terms:

- Redis: one request is a pipeline of ``batch`` ``XADD stream * d <value>`` commands written
  at once; it completes when its ``batch`` replies are in (``RespReplyCounter``). ``window``
  requests in flight per connection, so ``batch x window`` messages are in flight, as for
  Rivven.
- NATS JetStream: one request is ``batch`` ``PUB subject <inbox> <value>`` frames; each
  message is acknowledged by one ``MSG`` to the connection's inbox (``NatsAckCounter``).

Every message carries its own ``ledger.MARK`` (peers have no batches), written by
``Template.fill``. Readers: Redis ``XREAD COUNT 1000`` from the last id (``RedisReader``);
NATS a pull consumer with ``AckNone`` and two pulls of 1000 outstanding (``NatsReader``).
The consume benchmark re-reads the stream from the start for the whole window (Redis resets
its last id; NATS creates a fresh durable consumer per pass); ``verify_stream`` reads it once
and feeds every mark to a ``Ledger``. Protocol details live in ``peer_protocol.py``.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Callable

from rivven_broker.bench.ledger import Ledger
from rivven_broker.bench.peer_protocol import (
    NatsAckCounter,
    NatsError,
    RespReplyCounter,
    jetstream_consumer_config,
    jetstream_stream_config,
    nats_connect,
    nats_pub,
    parse_nats_messages,
    parse_xread,
    pub_template,
    resp_command,
    xadd_template,
)
from rivven_broker.bench.stats import Buckets
from rivven_broker.bench.workers import (
    Channel,
    Window,
    WorkerResult,
    WorkerSpec,
    connect,
    run_producers,
)

__all__ = [
    "RedisProduceChannel",
    "NatsProduceChannel",
    "RedisReader",
    "NatsReader",
    "nats_open",
    "nats_request",
    "create_jetstream_stream",
    "jetstream_message_count",
    "prepare_redis_produce",
    "prepare_nats_produce",
    "prepare_redis_consume",
    "prepare_nats_consume",
    "verify_stream",
]

_RECEIVE_BYTES = 4 * 1024 * 1024
_READ_COUNT = 1000
_REPLY_TIMEOUT_S = 30.0


class RedisProduceChannel(Channel):
    """Pipelined XADDs; a request completes when all its replies arrived."""

    def __init__(self, sock: socket.socket, producer: int, spec: WorkerSpec) -> None:
        super().__init__(sock, producer)
        self.batch = spec.options.batch
        self.template = xadd_template(spec.topic, spec.options.record_bytes, self.batch)
        self.counter = RespReplyCounter()
        self.replies_used = 0

    def build(self, sequence: int, send_ns: int) -> tuple[bytearray, int, int]:
        return self.template.fill(self.producer, sequence, send_ns), self.batch, self.batch

    def feed(self, data: bytes) -> int:
        done = (self.counter.feed(data) - self.replies_used) // self.batch
        self.replies_used += done * self.batch
        return done


def nats_open(address: tuple[str, int], subscriptions: dict[str, int]) -> socket.socket:
    """Connect, handshake, subscribe ``{subject: sid}``, and wait until the server confirms."""
    sock = connect(address)
    buf = b""
    while b"\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise NatsError("nats-server closed the connection during the handshake")
        buf += chunk
    if not buf.startswith(b"INFO"):
        raise NatsError(f"unexpected greeting {buf[:60]!r}")
    subs = b"".join(f"SUB {subject} {sid}\r\n".encode() for subject, sid in subscriptions.items())
    sock.sendall(nats_connect() + subs + b"PING\r\n")
    pongs = 0
    buf = b""
    while pongs < 2:
        chunk = sock.recv(65536)
        if not chunk:
            raise NatsError("nats-server closed the connection during the handshake")
        buf += chunk
        if b"-ERR" in buf:
            raise NatsError(buf[buf.find(b"-ERR") :][:200].decode(errors="replace"))
        pongs = buf.count(b"PONG\r\n")
    return sock


def nats_request(sock: socket.socket, subject: str, inbox: str, payload: bytes) -> dict:
    """Publish ``payload`` to ``subject`` with reply ``inbox`` (already subscribed) and return
    the decoded JSON answer. Raises ``NatsError`` on an error answer or a timeout."""
    sock.sendall(nats_pub(subject, inbox, payload))
    buf = b""
    deadline = time.monotonic() + _REPLY_TIMEOUT_S
    sock.settimeout(_REPLY_TIMEOUT_S)
    try:
        while time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                raise NatsError("nats-server closed the connection")
            buf += chunk
            _, payloads, _, pings = parse_nats_messages(buf)
            if pings:
                sock.sendall(b"PONG\r\n" * pings)
            if payloads:
                answer = json.loads(payloads[0])
                if "error" in answer:
                    raise NatsError(f"{subject}: {answer['error']}")
                return answer
    finally:
        sock.settimeout(None)
    raise NatsError(f"no answer to {subject}")


def jetstream_message_count(address: tuple[str, int], stream: str) -> int:
    """How many messages the stream holds (``$JS.API.STREAM.INFO``). Blocks."""
    sock = nats_open(address, {"_INBOX.admin": 1})
    try:
        info = nats_request(sock, f"$JS.API.STREAM.INFO.{stream}", "_INBOX.admin", b"")
    finally:
        sock.close()
    return int(info["state"]["messages"])


def create_jetstream_stream(address: tuple[str, int], stream: str) -> None:
    """Create a file-stored JetStream stream ``stream`` on subject ``stream``. Blocks."""
    sock = nats_open(address, {"_INBOX.admin": 1})
    try:
        nats_request(sock, f"$JS.API.STREAM.CREATE.{stream}", "_INBOX.admin",
                     jetstream_stream_config(stream, [stream]))
    finally:
        sock.close()


class NatsProduceChannel(Channel):
    """PUBs with a reply inbox; a request completes when all its acks arrived."""

    def __init__(self, sock: socket.socket, producer: int, spec: WorkerSpec, inbox: str) -> None:
        super().__init__(sock, producer)
        self.batch = spec.options.batch
        self.template = pub_template(spec.topic, inbox, spec.options.record_bytes, self.batch)
        self.counter = NatsAckCounter()
        self.acks_used = 0
        self.pings_answered = 0

    def build(self, sequence: int, send_ns: int) -> tuple[bytearray, int, int]:
        return self.template.fill(self.producer, sequence, send_ns), self.batch, self.batch

    def feed(self, data: bytes) -> int:
        counter = self.counter
        done = (counter.feed(data) - self.acks_used) // self.batch
        self.acks_used += done * self.batch
        if counter.pings > self.pings_answered:
            self.sock.sendall(b"PONG\r\n" * (counter.pings - self.pings_answered))
            self.pings_answered = counter.pings
        return done


def _run_channels(spec: WorkerSpec, channels: list[Channel]) -> Callable[[Window, WorkerResult], None]:
    def run(window: Window, result: WorkerResult) -> None:
        try:
            run_producers(channels, window, spec.options, spec.rate_per_channel, result)
        finally:
            for channel in channels:
                channel.close()

    return run


def prepare_redis_produce(spec: WorkerSpec) -> Callable[[Window, WorkerResult], None]:
    channels: list[Channel] = [
        RedisProduceChannel(connect(spec.address), spec.producer_base + n, spec)
        for n in range(spec.options.connections)
    ]
    return _run_channels(spec, channels)


def prepare_nats_produce(spec: WorkerSpec) -> Callable[[Window, WorkerResult], None]:
    channels: list[Channel] = []
    for number in range(spec.options.connections):
        producer = spec.producer_base + number
        inbox = f"_INBOX.acks.{producer}"
        sock = nats_open(spec.address, {inbox: 1})
        channels.append(NatsProduceChannel(sock, producer, spec, inbox))
    return _run_channels(spec, channels)


# --- readers --------------------------------------------------------------------------------------


class RedisReader:
    """Reads a stream from its start with XREAD, one request at a time."""

    def __init__(self, sock: socket.socket, stream: str) -> None:
        self.sock = sock
        self.stream = stream
        self.last_id = b"0-0"

    def restart(self) -> None:
        self.last_id = b"0-0"

    def read(self) -> list[bytes]:
        """The next values (at most 1000); [] at the end of the stream. Blocks."""
        self.sock.sendall(
            resp_command(b"XREAD", b"COUNT", _READ_COUNT, b"STREAMS", self.stream, self.last_id)
        )
        buf = b""
        while True:
            chunk = self.sock.recv(_RECEIVE_BYTES)
            if not chunk:
                raise ConnectionError("redis-server closed the connection")
            buf += chunk
            parsed = parse_xread(buf)
            if parsed is not None:
                entries = parsed[1]
                if entries:
                    self.last_id = entries[-1][0]
                return [value for _, value in entries]


class NatsReader:
    """Reads a JetStream stream from its start through a pull consumer (AckNone)."""

    def __init__(self, sock: socket.socket, stream: str, inbox: str, name: str) -> None:
        self.sock = sock
        self.name = name  # prefix of this reader's durable consumers (unique per stream)
        self.stream = stream
        self.inbox = inbox
        self.passes = 0
        self.buf = b""
        self.requested = self.received = 0
        self.total = 0
        self.retries = 0
        self.durable = ""

    def restart(self, total: int) -> None:
        """Start a pass over ``total`` messages with a fresh durable consumer. Blocks."""
        self.passes += 1
        self.durable = f"{self.name}-{self.passes}"
        nats_request(
            self.sock,
            f"$JS.API.CONSUMER.DURABLE.CREATE.{self.stream}.{self.durable}",
            "_INBOX.admin",
            jetstream_consumer_config(self.stream, self.durable),
        )
        self.buf = b""
        self.requested = self.received = 0
        self.total = total
        self.retries = 0

    def _pull(self) -> None:
        while self.requested < self.total and self.requested - self.received < 2 * _READ_COUNT:
            count = min(_READ_COUNT, self.total - self.requested)
            body = json.dumps({"batch": count, "expires": 10_000_000_000}).encode()
            self.sock.sendall(
                nats_pub(f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self.durable}", self.inbox, body)
            )
            self.requested += count

    def read(self) -> list[bytes]:
        """The next payloads; [] once the pass has read ``total``. Blocks (at most 30 s
        without data: ``NatsError``)."""
        if self.received >= self.total:
            return []
        self._pull()
        self.sock.settimeout(_REPLY_TIMEOUT_S)
        try:
            while True:
                try:
                    chunk = self.sock.recv(_RECEIVE_BYTES)
                except socket.timeout:
                    raise NatsError(f"no message for {_REPLY_TIMEOUT_S} s after "
                                    f"{self.received} of {self.total}") from None
                if not chunk:
                    raise ConnectionError("nats-server closed the connection")
                self.buf += chunk
                pos, payloads, statuses, pings = parse_nats_messages(self.buf)
                self.buf = self.buf[pos:]
                if pings:
                    self.sock.sendall(b"PONG\r\n" * pings)
                for status in statuses:
                    self._on_status(status.decode(errors="replace").strip())
                if payloads:
                    self.received += len(payloads)
                    return payloads
                self._pull()
        finally:
            self.sock.settimeout(None)

    def _on_status(self, status: str) -> None:
        """A pull answered with a status. ``503`` (no responders: a consumer just created is
        not serving pulls yet) means the pull was lost: forget it and pull again. Counting a
        lost pull as 1000 may over-request, which is harmless (the pass stops at ``total``)."""
        if " 503" not in status or self.retries >= 100:
            raise NatsError(f"pull status {status!r} after {self.received} of {self.total}")
        self.retries += 1
        time.sleep(0.01)
        self.requested = max(self.received, self.requested - _READ_COUNT)


def _nats_reader(spec: WorkerSpec, address: tuple[str, int]) -> NatsReader:
    inbox = f"_INBOX.pull.{spec.index}"
    sock = nats_open(address, {"_INBOX.admin": 1, inbox: 2})
    return NatsReader(sock, spec.topic, inbox, f"w{spec.index}")


def _consume_loop(
    spec: WorkerSpec,
    read: Callable[[], list[bytes]],
    restart: Callable[[], None],
    close: Callable[[], None],
) -> Callable[[Window, WorkerResult], None]:
    def run(window: Window, result: WorkerResult) -> None:
        buckets = Buckets(spec.options.duration_s)
        passes = 0
        try:
            restart()
            while time.monotonic() < window.end:
                values = read()
                now = time.monotonic()
                if not values:
                    restart()
                    passes += 1
                    continue
                if window.start <= now:
                    result.records += len(values)
                    result.requests += 1
                    buckets.add(now - window.start, len(values))
        finally:
            close()
        result.payload_bytes = result.records * spec.options.record_bytes
        result.wire_bytes = result.payload_bytes
        result.buckets = buckets.counts
        result.seconds = spec.options.duration_s
        result.extra["passes"] = passes

    return run


def prepare_redis_consume(spec: WorkerSpec) -> Callable[[Window, WorkerResult], None]:
    reader = RedisReader(connect(spec.address), spec.topic)
    return _consume_loop(spec, reader.read, reader.restart, reader.sock.close)


def prepare_nats_consume(spec: WorkerSpec) -> Callable[[Window, WorkerResult], None]:
    reader = _nats_reader(spec, spec.address)
    return _consume_loop(
        spec, reader.read, lambda: reader.restart(spec.expected_units), reader.sock.close
    )


def verify_stream(peer: str, address: tuple[str, int], stream: str, ledger: Ledger) -> int:
    """Read the whole stream once and observe every mark. Returns the messages read. Blocks."""
    count = 0
    if peer == "redis":
        reader = RedisReader(connect(address), stream)
        sock = reader.sock
        read = reader.read
    else:
        spec_inbox = "_INBOX.verify"
        sock = nats_open(address, {"_INBOX.admin": 1, spec_inbox: 2})
        nats = NatsReader(sock, stream, spec_inbox, "verify")
        nats.restart(jetstream_message_count(address, stream))
        read = nats.read
    try:
        while values := read():
            for value in values:
                ledger.observe_value(value)
            count += len(values)
    finally:
        sock.close()
    return count
