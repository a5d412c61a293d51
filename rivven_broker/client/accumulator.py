"""The producer's record accumulator: records -> per-partition batches -> Produce plans.

Theory of operation
-------------------
``send`` appends a record to the open ``ProducerBatch`` of its partition (a ``BatchBuilder``
plus one opaque completion token per record, which the driver turns into a future). A batch is
*ready* when it is full (``append`` refused a record, so it was sealed), when it has lingered
``linger_ms`` since its first record, when a ``flush`` or ``close`` is under way or the buffer is
full (``buffered_bytes`` at ``buffer_memory_bytes``, as Kafka's "exhausted"), or, for a batch
that failed and waits to be retried, when its backoff ends. ``drain(now_ms, ...)`` takes the
ready batches whose leader is known and whose connection can take a request, at most one batch
per partition per request (so per-partition order holds while nothing fails), groups them by
leader node and bounds each request to ``request_bytes_max`` (a request always carries at least
one batch). It also reports when the next batch will become ready, so the sender sleeps exactly
until then.

Partitioning: an explicit ``partition`` wins; a key goes to murmur2 ``partition_for_key``; a
keyless record goes to the topic's sticky partition, and the sticky partition moves (KIP-480)
whenever a keyless record finds no open batch with room there, i.e. when the previous batch was
sealed or drained. Batches stay big and keyless load still spreads.

Memory: ``buffered_bytes`` estimates the bytes of every record not yet completed (payload plus
the fixed record overhead); the driver blocks ``send`` while it exceeds
``buffer_memory_bytes``. Completing or failing a batch gives its bytes back.

Retries: a batch that failed with a retriable error goes back to the *front* of its partition
queue (ordered by creation sequence) with ``retry_at_ms``; while it waits, later batches of that
partition wait too, so retries do not reorder a partition unless several of its batches were in
flight at once (as in Kafka without idempotence; see docs/client.md).

Idempotence: a batch drained for the first time gets a producer id, epoch and base sequence
from the ``TransactionManager``; ``seal`` writes them into the built header and redoes its CRC
(``stamp_producer``: one copy and one CRC pass per batch, never per record), and a retry
resends the same bytes. ``drain(partition_ready=...)`` holds back partitions the manager is not
ready for (no producer id yet, or not yet added to the transaction); it is also asked for a
partition whose batch still lingers, so a transaction's AddPartitionsToTxn for it goes out
while the batch fills, not after (as Kafka's producer adds a partition at ``send``).

Pure and single-threaded: drivers serialise access with their own lock. The only things that
run outside that lock are ``ProducerBatch.seal`` (builds and compresses the bytes) and the
driver's handling of the tokens.
"""

from __future__ import annotations

import struct
from collections import deque
from typing import Any, Callable, NamedTuple

import crc32c as _crc32c

from rivven_broker.records.batch import RecordTooLargeError
from rivven_broker.records.builder import BatchBuilder
from rivven_broker.records.header import ATTR_TRANSACTIONAL, CRC_START, HEADER_BYTES
from rivven_broker.records.murmur2 import partition_for_key
from rivven_broker.records.partitioner import StickyPartitioner

__all__ = ["ProducerBatch", "ProducePlan", "DrainResult", "RecordAccumulator", "stamp_producer"]

#: Rough per-record bytes beyond key and value, for ``buffered_bytes`` (the record framing).
RECORD_ESTIMATE_OVERHEAD_BYTES = 29
_ATTRIBUTES = struct.Struct(">h")  # at byte 21 of the header
_PRODUCER = struct.Struct(">qhi")  # producer_id, producer_epoch, base_sequence at byte 43
_CRC = struct.Struct(">I")  # at byte 17


def stamp_producer(
    data: bytes, producer_id: int, producer_epoch: int, base_sequence: int, transactional: bool
) -> bytes:
    """A built batch with its producer fields and transactional bit set and its CRC redone.

    The records section is not touched (one copy, one CRC pass over it). Pure.
    """
    header = bytearray(memoryview(data)[:HEADER_BYTES])
    (attributes,) = _ATTRIBUTES.unpack_from(header, 21)
    if transactional:
        attributes |= ATTR_TRANSACTIONAL
    else:
        attributes &= ~ATTR_TRANSACTIONAL
    _ATTRIBUTES.pack_into(header, 21, attributes)
    _PRODUCER.pack_into(header, 43, producer_id, producer_epoch, base_sequence)
    body = memoryview(data)[HEADER_BYTES:]
    crc = _crc32c.crc32c(body, _crc32c.crc32c(memoryview(header)[CRC_START:]))
    _CRC.pack_into(header, 17, crc)
    return b"".join((header, body))


