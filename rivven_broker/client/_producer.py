"""The blocking ``Producer``: a thin layer over the async driver on a background loop thread.

Theory of operation
-------------------
The producer is ``AsyncProducer`` (``_aio_producer.py``), hosted on a ``LoopThread``: its
sender task, connections and retries run there. This class adds only what a blocking caller
needs, and keeps the per-record path off the portal:

- ``send`` is the hot path. On the caller's thread, under the driver's ``Bridge`` lock, it
  appends the record to the accumulator (``AsyncProducer.append``, the same admission checks
  as the async ``send_nowait``) with a ``RecordFuture`` as its token, and wakes the loop only
  when a batch opened or sealed: one ``call_soon_threadsafe`` of ``AsyncProducer.step_now``,
  which steps the sender right there on the loop (no signal, no task switch before the
  request leaves). It blocks only when the topic's metadata is unknown or the buffer
  is full, waiting on the bridge's condition (every signal of the driver notifies it) for at
  most ``max_block_ms``.
- Finished batches settle their futures a batch per lock hold (``resolve_futures``, the
  driver's ``settle``), on the loop thread, which also runs ``on_delivery`` callbacks.
- Everything that waits for the network anyway (``flush``, ``partitions_for`` when the topic
  is unknown, the transactional methods, ``close``) is one portal call into the driver.

``close`` stops taking records, flushes (bounded by its ``timeout``), then leaves the driver,
which fails anything left with ``ClosedError``, and stops the loop thread.
"""

from __future__ import annotations

import functools
import threading
import time
from concurrent.futures import Future
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, PENDING
from typing import Any, Callable

import anyio

from rivven_broker.client._aio_producer import open_producer
from rivven_broker.client._loop_thread import start_loop_thread
from rivven_broker.client.config import bootstrap_and_topics, serialize
from rivven_broker.client.errors import RivvenError
from rivven_broker.client.types import RecordMetadata

__all__ = ["Producer", "DeliveryCallback"]

#: ``on_delivery(error, metadata)``: exactly one of the two is None.
DeliveryCallback = Callable[["RivvenError | None", "RecordMetadata | None"], None]
_IDLE_WAIT_S = 1.0


def _ms(timeout: float | None) -> int | None:
    return None if timeout is None else int(timeout * 1000)


