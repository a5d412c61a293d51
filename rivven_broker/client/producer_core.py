"""The producer's sender logic, shared by the blocking and the trio driver.

Theory of operation
-------------------
A driver owns sockets, a clock and a thread or task; this core owns every decision:

- ``step(now_ms, node_ready)`` is called whenever the sender wakes. It fails batches whose
  delivery deadline passed while queued, drains the ready batches into ``ProducePlan``s (one
  request per node that can take one; ``node_ready`` says which can, and the leaders that
  are not connected come back in ``dial``), counts an attempt on each, says whether a Metadata
  request is due (``MetadataCache.refresh_due``: none in flight) and when to wake next (a
  refresh in flight wakes the driver with its answer).
- ``produce_request(plan)`` builds the request (after the driver sealed the batches, which may
  compress, outside its lock).
- ``on_response`` / ``on_request_failed`` turn an answer or a lost connection into
  ``BatchOutcome``s for finished batches; retriable failures go back to the accumulator with a
  backoff (``RetryPolicy``) as long as the batch's ``delivery_timeout_ms`` allows, and mark
  metadata stale when the error says the leader moved.

With ``acks=0`` the broker answers nothing: a batch is done once written, with offset -1.

Exactly-once (``ProducerConfig.idempotence``, on by default): a ``TransactionManager``
(``transaction_manager.py``) holds batches back until the producer has an id (and, in a
transaction, until their partition was added), stamps each batch with the producer id, epoch
and sequence when it is first drained (a retry resends the same bytes), and turns the
broker's sequence answers into decisions: ``duplicate`` and ``DUPLICATE_SEQUENCE`` are
successes, ``OUT_OF_ORDER_SEQUENCE`` behind an earlier batch still being retried is retried,
``UNKNOWN_PRODUCER_ID`` makes an idempotent producer take a new id and retry,
``PRODUCER_FENCED`` is fatal. Coordinator requests come from ``next_coordinator_call`` and
their answers go to ``on_coordinator_answer``.

Pure: ``now_ms`` and the ``random.Random`` are injected; nothing blocks.
"""

from __future__ import annotations

import random
from typing import Any, Callable, NamedTuple

from rivven_broker.client.accumulator import ProducePlan, ProducerBatch, RecordAccumulator
from rivven_broker.client.config import ConnectionConfig, ProducerConfig
from rivven_broker.client.errors import DeliveryTimeoutError, RivvenError, error_for
from rivven_broker.client.transaction_manager import CoordinatorCall, TransactionManager
from rivven_broker.client.metadata import MetadataCache
from rivven_broker.client.requests import produce_request, produce_results
from rivven_broker.client.retry import RetryPolicy
from rivven_broker.protocol import messages as m
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.records.partitioner import StickyPartitioner

__all__ = ["BatchOutcome", "SenderStep", "ProducerCore"]


class BatchOutcome(NamedTuple):
    """A finished batch: ``error`` None means stored at ``base_offset`` (-1 for acks=0)."""

    batch: ProducerBatch
    base_offset: int
    error: RivvenError | None


#: ``node_ready(node_id)``: True when the driver's connection to the node can take a request
#: now, False when it is connected but busy, None when it is not connected (to be dialled).
NodeReady = Callable[[int], "bool | None"]


class SenderStep(NamedTuple):
    plans: list[ProducePlan]  # to seal and send now
    failed: list[BatchOutcome]  # batches that expired while queued
    wake_at_ms: int | None  # when to step again at the latest (None: when woken)
    metadata_due: bool  # send a Metadata request first
    dial: list[int] = []  # leaders with batches waiting and no connection: dial them


