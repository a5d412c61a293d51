"""The blocking ``Producer``: ``send`` from any thread, a background sender thread does I/O.

Theory of operation
-------------------
``send`` is the per-record hot path. Under one lock it finds the topic's partition count in
the metadata cache, checks the buffer bound and appends the record to the accumulator with a
``concurrent.futures.Future`` as its completion token; it wakes the sender only when a batch
was opened or sealed. It blocks only when the topic is not in the metadata cache yet or the
buffer is full, and then for at most ``max_block_ms``.

The sender thread loops: ``ProducerCore.step`` (under the lock) says which batches go where and
when to wake; outside the lock it dials leaders, seals (builds and compresses) batches, sends
the Produce requests (at most ``max_in_flight_requests_per_connection`` per broker), refreshes
metadata, and waits in ``NetworkClient.poll`` until a response, a wakeup or the next deadline.
Responses become ``BatchOutcome``s; the thread resolves their futures (``RecordMetadata`` or
the error) and runs ``on_delivery`` callbacks, then notifies threads waiting in ``flush`` or
for buffer space.

``close`` stops taking records, delivers what is buffered (bounded by its ``timeout``), then
fails anything left with ``ClosedError`` and joins the thread.

Exactly-once: the producer is idempotent by default. The sender thread also carries the
core's coordinator requests (``InitProducerId``, ``AddPartitionsToTxn``, ``AddOffsetsToTxn``,
``TxnOffsetCommit``, ``EndTxn``: one at a time, to any broker) and feeds their answers back.
The transactional methods run on the user's thread: each asks the core for a ``TxnResult``
under the lock, wakes the sender and waits (at most ``max_block_ms``, or ``timeout``) until it
is done. ``commit_transaction`` flushes first; ``abort_transaction`` fails the queued records
of the transaction (``TransactionAbortedError``) and waits for those in flight first.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import Future
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, PENDING
from typing import Any, Callable

from rivven_broker.client._cluster import ClusterIO
from rivven_broker.client._network import NetworkClient, monotonic_ms
from rivven_broker.client.accumulator import ProducePlan
from rivven_broker.client.config import (
    ConnectionConfig,
    ProducerConfig,
    bootstrap_and_topics,
    build_configs,
    serialize,
    normalise_acks,
)
from rivven_broker.client.errors import (
    BufferExhaustedError,
    ClientTimeoutError,
    ClosedError,
    ConnectionFailedError,
    InvalidTxnStateError,
    MessageTooLargeError,
    RivvenError,
    TransactionAbortedError,
    UnknownTopicOrPartitionError,
    error_for,
)
from rivven_broker.client.metadata import Address, MetadataCache, parse_bootstrap
from rivven_broker.client.producer_core import BatchOutcome, ProducerCore
from rivven_broker.client.transaction_manager import (
    CoordinatorCall,
    TransactionManager,
    TxnResult,
    offsets_of,
)
from rivven_broker.client.types import RecordMetadata
from rivven_broker.records.batch import RecordTooLargeError

__all__ = ["Producer", "DeliveryCallback"]

#: ``on_delivery(error, metadata)``: exactly one of the two is None.
DeliveryCallback = Callable[["RivvenError | None", "RecordMetadata | None"], None]
_IDLE_WAIT_MS = 1000
_ABORT_POLL_S = 0.05


class Producer:
    """Sends records to Rivven; thread-safe. See docs/client.md for every option.

    ``Producer(bootstrap, acks="all", linger_ms=5, batch_size_bytes=1 MiB, compression="none",
    idempotent=None (on unless acks or in-flight settings forbid it), transactional_id=None,
    transaction_timeout_ms=60000, delivery_timeout_ms=120000,
    max_in_flight_requests_per_connection=5, buffer_memory_bytes=32 MiB, max_block_ms=60000,
    client_id=..., request_timeout_ms=30000, retry_backoff_ms=100, ...)``.

    Construction starts the sender thread and does not block on the network.

    Raises:
        ValueError / TypeError: a bad or unknown option.
    """

    def __init__(self, bootstrap: str | None = None, **options: Any) -> None:
        bootstrap, _ = bootstrap_and_topics(() if bootstrap is None else (bootstrap,), None,
                                            options, takes_topics=False)
        if "acks" in options:
            options["acks"] = normalise_acks(options["acks"])
        self._config, self._conn_config = build_configs(options, ProducerConfig, ConnectionConfig)
        self._serializing = self._config.key_serializer is not None or (
            self._config.value_serializer is not None)
        self._lock = threading.Lock()  # guards the core; ``with self._lock`` is the fast path
        self._cond = threading.Condition(self._lock)
        self._futures_done = threading.Condition()  # shared by every future of this producer
        self._metadata = MetadataCache(
            parse_bootstrap(bootstrap),
            metadata_max_age_ms=self._conn_config.metadata_max_age_ms,
            refresh_backoff_ms=self._conn_config.retry_backoff_ms,
        )
        rng = random.Random()
        self._core = ProducerCore(self._config, self._conn_config, self._metadata, rng)
        self._acc = self._core.accumulator
        self._append = self._acc.append  # bound once: the hot path calls it per record
        txn = self._core.txn
        self._txn_check = txn.check_send if txn is not None and txn.transactional else None
        self._partition_counts = self._metadata.partition_counts
        self._buffer_memory_bytes = self._config.buffer_memory_bytes
        self._net = NetworkClient(
            self._conn_config,
            # + a Handshake and a Metadata request beside the produce requests
            in_flight_max=self._config.max_in_flight_requests_per_connection + 2,
            rng=rng,
        )
        self._cluster = ClusterIO(
            self._net,
            self._metadata,
            self._cond,
            allow_auto_topic_creation=self._config.allow_auto_topic_creation,
        )
        self._closed = False  # no more sends
        self._stopping = False  # the sender thread should exit
        self._fatal: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="rivven-producer", daemon=True)
        self._thread.start()

    # --- the user's side ---------------------------------------------------------------------
    def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        headers: Any = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> Future:
        """Queue one record; returns a ``Future`` resolving to its ``RecordMetadata``.

        Blocks only while the topic's metadata is unknown or the buffer is full, at most
        ``max_block_ms``. Delivery errors (after retries) go to the future and ``on_delivery``
        (called on the sender thread as ``on_delivery(error, metadata)``).

        Raises:
            ClosedError: the producer is closed.
            ClientTimeoutError: the topic's metadata did not arrive within ``max_block_ms``
                (``BufferExhaustedError`` when the buffer stayed full).
            BrokerError: the topic is invalid (e.g. ``InvalidTopicNameError``), or ``partition``
                is out of range (``UnknownTopicOrPartitionError``).
            MessageTooLargeError: the record cannot fit in any batch.
            TypeError: key, value or headers of the wrong type.
        """
        if self._serializing:
            key, value = serialize(self._config, key, value)
        future = RecordFuture(self._futures_done)
        if timestamp_ms is None:
            timestamp_ms = time.time_ns() // 1_000_000
        with self._lock:
            if self._txn_check is not None:
                self._txn_check()
            count = self._partition_counts.get(topic)
            if count is None or partition is not None or self._closed or (
                self._acc.buffered_bytes >= self._buffer_memory_bytes
            ):
                count = self._admit(topic, partition)
            try:
                wake = self._append(topic, partition, timestamp_ms, key, value, headers or (),
                                    future, time.monotonic_ns() // 1_000_000, count)
            except RecordTooLargeError as error:
                raise MessageTooLargeError(str(error)) from error
        if wake:
            self._net.wakeup()
        if on_delivery is not None:
            future.add_done_callback(_delivery_adapter(on_delivery))
        return future

    def _admit(self, topic: str, partition: int | None) -> int:
        """The slow checks of ``send`` (lock held): open, metadata, partition, buffer room."""
        if self._closed:
            raise ClosedError("send() after close()")
        count = self._metadata.partition_count(topic)
        if count is None:
            count = self._await_partitions(topic)
        if partition is not None and not 0 <= partition < count:
            raise UnknownTopicOrPartitionError(
                f"partition {partition} of {topic!r} does not exist ({count} partitions)"
            )
        if self._acc.buffered_bytes >= self._acc.buffer_memory_bytes:
            self._await_room()
        return count

    def _await_partitions(self, topic: str) -> int:
        """Wait (lock held) until ``topic`` has a partition count; raise on error or timeout."""
        deadline = monotonic_ms() + self._config.max_block_ms
        self._metadata.add_topics([topic])
        self._metadata.request_update()
        self._net.wakeup()
        while True:
            self._check_alive()
            count = self._metadata.partition_count(topic)
            if count is not None:
                return count
            code = self._metadata.topic_error(topic)
            if code is not None and not code.retriable:
                raise error_for(code, f"topic {topic!r}")
            remaining = deadline - monotonic_ms()
            if remaining <= 0:
                reason = self._cluster.connect_error()
                if reason is not None and self._metadata.version == 0:
                    raise ConnectionFailedError(f"no broker reachable: {reason.message}")
                raise ClientTimeoutError(
                    f"topic {topic!r} not in metadata after max_block_ms="
                    f"{self._config.max_block_ms}" + (f" ({code.name})" if code else "")
                )
            self._cond.wait(min(remaining, _IDLE_WAIT_MS) / 1000)

    def _await_room(self) -> None:
        deadline = monotonic_ms() + self._config.max_block_ms
        while self._acc.buffered_bytes >= self._acc.buffer_memory_bytes:
            self._check_alive()
            remaining = deadline - monotonic_ms()
            if remaining <= 0:
                raise BufferExhaustedError(
                    f"buffer of {self._acc.buffer_memory_bytes} bytes still full after "
                    f"max_block_ms={self._config.max_block_ms}"
                )
            self._cond.wait(remaining / 1000)

    def _check_alive(self) -> None:
        if self._fatal is not None:
            raise ClosedError(f"the sender thread failed: {self._fatal!r}") from self._fatal
        if self._closed:
            raise ClosedError("the producer was closed")

    def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered now and wait until each of those records completed.

        Blocks up to ``timeout`` seconds (None: no bound). Record errors go to their futures.

        Raises:
            ClientTimeoutError: records were still pending at the timeout.
            ClosedError: the sender thread died.
        """
        deadline = None if timeout is None else monotonic_ms() + int(timeout * 1000)
        with self._cond:
            pending = self._acc.incomplete()
            self._acc.flushes_in_progress += 1
            try:
                self._net.wakeup()
                while any(not batch.done for batch in pending):
                    if self._fatal is not None:
                        raise ClosedError(f"the sender thread failed: {self._fatal!r}")
                    if deadline is None:
                        self._cond.wait(_IDLE_WAIT_MS / 1000)
                        continue
                    remaining = deadline - monotonic_ms()
                    if remaining <= 0:
                        left = sum(b.record_count for b in pending if not b.done)
                        raise ClientTimeoutError(f"flush timed out with {left} records pending")
                    self._cond.wait(remaining / 1000)
            finally:
                self._acc.flushes_in_progress -= 1

    def close(self, timeout: float | None = None) -> None:
        """Deliver what is buffered (up to ``timeout`` seconds), then stop. Idempotent.

        Records still pending at the timeout fail with ``ClosedError``. Blocks.
        """
        with self._cond:
            already = self._closed
            self._closed = True
            self._acc.closing = True
        if not already and self._thread is not threading.current_thread():
            try:
                self.flush(timeout)
            except RivvenError:
                pass  # pending records are failed below
        with self._cond:
            self._stopping = True
        self._net.wakeup()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def partitions_for(self, topic: str) -> list[int]:
        """The topic's partition numbers (fetching metadata, up to ``max_block_ms``).

        Raises as ``send`` does for an unknown or invalid topic.
        """
        with self._cond:
            count = self._metadata.partition_count(topic)
            if count is None:
                count = self._await_partitions(topic)
        return list(range(count))

    # --- transactions ---------------------------------------------------------------------
    def init_transactions(self, timeout: float | None = None) -> None:
        """Get the producer id of ``transactional_id``, fencing older instances (their open
        transaction is aborted). Call once, first. Blocks up to ``timeout`` seconds (default
        ``max_block_ms``).

        Raises:
            InvalidTxnStateError: no ``transactional_id``, or called twice.
            ProducerFencedError: fatal; a newer instance took over. ClientTimeoutError.
        """
        with self._cond:
            result = self._transactions().init_transactions()
        self._await(result, timeout)

    def begin_transaction(self) -> None:
        """Start a transaction (local; the broker learns it from the first write). Never
        blocks. Raises ``InvalidTxnStateError`` unless initialised and no transaction is open,
        or the fatal error (``ProducerFencedError``)."""
        with self._cond:
            self._transactions().begin_transaction()

    def send_offsets_to_transaction(
        self, offsets: Any, group_id: Any, timeout: float | None = None
    ) -> None:
        """Commit ``offsets`` (``{TopicPartition: next offset to consume}``; values may
        also carry ``.offset``) for ``group_id`` if and only if the transaction commits.
        ``group_id`` is a group id (no membership check) or, better, the consuming
        ``Consumer.group_metadata()``: the broker then refuses the offsets once that member
        left its generation (a zombie whose partitions moved on). Blocks until the
        coordinator recorded them.

        Raises:
            CommitFailedError: the member left that generation (UNKNOWN_MEMBER_ID,
                ILLEGAL_GENERATION, FENCED_INSTANCE_ID): call ``abort_transaction``, poll
                again (the consumer rejoins) and redo the work.
            TypeError: ``group_id`` is neither a str nor group metadata.
            InvalidTxnStateError, ProducerFencedError, ClientTimeoutError, BrokerError.
        """
        converted = offsets_of(offsets)
        with self._cond:
            result = self._transactions().send_offsets(converted, group_id)
        self._await(result, timeout)

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Flush the transaction's records, then commit it: they (and its offsets) become
        visible to read_committed consumers together. Blocks until the decision is durable.

        Raises:
            the error that made the transaction abortable (a record failed): call
            ``abort_transaction``; ProducerFencedError (fatal); InvalidTxnStateError;
            ClientTimeoutError (retry ``commit_transaction`` or abort).
        """
        self.flush(timeout)
        with self._cond:
            result = self._transactions().begin_commit()
        self._await(result, timeout)

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Abort the open transaction: queued records fail with ``TransactionAbortedError``,
        written ones are never visible to read_committed consumers. Blocks until done.

        Raises:
            ProducerFencedError (fatal), InvalidTxnStateError, ClientTimeoutError.
        """
        deadline = monotonic_ms() + self._timeout_ms(timeout)
        error = TransactionAbortedError("the transaction was aborted before this was sent")
        while True:
            with self._cond:
                self._transactions()
                outcomes, finished = self._core.abort_transaction_records(error)
            self._finish(outcomes)
            if finished:
                break
            if monotonic_ms() >= deadline:
                raise ClientTimeoutError("records of the transaction still in flight")
            with self._cond:
                self._cond.wait(_ABORT_POLL_S)
        with self._cond:
            result = self._transactions().begin_abort()
        self._await(result, max(deadline - monotonic_ms(), 1) / 1000)

    def _transactions(self) -> TransactionManager:
        """The transaction manager (lock held). Raises unless ``transactional_id`` is set."""
        self._check_alive()
        txn = self._core.txn
        if txn is None or not txn.transactional:
            raise InvalidTxnStateError("the producer has no transactional_id")
        return txn

    def _timeout_ms(self, timeout: float | None) -> int:
        return self._config.max_block_ms if timeout is None else int(timeout * 1000)

    def _await(self, result: TxnResult, timeout: float | None) -> None:
        """Wake the sender, wait until ``result`` is done, raise its error."""
        self._net.wakeup()
        deadline = monotonic_ms() + self._timeout_ms(timeout)
        with self._cond:
            while not result.done:
                if self._fatal is not None:
                    raise ClosedError(f"the sender thread failed: {self._fatal!r}")
                remaining = deadline - monotonic_ms()
                if remaining <= 0:
                    raise ClientTimeoutError("the transaction coordinator did not answer in time")
                self._cond.wait(min(remaining, _IDLE_WAIT_MS) / 1000)
        if result.error is not None:
            raise result.error

    def metrics(self) -> dict[str, int]:
        """A few live counters (buffered bytes and batches)."""
        with self._cond:
            return {
                "buffered_bytes": self._acc.buffered_bytes,
                "incomplete_batches": len(self._acc.incomplete()),
            }

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- the sender thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._loop_once():
                pass
        except BaseException as exc:  # a bug: fail everything rather than hang callers
            self._fatal = exc
            raise
        finally:
            self._shutdown()

    def _loop_once(self) -> bool:
        """One sender iteration; False when the thread should exit."""
        in_flight_max = self._config.max_in_flight_requests_per_connection
        net = self._net

        def node_ready(node_id: int) -> bool | None:
            address = self._metadata.address_of(node_id)
            if not net.is_connected(address):
                return None
            return net.is_ready(address) and net.in_flight(address) < in_flight_max

        with self._cond:
            if self._stopping:
                return False
            now = monotonic_ms()
            step = self._core.step(now, node_ready)
        self._finish(step.failed)
        if step.metadata_due:
            self._cluster.refresh_if_due(now)
        wait_ms = _IDLE_WAIT_MS if step.wake_at_ms is None else step.wake_at_ms - now
        dialled, retry_at = self._cluster.dial_waiting(step.dial, now)
        if retry_at is not None:
            wait_ms = min(wait_ms, retry_at - now)
        for plan in step.plans:
            self._send_plan(plan)
        with self._cond:
            call = self._core.next_coordinator_call(monotonic_ms())
        if call is not None:
            self._send_call(call, now)
        self._net.poll(0 if dialled else max(0, min(wait_ms, _IDLE_WAIT_MS)))
        return True

    def _send_call(self, call: CoordinatorCall, now: int) -> None:
        """Send a coordinator request to its broker (any, unless the core names one); its
        answer goes back to the core."""

        def on_answer(response: Any, error: RivvenError | None) -> None:
            with self._cond:
                self._core.on_coordinator_answer(call, response, error, monotonic_ms())
                self._cond.notify_all()

        if call.address is not None:  # the transactional id's coordinator
            address = self._cluster.dial(Address(*call.address))
        else:
            address = self._cluster.any_address(now)
        if address is None:
            reason = self._cluster.connect_error()
            on_answer(None, ConnectionFailedError(
                f"no broker reachable for the coordinator: {reason.message if reason else ''}"
            ))
            return
        self._net.send(address, call.request, on_answer)

    def _send_plan(self, plan: ProducePlan) -> None:
        for batch in plan.batches:
            batch.seal()
        with self._cond:
            address = self._metadata.address_of(plan.node_id)
        request = self._core.produce_request(plan)
        if not self._core.expects_response:
            self._net.send(address, request, None)
            with self._cond:
                outcomes = self._core.on_sent_without_ack(plan)
            self._finish(outcomes)
            return

        def on_answer(response: Any, error: RivvenError | None) -> None:
            now = monotonic_ms()
            with self._cond:
                if error is not None:
                    outcomes = self._core.on_request_failed(plan, error, now)
                else:
                    outcomes = self._core.on_response(plan, response, now)
            self._finish(outcomes)

        self._net.send(address, request, on_answer)

    def _finish(self, outcomes: list[BatchOutcome]) -> None:
        """Resolve the futures of finished batches (outside the core lock), then notify."""
        for batch, base_offset, error in outcomes:
            if error is None:
                topic, partition = batch.topic, batch.partition
                new = tuple.__new__
                offset = base_offset
                step = 1 if base_offset >= 0 else 0
                results = []
                for timestamp in batch.timestamps:
                    results.append(new(RecordMetadata, (topic, partition, offset, timestamp)))
                    offset += step
                resolve_futures(self._futures_done, batch.tokens, results, None)
            else:
                resolve_futures(self._futures_done, batch.tokens, None, error)
        if outcomes:
            with self._cond:
                self._cond.notify_all()

    def _shutdown(self) -> None:
        """Thread exit: close connections, fail whatever is left, wake every waiter."""
        error = ClosedError("the producer closed before these records were delivered")
        self._net.close(error)  # in-flight requests fail (and may be requeued)...
        with self._cond:
            outcomes = self._core.abort_queued(error)  # ...so abort the queue afterwards
            self._closed = True
        self._finish(outcomes)
        with self._cond:
            self._cond.notify_all()


