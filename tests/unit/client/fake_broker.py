"""A tiny in-memory broker over real loopback sockets, for testing the client drivers alone.

Goal and method: the blocking client's driver (threads, sockets, retries) needs a peer that can
be told to misbehave on cue (answer NOT_LEADER twice, drop a connection, stall). This fake
speaks the real protocol through ``ServerConnection`` on a thread per connection, keeps each
partition as a list of raw batches, assigns offsets with ``header.stamp`` and validates every
produced batch with ``header.validate`` — the same bytes rules as the real broker, none of its
storage. Fault injection is a queue of per-request actions (``inject``); ``trickle`` makes it
send answers in small pieces with pauses, as a slow network would. It is a test fake: no
long-polling beyond a short wait, no limits, no persistence.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from typing import Any, Callable

from rivven_broker.protocol import messages as m
from rivven_broker.protocol.connection import RequestReceived, ServerConnection
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.records.header import (
    LOG_OVERHEAD_BYTES,
    BatchError,
    iter_batches,
    stamp,
    validate,
)


class FakeBroker:
    """Start with ``FakeBroker().start()``; ``.bootstrap`` is its "host:port"."""

    def __init__(self, *, auto_create_partitions: int = 3, node_id: int = 1) -> None:
        self.node_id = node_id
        self.auto_create_partitions = auto_create_partitions
        self.logs: dict[tuple[str, int], list[tuple[int, bytes]]] = {}  # (base_offset, batch)
        self.topics: dict[str, int] = {}
        self.lock = threading.Condition()
        self.requests: list[str] = []  # api names, in arrival order
        self.faults: deque[tuple[str, Callable[[Any], Any]]] = deque()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.bootstrap = f"127.0.0.1:{self.port}"
        self._conns: list[socket.socket] = []
        self._stopped = False
        self._piece_bytes = 0  # 0: each answer in one sendall
        self._pause_s = 0.0

    # --- control --------------------------------------------------------------------------
    def start(self) -> FakeBroker:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopped = True
        self._listener.close()
        for conn in list(self._conns):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def trickle(self, piece_bytes: int, pause_s: float) -> None:
        """Send every later answer in pieces of ``piece_bytes``, pausing between them."""
        self._piece_bytes = piece_bytes
        self._pause_s = pause_s

    def inject(self, api: str, action: Callable[[Any], Any]) -> None:
        """The next request of type ``api`` (class name) is answered by ``action(request)``
        instead; an action returning None drops the connection."""
        self.faults.append((api, action))

    def create_topic(self, name: str, partitions: int) -> None:
        with self.lock:
            self.topics[name] = partitions
            for p in range(partitions):
                self.logs.setdefault((name, p), [])

    def end_offset(self, topic: str, partition: int) -> int:
        with self.lock:
            log = self.logs.get((topic, partition), [])
            if not log:
                return 0
            base, data = log[-1]
            return base + next(iter_batches(data))[1].last_offset_delta + 1

    # --- serving --------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._stopped:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        core = ServerConnection()
        try:
            while True:
                data = conn.recv(1 << 20)
                if not data:
                    return
                core.receive_data(data)
                while (event := core.next_event()) is not None:
                    if not isinstance(event, RequestReceived):
                        answer = core.send_error(
                            event.correlation_id, event.error_code, event.message
                        )
                        conn.sendall(answer)
                        continue
                    response = self._answer(event.request)
                    if response is _DROP:
                        conn.close()
                        return
                    if event.request.expects_response():
                        self._send(conn, core.send_response(event.correlation_id, response))
        except OSError:
            return
        finally:
            conn.close()

    def _send(self, conn: socket.socket, data: bytes) -> None:
        step = self._piece_bytes or len(data)
        for start in range(0, len(data), step):
            if start:
                time.sleep(self._pause_s)
            conn.sendall(data[start : start + step])

    def _answer(self, request: Any) -> Any:
        name = type(request).__name__
        with self.lock:
            self.requests.append(name)
            for index, (api, action) in enumerate(self.faults):
                if api == name:
                    del self.faults[index]
                    result = action(request)
                    return _DROP if result is None else result
        handler = getattr(self, f"_on_{name}", None)
        if handler is None:
            return m.ErrorResponse(ErrorCode.UNSUPPORTED_VERSION, name)
        with self.lock:
            return handler(request)

    def _on_Handshake(self, request: Any) -> Any:
        return m.HandshakeResponse(api_versions=m.supported_api_versions())

    def _on_Ping(self, request: Any) -> Any:
        return m.Pong()

    def _topic_metadata(self, name: str, create: bool) -> Any:
        if name not in self.topics and create:
            self.create_topic(name, self.auto_create_partitions)
        if name not in self.topics:
            return m.TopicMetadata(name=name, error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        parts = tuple(
            m.PartitionMetadata(partition=p, leader=self.node_id, leader_epoch=0,
                                replicas=(self.node_id,), isr=(self.node_id,))
            for p in range(self.topics[name])
        )
        return m.TopicMetadata(name=name, partitions=parts)

    def _on_Metadata(self, request: Any) -> Any:
        names = sorted(self.topics) if request.topics is None else request.topics
        return m.MetadataResponse(
            brokers=(m.BrokerMetadata(node_id=self.node_id, host="127.0.0.1", port=self.port),),
            controller_id=self.node_id,
            cluster_id="fake",
            topics=tuple(self._topic_metadata(n, request.allow_auto_topic_creation) for n in names),
        )

    def _on_CreateTopic(self, request: Any) -> Any:
        if request.name in self.topics:
            return m.CreateTopicResponse(
                name=request.name, error_code=ErrorCode.TOPIC_ALREADY_EXISTS
            )
        self.create_topic(request.name, request.partitions)
        return m.CreateTopicResponse(name=request.name, partitions=request.partitions,
                                     replication_factor=1)

    def _on_ListTopics(self, request: Any) -> Any:
        return m.ListTopicsResponse(
            topics=tuple(
                m.TopicListing(name=n, partitions=c) for n, c in sorted(self.topics.items())
            )
        )

    def _append(self, topic: str, partition: int, records: bytes) -> tuple[ErrorCode, int]:
        if (topic, partition) not in self.logs:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1
        batches = list(iter_batches(records))
        try:
            for pos, header in batches:
                validate(records, pos, header.batch_length + LOG_OVERHEAD_BYTES)
        except BatchError:
            return ErrorCode.CORRUPT_MESSAGE, -1
        first = None
        for pos, header in batches:
            base = self.end_offset(topic, partition)
            first = base if first is None else first
            data = records[pos:pos + header.batch_length + LOG_OVERHEAD_BYTES]
            data = stamp(base, header.batch_length, 0) + data[16:]
            self.logs[(topic, partition)].append((base, data))
        self.lock.notify_all()
        return ErrorCode.NONE, first

    def _on_Produce(self, request: Any) -> Any:
        topics = []
        for topic in request.topics:
            parts = []
            for part in topic.partitions:
                code, base = self._append(topic.name, part.partition, part.records)
                parts.append(m.ProducePartitionResponse(partition=part.partition, error_code=code,
                                                        base_offset=base))
            topics.append(m.ProduceTopicResponse(name=topic.name, partitions=tuple(parts)))
        return m.ProduceResponse(topics=tuple(topics))

    def _read(
        self, topic: str, partition: int, offset: int, max_bytes: int
    ) -> tuple[ErrorCode, bytes]:
        log = self.logs.get((topic, partition))
        if log is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, b""
        end = self.end_offset(topic, partition)
        if offset > end:
            return ErrorCode.OFFSET_OUT_OF_RANGE, b""
        out, size = [], 0
        for base, data in log:
            last = base + next(iter_batches(data))[1].last_offset_delta
            if last < offset:
                continue
            if out and size + len(data) > max_bytes:
                break
            out.append(data)
            size += len(data)
        return ErrorCode.NONE, b"".join(out)

    def _on_Fetch(self, request: Any) -> Any:
        wanted = [(t.name, p) for t in request.topics for p in t.partitions]
        if not any(self._read(n, p.partition, p.fetch_offset, 1)[1] for n, p in wanted):
            self.lock.wait(min(request.max_wait_ms, 50) / 1000)
        topics = []
        for topic in request.topics:
            parts = []
            for p in topic.partitions:
                code, data = self._read(
                    topic.name, p.partition, p.fetch_offset, p.partition_max_bytes
                )
                parts.append(m.FetchPartitionResponse(
                    partition=p.partition, error_code=code,
                    high_watermark=self.end_offset(topic.name, p.partition), records=data))
            topics.append(m.FetchTopicResponse(name=topic.name, partitions=tuple(parts)))
        return m.FetchResponse(topics=tuple(topics))

    def _on_ListOffsets(self, request: Any) -> Any:
        topics = []
        for topic in request.topics:
            parts = []
            for p in topic.partitions:
                if (topic.name, p.partition) not in self.logs:
                    parts.append(m.ListOffsetsPartitionResponse(
                        partition=p.partition, error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                    continue
                latest = self.end_offset(topic.name, p.partition)
                offset = 0 if p.timestamp == m.EARLIEST_TIMESTAMP else latest
                parts.append(m.ListOffsetsPartitionResponse(partition=p.partition, offset=offset))
            topics.append(m.ListOffsetsTopicResponse(name=topic.name, partitions=tuple(parts)))
        return m.ListOffsetsResponse(topics=tuple(topics))


_DROP = object()


def produce_error(code: ErrorCode) -> Callable[[Any], Any]:
    """An ``inject`` action: answer every partition of a Produce with ``code``."""

    def action(request: Any) -> Any:
        return m.ProduceResponse(topics=tuple(
            m.ProduceTopicResponse(name=t.name, partitions=tuple(
                m.ProducePartitionResponse(partition=p.partition, error_code=code)
                for p in t.partitions))
            for t in request.topics))

    return action


def drop_connection(request: Any) -> None:
    """An ``inject`` action: close the connection without answering."""
    return None
