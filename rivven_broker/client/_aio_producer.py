"""The async ``Producer`` (AnyIO: trio or asyncio): the ``ProducerCore`` driven by tasks.

Theory of operation
-------------------
``send``/``enqueue``/``send_nowait`` append to the ``ProducerCore``'s accumulator (no awaits in
between, so no lock is needed) with a ``Delivery`` handle as the record's token, and wake the
sender task. The sender task steps the core: it dials leaders, seals batches and sends each
Produce request (at most ``max_in_flight_requests_per_connection`` per broker) at once on its
connection (``Connection.request_soon``; a task only when the socket is busy or simulated).
The connection's reader feeds each answer back to the core and resolves the deliveries, and
once it paired the answers of one receive it steps the sender itself (``after_answers``), so
an answer and the requests it lets out follow each other without a task switch (as the old
blocking driver's one thread did: answers, step, send). The sender task still steps whenever
it is woken (records, failures, metadata, dials) or its timer is due. ``flush`` waits until
every record buffered when it was called completed; leaving ``open_producer`` flushes, then
stops.

Stepping on the reader's turn is safe, and so would be a step between two answers of one
connection (settled 2026-11-27; an attempt that stepped after each answer had failed
``test_100k_idempotent_records_through_duplicates_and_dropped_connections``). For the core, a
step taken before an answer is handled is the same as a step taken just before that answer
arrived, a timing it must survive anyway: a batch sent ahead of an earlier one of its
partition that is failing gets ``OUT_OF_ORDER_SEQUENCE`` and is retried while the earlier one
is unfinished (``producer_core._retry_in_sequence``). The failures had two other causes: the
reader went on pairing answers after a request sent from an answer's step had broken the
connection (its waiters failed and gone: an ``IndexError``; the reader now stops), and the
test's faulty proxy let the answer of a duplicated request through twice when the broker
answered the first copy quickly (the client saw one answer twice: a protocol error failing
the connection's requests for good, hence broken sequences; fixed in the proxy).

Exactly-once: as in the blocking producer, the sender task also starts one task per
coordinator request the core asks for (``InitProducerId`` and the transaction apis, one at a
time, to any broker) and feeds the answer back; the transactional methods wait on the
``TxnResult`` the core returns, woken by the progress signal.

Time is ``env.clock`` (the event loop's clock by default, a virtual one in the simulator).
A ``Delivery`` makes its event only when awaited before it resolved: most are resolved first
(``enqueue`` callers await many at once, or none), and an event per record costs.

``send_many_nowait`` queues the records of one topic in one call (one lock, one metadata
and buffer check, one ``Delivery``; each record's token is a ``_SharedDelivery`` that
resolves it when the last of them settles): a caller with many records at hand (the
connector runtime's encoded path) pays the per-call costs once, not per record.
"""

from __future__ import annotations

import functools
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Sequence

import anyio
import anyio.lowlevel

from rivven_broker.client._aio_net import (
    Bridge,
    ClientEnv,
    Cluster,
    Signal,
    env_rng,
    open_task_group,
)
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
from rivven_broker.client.metadata import Address
from rivven_broker.client.producer_core import BatchOutcome, ProducerCore
from rivven_broker.client.transaction_manager import (
    CoordinatorCall,
    TransactionManager,
    TxnResult,
    offsets_of,
)
from rivven_broker.client.types import RecordMetadata
from rivven_broker.records.batch import RecordTooLargeError

__all__ = ["AsyncProducer", "Delivery", "open_producer"]

_IDLE_WAIT_MS = 1000


class Delivery:
    """The pending outcome of one record: ``await delivery`` -> ``RecordMetadata``."""

    __slots__ = ("_event", "_done", "_result", "_error")

    def __init__(self) -> None:
        self._event: anyio.Event | None = None  # made by the first wait before the outcome
        self._done = False
        self._result: RecordMetadata | None = None
        self._error: RivvenError | None = None

    def done(self) -> bool:
        return self._done

    async def wait(self) -> RecordMetadata:
        """The record's metadata once acknowledged. Raises the delivery error."""
        if not self._done:
            if self._event is None:
                self._event = anyio.Event()
            await self._event.wait()
        else:
            await anyio.lowlevel.checkpoint()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def __await__(self):
        return self.wait().__await__()

    def _resolve(self, result: RecordMetadata | None, error: RivvenError | None) -> None:
        self._result, self._error = result, error
        self._done = True
        if self._event is not None:
            self._event.set()


