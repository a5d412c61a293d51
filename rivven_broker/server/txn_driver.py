"""The transaction coordinator's trio driver: ``__transaction_state``, markers, ticks.

Theory of operation
-------------------
``TxnDriver`` runs the pure ``TransactionCoordinator`` (``coordinator/transaction_coordinator``)
and carries out its instructions (the contract is in ``coordinator/txn_events``); it keeps no
transaction state of its own.

- *Shards*: each partition of ``__transaction_state`` coordinated here has its own
  coordinator, tick loop and tasks (``_Shard``); a transactional id belongs to partition
  ``transaction_partition_for(id, partitions)``. A single node has one partition (local,
  ``cleanup.policy=compact``, created at the first append), loaded in ``run`` before the
  client listener opens. A clustered broker's ``__transaction_state`` is a replicated topic of
  the metadata and it coordinates exactly the partitions it leads (``own``, after every
  applied change), as the group driver does: a partition gained is loaded from its replicated
  log in a task (COORDINATOR_LOAD_IN_PROGRESS meanwhile), a partition lost drops its shard
  (NOT_COORDINATOR for what it held; its marker tasks stop; the new leader re-issues the
  markers of in-doubt transactions from the log). InitProducerId without a transactional id
  goes, on a clustered broker, to the *id desk*: a coordinator with no log that only hands
  out producer ids, so every broker serves idempotent producers.
- *Loading*: every record of the shard's partition is replayed through ``coordinator.load``;
  the markers of in-doubt transactions (PrepareCommit / PrepareAbort: the decision is
  durable, the markers may not be) are written again.
- *Requests* (InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn):
  ``begin`` feeds ``TxnRequestReceived`` to the shard of the request's id; a reply emitted at
  once is returned, otherwise a ``Pending`` waits for it (a reply that depends on an append is
  released once the append is durable).
- *Group membership* (KIP-447): a TxnOffsetCommit carrying a generation or member id (the
  consumer's ``group_metadata()``) from the transaction's current producer is first checked
  against the group's coordinator: here (``context.groups``, same trio thread, so the answer
  is the group's state now) or, in a cluster, on the broker leading the group's partition
  (a ``check_txn_member`` call). A member that left that generation is answered
  UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION / FENCED_INSTANCE_ID for every partition and its
  offsets never enter the transaction. A stale producer skips the check: the coordinator
  answers it PRODUCER_FENCED.
- ``AppendTxnLog``: appended at once, in emission order, to the shard's partition through
  its ``Partition``; a task waits until it is durable (under ``sync=always``; the
  other policies acknowledge on append, as they do for data) and, in a cluster, until the
  partition's high watermark passes it, and feeds ``TxnLogAppended``. A storage error, or a
  leadership lost, feeds ``TxnLogAppendFailed`` (the requester gets COORDINATOR_NOT_AVAILABLE).
- ``RequestProducerIds`` (a clustered broker): a task asks the controller for a block
  (``ClusterControl.allocate_producer_ids``) and feeds ``ProducerIdsGranted``, or
  ``TxnLogAppendFailed`` when the controller cannot answer (the parked InitProducerId requests
  get COORDINATOR_NOT_AVAILABLE, which clients retry).
- ``WriteMarkers``: a task appends a COMMIT or ABORT control batch to every partition of the
  transaction - here, for the partitions this broker leads (a single node: all), else by a
  ``write_markers`` call to each partition's leader - (a partition whose topic is gone is
  skipped; a failure is retried with a doubling delay), waits until every marker is durable
  (in a cluster: below its partition's high watermark), on commit hands the offsets to the
  group side (here, ``offsets_sink``, or the group's coordinator by a ``commit_txn_offsets``
  call), and only then feeds ``MarkersWritten``: the coordinator's CompleteCommit record must
  never precede durable markers.
- *Produce checks*: a partition leader checks a transactional batch against the coordinator
  of its id (``check_produce``). Here: the pure check, synchronously. Remote (a cluster):
  the produce path must not wait on another broker for every batch, so it follows KIP-890
  (docs/adr/0003): a batch whose producer already has a transaction open in the partition at
  its epoch is appended at once; the first batch of a transaction in a partition is verified
  first by a ``verify_txn`` call (the data path holds that request, and only that
  connection's requests, until the answer), the verification is remembered for that
  partition, producer id and epoch, consumed by the append, and dropped by any marker for the
  producer there - so a batch verified before its transaction ended can never open a new,
  hanging one.
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
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable, NamedTuple

import trio

from rivven_broker.coordinator.offsets_codec import OFFSETS_TOPIC, offsets_partition_for
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
from rivven_broker.coordinator.txn_log_codec import (
    TRANSACTION_STATE_TOPIC,
    PendingOffset,
    transaction_partition_for,
)
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
from rivven_broker.records.control import ControlType, build_control_batch
from rivven_broker.records.header import HEADER_BYTES, BatchError, BatchHeader, parse_header
from rivven_broker.server.cluster.broker_calls import BrokerCallFailed, BrokerCalls
from rivven_broker.server.context import Pending, RequestContext
from rivven_broker.server.coordinator_shards import ownership_changes
from rivven_broker.server.log_replay import replay
from rivven_broker.storage.errors import (
    StorageError,
    SyncFailedError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)

if TYPE_CHECKING:
    from rivven_broker.server.context import ServerContext
    from rivven_broker.storage.partition import CommitRule, Partition, Partitions

__all__ = ["TxnDriver", "OffsetsSink", "TXN_REQUEST_TYPES"]

log = logging.getLogger(__name__)

#: An append awaiting commitment: the partition, the leadership it was appended under (None:
#: a single node) and its last offset.
_Written = tuple["Partition", "CommitRule | None", int]
TXN_REQUEST_TYPES = (InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn)
#: ``offsets_sink(group_id, offsets, commit_timestamp_ms)``: make a committed transaction's
#: consumer offsets durable in ``__consumer_offsets`` and visible to the group coordinator.
OffsetsSink = Callable[[str, tuple[PendingOffset, ...], int], Awaitable[None]]

_TICK_MS_MAX = 1_000
_TICK_MS_MIN = 10
_MARKER_RETRY_MS = 100
#: Verifications remembered at most (dropped by markers; cleared whole past this bound).
_VERIFIED_MAX = 100_000
_DESK = -1


class _Marker(NamedTuple):
    """A transaction's COMMIT or ABORT marker, its control batch built once for every
    partition it goes to (the same bytes everywhere: each log writes its own base offset,
    which the CRC does not cover; building it was ~30 us, 1.5 ms a transaction over 51
    partitions)."""

    kind: ControlType
    producer_id: int
    epoch: int
    now_ms: int
    batch: bytes

    @classmethod
    def build(cls, kind: ControlType, producer_id: int, epoch: int, now_ms: int) -> _Marker:
        return cls(kind, producer_id, epoch, now_ms,
                   build_control_batch(kind, producer_id, epoch, now_ms))


class _Slot:
    """Where a request's reply lands (and what to refuse it with if its shard goes)."""

    __slots__ = ("event", "response", "request")

    def __init__(self, request: Any) -> None:
        self.event = trio.Event()
        self.response: Response | None = None
        self.request = request

    async def wait(self) -> Response:
        await self.event.wait()
        assert self.response is not None
        return self.response