class Producer:
    """Sends records to Rivven; thread-safe. See docs/client.md for every option.

    ``Producer(bootstrap, acks="all", linger_ms=5, batch_size_bytes=1 MiB, compression="none",
    idempotent=None (on unless acks or in-flight settings forbid it), transactional_id=None,
    transaction_timeout_ms=60000, delivery_timeout_ms=120000,
    max_in_flight_requests_per_connection=5, buffer_memory_bytes=32 MiB, max_block_ms=60000,
    client_id=..., request_timeout_ms=30000, retry_backoff_ms=100, ...)``.

    Construction starts the loop thread and does not block on the network.

    Raises:
        ValueError / TypeError: a bad or unknown option.
    """

    def __init__(self, bootstrap: str | None = None, **options: Any) -> None:
        bootstrap, _ = bootstrap_and_topics(() if bootstrap is None else (bootstrap,), None,
                                            options, takes_topics=False)
        self._loop = start_loop_thread("rivven-producer")
        bridge = self._loop.bridge
        try:
            self._async = self._loop.host(open_producer, bootstrap, bridge=bridge, **options)
        except BaseException:
            self._loop.close()
            raise
        self._futures_done = threading.Condition()  # shared by every future of this producer
        self._async.settle = self._settle
        self._config = self._async._config
        self._serializing = self._async._serializing
        self._bridge = bridge
        self._lock = bridge.lock
        self._append = self._async.append
        self._wake = self._async._wake
        self._time_ns = self._loop.time_ns
        #: a batch opened or sealed: the sender steps on the loop as soon as it can
        self._step_soon = functools.partial(bridge.call_soon, self._async.step_now)
        self._closed = False

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
        (called on the loop thread as ``on_delivery(error, metadata)``).

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
            timestamp_ms = self._time_ns() // 1_000_000
        with self._lock:
            try:
                wake = self._append(topic, value, key, headers, partition, timestamp_ms, future)
            except anyio.WouldBlock:
                wake = self._append_when_possible(topic, value, key, headers, partition,
                                                  timestamp_ms, future)
        if wake:
            self._step_soon()
        if on_delivery is not None:
            future.add_done_callback(_delivery_adapter(on_delivery))
        return future

    def _append_when_possible(self, *record: Any) -> bool:
        """``append`` once the topic's metadata is known and the buffer has room (lock held),
        at most ``max_block_ms``."""
        topic = record[0]
        monotonic = self._loop.monotonic
        deadline = monotonic() + self._config.max_block_ms / 1000
        if self._async.partition_count(topic) is None:
            # The sender refreshes the metadata the append asked for, and steps on its own
            # after that. Once only: a fire notifies this very wait, so firing again after
            # each wake-up would bounce between the threads until the metadata arrived.
            self._wake.fire()
        while True:
            remaining = deadline - monotonic()
            if remaining <= 0:
                raise self._async.capacity_error(topic)
            self._bridge.wait(min(remaining, _IDLE_WAIT_S))
            try:
                return self._append(*record)
            except anyio.WouldBlock:
                continue

    def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered now and wait until each of those records completed.

        Blocks up to ``timeout`` seconds (None: no bound). Record errors go to their futures.

        Raises:
            ClientTimeoutError: records were still pending at the timeout.
        """
        self._loop.call(self._async.flush, _ms(timeout))

    def close(self, timeout: float | None = None) -> None:
        """Deliver what is buffered (up to ``timeout`` seconds), then stop. Idempotent.

        Records still pending at the timeout fail with ``ClosedError``. Blocks.
        """
        if self._closed:
            return
        self._closed = True
        with self._lock:
            self._async._closed = True  # no more sends
            self._async._acc.closing = True
        try:
            self._loop.call(self._async.flush, _ms(timeout))
        except RivvenError:
            pass  # pending records are failed by the driver's shutdown
        self._async.flush_on_exit = False
        self._loop.close()

    def partitions_for(self, topic: str) -> list[int]:
        """The topic's partition numbers (fetching metadata, up to ``max_block_ms``).

        Raises as ``send`` does for an unknown or invalid topic.
        """
        count = self._async.partition_count(topic)
        if count is not None:
            return list(range(count))
        return self._loop.call(self._async.partitions_for, topic)

    # --- transactions (the driver's; timeouts in seconds, default max_block_ms) ------------
    def init_transactions(self, timeout: float | None = None) -> None:
        """Get the producer id of ``transactional_id``, fencing older instances (their open
        transaction is aborted). Call once, first. Blocks up to ``timeout`` seconds (default
        ``max_block_ms``).

        Raises:
            InvalidTxnStateError: no ``transactional_id``, or called twice.
            ProducerFencedError: fatal; a newer instance took over. ClientTimeoutError.
        """
        self._loop.call(self._async.init_transactions, _ms(timeout))

    def begin_transaction(self) -> None:
        """Start a transaction (local; the broker learns it from the first write). Never
        blocks on the network. Raises ``InvalidTxnStateError`` unless initialised and no
        transaction is open, or the fatal error (``ProducerFencedError``)."""
        with self._lock:
            self._async._transactions().begin_transaction()

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
        self._loop.call(self._async.send_offsets_to_transaction, offsets, group_id, _ms(timeout))

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Flush the transaction's records, then commit it: they (and its offsets) become
        visible to read_committed consumers together. Blocks until the decision is durable.

        Raises:
            the error that made the transaction abortable (a record failed): call
            ``abort_transaction``; ProducerFencedError (fatal); InvalidTxnStateError;
            ClientTimeoutError (retry ``commit_transaction`` or abort).
        """
        self._loop.call(self._async.commit_transaction, _ms(timeout))

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Abort the open transaction: queued records fail with ``TransactionAbortedError``,
        written ones are never visible to read_committed consumers. Blocks until done.

        Raises:
            ProducerFencedError (fatal), InvalidTxnStateError, ClientTimeoutError.
        """
        self._loop.call(self._async.abort_transaction, _ms(timeout))

    def metrics(self) -> dict[str, int]:
        """A few live counters (buffered bytes and batches)."""
        return self._async.metrics()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- the loop's side ---------------------------------------------------------------------
    def _settle(self, futures: list[RecordFuture], results: list[Any] | None,
                error: BaseException | None) -> None:
        resolve_futures(self._futures_done, futures, results, error)


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

