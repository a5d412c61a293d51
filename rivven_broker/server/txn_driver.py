"""The transaction coordinator's trio driver: ``__transaction_state``, markers, ticks.

Theory of operation
-------------------
``TxnDriver`` runs the pure ``TransactionCoordinator`` (``coordinator/transaction_coordinator``)
and carries out its instructions (the contract is in ``coordinator/txn_events``); it keeps no
transaction state of its own.

- *Loading* (``run``, before the client listener opens): every record of the internal topic
  ``__transaction_state`` (one partition, ``cleanup.policy=compact``; created at the first
  append) is replayed through ``coordinator.load``; the markers of in-doubt transactions
  (PrepareCommit / PrepareAbort: the decision is durable, the markers may not be) are written
  again. Until then requests are answered ``COORDINATOR_LOAD_IN_PROGRESS``.
- *Requests* (InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn):
  ``begin`` feeds ``TxnRequestReceived``; a reply emitted at once is returned, otherwise a
  ``Pending`` waits for it (a reply that depends on an append is released once the append is
  durable).
- *Group membership* (KIP-447): a TxnOffsetCommit carrying a generation or member id (the
  consumer's ``group_metadata()``) from the transaction's current producer is first checked
  against the group coordinator (``context.groups``, same trio thread, so the answer is the
  group's state now): a member that left that generation is answered UNKNOWN_MEMBER_ID /
  ILLEGAL_GENERATION / FENCED_INSTANCE_ID for every partition and its offsets never enter the
  transaction. A stale producer skips the check: the coordinator answers it PRODUCER_FENCED.
- ``AppendTxnLog``: appended at once, in emission order, through the partition's
  ``PartitionTxnState``; a task waits until it is durable (under ``sync=always``; the other
  policies acknowledge on append, as they do for data) and feeds ``TxnLogAppended``. A
  storage error feeds ``TxnLogAppendFailed`` (the requester gets COORDINATOR_NOT_AVAILABLE).
- ``RequestProducerIds`` (a clustered broker): a task asks the controller for a block
  (``ClusterControl.allocate_producer_ids``) and feeds ``ProducerIdsGranted``, or
  ``TxnLogAppendFailed`` when the controller cannot answer (the parked InitProducerId requests
  get COORDINATOR_NOT_AVAILABLE, which clients retry).
- ``WriteMarkers``: a task appends a COMMIT or ABORT control batch to every partition of the
  transaction (each check-append-update without a checkpoint; a partition whose topic is gone
  is skipped; a storage error is retried with a doubling delay), pokes long-polling fetches,
  waits until every marker is durable, on commit hands the offsets to the group side
  (``offsets_sink``), and only then feeds ``MarkersWritten``: the coordinator's CompleteCommit
  record must never precede durable markers.
- ``TxnTick`` is fed when ``next_deadline_ms`` comes, at least once a second (timeouts).

Events are fed through one queue, so the instructions of one event are all carried out, in
order, before the next event is handled. Times are wall-clock ms (``env.clock.wall_ms``):
transaction start times are persisted and compared after restarts.

``marker_delay_ms`` (a broker setting for fault-injection tests, 0 by default) delays every
marker write after the decision, which lets a test kill the broker between the two.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Hashable, Iterator

import trio

from rivven_broker.coordinator.transaction_coordinator import TransactionCoordinator
from rivven_broker.coordinator.txn_events import (
    AppendTxnLog,
    MarkersWritten,
    ProducerIdsGranted,
    RequestProducerIds,
    TxnEvent,
    TxnInstruction,
    TxnLogAppended,
    TxnLogAppendFailed,
    TxnReply,
    TxnRequestReceived,
    TxnTick,
    WriteMarkers,
)
from rivven_broker.coordinator.txn_log_codec import TRANSACTION_STATE_TOPIC, PendingOffset
from rivven_broker.coordinator.txn_requests import error_response
from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.message_base import Request, Response
from rivven_broker.protocol.txn_messages import (
    AddOffsetsToTxn,
    AddPartitionsToTxn,
    EndTxn,
    InitProducerId,
    TxnOffsetCommit,
)
from rivven_broker.records.builder import BatchBuilder
from rivven_broker.records.control import ControlType
from rivven_broker.records.header import BatchError, BatchHeader
from rivven_broker.records.reader import decode_records
from rivven_broker.server.context import Pending, RequestContext
from rivven_broker.storage.errors import (
    StorageError,
    SyncFailedError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)

if TYPE_CHECKING:
    from rivven_broker.server.context import ServerContext
    from rivven_broker.server.producer_state_driver import ProducerStates
    from rivven_broker.storage.partition_log import PartitionLog

__all__ = ["TxnDriver", "OffsetsSink", "TXN_REQUEST_TYPES"]

log = logging.getLogger(__name__)

TXN_REQUEST_TYPES = (InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn)
#: ``offsets_sink(group_id, offsets, commit_timestamp_ms)``: make a committed transaction's
#: consumer offsets durable in ``__consumer_offsets`` and visible to the group coordinator.
OffsetsSink = Callable[[str, tuple[PendingOffset, ...], int], Awaitable[None]]

_TICK_MS_MAX = 1_000
_TICK_MS_MIN = 10
_READ_BYTES = 1 << 20
_MARKER_RETRY_MS = 100


class _Slot:
    """Where a request's reply lands."""

    __slots__ = ("event", "response")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.response: Response | None = None

    async def wait(self) -> Response:
        await self.event.wait()
        assert self.response is not None
        return self.response