class _SharedDelivery:
    """The token of every record of one ``send_many_nowait``: resolves its ``Delivery`` when
    the last of them settles (with the first error, if one failed)."""

    __slots__ = ("delivery", "left", "error")

    def __init__(self, delivery: Delivery, count: int) -> None:
        self.delivery, self.left = delivery, count
        self.error: RivvenError | None = None

    def _resolve(self, result: RecordMetadata | None, error: RivvenError | None) -> None:
        if error is not None and self.error is None:
            self.error = error
        self.left -= 1
        if self.left == 0:
            self.delivery._resolve(None if self.error is not None else result, self.error)


class AsyncProducer:
    """Use through ``open_producer``. Methods are called from tasks of one event loop."""

    def __init__(self, bootstrap: str, env: Any, nursery: Any, *, bridge: Bridge | None = None,
                 **options: Any) -> None:
        """``bridge``: shared with a blocking front (``_producer.Producer``), which then appends
        records on its callers' threads under ``bridge.lock`` and settles record tokens its own
        way (``settle``)."""
        if "acks" in options:
            options["acks"] = normalise_acks(options["acks"])
        self._config, conn_config = build_configs(options, ProducerConfig, ConnectionConfig)
        self._serializing = self._config.key_serializer is not None or (
            self._config.value_serializer is not None)
        self._env = env
        self._clock = env.clock
        self._nursery = nursery
        self._bridge = bridge = bridge or Bridge()
        self._lock = bridge.lock
        self._cluster = Cluster(
            bootstrap, conn_config, env, nursery,
            in_flight_max=self._config.max_in_flight_requests_per_connection + 2,
            allow_auto_topic_creation=self._config.allow_auto_topic_creation, bridge=bridge,
        )
        self._metadata = self._cluster.metadata
        rng = env_rng(env, "producer")
        self._wake = Signal(bridge)
        self._cluster.on_update = self._wake.fire  # a refresh or a dial ended: step again
        self._cluster.after_answers = self._step_after_answers
        #: a Produce answer came in on a reader's turn: that reader steps (``_plan_answered``)
        self._step_due = False
        #: when the sender task steps again unless woken (its last step's answer)
        self._sender_wake_at_ms = 0
        self._core = ProducerCore(self._config, conn_config, self._metadata, rng)
        self._acc = self._core.accumulator
        txn = self._core.txn
        self._txn_check = txn.check_send if txn is not None and txn.transactional else None
        self._request_timeout_ms = conn_config.request_timeout_ms
        self._progress = Signal(bridge)
        #: ``settle(tokens, results, error)``: finishes a batch's record tokens (each with its
        #: ``RecordMetadata``, or all with ``error``); ``Delivery``s by default
        self.settle = settle_deliveries
        self.flush_on_exit = True
        self._in_flight: dict[Address, int] = {}
        self._closed = False
        self._stopped = False

    # --- sending -------------------------------------------------------------------------------
    async def send(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                   headers: Any = None, partition: int | None = None,
                   timestamp_ms: int | None = None) -> RecordMetadata:
        """Send one record and wait for its acknowledgement.

        Raises what ``enqueue`` raises, then the delivery error (after retries).
        """
        delivery = await self.enqueue(topic, value, key, headers, partition, timestamp_ms)
        return await delivery

    async def enqueue(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                      headers: Any = None, partition: int | None = None,
                      timestamp_ms: int | None = None) -> Delivery:
        """Queue one record; waits (at most ``max_block_ms``) only for the topic's metadata or
        buffer space. Returns its ``Delivery``. Always a checkpoint.

        Raises:
            ClosedError, ClientTimeoutError, BufferExhaustedError, ConnectionFailedError,
            BrokerError (invalid topic, partition out of range), MessageTooLargeError,
            TypeError: as the blocking ``Producer.send``.
        """
        return await self._queue_when_possible(topic, functools.partial(
            self.send_nowait, topic, value, key, headers, partition, timestamp_ms))

    def send_nowait(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                    headers: Any = None, partition: int | None = None,
                    timestamp_ms: int | None = None) -> Delivery:
        """Queue one record without waiting. Raises ``anyio.WouldBlock`` when the topic's
        metadata is not known yet or the buffer is full (``enqueue`` waits instead)."""
        if self._serializing:
            key, value = serialize(self._config, key, value)
        delivery = Delivery()
        if timestamp_ms is None:
            timestamp_ms = self._clock.wall_ms()
        with self._lock:
            wake = self.append(topic, value, key, headers, partition, timestamp_ms, delivery)
        if wake:
            self._wake.fire()
        return delivery

    def send_many_nowait(self, topic: str, keys: Sequence[bytes | None],
                         values: Sequence[bytes | None], headers: Sequence[Any],
                         timestamps_ms: Sequence[int]) -> Delivery:
        """Queue records of ``topic`` without waiting: the sequences are parallel, one entry
        per record; partitions as ``send_nowait`` picks them (no explicit partition). One
        ``Delivery`` for them all: done when every record is acknowledged (its result: the
        last one's metadata) or with the first error. The buffer bound is checked once,
        before the first record (the call may take the buffer past it by its own records).

        Raises ``anyio.WouldBlock`` (nothing queued) when the topic's metadata is not known
        yet or the buffer is full (``enqueue_many`` waits instead); else what ``send_nowait``
        raises (then the records before the offending one may be queued: a transaction
        must be aborted)."""
        count = len(keys)
        assert count and len(values) == len(headers) == len(timestamps_ms) == count
        assert self.settle is settle_deliveries, "a blocking front settles its own tokens"
        if self._serializing:
            keys, values = map(list, zip(*(serialize(self._config, key, value)
                                           for key, value in zip(keys, values))))
        delivery = Delivery()
        share = _SharedDelivery(delivery, count)
        with self._lock:
            wake = self._append_many(topic, keys, values, headers, timestamps_ms, share)
        if wake:
            self._wake.fire()
        return delivery

    async def enqueue_many(self, topic: str, keys: Sequence[bytes | None],
                           values: Sequence[bytes | None], headers: Sequence[Any],
                           timestamps_ms: Sequence[int]) -> Delivery:
        """``send_many_nowait``, waiting (at most ``max_block_ms``) for the topic's metadata
        or buffer space as ``enqueue`` does. Always a checkpoint."""
        return await self._queue_when_possible(topic, functools.partial(
            self.send_many_nowait, topic, keys, values, headers, timestamps_ms))

    async def _queue_when_possible(self, topic: str, queue: Callable[[], Delivery]) -> Delivery:
        """``queue()`` (a ``send_nowait``), waiting while it would block for the topic's
        metadata or buffer space, at most ``max_block_ms``. Always a checkpoint."""
        deadline = self._clock.monotonic_ms() + self._config.max_block_ms
        while True:
            try:
                delivery = queue()
            except anyio.WouldBlock:
                self._wake.fire()
                await self._wait_for_capacity(topic, deadline)
                continue
            await anyio.lowlevel.checkpoint()
            return delivery

    def _append_many(self, topic: str, keys: Sequence[bytes | None],
                     values: Sequence[bytes | None], headers: Sequence[Any],
                     timestamps_ms: Sequence[int], token: Any) -> bool:
        """``append`` for many records of one topic (``_lock`` held): the checks once."""
        count = self._checked_partition_count(topic, None)
        try:
            return self._acc.append_many(topic, timestamps_ms, keys, values, headers, token,
                                         self._clock.monotonic_ms(), count)
        except RecordTooLargeError as error:
            raise MessageTooLargeError(str(error)) from error

    def append(self, topic: str, value: bytes | None, key: bytes | None, headers: Any,
               partition: int | None, timestamp_ms: int, token: Any) -> bool:
        """Append one (serialized) record with ``token`` to the accumulator; call with
        ``_lock`` held (any thread). True when the sender must be woken (a batch opened or
        sealed, or the topic's metadata is wanted: then it also raises).

        Raises:
            anyio.WouldBlock: the topic's metadata is not known yet (asked for: fire
                ``_wake``), or the buffer is full; wait for ``capacity_error`` or progress.
            ClosedError, BrokerError (invalid topic, partition out of range),
            MessageTooLargeError, TypeError: as the blocking ``Producer.send``.
        """
        count = self._checked_partition_count(topic, partition)
        try:
            return self._acc.append(topic, partition, timestamp_ms, key, value, headers or (),
                                    token, self._clock.monotonic_ms(), count)
        except RecordTooLargeError as error:
            raise MessageTooLargeError(str(error)) from error

    def _checked_partition_count(self, topic: str, partition: int | None) -> int:
        """The checks before an append (``_lock`` held): open, the transaction's state,
        the topic's partition count (which it returns), ``partition`` in range, room in the
        buffer. Raises as ``append``."""
        if self._closed:
            raise ClosedError("send after the producer closed")
        if self._txn_check is not None:
            self._txn_check()
        count = self._known_partition_count(topic)
        if count is None:
            raise anyio.WouldBlock
        if partition is not None and not 0 <= partition < count:
            raise UnknownTopicOrPartitionError(
                f"partition {partition} of {topic!r} does not exist ({count} partitions)"
            )
        if not self._acc.has_room():
            raise anyio.WouldBlock
        return count

    def capacity_error(self, topic: str) -> RivvenError:
        """Why a record for ``topic`` could not be queued within ``max_block_ms`` (``_lock``
        held): no metadata (and why), or a full buffer."""
        if self._metadata.partition_count(topic) is None:
            error = self._cluster.last_error
            if error is not None and self._metadata.version == 0:
                return ConnectionFailedError(f"no broker reachable: {error.message}")
            code = self._metadata.topic_error(topic)
            return ClientTimeoutError(
                f"topic {topic!r} not in metadata after max_block_ms="
                f"{self._config.max_block_ms}" + (f" ({code.name})" if code else ""))
        return BufferExhaustedError(
            f"buffer of {self._acc.buffer_memory_bytes} bytes still full after "
            f"max_block_ms={self._config.max_block_ms}")

    async def _wait_for_capacity(self, topic: str, deadline: int) -> None:
        remaining = deadline - self._clock.monotonic_ms()
        with self._lock:
            known = self._metadata.partition_count(topic) is not None
            if remaining <= 0:
                raise self.capacity_error(topic)
        if not known:
            await self._cluster.changed.wait(min(remaining, _IDLE_WAIT_MS))
        else:
            await self._progress.wait(min(remaining, _IDLE_WAIT_MS))

    async def flush(self, timeout_ms: int | None = None) -> None:
        """Send everything buffered now and wait until each of those records completed.

        Raises:
            ClientTimeoutError: records still pending after ``timeout_ms``.
        """
        with self._lock:
            pending = self._acc.incomplete()
            self._acc.flushes_in_progress += 1
        try:
            self._wake.fire()
            with anyio.move_on_after(float("inf") if timeout_ms is None else timeout_ms / 1000):
                while any(not batch.done for batch in pending):
                    await self._progress.wait()
                return
            left = sum(batch.record_count for batch in pending if not batch.done)
            raise ClientTimeoutError(f"flush timed out with {left} records pending")
        finally:
            with self._lock:
                self._acc.flushes_in_progress -= 1

    # --- transactions (as the blocking Producer's; timeouts default to max_block_ms) -------
    async def init_transactions(self, timeout_ms: int | None = None) -> None:
        """Get the producer id of ``transactional_id``, fencing older instances.

        Raises:
            InvalidTxnStateError, ProducerFencedError (fatal), ClientTimeoutError.
        """
        with self._lock:
            result = self._transactions().init_transactions()
        await self._await(result, timeout_ms)

    async def begin_transaction(self) -> None:
        """Start a transaction (local). Raises ``InvalidTxnStateError`` or the fatal error."""
        with self._lock:
            self._transactions().begin_transaction()
        await anyio.lowlevel.checkpoint()

    async def send_offsets_to_transaction(
        self, offsets: Any, group_id: Any, timeout_ms: int | None = None
    ) -> None:
        """Commit ``offsets`` ({TopicPartition: next offset}) of ``group_id`` (a group id or
        a consumer's ``group_metadata()``) with the transaction. Raises as the blocking one
        (CommitFailedError: abort, poll again, retry)."""
        converted = offsets_of(offsets)
        with self._lock:
            result = self._transactions().send_offsets(converted, group_id)
        await self._await(result, timeout_ms)

    async def commit_transaction(self, timeout_ms: int | None = None) -> None:
        """Flush the transaction's records, then commit it. Raises as the blocking one."""
        await self.flush(timeout_ms)
        with self._lock:
            result = self._transactions().begin_commit()
        await self._await(result, timeout_ms)

    async def abort_transaction(self, timeout_ms: int | None = None) -> None:
        """Abort the open transaction (queued records fail with TransactionAbortedError).
        Raises ClientTimeoutError when that takes longer than ``timeout_ms``."""
        with self._lock:
            txn = self._transactions()
        finished = False
        error = TransactionAbortedError("the transaction was aborted before this was sent")
        with anyio.move_on_after(self._timeout_ms(timeout_ms) / 1000):
            while True:
                with self._lock:
                    outcomes, finished = self._core.abort_transaction_records(error)
                self._finish(outcomes)
                if finished:
                    break
                await self._progress.wait(_IDLE_WAIT_MS)
        if not finished:
            raise ClientTimeoutError("the transaction's records were not settled in time")
        with self._lock:
            result = txn.begin_abort()
        await self._await(result, timeout_ms)

    def _transactions(self) -> TransactionManager:
        txn = self._core.txn
        if txn is None or not txn.transactional:
            raise InvalidTxnStateError("the producer has no transactional_id")
        return txn

    def _timeout_ms(self, timeout_ms: int | None) -> int:
        return self._config.max_block_ms if timeout_ms is None else timeout_ms

    async def _await(self, result: TxnResult, timeout_ms: int | None) -> None:
        self._wake.fire()
        with anyio.move_on_after(self._timeout_ms(timeout_ms) / 1000):
            while not result.done:
                await self._progress.wait(_IDLE_WAIT_MS)
        if not result.done:
            raise ClientTimeoutError("the transaction coordinator did not answer in time")
        if result.error is not None:
            raise result.error

    def partition_count(self, topic: str) -> int | None:
        return self._metadata.partition_count(topic)

    def _known_partition_count(self, topic: str) -> int | None:
        """The topic's partition count, or None after asking for its metadata (``_lock``
        held). Raises the topic's error when it is final (an invalid or unknown topic that
        metadata will not fix)."""
        count = self._metadata.partition_count(topic)
        if count is None:
            code = self._metadata.topic_error(topic)
            if code is not None and not code.retriable:
                raise error_for(code, f"topic {topic!r}")
            self._metadata.add_topics([topic])
            self._metadata.request_update()
        return count

    async def partitions_for(self, topic: str) -> list[int]:
        """The topic's partition numbers (fetching metadata, up to ``max_block_ms``).

        Raises as ``enqueue`` does for an unknown or invalid topic."""
        deadline = self._clock.monotonic_ms() + self._config.max_block_ms
        while True:
            with self._lock:
                count = self._known_partition_count(topic)
            if count is not None:
                return list(range(count))
            self._wake.fire()
            await self._wait_for_capacity(topic, deadline)

    def metrics(self) -> dict[str, int]:
        """A few live counters (buffered bytes and batches)."""
        with self._lock:
            return {"buffered_bytes": self._acc.buffered_bytes,
                    "incomplete_batches": len(self._acc.incomplete())}

    # --- the sender task -----------------------------------------------------------------------
    async def _run_sender(self) -> None:
        while not self._stopped:
            wait_ms = max(0, min(self._step(), _IDLE_WAIT_MS))
            self._sender_wake_at_ms = self._clock.monotonic_ms() + wait_ms
            await self._wake.wait(wait_ms)

    def _step_after_answers(self) -> None:
        """A connection's reader paired the answers of one receive: step now, on its turn,
        if a Produce answer among them asked for it (no task switch between an answer and
        the requests it lets out)."""
        if self._step_due:
            self._step_due = False
            self.step_now()

    def step_now(self) -> None:
        """Step outside the sender task, on the loop (a reader after answers; a blocking
        front's wake-up, called soon on the loop: one hop instead of a signal and a task
        switch). The sender task is woken only when this step wants an earlier next step
        than the one it sleeps until."""
        if self._stopped:
            return
        steps_max = self._config.max_in_flight_requests_per_connection + 1
        for _ in range(steps_max):  # again while the core has more for ready nodes now
            wait_ms = self._step()
            if wait_ms > 0:
                break
        if self._clock.monotonic_ms() + wait_ms < self._sender_wake_at_ms:
            self._wake.fire()

    def _node_ready(self, node_id: int) -> bool | None:
        address = self._metadata.address_of(node_id)
        if self._cluster.connection(address) is None:
            return None
        return self._in_flight.get(address, 0) < self._config.max_in_flight_requests_per_connection

    def _step(self) -> int:
        """One step of the sender (never awaits): what the core says, done; returns the ms
        until the next step is due."""
        lock = self._lock
        now = self._clock.monotonic_ms()
        with lock:
            step = self._core.step(now, self._node_ready)
        self._finish(step.failed)
        wait_ms = _IDLE_WAIT_MS if step.wake_at_ms is None else step.wake_at_ms - now
        if step.metadata_due:
            self._cluster.refresh_soon()  # its end wakes this task (on_update)
        retry_at = self._cluster.dial_waiting(step.dial, now)  # a dial's end wakes it too
        if retry_at is not None:
            wait_ms = min(wait_ms, max(retry_at - now, 1))
        for plan in step.plans:
            address = self._metadata.address_of(plan.node_id)
            for batch in plan.batches:
                batch.seal()
            self._in_flight[address] = self._in_flight.get(address, 0) + 1
            self._send_plan_soon(plan, address)
        with lock:
            call = self._core.next_coordinator_call(self._clock.monotonic_ms())
        if call is not None:
            self._nursery.start_soon(self._send_call, call)
        return wait_ms

    async def _send_call(self, call: CoordinatorCall) -> None:
        """One coordinator request to its broker (any, unless the core names one); the
        answer goes back to the core."""
        response, error = None, None
        try:
            if call.address is not None:  # the transactional id's coordinator
                conn = await self._cluster.connect(Address(*call.address))
            else:
                conn = await self._cluster.any_connection()
            if conn is None:
                raise ConnectionFailedError("no broker reachable for the coordinator")
            response = await conn.request(call.request, self._request_timeout_ms)
        except RivvenError as failure:
            error = failure
        except BaseException:  # cancelled: the call may be sent again
            lost = ConnectionFailedError("the coordinator request was cancelled")
            with self._lock:
                self._core.on_coordinator_answer(call, None, lost, self._clock.monotonic_ms())
            raise
        if self._stopped:
            return
        with self._lock:
            self._core.on_coordinator_answer(call, response, error, self._clock.monotonic_ms())
        self._progress.fire()
        self._wake.fire()

    def _send_plan_soon(self, plan: ProducePlan, address: Address) -> None:
        """Send one Produce request: at once, its answer handled by the connection's reader
        (``request_soon``), or, when the connection cannot take it so, by a task."""
        conn = self._cluster.connection(address)
        if conn is not None:
            with self._lock:
                request = self._core.produce_request(plan)

            def on_answer(response: Any, error: RivvenError | None) -> None:
                # an answer (not a failure, nor "sent, no answer expected") comes from the
                # connection's reader, which then steps the sender (``after_answers``)
                self._plan_answered(plan, address, response, error,
                                    reader_steps=response is not None)

            if conn.request_soon(request, self._request_timeout_ms, on_answer):
                return
        self._nursery.start_soon(self._send_plan, plan, address)

    async def _send_plan(self, plan: ProducePlan, address: Address) -> None:
        response, error = None, None
        try:
            with self._lock:
                request = self._core.produce_request(plan)
            conn = self._cluster.connection(address)
            if conn is None:
                raise ConnectionFailedError(f"not connected to {address}")
            response = await conn.request(request, self._request_timeout_ms)
        except RivvenError as failure:
            error = failure
        except BaseException:  # cancelled (shut down): its batches are failed there
            self._in_flight[address] -= 1
            raise
        self._plan_answered(plan, address, response, error)

    def _plan_answered(self, plan: ProducePlan, address: Address, response: Any,
                       error: RivvenError | None, *, reader_steps: bool = False) -> None:
        """A Produce request's answer (or failure) back to the core; settle what finished.
        Then the sender steps: at once in the reader's ``after_answers`` (``reader_steps``),
        else in its task, woken here."""
        try:
            if self._stopped:  # shut down meanwhile: its batches were failed there
                return
            core = self._core
            with self._lock:
                now = self._clock.monotonic_ms()
                if error is not None:
                    outcomes = core.on_request_failed(plan, error, now)
                elif core.expects_response:
                    outcomes = core.on_response(plan, response, now)
                else:
                    outcomes = core.on_sent_without_ack(plan)
            self._finish(outcomes)
        finally:
            self._in_flight[address] -= 1
            if reader_steps:
                self._step_due = True
            else:
                self._wake.fire()

    def _finish(self, outcomes: list[BatchOutcome]) -> None:
        """Settle the tokens of finished batches (never with ``_lock`` held: a delivery
        callback may send), then wake whoever waits for progress."""
        settle = self.settle
        for batch, base_offset, error in outcomes:
            if error is None:
                settle(batch.tokens, metadata_of(batch, base_offset), None)
            else:
                settle(batch.tokens, None, error)
        if outcomes:
            self._progress.fire()

    # --- closing -------------------------------------------------------------------------------
    def _shutdown(self) -> None:
        """Stop at once: fail whatever is left with ``ClosedError``. Never blocks."""
        self._closed = True
        self._stopped = True
        self._cluster.close()
        error = ClosedError("the producer closed before these records were delivered")
        with self._lock:
            outcomes = self._core.abort_queued(error)
            for batch in self._acc.incomplete():  # in flight: their request tasks are cancelled
                self._acc.complete(batch)
                outcomes.append(BatchOutcome(batch, -1, error))
        self._finish(outcomes)
        self._wake.fire()