class ProducerBatch:
    """One partition's batch on its way: builder or built bytes, tokens, retry state."""

    __slots__ = (
        "topic",
        "partition",
        "builder",
        "tokens",
        "timestamps",
        "sequence",
        "created_ms",
        "deadline_ms",
        "buffered_bytes",
        "attempts",
        "retry_at_ms",
        "sealed",
        "data",
        "done",
        "producer_id",
        "producer_epoch",
        "base_sequence",
        "transactional",
        "stamped",
    )

    def __init__(
        self, topic: str, partition: int, builder: BatchBuilder, sequence: int, now_ms: int,
        deadline_ms: int,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.builder: BatchBuilder | None = builder
        self.tokens: list[Any] = []
        self.timestamps: list[int] = []
        self.sequence = sequence
        self.created_ms = now_ms
        self.deadline_ms = deadline_ms
        self.buffered_bytes = 0
        self.attempts = 0
        self.retry_at_ms = 0
        self.sealed = False
        self.data: bytes | None = None
        self.done = False
        # Set by the TransactionManager when first drained (idempotent producers); ``seal``
        # writes them into the header. base_sequence -1: not stamped.
        self.producer_id = -1
        self.producer_epoch = -1
        self.base_sequence = -1
        self.transactional = False
        self.stamped: tuple[int, int, int, bool] | None = None

    @property
    def record_count(self) -> int:
        return len(self.tokens)

    def seal(self) -> bytes:
        """Build (and compress) the batch bytes once; later calls return the same bytes,
        re-stamped if the producer id, epoch or sequence assigned to it changed."""
        if self.data is None:
            assert self.builder is not None and not self.builder.is_empty
            self.data = self.builder.build()
            self.builder = None
        if self.base_sequence >= 0:
            wanted = (self.producer_id, self.producer_epoch, self.base_sequence, self.transactional)
            if self.stamped != wanted:
                self.data = stamp_producer(self.data, *wanted)
                self.stamped = wanted
        self.sealed = True
        return self.data

    def __repr__(self) -> str:
        return (
            f"ProducerBatch({self.topic}-{self.partition} #{self.sequence}, "
            f"{self.record_count} records, attempts={self.attempts})"
        )


class ProducePlan(NamedTuple):
    """Batches to send to one node in one Produce request."""

    node_id: int
    batches: list[ProducerBatch]


class DrainResult(NamedTuple):
    plans: list[ProducePlan]
    next_ready_ms: int | None  # when an unready batch becomes ready (None: nothing pending)
    unknown_leader: bool  # some ready batch has no known leader: refresh metadata


class RecordAccumulator:
    """Per-partition queues of batches. Not thread-safe; never blocks."""

    def __init__(
        self,
        partitioner: StickyPartitioner,
        *,
        batch_size_bytes: int,
        linger_ms: int,
        compression: str,
        buffer_memory_bytes: int,
        request_bytes_max: int,
        delivery_timeout_ms: int,
    ) -> None:
        assert linger_ms >= 0 and delivery_timeout_ms > 0
        assert batch_size_bytes > 0 and buffer_memory_bytes > 0 and request_bytes_max > 0
        self.partitioner = partitioner
        self.batch_size_bytes = batch_size_bytes
        self.linger_ms = linger_ms
        self.compression = compression
        self.buffer_memory_bytes = buffer_memory_bytes
        self.request_bytes_max = request_bytes_max
        self.delivery_timeout_ms = delivery_timeout_ms
        self.buffered_bytes = 0
        self.flushes_in_progress = 0
        self.closing = False
        self._queues: dict[tuple[str, int], deque[ProducerBatch]] = {}
        self._open: dict[tuple[str, int], ProducerBatch] = {}
        self._incomplete: set[ProducerBatch] = set()
        self._sequence = 0

    # --- the send path --------------------------------------------------------------------
    def append(
        self,
        topic: str,
        partition: int | None,
        timestamp_ms: int,
        key: bytes | None,
        value: bytes | None,
        headers: Any,
        token: Any,
        now_ms: int,
        num_partitions: int,
    ) -> bool:
        """Add a record; True when the sender should wake (a batch was sealed or opened).

        ``partition`` None picks one: murmur2 of the key, or the sticky partition.

        Raises what ``BatchBuilder.append`` raises (``RecordTooLargeError``, ``TypeError``,
        ``ValueError``); nothing is added then.
        """
        sticky = False
        if partition is None:
            if key is not None:
                partition = partition_for_key(key, num_partitions)
            else:
                partition = self.partitioner.partition(topic, num_partitions)
                if (topic, partition) not in self._open:  # its batch was sealed or drained
                    partition = self.partitioner.on_new_batch(topic, num_partitions, partition)
                sticky = True
        tp = (topic, partition)
        batch = self._open.get(tp)
        if batch is not None and batch.builder.append(timestamp_ms, key, value, headers):
            # _accept, inlined: this is the per-record path
            size = RECORD_ESTIMATE_OVERHEAD_BYTES
            if key is not None:
                size += len(key)
            if value is not None:
                size += len(value)
            batch.tokens.append(token)
            batch.timestamps.append(timestamp_ms)
            batch.buffered_bytes += size
            self.buffered_bytes += size
            return False
        if batch is not None:  # full: seal it; a keyless record moves the sticky partition
            del self._open[tp]
            batch.sealed = True
            if sticky:
                partition = self.partitioner.on_new_batch(topic, num_partitions, partition)
                tp = (topic, partition)
                batch = self._open.get(tp)
                if batch is not None and batch.builder.append(timestamp_ms, key, value, headers):
                    self._accept(batch, timestamp_ms, key, value, token)
                    return True
                if batch is not None:
                    del self._open[tp]
                    batch.sealed = True
        size = RECORD_ESTIMATE_OVERHEAD_BYTES + len(key or b"") + len(value or b"")
        if size > self.request_bytes_max:  # (joining an open batch, it could not be)
            raise RecordTooLargeError(
                f"a record of {size} bytes is larger than request_bytes_max (kafka-python's "
                f"max_request_size), {self.request_bytes_max}")
        batch = self._new_batch(tp, now_ms)
        try:
            accepted = batch.builder.append(timestamp_ms, key, value, headers)
        except BaseException:
            self._drop_empty(batch)
            raise
        assert accepted, "a fresh batch refused its first record"
        self._accept(batch, timestamp_ms, key, value, token)
        return True

    def append_many(
        self,
        topic: str,
        timestamps_ms: Any,
        keys: Any,
        values: Any,
        headers: Any,
        token: Any,
        now_ms: int,
        num_partitions: int,
    ) -> bool:
        """``append`` each record of parallel sequences (partitions picked as for
        ``partition`` None; every record gets ``token``); True when the sender should wake.
        Raises as ``append``: the records before the one refused stay added."""
        append = self.append
        wake = False
        for timestamp_ms, key, value, record_headers in zip(timestamps_ms, keys, values,
                                                            headers):
            if append(topic, None, timestamp_ms, key, value, record_headers, token, now_ms,
                      num_partitions):
                wake = True
        return wake

    def _drop_empty(self, batch: ProducerBatch) -> None:
        """Undo ``_new_batch`` for a batch whose first record was refused."""
        tp = (batch.topic, batch.partition)
        del self._open[tp]
        self._queues[tp].pop()
        self._incomplete.discard(batch)

    def _accept(self, batch: ProducerBatch, timestamp_ms: int, key, value, token) -> None:
        size = RECORD_ESTIMATE_OVERHEAD_BYTES
        if key is not None:
            size += len(key)
        if value is not None:
            size += len(value)
        batch.tokens.append(token)
        batch.timestamps.append(timestamp_ms)
        batch.buffered_bytes += size
        self.buffered_bytes += size

    def _new_batch(self, tp: tuple[str, int], now_ms: int) -> ProducerBatch:
        builder = BatchBuilder(batch_bytes_max=min(self.batch_size_bytes, self.request_bytes_max),
                               compression=self.compression)
        self._sequence += 1
        batch = ProducerBatch(
            tp[0], tp[1], builder, self._sequence, now_ms, now_ms + self.delivery_timeout_ms
        )
        self._open[tp] = batch
        self._queues.setdefault(tp, deque()).append(batch)
        self._incomplete.add(batch)
        return batch

    def has_room(self) -> bool:
        """Whether ``send`` may append now (``buffered_bytes`` under the bound)."""
        return self.buffered_bytes < self.buffer_memory_bytes

    # --- the sender -----------------------------------------------------------------------
    def drain(
        self,
        now_ms: int,
        leader_for: Callable[[str, int], int | None],
        node_ready: Callable[[int], bool],
        partition_ready: Callable[[tuple[str, int]], bool] | None = None,
    ) -> DrainResult:
        """Take the ready batches, grouped into at most one request per ready node.
        ``partition_ready(tp)`` False holds a partition back (no producer id yet, or not yet
        added to the transaction). A request takes one batch per partition; when the
        partition's next batch is full too (or the buffer is), ``next_ready_ms`` is now: the
        driver steps again at once, so the node's pipeline fills up to its in-flight limit
        instead of waiting for the next answer or the next batch sealed."""
        # a full buffer sends what lingers: a sender blocked on room must not wait out linger_ms
        force = self.flushes_in_progress > 0 or self.closing or not self.has_room()
        by_node: dict[int, list[ProducerBatch]] = {}
        bytes_by_node: dict[int, int] = {}
        next_ready_ms: int | None = None
        unknown_leader = False
        for tp, queue in self._queues.items():
            if not queue:
                continue
            batch = queue[0]
            if batch.retry_at_ms > now_ms:
                ready_ms = batch.retry_at_ms
            elif batch.sealed or force:
                ready_ms = now_ms
            else:
                ready_ms = batch.created_ms + self.linger_ms
            if ready_ms > now_ms:
                if partition_ready is not None and batch.base_sequence < 0:
                    # asked now, so a transaction's AddPartitionsToTxn overlaps the linger
                    partition_ready(tp)
                next_ready_ms = ready_ms if next_ready_ms is None else min(next_ready_ms, ready_ms)
                continue
            node = leader_for(tp[0], tp[1])
            if node is None:
                unknown_leader = True
                continue
            if not node_ready(node):
                continue
            if partition_ready is not None and not partition_ready(tp):
                continue
            size = batch.builder.size_bytes if batch.data is None else len(batch.data)
            used = bytes_by_node.get(node, 0)
            if used and used + size > self.request_bytes_max:
                next_ready_ms = now_ms  # more to send as soon as this request is out
                continue
            bytes_by_node[node] = used + size
            queue.popleft()
            if self._open.get(tp) is batch:
                del self._open[tp]
            batch.sealed = True
            by_node.setdefault(node, []).append(batch)
            if queue and queue[0].retry_at_ms <= now_ms and (queue[0].sealed or force):
                next_ready_ms = now_ms  # its next full batch: in the node's next request
        plans = [ProducePlan(node, batches) for node, batches in by_node.items()]
        return DrainResult(plans, next_ready_ms, unknown_leader)

    def reenqueue(self, batch: ProducerBatch, retry_at_ms: int) -> None:
        """Put a failed batch back for a retry at ``retry_at_ms``, in sequence order."""
        assert not batch.done and batch.sealed
        batch.retry_at_ms = retry_at_ms
        queue = self._queues.setdefault((batch.topic, batch.partition), deque())
        index = 0
        while index < len(queue) and queue[index].sequence < batch.sequence:
            index += 1
        queue.insert(index, batch)

    def complete(self, batch: ProducerBatch) -> None:
        """The batch is finished (acknowledged or failed for good): give back its bytes."""
        assert not batch.done
        batch.done = True
        self._incomplete.discard(batch)
        self.buffered_bytes -= batch.buffered_bytes
        assert self.buffered_bytes >= 0

    def expired(self, now_ms: int) -> list[ProducerBatch]:
        """Remove and return queued (not in-flight) batches past their delivery deadline."""
        out = []
        for tp, queue in self._queues.items():
            if queue and queue[0].deadline_ms <= now_ms:
                keep = deque()
                for batch in queue:
                    (out if batch.deadline_ms <= now_ms else keep).append(batch)
                self._queues[tp] = keep
                if self._open.get(tp) in out:
                    del self._open[tp]
        return out

    def abort_all(self) -> list[ProducerBatch]:
        """Remove and return every queued batch (on close without delivering them)."""
        out = [batch for queue in self._queues.values() for batch in queue]
        self._queues.clear()
        self._open.clear()
        return out

    def incomplete(self) -> list[ProducerBatch]:
        """Every batch not yet completed (queued or in flight): what ``flush`` waits for."""
        return list(self._incomplete)

    def earliest_deadline_ms(self) -> int | None:
        """The earliest delivery deadline among queued (not in-flight) batches."""
        deadlines = [min(b.deadline_ms for b in queue) for queue in self._queues.values() if queue]
        return min(deadlines) if deadlines else None

    def has_queued(self) -> bool:
        return any(self._queues.values())

    def check_invariants(self) -> None:
        """Assert the accumulator's invariants (tests and the simulator call this)."""
        total = sum(b.buffered_bytes for b in self._incomplete)
        assert total == self.buffered_bytes, (total, self.buffered_bytes)
        for tp, batch in self._open.items():
            assert not batch.sealed and batch.builder is not None
            assert self._queues[tp] and self._queues[tp][-1] is batch
        for tp, queue in self._queues.items():
            sequences = [b.sequence for b in queue]
            assert sequences == sorted(sequences), (tp, sequences)
            for batch in queue:
                assert not batch.done and batch in self._incomplete
                assert (batch.topic, batch.partition) == tp
                assert len(batch.tokens) == len(batch.timestamps)