class _Shard:
    """The transactional ids of one ``__transaction_state`` partition coordinated here (or,
    partition -1, a clustered broker's id desk)."""

    def __init__(self, partition: int, epoch: int, coordinator: TransactionCoordinator) -> None:
        self.partition = partition
        self.epoch = epoch  # the partition's leader epoch it was loaded at (-1: not replicated)
        self.coordinator = coordinator
        self.loaded = False
        self.scope = trio.CancelScope()
        self.nursery: trio.Nursery | None = None
        self.tick = trio.Event()
        self.tokens: set[int] = set()
        self.gone = False


class TxnDriver:
    """Runs the transaction coordinators of one broker. See the module docstring."""

    def __init__(
        self, context: ServerContext, states: Partitions, *, marker_delay_ms: int = 0,
        clustered: bool = False, offsets_sink: OffsetsSink | None = None,
    ) -> None:
        assert marker_delay_ms >= 0
        self._context = context
        self._states = states
        self._marker_delay_ms = marker_delay_ms
        self.clustered = clustered
        #: Partitions of ``__transaction_state`` (a cluster's: as the metadata says).
        self.partitions = 1
        self._shards: dict[int, _Shard] = {}
        if clustered:
            self._desk = _Shard(_DESK, -1, TransactionCoordinator(
                producer_ids_from_controller=True))
        else:
            self._desk = self._shards[0] = _Shard(0, -1, TransactionCoordinator())
        #: The group side's commit of transactional offsets (``GroupDriver.commit_txn_offsets``);
        #: None: offsets are dropped with a warning.
        self.offsets_sink = offsets_sink
        self._slots: dict[int, _Slot] = {}
        self._tokens = itertools.count(1)
        self._events: deque[tuple[_Shard, TxnEvent]] = deque()
        self._feeding = False
        self._nursery: trio.Nursery | None = None
        #: ``(topic, partition, producer id, epoch)`` a remote coordinator verified (KIP-890).
        self._verified: set[tuple[str, int, int, int]] = set()

    @property
    def coordinator(self) -> TransactionCoordinator:
        """A single node's coordinator (a clustered broker's id desk)."""
        return self._desk.coordinator

    # --- running ---------------------------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Load (a single node: ``__transaction_state``), then tick until cancelled.

        Raises:
            CorruptTxnRecordError: a record of ``__transaction_state`` is malformed.
            SyncFailedError: an fsync failed (the broker must stop).
        """
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self._serve, self._desk)
            for shard in list(self._shards.values()):
                if shard is not self._desk:
                    nursery.start_soon(self._serve, shard)
            task_status.started()

    async def _serve(self, shard: _Shard, *, task_status: Any = trio.TASK_STATUS_IGNORED
                     ) -> None:
        with shard.scope:
            async with trio.open_nursery() as nursery:
                shard.nursery = nursery
                records = [] if shard.partition == _DESK else await self._read_log(shard)
                instructions = shard.coordinator.load(records)
                shard.loaded = True
                if instructions:
                    log.info("%s-%d: completing %d in-doubt transactions",
                             TRANSACTION_STATE_TOPIC, shard.partition, len(instructions))
                if shard.epoch >= 0:
                    log.info("%s-%d: coordinating its transactions at leader epoch %d",
                             TRANSACTION_STATE_TOPIC, shard.partition, shard.epoch)
                self._carry_out(shard, instructions)
                self._drain_events()
                task_status.started()
                await self._tick_loop(shard)

    async def _read_log(self, shard: _Shard) -> list[tuple[bytes, bytes | None]]:
        """The shard's partition, record by record, a chunk at a time."""
        logs = self._context.logs
        info = logs.topics().get(TRANSACTION_STATE_TOPIC)
        if info is None or shard.partition >= info.partitions:
            return []
        records = await replay(logs.get_log(TRANSACTION_STATE_TOPIC, shard.partition))
        assert all(key is not None for key, _ in records), "a record without a key"
        return records  # type: ignore[return-value]

    async def _tick_loop(self, shard: _Shard) -> None:
        """Feed ``TxnTick`` at the coordinator's next deadline (at least once a second);
        every other event re-arms the timer (it may bring the deadline forward)."""
        clock = self._context.env.clock
        while True:
            deadline = shard.coordinator.next_deadline_ms()
            wait_ms = _TICK_MS_MAX
            if deadline is not None:
                wait_ms = min(max(deadline - clock.wall_ms(), _TICK_MS_MIN), _TICK_MS_MAX)
            shard.tick = trio.Event()
            with trio.move_on_after(wait_ms / 1000):
                await shard.tick.wait()
            if not shard.tick.is_set():
                self._feed(shard, TxnTick())

    # --- ownership (clustered) ---------------------------------------------------------------

    def own(self, partitions: int, leading: dict[int, int]) -> None:
        """Coordinate the transactional ids of exactly the ``__transaction_state`` partitions
        this broker leads (``leading``: partition -> leader epoch). Never blocks."""
        assert self.clustered
        self.partitions = partitions
        drop, start = ownership_changes({p: s.epoch for p, s in self._shards.items()}, leading)
        for partition in drop:
            self._unload(self._shards[partition])
        for partition, epoch in start:
            shard = self._shards[partition] = _Shard(partition, epoch, TransactionCoordinator(
                producer_ids_from_controller=True))
            if self._nursery is not None:  # (else run() starts it)
                self._nursery.start_soon(self._serve, shard)

    def _unload(self, shard: _Shard) -> None:
        del self._shards[shard.partition]
        shard.gone = True
        shard.scope.cancel()
        for token in shard.tokens:
            slot = self._slots.pop(token, None)
            if slot is not None:
                slot.response = error_response(slot.request, ErrorCode.NOT_COORDINATOR)
                slot.event.set()
        log.info("%s-%d: no longer coordinating its transactions", TRANSACTION_STATE_TOPIC,
                 shard.partition)

    def coordinator_address(self, transactional_id: str) -> tuple[int, str, int] | None:
        """Where a clustered broker finds ``transactional_id``'s coordinator (None: no live
        leader of its partition, or the topic is not created yet)."""
        cluster = self._context.cluster
        assert self.clustered and cluster is not None
        record = cluster.image().topic(TRANSACTION_STATE_TOPIC)
        if record is None:
            return None
        partition = transaction_partition_for(transactional_id, len(record.partitions))
        return cluster.leader_address(TRANSACTION_STATE_TOPIC, partition)

    # --- requests --------------------------------------------------------------------------

    def handlers(self) -> dict[type[Request], Callable[[Any, RequestContext], Response | Pending]]:
        """The request handlers this driver serves, for the broker's dispatch table."""
        return {cls: self.begin for cls in TXN_REQUEST_TYPES}

    def _shard_for(self, transactional_id: str | None) -> _Shard | ErrorCode:
        """The loaded shard coordinating ``transactional_id`` here, or why there is none."""
        if transactional_id is None or not self.clustered:
            shard: _Shard | None = self._desk
        else:
            shard = self._shards.get(transaction_partition_for(transactional_id,
                                                               self.partitions))
        if shard is None:
            return ErrorCode.NOT_COORDINATOR
        if not shard.loaded:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return shard

    def begin(self, request: Any, call: RequestContext) -> Response | Pending:
        """Hand a transaction request to the coordinator of its id. Never blocks."""
        shard = self._shard_for(request.transactional_id)
        if isinstance(shard, ErrorCode):
            return error_response(request, shard)
        if isinstance(request, TxnOffsetCommit):
            refused = self._membership_error(request)
            if refused is _REMOTE:
                return Pending(lambda: self._begin_after_remote_check(shard, request))
            if refused is not None:
                return error_response(request, refused)  # type: ignore[arg-type]
        return self._hand_over(shard, request)

    def _hand_over(self, shard: _Shard, request: Any) -> Response | Pending:
        token = next(self._tokens)
        slot = self._slots[token] = _Slot(request)
        shard.tokens.add(token)
        self._feed(shard, TxnRequestReceived(token, request))
        if slot.response is not None:
            shard.tokens.discard(token)
            return slot.response

        async def wait() -> Response:
            try:
                return await slot.wait()
            finally:
                shard.tokens.discard(token)
                self._slots.pop(token, None)
        return Pending(wait)

    async def _begin_after_remote_check(self, shard: _Shard,
                                        request: TxnOffsetCommit) -> Response:
        code = await self._remote_member_check(request)
        if code is not None:
            return error_response(request, code)
        if shard.gone:
            return error_response(request, ErrorCode.NOT_COORDINATOR)
        answer = self._hand_over(shard, request)
        return await answer.wait() if isinstance(answer, Pending) else answer

    def _membership_error(self, request: TxnOffsetCommit) -> ErrorCode | object | None:
        """Why the group refuses this commit's membership (module docstring), None, or
        ``_REMOTE`` when the group's coordinator is another broker."""
        if request.generation_id == -1 and not request.member_id:
            return None
        shard = self._shard_for(request.transactional_id)
        assert not isinstance(shard, ErrorCode)
        meta = shard.coordinator.metadata(request.transactional_id)
        if meta is None or (meta.producer_id, meta.producer_epoch) != (
            request.producer_id, request.producer_epoch
        ):
            return None  # the coordinator's own answer (fenced, unknown id) comes first
        groups = self._context.groups
        if groups is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        code = groups.check_txn_member(
            request.group_id, request.generation_id, request.member_id,
            request.group_instance_id,
        )
        if code == ErrorCode.NOT_COORDINATOR and self.clustered:
            return _REMOTE
        return code

    async def _remote_member_check(self, request: TxnOffsetCommit) -> ErrorCode | None:
        body = {"group": request.group_id, "generation": request.generation_id,
                "member": request.member_id, "instance": request.group_instance_id}
        try:
            code = await self._call_group_coordinator(request.group_id, "check_txn_member", body)
        except BrokerCallFailed as exc:
            log.info("checking %s's membership failed: %s", request.group_id, exc)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return None if code is None else ErrorCode(code)

    # --- the produce path's check ------------------------------------------------------------

    def check_produce(
        self, transactional_id: str | None, header: BatchHeader, topic: str, partition: int
    ) -> ErrorCode:
        """May this transactional batch be appended now? Never blocks. A remote coordinator's
        answer is the verification the data path obtained first (``verify_remote``), or a
        transaction the producer already has open here at this epoch."""
        if transactional_id is None:
            return ErrorCode.INVALID_REQUEST
        shard = self._shard_for(transactional_id)
        if isinstance(shard, _Shard):
            return shard.coordinator.check_produce(
                transactional_id, header.producer_id, header.producer_epoch, topic, partition
            )
        if not self.clustered or shard != ErrorCode.NOT_COORDINATOR:
            return shard
        key = (topic, partition, header.producer_id, header.producer_epoch)
        if key in self._verified:
            self._verified.discard(key)
            return ErrorCode.NONE
        if self._open_here(topic, partition, header.producer_id, header.producer_epoch):
            return ErrorCode.NONE
        return ErrorCode.COORDINATOR_NOT_AVAILABLE  # (verified, then a marker ended it: retry)

    def _open_here(self, topic: str, partition: int, producer_id: int, epoch: int) -> bool:
        state = self._states.find(topic, partition)
        return state is not None and producer_id in state.state.ongoing_transactions() and (
            state.state.producer_epoch(producer_id) == epoch)

    def to_verify(self, transactional_id: str | None,
                  batches: Iterable[tuple[str, int, bytes]]) -> list[tuple[str, int, int, int]]:
        """Of a Produce's ``(topic, partition, records)``, the transactional batches whose
        coordinator is another broker and which would open a transaction in their partition:
        ``(topic, partition, producer id, epoch)`` to verify first. Never blocks."""
        if not self.clustered or transactional_id is None:
            return []
        if not isinstance(self._shard_for(transactional_id), ErrorCode):
            return []  # coordinated here: checked synchronously
        needed = []
        for topic, partition, records in batches:
            if len(records) < HEADER_BYTES:
                continue
            try:
                header = parse_header(records)
            except BatchError:
                continue  # the append refuses it
            if not header.is_transactional or header.producer_id < 0:
                continue
            key = (topic, partition, header.producer_id, header.producer_epoch)
            if key not in self._verified and not self._open_here(*key):
                needed.append(key)
        return needed

    async def verify_remote(self, transactional_id: str,
                            keys: list[tuple[str, int, int, int]]) -> dict[tuple[str, int],
                                                                           ErrorCode]:
        """Ask the id's coordinator whether these batches may open a transaction in their
        partitions; remember the ones it allows (``check_produce`` consumes them). Returns
        the refusals by partition. Bounded by the call timeout."""
        where = self.coordinator_address(transactional_id)
        refused = {(t, p): ErrorCode.COORDINATOR_NOT_AVAILABLE for t, p, _, _ in keys}
        if where is None:
            return refused
        calls = self._calls()
        if calls is None:
            return refused
        body = {"id": transactional_id, "batches": [list(k) for k in keys]}
        try:
            codes = await calls.call(where[0], "verify_txn", body)
        except BrokerCallFailed as exc:
            log.info("verifying %r's batches failed: %s", transactional_id, exc)
            return refused
        for key, code in zip(keys, codes):
            code = ErrorCode(code)
            if code == ErrorCode.NONE:
                if len(self._verified) >= _VERIFIED_MAX:
                    self._verified.clear()
                self._verified.add(key)
                refused.pop((key[0], key[1]), None)
            else:
                refused[(key[0], key[1])] = code
        return refused

    # --- answering other brokers' calls -------------------------------------------------------

    def call_handlers(self) -> dict[str, Callable[[int, Any], Awaitable[Any]]]:
        """What other brokers may ask this one (``BrokerCalls.handlers``)."""
        return {"verify_txn": self._serve_verify, "write_markers": self._serve_markers,
                "check_txn_member": self._serve_member_check,
                "commit_txn_offsets": self._serve_offsets}

    async def _serve_verify(self, caller: int, body: Any) -> list[int]:
        transactional_id = str(body["id"])
        shard = self._shard_for(transactional_id)
        codes = []
        for topic, partition, producer_id, epoch in body["batches"]:
            if isinstance(shard, ErrorCode):
                codes.append(int(shard))
            else:
                codes.append(int(shard.coordinator.check_produce(
                    transactional_id, int(producer_id), int(epoch), str(topic), int(partition))))
        return codes

    async def _serve_markers(self, caller: int, body: Any) -> list[int]:
        """Markers a coordinator asks this partition leader to write: a code per partition,
        NONE once the marker is below the partition's high watermark."""
        kind = ControlType.COMMIT if body["committed"] else ControlType.ABORT
        producer_id, epoch = int(body["producer_id"]), int(body["epoch"])
        written: list[_Written] = []
        codes, positions = [], {}
        marker = _Marker.build(kind, producer_id, epoch, self._context.env.clock.wall_ms())
        for topic, partition in body["partitions"]:
            before = len(written)
            codes.append(self._append_marker(str(topic), int(partition), marker, written))
            if len(written) > before:
                positions[before] = len(codes) - 1
        for index, ok in (await self._committed(written)).items():
            if not ok:
                codes[positions[index]] = ErrorCode.NOT_LEADER
        return [int(code) for code in codes]

    async def _serve_member_check(self, caller: int, body: Any) -> int | None:
        groups = self._context.groups
        if groups is None:
            return int(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        code = groups.check_txn_member(str(body["group"]), int(body["generation"]),
                                       str(body["member"]), body["instance"])
        return None if code is None else int(code)

    async def _serve_offsets(self, caller: int, body: Any) -> int:
        groups = self._context.groups
        if groups is None:
            return int(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        group = str(body["group"])
        offsets = tuple(PendingOffset(group, str(t), int(p), int(o), m)
                        for t, p, o, m in body["offsets"])
        try:
            await groups.commit_txn_offsets(group, offsets, int(body["timestamp"]))
        except StorageError as exc:
            log.info("transactional offsets of %s for broker %d: %s", group, caller, exc)
            return int(ErrorCode.NOT_COORDINATOR)
        return 0

    # --- events and instructions -----------------------------------------------------------

    def _feed(self, shard: _Shard, event: TxnEvent) -> None:
        self._events.append((shard, event))
        if not self._feeding:
            self._drain_events()

    def _drain_events(self) -> None:
        self._feeding = True
        try:
            while self._events:
                shard, event = self._events.popleft()
                if shard.gone or not shard.loaded:
                    continue
                now_ms = self._context.env.clock.wall_ms()
                self._carry_out(shard, shard.coordinator.handle(event, now_ms))
                if not isinstance(event, TxnTick):
                    shard.tick.set()  # re-arm the timer: the next deadline may have moved
        finally:
            self._feeding = False

    def _carry_out(self, shard: _Shard, instructions: list[TxnInstruction]) -> None:
        nursery = shard.nursery
        assert nursery is not None
        for instruction in instructions:
            if isinstance(instruction, TxnReply):
                slot = self._slots.pop(instruction.token, None)
                if slot is not None:
                    slot.response = instruction.response
                    slot.event.set()
            elif isinstance(instruction, AppendTxnLog):
                self._append_txn_log(shard, instruction)
            elif isinstance(instruction, RequestProducerIds):
                nursery.start_soon(self._request_producer_ids, shard, instruction)
            else:
                assert isinstance(instruction, WriteMarkers), instruction
                nursery.start_soon(self._write_markers, shard, instruction)

    def _append_txn_log(self, shard: _Shard, instruction: AppendTxnLog) -> None:
        context = self._context
        now_ms = context.env.clock.wall_ms()
        try:
            state = self._txn_log(shard, now_ms)
            builder = BatchBuilder(batch_bytes_max=limits.max_message_bytes_default)
            builder.append(now_ms, instruction.key, instruction.value)
            outcome = state.append_as_leader(builder.build(), now_ms, _no_transactions)
            assert outcome.info is not None, outcome
        except SyncFailedError:
            raise
        except (StorageError, BatchError, OSError) as exc:
            log.error("appending to %s-%d failed: %s", TRANSACTION_STATE_TOPIC,
                      shard.partition, exc)
            self._events.append((shard, TxnLogAppendFailed(instruction.append_id)))
            return
        assert shard.nursery is not None
        shard.nursery.start_soon(
            self._when_durable, shard, (state, state.rule, outcome.info.last_offset),
            instruction.append_id
        )

    async def _request_producer_ids(self, shard: _Shard, instruction: RequestProducerIds
                                    ) -> None:
        """A block of producer ids from the controller (bounded by its propose timeout)."""
        cluster = self._context.cluster
        block = None
        if cluster is not None:
            block = await cluster.allocate_producer_ids(instruction.count)
        if block is None:
            self._feed(shard, TxnLogAppendFailed(instruction.append_id))
        else:
            self._feed(shard, ProducerIdsGranted(instruction.append_id, *block))

    def _txn_log(self, shard: _Shard, now_ms: int) -> Partition:
        context = self._context
        logs = context.logs
        if self.clustered:  # the metadata's topic; only its leader appends
            state = context.partition(TRANSACTION_STATE_TOPIC, shard.partition)
            if state.rule is None:
                raise StorageError(f"{TRANSACTION_STATE_TOPIC}-{shard.partition} is not led "
                                   f"here any more")
            return state
        if TRANSACTION_STATE_TOPIC not in logs.topics():
            try:
                logs.create_topic(
                    TRANSACTION_STATE_TOPIC, 1, 1, {"cleanup.policy": "compact"}, now_ms
                )
                log.info("created internal topic %s", TRANSACTION_STATE_TOPIC)
            except TopicExistsError:
                pass
        return context.partition(TRANSACTION_STATE_TOPIC, 0)

    async def _when_durable(self, shard: _Shard, written: _Written, append_id: int) -> None:
        done = await self._committed([written])
        event = TxnLogAppended(append_id) if done[0] else TxnLogAppendFailed(append_id)
        self._feed(shard, event)

    async def _committed(self, written: list[_Written]) -> dict[int, bool]:
        """Wait until each ``(partition, rule, offset)`` is below its partition's high
        watermark (a single node: durable; a cluster: on every in-sync replica); which made
        it (False: leadership lost, or cut)."""
        return {index: await partition.wait_committed(offset, rule)
                for index, (partition, rule, offset) in enumerate(written)}

    # --- markers ---------------------------------------------------------------------------

    async def _write_markers(self, shard: _Shard, instruction: WriteMarkers) -> None:
        context = self._context
        if self._marker_delay_ms:
            await context.env.clock.sleep_ms(self._marker_delay_ms)
        kind = ControlType.COMMIT if instruction.committed else ControlType.ABORT
        remaining = list(instruction.partitions)
        delay_ms = _MARKER_RETRY_MS
        while remaining:
            remaining = await self._markers_round(instruction, kind, remaining)
            if remaining:
                await context.env.clock.sleep_ms(delay_ms)
                delay_ms = min(delay_ms * 2, limits.transaction_marker_retry_ms_max)
        if instruction.committed and instruction.offsets:
            await self._commit_offsets(instruction.offsets)
        self._feed(shard, MarkersWritten(
            instruction.transactional_id,
            instruction.producer_id,
            instruction.producer_epoch,
            instruction.committed,
        ))

    async def _markers_round(self, instruction: WriteMarkers, kind: ControlType,
                             partitions: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """Write the marker to every partition once (here, or by a call to its leader);
        return those still to do."""
        local: list[tuple[str, int]] = []
        remote: dict[int, list[tuple[str, int]]] = {}
        failed: list[tuple[str, int]] = []
        cluster = self._context.cluster if self.clustered else None
        for topic, partition in partitions:
            if cluster is None or self._leads_here(topic, partition):
                local.append((topic, partition))
                continue
            where = cluster.leader_address(topic, partition)
            if where is None:
                if cluster.image().topic(topic) is None:
                    continue  # deleted: nothing to end there
                failed.append((topic, partition))  # offline: later
            else:
                remote.setdefault(where[0], []).append((topic, partition))
        written: list[_Written] = []
        owners: list[tuple[str, int]] = []  # the partition of each written marker
        marker = _Marker.build(kind, instruction.producer_id, instruction.producer_epoch,
                               self._context.env.clock.wall_ms())
        for topic, partition in local:
            before = len(written)
            code = self._append_marker(topic, partition, marker, written)
            if code not in (ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION):
                failed.append((topic, partition))
            elif len(written) > before:
                owners.append((topic, partition))
        if remote:
            async with trio.open_nursery() as nursery:
                for node, parts in remote.items():
                    nursery.start_soon(self._remote_markers, node, parts, instruction, failed)
        done = await self._committed(written)
        failed += [owners[i] for i, ok in done.items() if not ok]
        return failed

    def _leads_here(self, topic: str, partition: int) -> bool:
        replicas = self._context.replicas
        return replicas is not None and replicas.leads_partition((topic, partition))

    def _append_marker(self, topic: str, partition: int, marker: _Marker,
                       written: list[_Written]) -> ErrorCode:
        """Append ``marker`` here now (no checkpoint); NONE when appended (``written`` gets
        it) or obsolete, else why not. Drops the producer's verifications there."""
        producer_id = marker.producer_id
        context = self._context
        try:
            state = context.partition(topic, partition)
        except UnknownTopicOrPartitionError:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if self.clustered and state.rule is None:
            return ErrorCode.NOT_LEADER
        try:
            offset = state.append_marker(marker.kind, producer_id, marker.epoch,
                                         marker.now_ms, marker.batch)
        except SyncFailedError:
            raise
        except (StorageError, OSError) as exc:
            log.error("writing a %s marker to %s-%d failed: %s", marker.kind.name, topic,
                      partition, exc)
            return getattr(exc, "code", ErrorCode.KAFKA_STORAGE_ERROR) or (
                ErrorCode.KAFKA_STORAGE_ERROR)
        if self._verified:
            self._verified = {k for k in self._verified
                              if (k[0], k[1], k[2]) != (topic, partition, producer_id)}
        if offset is not None:
            written.append((state, state.rule, offset))
        return ErrorCode.NONE

    async def _remote_markers(self, node: int, partitions: list[tuple[str, int]],
                              instruction: WriteMarkers, failed: list[tuple[str, int]]) -> None:
        calls = self._calls()
        if calls is None:
            failed.extend(partitions)
            return
        body = {"producer_id": instruction.producer_id, "epoch": instruction.producer_epoch,
                "committed": instruction.committed, "partitions": [list(p) for p in partitions]}
        try:
            codes = await calls.call(node, "write_markers", body)
        except BrokerCallFailed as exc:
            log.info("markers of %r at broker %d: %s", instruction.transactional_id, node, exc)
            failed.extend(partitions)
            return
        for part, code in zip(partitions, codes):
            if code not in (0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION):
                failed.append(part)

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
                    await self._commit_group_offsets(sink, group_id, group_offsets, now_ms)
                    break
                except SyncFailedError:
                    raise
                except (StorageError, OSError, BrokerCallFailed) as exc:
                    log.error("committing the offsets of %s failed: %s; retrying", group_id, exc)
                await self._context.env.clock.sleep_ms(delay_ms)
                delay_ms = min(delay_ms * 2, limits.transaction_marker_retry_ms_max)

    async def _commit_group_offsets(self, sink: OffsetsSink, group_id: str,
                                    offsets: list[PendingOffset], now_ms: int) -> None:
        groups = self._context.groups
        if not self.clustered or groups is None or groups.coordinates(group_id):
            await sink(group_id, tuple(offsets), now_ms)  # coordinated here
            return
        body = {"group": group_id, "timestamp": now_ms,
                "offsets": [[o.topic, o.partition, o.offset, o.metadata] for o in offsets]}
        code = await self._call_group_coordinator(group_id, "commit_txn_offsets", body)
        if code:
            raise StorageError(f"the coordinator of {group_id} answered {ErrorCode(code).name}")

    async def _call_group_coordinator(self, group_id: str, op: str, body: Any) -> Any:
        cluster, groups = self._context.cluster, self._context.groups
        assert cluster is not None and groups is not None
        where = cluster.leader_address(OFFSETS_TOPIC,
                                       offsets_partition_for(group_id, groups.partitions))
        calls = self._calls()
        if where is None or calls is None:
            raise BrokerCallFailed(f"the coordinator of {group_id} is not available")
        return await calls.call(where[0], op, body)

    def _calls(self) -> BrokerCalls | None:
        """The broker-to-broker calls (None until the cluster control runs)."""
        cluster = self._context.cluster
        return None if cluster is None else cluster.calls

    # --- statistics --------------------------------------------------------------------------

    def statistics(self) -> dict[str, int]:
        """The coordinators' counts (summed over the shards) plus replies still awaited."""
        totals: dict[str, int] = {}
        shards = {id(s): s for s in (self._desk, *self._shards.values())}
        for shard in shards.values():
            for name, value in shard.coordinator.statistics().items():
                if name in ("next_producer_id", "producer_id_block_end"):
                    if shard is self._desk:
                        totals[name] = value
                else:
                    totals[name] = totals.get(name, 0) + value
        totals["replies_waiting"] = len(self._slots)
        totals["verified_batches"] = len(self._verified)
        totals["shards"] = len(self._shards)
        return totals


#: ``_membership_error``'s answer when the group's coordinator is another broker.
_REMOTE = object()


def _no_transactions(header: BatchHeader) -> ErrorCode:
    """``__transaction_state`` takes no transactional batches."""
    return ErrorCode.INVALID_REQUEST