class ProducerCore:
    """Sender decisions for one producer. Not thread-safe (drivers lock); never blocks."""

    def __init__(
        self,
        config: ProducerConfig,
        connection: ConnectionConfig,
        metadata: MetadataCache,
        rng: random.Random,
    ) -> None:
        self.config = config
        self.metadata = metadata
        self.rng = rng
        self.acks = config.acks
        self.txn: TransactionManager | None = None
        if config.idempotence:
            assert config.acks == m.ACKS_ALL
            self.txn = TransactionManager(
                transactional_id=config.transactional_id,
                transaction_timeout_ms=config.transaction_timeout_ms,
                retry_backoff_ms=connection.retry_backoff_ms,
                fallback_allowed=config.idempotent is None,
            )
        self.retry = RetryPolicy(
            retry_backoff_ms=connection.retry_backoff_ms,
            retry_backoff_max_ms=connection.retry_backoff_max_ms,
            retries_max=config.retries,
        )
        self.request_timeout_ms = connection.request_timeout_ms
        self.accumulator = RecordAccumulator(
            StickyPartitioner(rng),
            batch_size_bytes=config.batch_size_bytes,
            linger_ms=config.linger_ms,
            compression=config.compression,
            buffer_memory_bytes=config.buffer_memory_bytes,
            request_bytes_max=config.request_bytes_max,
            delivery_timeout_ms=config.delivery_timeout_ms,
        )

    @property
    def expects_response(self) -> bool:
        return self.acks != m.ACKS_NONE

    def step(self, now_ms: int, node_ready: NodeReady) -> SenderStep:
        """Decide what the sender does now (see the module docstring)."""
        acc = self.accumulator
        dial: dict[int, None] = {}

        def ready(node_id: int) -> bool:
            answer = node_ready(node_id) if self.metadata.address_of(node_id) is not None else False
            if answer is None:
                dial[node_id] = None
            return bool(answer)

        txn = self.txn
        failed = [
            BatchOutcome(batch, -1, self._expired_error(batch))
            for batch in acc.expired(now_ms)
        ]
        if txn is not None and txn.fatal_error is not None:
            failed += [BatchOutcome(b, -1, txn.fatal_error) for b in acc.abort_all()]
        for outcome in failed:
            acc.complete(outcome.batch)
            if txn is not None:
                txn.failed(outcome.batch, outcome.error)
        drained = acc.drain(
            now_ms, self.metadata.leader_for, ready, None if txn is None else txn.can_drain
        )
        if drained.unknown_leader:
            self.metadata.request_update()
        for plan in drained.plans:
            for batch in plan.batches:
                batch.attempts += 1
                if txn is not None:
                    txn.assign(batch)
        wake_at = drained.next_ready_ms
        if txn is not None and txn.retry_at_ms > now_ms:
            wake_at = txn.retry_at_ms if wake_at is None else min(wake_at, txn.retry_at_ms)
        metadata = self.metadata
        metadata_due = metadata.refresh_due(now_ms)
        if metadata.wanted and not metadata.refresh_in_flight:  # its answer wakes the driver
            due = max(metadata.update_due_ms(now_ms), now_ms + 1)
            wake_at = due if wake_at is None else min(wake_at, due)
        deadline = self.accumulator.earliest_deadline_ms()
        if deadline is not None:
            wake_at = deadline if wake_at is None else min(wake_at, deadline)
        return SenderStep(drained.plans, failed, wake_at, metadata_due, list(dial))

    def _expired_error(self, batch: ProducerBatch) -> RivvenError:
        return DeliveryTimeoutError(
            f"{batch.record_count} records for {batch.topic}-{batch.partition} not delivered "
            f"within delivery_timeout_ms={self.config.delivery_timeout_ms} "
            f"after {batch.attempts} attempts"
        )

    def produce_request(self, plan: ProducePlan) -> m.Produce:
        """The request for ``plan``; every batch must be sealed."""
        return produce_request(
            plan,
            acks=self.acks,
            timeout_ms=self.request_timeout_ms,
            transactional_id=self.config.transactional_id,
        )

    # --- the coordinator (producer ids and transactions) --------------------------------------
    def next_coordinator_call(self, now_ms: int) -> CoordinatorCall | None:
        """The InitProducerId or transaction request to send now to any broker, if any."""
        return None if self.txn is None else self.txn.next_call(now_ms)

    def on_coordinator_answer(
        self, call: CoordinatorCall, response: Any, error: RivvenError | None, now_ms: int
    ) -> None:
        """The answer to (or failure of) ``call``."""
        assert self.txn is not None
        self.txn.on_call_done(call.call_id, response, error, now_ms)

    def abort_transaction_records(self, error: RivvenError) -> tuple[list[BatchOutcome], bool]:
        """Fail every queued batch of an aborting transaction (in-flight ones finish).

        Returns the outcomes and whether the records are done with: nothing of the
        transaction is queued or in flight, so the EndTxn(abort) may be sent. Until then the
        driver calls again whenever a request finishes (a failed one may requeue its batch).
        """
        assert self.txn is not None
        outcomes = self.abort_queued(error)
        return outcomes, self.txn.in_flight_batches == 0 and not self.accumulator.has_queued()

    def on_sent_without_ack(self, plan: ProducePlan) -> list[BatchOutcome]:
        """acks=0: the request is written, so its batches are done (offset -1)."""
        outcomes = []
        for batch in plan.batches:
            self.accumulator.complete(batch)
            outcomes.append(BatchOutcome(batch, -1, None))
        return outcomes

    def on_response(self, plan: ProducePlan, response: Any, now_ms: int) -> list[BatchOutcome]:
        """Outcomes of the batches the answer finished; retriable ones are requeued."""
        try:
            results = produce_results(plan, response)
        except RivvenError as error:  # an ErrorResponse for the whole request
            return self.on_request_failed(plan, error, now_ms)
        outcomes = []
        txn = self.txn
        for batch, code, base_offset, message in results:
            if txn is not None:
                txn.returned(batch)
                if code == ErrorCode.DUPLICATE_SEQUENCE:  # written long ago; offset unknown
                    code, base_offset = ErrorCode.NONE, -1
            if code == ErrorCode.NONE:
                self.accumulator.complete(batch)
                if txn is not None:
                    txn.acknowledged(batch)
                outcomes.append(BatchOutcome(batch, base_offset, None))
                continue
            error = error_for(code, f"producing to {batch.topic}-{batch.partition}: {message}"
                              if message else f"producing to {batch.topic}-{batch.partition}")
            if txn is not None and _retry_in_sequence(txn, batch, code):
                error.retriable = True
            outcome = self._failed(batch, error, now_ms)
            if outcome is not None:
                outcomes.append(outcome)
        return outcomes

    def on_request_failed(
        self, plan: ProducePlan, error: RivvenError, now_ms: int
    ) -> list[BatchOutcome]:
        """The whole request failed (connection lost, timed out, an ErrorResponse)."""
        outcomes = []
        for batch in plan.batches:
            if self.txn is not None:
                self.txn.returned(batch)
            outcome = self._failed(batch, error, now_ms)
            if outcome is not None:
                outcomes.append(outcome)
        return outcomes

    def _failed(self, batch: ProducerBatch, error: RivvenError, now_ms: int) -> BatchOutcome | None:
        decision = self.retry.decide(
            retriable=error.retriable,
            error_code=error.error_code,
            attempts=batch.attempts,
            now_ms=now_ms,
            deadline_ms=batch.deadline_ms,
            rng=self.rng,
        )
        if decision.refresh_metadata:
            self.metadata.request_update()
        if decision.retry:
            self.accumulator.reenqueue(batch, decision.retry_at_ms)
            return None
        self.accumulator.complete(batch)
        if self.txn is not None:
            self.txn.failed(batch, error)
        if error.retriable and decision.reason == "deadline passed":
            message = f"{self._expired_error(batch).message}; last error: {error}"
            timeout = DeliveryTimeoutError(message)
            timeout.__cause__ = error
            return BatchOutcome(batch, -1, timeout)
        return BatchOutcome(batch, -1, error)

    def abort_queued(self, error: RivvenError) -> list[BatchOutcome]:
        """Fail every queued batch with ``error`` (close without delivering)."""
        outcomes = []
        for batch in self.accumulator.abort_all():
            self.accumulator.complete(batch)
            if self.txn is not None:
                self.txn.failed(batch, error)
            outcomes.append(BatchOutcome(batch, -1, error))
        return outcomes


def _retry_in_sequence(txn: TransactionManager, batch: ProducerBatch, code: ErrorCode) -> bool:
    """Whether a sequence error is only the echo of an earlier batch being retried (or an
    unknown producer an idempotent producer recovers from with a new id)."""
    if code == ErrorCode.OUT_OF_ORDER_SEQUENCE:
        return not txn.is_oldest(batch)
    if code == ErrorCode.UNKNOWN_PRODUCER_ID:
        return txn.unknown_producer(batch)
    return False