class TxnDriver:
    """Runs the transaction coordinator of one broker. See the module docstring."""

    def __init__(
        self, context: ServerContext, states: ProducerStates, *, marker_delay_ms: int = 0,
        clustered: bool = False,
    ) -> None:
        assert marker_delay_ms >= 0
        self._context = context
        self._states = states
        self._marker_delay_ms = marker_delay_ms
        self.coordinator = TransactionCoordinator(producer_ids_from_controller=clustered)
        #: Set by the group side once it runs (H11's group driver); None: offsets are dropped
        #: with a warning.
        self.offsets_sink: OffsetsSink | None = None
        self._slots: dict[Hashable, _Slot] = {}
        self._tokens = itertools.count(1)
        self._events: deque[TxnEvent] = deque()
        self._feeding = False
        self._loaded = False
        self._nursery: trio.Nursery | None = None
        self._tick = trio.Event()

    # --- running ---------------------------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Load ``__transaction_state``, then tick until cancelled. Blocks.

        Raises:
            CorruptTxnRecordError: a record of ``__transaction_state`` is malformed.
            SyncFailedError: an fsync failed (the broker must stop).
        """
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            instructions = self.coordinator.load(self._read_log())
            self._loaded = True
            if instructions:
                log.info("completing %d in-doubt transactions", len(instructions))
            self._carry_out(instructions)
            self._drain_events()
            task_status.started()
            await self._tick_loop()

    def _read_log(self) -> Iterator[tuple[bytes, bytes | None]]:
        logs = self._context.logs
        if TRANSACTION_STATE_TOPIC not in logs.topics():
            return
        plog = logs.get_log(TRANSACTION_STATE_TOPIC, 0)
        offset = plog.log_start_offset
        while offset < plog.log_end_offset:
            result = plog.read(offset, _READ_BYTES)
            for record in decode_records(result.records, min_offset=offset):
                assert record.key is not None, "a __transaction_state record without a key"
                yield record.key, record.value
            offset = result.next_offset

    async def _tick_loop(self) -> None:
        """Feed ``TxnTick`` at the coordinator's next deadline (at least once a second);
        every other event re-arms the timer (it may bring the deadline forward)."""
        clock = self._context.env.clock
        while True:
            deadline = self.coordinator.next_deadline_ms()
            wait_ms = _TICK_MS_MAX
            if deadline is not None:
                wait_ms = min(max(deadline - clock.wall_ms(), _TICK_MS_MIN), _TICK_MS_MAX)
            self._tick = trio.Event()
            with trio.move_on_after(wait_ms / 1000):
                await self._tick.wait()
            if not self._tick.is_set():
                self._feed(TxnTick())

    # --- requests --------------------------------------------------------------------------

    def handlers(self) -> dict[type[Request], Callable[[Any, RequestContext], Response | Pending]]:
        """The request handlers this driver serves, for the broker's dispatch table."""
        return {cls: self.begin for cls in TXN_REQUEST_TYPES}

    def begin(self, request: Any, call: RequestContext) -> Response | Pending:
        """Hand a transaction request to the coordinator. Never blocks."""
        if not self._loaded or self._nursery is None:
            return error_response(request, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        if isinstance(request, TxnOffsetCommit):
            refused = self._membership_error(request)
            if refused is not None:
                return error_response(request, refused)
        token = next(self._tokens)
        slot = self._slots[token] = _Slot()
        self._feed(TxnRequestReceived(token, request))
        if slot.response is not None:
            return slot.response
        return Pending(slot.wait)

    def _membership_error(self, request: TxnOffsetCommit) -> ErrorCode | None:
        """Why the group refuses this commit's membership (module docstring), or None."""
        if request.generation_id == -1 and not request.member_id:
            return None
        meta = self.coordinator.metadata(request.transactional_id)
        if meta is None or (meta.producer_id, meta.producer_epoch) != (
            request.producer_id, request.producer_epoch
        ):
            return None  # the coordinator's own answer (fenced, unknown id) comes first
        groups = self._context.groups
        if groups is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return groups.check_txn_member(
            request.group_id, request.generation_id, request.member_id,
            request.group_instance_id,
        )

    def check_produce(
        self, transactional_id: str | None, header: BatchHeader, topic: str, partition: int
    ) -> ErrorCode:
        """May this transactional batch be appended now? Pure; never blocks."""
        if transactional_id is None:
            return ErrorCode.INVALID_REQUEST
        if not self._loaded:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return self.coordinator.check_produce(
            transactional_id, header.producer_id, header.producer_epoch, topic, partition
        )

    # --- events and instructions -----------------------------------------------------------

    def _feed(self, event: TxnEvent) -> None:
        self._events.append(event)
        if not self._feeding:
            self._drain_events()

    def _drain_events(self) -> None:
        self._feeding = True
        try:
            while self._events:
                event = self._events.popleft()
                now_ms = self._context.env.clock.wall_ms()
                self._carry_out(self.coordinator.handle(event, now_ms))
                if not isinstance(event, TxnTick):
                    self._tick.set()  # re-arm the timer: the next deadline may have moved
        finally:
            self._feeding = False

    def _carry_out(self, instructions: list[TxnInstruction]) -> None:
        assert self._nursery is not None
        for instruction in instructions:
            if isinstance(instruction, TxnReply):
                slot = self._slots.pop(instruction.token, None)
                if slot is not None:
                    slot.response = instruction.response
                    slot.event.set()
            elif isinstance(instruction, AppendTxnLog):
                self._append_txn_log(instruction)
            elif isinstance(instruction, RequestProducerIds):
                self._nursery.start_soon(self._request_producer_ids, instruction)
            else:
                assert isinstance(instruction, WriteMarkers), instruction
                self._nursery.start_soon(self._write_markers, instruction)

    def _append_txn_log(self, instruction: AppendTxnLog) -> None:
        context = self._context
        now_ms = context.env.clock.wall_ms()
        try:
            plog = self._txn_log(now_ms)
            builder = BatchBuilder(batch_bytes_max=limits.max_message_bytes_default)
            builder.append(now_ms, instruction.key, instruction.value)
            state = self._states.get(TRANSACTION_STATE_TOPIC, 0, plog)
            outcome = state.append(builder.build(), now_ms, _no_transactions)
            assert outcome.info is not None, outcome
            context.sync_worker.mark_dirty(plog)
        except SyncFailedError:
            raise
        except (StorageError, BatchError, OSError) as exc:
            log.error("appending to %s failed: %s", TRANSACTION_STATE_TOPIC, exc)
            self._events.append(TxnLogAppendFailed(instruction.append_id))
            return
        assert self._nursery is not None
        self._nursery.start_soon(
            self._when_durable, plog, outcome.info.last_offset, instruction.append_id
        )

    async def _request_producer_ids(self, instruction: RequestProducerIds) -> None:
        """A block of producer ids from the controller (bounded by its propose timeout)."""
        cluster = self._context.cluster
        block = None
        if cluster is not None:
            block = await cluster.allocate_producer_ids(instruction.count)
        if block is None:
            self._feed(TxnLogAppendFailed(instruction.append_id))
        else:
            self._feed(ProducerIdsGranted(instruction.append_id, *block))

    def _txn_log(self, now_ms: int) -> PartitionLog:
        logs = self._context.logs
        if TRANSACTION_STATE_TOPIC not in logs.topics():
            try:
                logs.create_topic(
                    TRANSACTION_STATE_TOPIC, 1, 1, {"cleanup.policy": "compact"}, now_ms
                )
                log.info("created internal topic %s", TRANSACTION_STATE_TOPIC)
            except TopicExistsError:
                pass
        return logs.get_log(TRANSACTION_STATE_TOPIC, 0)

    async def _when_durable(self, plog: PartitionLog, last_offset: int, append_id: int) -> None:
        await self._context.sync_worker.wait_durable(plog, last_offset)
        self._feed(TxnLogAppended(append_id))

    # --- markers ---------------------------------------------------------------------------

    async def _write_markers(self, instruction: WriteMarkers) -> None:
        context = self._context
        if self._marker_delay_ms:
            await context.env.clock.sleep_ms(self._marker_delay_ms)
        kind = ControlType.COMMIT if instruction.committed else ControlType.ABORT
        remaining = list(instruction.partitions)
        written: list[tuple[PartitionLog, int]] = []
        delay_ms = _MARKER_RETRY_MS
        while remaining:
            remaining = self._append_markers(instruction, kind, remaining, written)
            if remaining:
                await context.env.clock.sleep_ms(delay_ms)
                delay_ms = min(delay_ms * 2, limits.transaction_marker_retry_ms_max)
        for plog, offset in written:
            await context.sync_worker.wait_durable(plog, offset)
        if instruction.committed and instruction.offsets:
            await self._commit_offsets(instruction.offsets)
        self._feed(
            MarkersWritten(
                instruction.transactional_id,
                instruction.producer_id,
                instruction.producer_epoch,
                instruction.committed,
            )
        )

    def _append_markers(
        self,
        instruction: WriteMarkers,
        kind: ControlType,
        partitions: list[tuple[str, int]],
        written: list[tuple[PartitionLog, int]],
    ) -> list[tuple[str, int]]:
        """Append the marker to each partition now (no checkpoint); return those that failed."""
        context = self._context
        now_ms = context.env.clock.wall_ms()
        failed = []
        for topic, partition in partitions:
            try:
                plog = context.logs.get_log(topic, partition)
            except UnknownTopicOrPartitionError:
                continue  # deleted: nothing to end there
            try:
                offset = self._states.get(topic, partition, plog).append_marker(
                    kind, instruction.producer_id, instruction.producer_epoch, now_ms
                )
            except SyncFailedError:
                raise
            except (StorageError, OSError) as exc:
                log.error("writing a %s marker to %s-%d failed: %s", kind.name, topic,
                          partition, exc)
                failed.append((topic, partition))
                continue
            if offset is not None:
                context.sync_worker.mark_dirty(plog)
                context.waker.poke((topic, partition))
                written.append((plog, offset))
        return failed

    async def _commit_offsets(self, offsets: tuple[PendingOffset, ...]) -> None:
        by_group: dict[str, list[PendingOffset]] = {}
        for offset in offsets:
            by_group.setdefault(offset.group_id, []).append(offset)
        sink = self.offsets_sink
        now_ms = self._context.env.clock.wall_ms()
        for group_id, group_offsets in sorted(by_group.items()):
            if sink is None:
                log.warning("no group coordinator: dropping %d transactional offsets of %s",
                            len(group_offsets), group_id)
                continue
            delay_ms = _MARKER_RETRY_MS
            while True:  # the commit is decided: the offsets must land, however long it takes
                try:
                    await sink(group_id, tuple(group_offsets), now_ms)
                    break
                except SyncFailedError:
                    raise
                except (StorageError, OSError) as exc:
                    log.error("committing the offsets of %s failed: %s; retrying", group_id, exc)
                await self._context.env.clock.sleep_ms(delay_ms)
                delay_ms = min(delay_ms * 2, limits.transaction_marker_retry_ms_max)

    # --- statistics --------------------------------------------------------------------------

    def statistics(self) -> dict[str, int]:
        """The coordinator's counts plus replies still awaited."""
        stats = self.coordinator.statistics()
        stats["replies_waiting"] = len(self._slots)
        return stats


def _no_transactions(header: BatchHeader) -> ErrorCode:
    """``__transaction_state`` takes no transactional batches."""
    return ErrorCode.INVALID_REQUEST
