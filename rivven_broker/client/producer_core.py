"""The producer's sender logic, shared by the blocking and the trio driver.

Theory of operation
-------------------
A driver owns sockets, a clock and a thread or task; this core owns every decision:

- ``step(now_ms, node_ready)`` is called whenever the sender wakes. It fails batches whose
  delivery deadline passed while queued, drains the ready batches into ``ProducePlan``s (one
  request per node that can take one), counts an attempt on each, says whether metadata must
  be fetched first and when to wake next.
- ``produce_request(plan)`` builds the request (after the driver sealed the batches, which may
  compress, outside its lock).
- ``on_response`` / ``on_request_failed`` turn an answer or a lost connection into
  ``BatchOutcome``s for finished batches; retriable failures go back to the accumulator with a
  backoff (``RetryPolicy``) as long as the batch's ``delivery_timeout_ms`` allows, and mark
  metadata stale when the error says the leader moved.

With ``acks=0`` the broker answers nothing: a batch is done once written, with offset -1.
``idempotent=True`` and ``transactional_id`` are accepted ahead of the exactly-once milestone:
until the broker grants producer ids they mean ``acks=all`` and no retries (a retry without
sequence numbers could duplicate; see docs/client.md).

Pure: ``now_ms`` and the ``random.Random`` are injected; nothing blocks.
"""

from __future__ import annotations

import random
from typing import Any, Callable, NamedTuple

from rivven_broker.client.accumulator import ProducePlan, ProducerBatch, RecordAccumulator
from rivven_broker.client.config import ConnectionConfig, ProducerConfig
from rivven_broker.client.errors import DeliveryTimeoutError, RivvenError, error_for
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


class SenderStep(NamedTuple):
    plans: list[ProducePlan]  # to seal and send now
    failed: list[BatchOutcome]  # batches that expired while queued
    wake_at_ms: int | None  # when to step again at the latest (None: when woken)
    metadata_due: bool  # send a Metadata request first


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
        exactly_once_pending = config.idempotent or config.transactional_id is not None
        self.acks = m.ACKS_ALL if exactly_once_pending else config.acks
        self.retry = RetryPolicy(
            retry_backoff_ms=connection.retry_backoff_ms,
            retry_backoff_max_ms=connection.retry_backoff_max_ms,
            retries_max=0 if exactly_once_pending else config.retries,
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

    def step(self, now_ms: int, node_ready: Callable[[int], bool]) -> SenderStep:
        """Decide what the sender does now (see the module docstring)."""
        acc = self.accumulator
        failed = [
            BatchOutcome(batch, -1, self._expired_error(batch))
            for batch in acc.expired(now_ms)
        ]
        for outcome in failed:
            acc.complete(outcome.batch)
        drained = acc.drain(now_ms, self.metadata.leader_for, node_ready)
        if drained.unknown_leader:
            self.metadata.request_update()
        for plan in drained.plans:
            for batch in plan.batches:
                batch.attempts += 1
        wake_at = drained.next_ready_ms
        metadata_due = bool(self.metadata.wanted) and self.metadata.needs_update(now_ms)
        if self.metadata.wanted:
            due = self.metadata.update_due_ms(now_ms)
            wake_at = due if wake_at is None else min(wake_at, due)
        deadline = self.accumulator.earliest_deadline_ms()
        if deadline is not None:
            wake_at = deadline if wake_at is None else min(wake_at, deadline)
        return SenderStep(drained.plans, failed, wake_at, metadata_due)

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
            transactional_id=None,  # sent once the broker speaks transactions
        )

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
        for batch, code, base_offset, message in results:
            if code == ErrorCode.NONE:
                self.accumulator.complete(batch)
                outcomes.append(BatchOutcome(batch, base_offset, None))
                continue
            error = error_for(code, f"producing to {batch.topic}-{batch.partition}: {message}"
                              if message else f"producing to {batch.topic}-{batch.partition}")
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
            outcomes.append(BatchOutcome(batch, -1, error))
        return outcomes