def metadata_of(batch: Any, base_offset: int) -> list[RecordMetadata]:
    """The ``RecordMetadata`` of each record of an acknowledged batch, in order."""
    topic, partition = batch.topic, batch.partition
    new = tuple.__new__
    offset = base_offset
    step = 1 if base_offset >= 0 else 0  # acks=0: no offsets
    results = []
    for timestamp in batch.timestamps:
        results.append(new(RecordMetadata, (topic, partition, offset, timestamp)))
        offset += step
    return results


def settle_deliveries(tokens: list[Delivery], results: list[RecordMetadata] | None,
                      error: RivvenError | None) -> None:
    if error is None:
        assert results is not None
        for delivery, result in zip(tokens, results):
            delivery._resolve(result, None)
    else:
        for delivery in tokens:
            delivery._resolve(None, error)


@asynccontextmanager
async def open_producer(
    bootstrap: str | None = None, *, env: Any = None, bridge: Bridge | None = None,
    **options: Any
) -> AsyncIterator[AsyncProducer]:
    """An async ``Producer`` for the body of an ``async with``; options as the blocking one.

    On a normal exit it flushes (bounded by ``delivery_timeout_ms``), then closes; on an
    exception it closes at once, failing pending records with ``ClosedError``.
    """
    bootstrap, _ = bootstrap_and_topics(() if bootstrap is None else (bootstrap,), None,
                                        options, takes_topics=False)
    async with open_task_group() as nursery:
        producer = AsyncProducer(bootstrap, env or ClientEnv(), nursery, bridge=bridge, **options)
        nursery.start_soon(producer._run_sender)
        try:
            yield producer
            producer._closed = True
            if producer.flush_on_exit:
                await producer.flush(producer._config.delivery_timeout_ms)
        finally:
            producer._shutdown()
            nursery.cancel_scope.cancel()