class RecordFuture(Future):
    """A ``concurrent.futures.Future`` that shares its producer's condition variable.

    A plain ``Future`` builds its own ``threading.Condition`` (two more objects per record on
    the hot path) and is resolved one lock round trip at a time. Record futures share one
    condition and are resolved a whole batch per lock hold (``resolve_futures``); ``result``
    and ``exception`` wait in a loop, so a wake-up meant for another future is harmless.
    Everything else (``done``, ``add_done_callback``, ``concurrent.futures.wait``) is the
    standard implementation. ``cancel`` returns False: a record handed to ``send`` cannot be
    taken back.
    """

    def __init__(self, condition: threading.Condition) -> None:  # no super().__init__: see above
        self._condition = condition
        self._state = PENDING
        self._result = None
        self._exception = None
        self._waiters: list = []
        self._done_callbacks: list = []

    def cancel(self) -> bool:
        return False

    def _wait_done(self, timeout: float | None) -> None:
        with self._condition:
            if timeout is None:
                while self._state != FINISHED:
                    self._condition.wait()
                return
            deadline = _now_s() + timeout
            while self._state != FINISHED:
                remaining = deadline - _now_s()
                if remaining <= 0:
                    raise TimeoutError()
                self._condition.wait(remaining)

    def result(self, timeout: float | None = None) -> RecordMetadata:
        self._wait_done(timeout)
        return super().result(0)

    def get(self, timeout: float | None = None) -> RecordMetadata:
        """``result`` under kafka-python's name (``future.get(timeout=10)``)."""
        return self.result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait_done(timeout)
        return super().exception(0)


def resolve_futures(
    condition: threading.Condition,
    futures: list[RecordFuture],
    results: list[Any] | None,
    error: BaseException | None,
) -> None:
    """Finish ``futures`` (each with its result, or all with ``error``) under one lock hold,
    wake every waiter once, then run done-callbacks (outside the lock, as ``Future`` does)."""
    callbacks = False
    with condition:
        for index, future in enumerate(futures):
            if future._state in (FINISHED, CANCELLED, CANCELLED_AND_NOTIFIED):
                continue
            if error is None:
                future._result = results[index]
            else:
                future._exception = error
            future._state = FINISHED
            for waiter in future._waiters:
                if error is None:
                    waiter.add_result(future)
                else:
                    waiter.add_exception(future)
            callbacks = callbacks or bool(future._done_callbacks)
        condition.notify_all()
    if callbacks:
        for future in futures:
            if future._done_callbacks:
                future._invoke_callbacks()


def _now_s() -> float:
    return time.monotonic()


def _delivery_adapter(callback: DeliveryCallback) -> Callable[[Future], None]:
    def on_done(future: Future) -> None:
        if future.cancelled():
            return
        error = future.exception()
        callback(error, None if error is not None else future.result())

    return on_done

