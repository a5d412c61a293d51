"""The data path: Produce, Fetch, ListOffsets, OffsetsForLeaderEpoch, DescribeLogDirs and
DeleteRecords against the partition logs.

Theory of operation
-------------------
Every handler has a synchronous first half, run by the connection's reader in request order,
and, when it must wait, an asynchronous second half returned as a ``Pending``.

Produce (first half): for each partition, its ``Partition`` (``storage/partition.py``)
appends as the leader through ``PartitionLog.append``, which checks every
batch's header, size and CRC and appends all of them or none; batches of idempotent or
transactional producers are first checked against the partition's producer state (and the
transaction coordinator): a retried batch is answered with its original offsets and
``duplicate`` set (nothing written, but the answer still waits for those offsets to be
durable), a refused one with its code (``OUT_OF_ORDER_SEQUENCE``, ``PRODUCER_FENCED``,
``UNKNOWN_PRODUCER_ID``, ``INVALID_TXN_STATE`` ...). The partition marks its log dirty for
the sync worker. Because appends happen in the reader, a producer's pipelined requests land
in the log in the order it sent them. In the produce lane's pass the partition stages
instead (``storage/staged_appends.py``) and the pass writes each partition once before it
answers: every answer of a staged produce first takes the write's fate (``unwritten``: a
failed write answers its error, as a failed append does). acks=0 ends here with no answer. The second half waits
on the partitions, within the request's ``timeout_ms``: ``acks=all`` on a replicated leader
until the high watermark covers every appended batch (``Partition.wait_committed``: on disk
on every ISR member) — a leader deposed meanwhile answers ``NOT_LEADER`` —, otherwise (a
single node, or ``acks=1``) until the broker's own copy is durable under its sync policy
(``Partition.wait_durable``: the group commit under ``sync=always``; at once otherwise). A
producer that pipelines eight requests therefore waits on one shared group commit, not
eight fsyncs. Partitions still not covered at the deadline answer ``REQUEST_TIMED_OUT``
(their data stays appended).
A batch that fails any check answers ``CORRUPT_MESSAGE`` (bad magic, sizes, counts or CRC: one
code for all, as Kafka does) and nothing of that partition's request is appended.

Fetch reads each partition with ``log.read(offset, budget, max_offset=high_watermark,
zero_copy=True)``: whole batches as stored, never an object per record; large batches come as
a ``FileRegion`` that the connection sends with ``os.sendfile``, never read into the process. The response holds at most ``max_bytes``,
except that the first partition with data always gets at least one whole batch (so a consumer
cannot stall on a batch larger than its budget); a later partition whose first batch does not
fit gets nothing this time. If fewer than ``min_bytes`` are ready, the second half long-polls:
it registers an event under every partition it reads, sleeps until a high watermark there
moves (``ServerContext.waker``; never at an append: nothing above the high watermark is
served) or until ``max_wait_ms``, and reads again. Errors on a partition (unknown, out of range, storage) are per partition and end
the wait at once. A ``read_committed`` fetch reads only below the partition's last stable
offset (the first offset of its oldest open transaction, capped by the high watermark) and
carries the aborted transactions overlapping what it returns, from the partition's
aborted-transaction index, so the consumer can drop them; every response reports the LSO.

ListOffsets: -2 is the log start offset, -1 the high watermark (the LSO for
``read_committed``), any other timestamp the first
offset of the first batch whose max timestamp is at least it (-1 when that is at or beyond the
high watermark). DeleteRecords moves the log start offset (-1: to the high watermark); offsets
beyond the high watermark are ``OFFSET_OUT_OF_RANGE``. OffsetsForLeaderEpoch answers from the
partition's leader-epoch cache where an epoch ended (a log whose leader never changed: epoch 0,
up to its end), fenced by ``current_leader_epoch`` as Fetch is.

Storage errors map through their ``.code``; an ``OSError`` on a partition is
``KAFKA_STORAGE_ERROR`` for that partition. A failed fsync (``SyncFailedError``) is never
answered: it propagates and stops the broker.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Callable

import trio

from rivven_broker.file_region import FileRegion
from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.messages import (
    ACKS_ALL,
    ACKS_NONE,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    READ_COMMITTED,
    AbortedTransaction,
    DeleteRecords,
    DeleteRecordsPartitionResponse,
    DeleteRecordsResponse,
    DeleteRecordsTopicResponse,
    Fetch,
    FetchPartition,
    FetchPartitionResponse,
    FetchResponse,
    FetchTopicResponse,
    ListOffsets,
    ListOffsetsPartitionResponse,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
    EpochEndOffset,
    OffsetsForLeaderEpoch,
    DescribeLogDirs,
    DescribeLogDirsResponse,
    DescribeLogDirsTopicResponse,
    LogDirPartition,
    OffsetsForLeaderEpochPartition,
    OffsetsForLeaderEpochResponse,
    OffsetsForLeaderEpochTopicResponse,
    Produce,
    ProducePartitionResponse,
    ProduceResponse,
)
from rivven_broker.protocol.fast_codec import (
    produce_partition_appended,
    produce_response_of,
    produce_response_of_one,
)
from rivven_broker.protocol.names import topic_name_error
from rivven_broker.records.header import BatchError, BatchHeader
from rivven_broker.records.reader import iter_records
from rivven_broker.storage.errors import (
    CorruptRecordsError,
    StorageError,
    UnknownTopicOrPartitionError,
)
from rivven_broker.server.context import Pending, RequestContext, ServerContext
from rivven_broker.server.produce_answers import (
    OnePartitionWait,
    PartitionError,
    error_of,
    produce_error,
    unacknowledged,
)
from rivven_broker.server.internal_topics import INTERNAL_TOPICS
from rivven_broker.storage.partition import CommitRule, Partition
from rivven_broker.storage.staged_appends import StagedWrite
from rivven_broker.storage.sync_worker import SyncMode

if TYPE_CHECKING:
    from rivven_broker.protocol.produce_shape import ProduceShape
    from rivven_broker.server.metrics import BrokerMetrics
    from rivven_broker.storage.partition_log import PartitionLog

__all__ = ["DataPath"]

log = logging.getLogger(__name__)

#: ``(topic name, now_ms) -> None`` when the topic now exists, else the error to answer.
AutoCreate = Callable[[str, int], "PartitionError | None"]
_CORRUPTION_PLACES_MAX = 1024  # damaged places remembered for logging once
_NOT_TAKEN = object()  # the fast path did nothing: the general path decides


class DataPath:
    """Produce, Fetch, ListOffsets and DeleteRecords of one broker. See the module docstring."""

    def __init__(self, context: ServerContext, create_topic: AutoCreate) -> None:
        self._context = context
        self._auto_create = create_topic
        self._corruption_logged: set[tuple[str, int]] = set()

    # --- produce ---------------------------------------------------------------------------

    def produce(self, request: Produce, now_ms: int,
                txn_refused: dict[tuple[str, int], ErrorCode] | None = None, *,
                received_at: float | None = None
                ) -> ProduceResponse | Pending | OnePartitionWait | None:
        """Append every partition's batches (see the module docstring). Never blocks.
        ``txn_refused``: partitions answered with that code without appending (a remote
        coordinator's verification said no). ``received_at``: trio's clock when the request
        was read (its timeout runs from then), if the caller has it."""
        if txn_refused is None:
            answer = self._produce_one_partition(request, now_ms, received_at)
            if answer is not _NOT_TAKEN:
                return answer  # type: ignore[return-value]
        return self._produce_general(request, now_ms, txn_refused, received_at)

    def begin_produce(self, request: Produce, call: RequestContext
                      ) -> ProduceResponse | Pending | OnePartitionWait | None:
        """``produce`` as a handler (``Handlers``): the request's clocks from ``call``."""
        return self.produce(request, call.now_ms, received_at=call.received_at)

    def _produce_general(self, request: Produce, now_ms: int,
                         txn_refused: dict[tuple[str, int], ErrorCode] | None,
                         received_at: float | None) -> ProduceResponse | Pending | None:
        """``produce`` for every request (the fast path's differential tests call it)."""
        context = self._context
        txn = context.txn
        if txn_refused is None and request.transactional_id is not None and txn is not None:
            unverified = txn.to_verify(request.transactional_id, (
                (topic.name, part.partition, part.records)
                for topic in request.topics for part in topic.partitions))
            if unverified:
                return self._verify_then_produce(request, unverified)
        waits: list[tuple[tuple[str, int], Partition, CommitRule | None, int]] = []
        outcome: dict[tuple[str, int], ProducePartitionResponse] = {}
        staged: list[tuple[tuple[str, int], StagedWrite]] = []  # written at the pass's end
        records_in = 0
        fresh_only = True  # every wait is of batches appended now: only progress settles them
        cluster = context.cluster
        replicas = context.replicas
        replicated = replicas is not None and request.acks == ACKS_ALL
        for topic in request.topics:
            topic_error = self._produce_topic_error(topic.name, now_ms)
            for part in topic.partitions:
                key = (topic.name, part.partition)
                if topic_error is not None:
                    outcome[key] = produce_error(part.partition, topic_error)
                    continue
                if txn_refused and key in txn_refused:
                    code = txn_refused[key]
                    outcome[key] = produce_error(part.partition, (code, code.description))
                    continue
                if replicas is not None:  # only the partition's leader appends
                    refused = replicas.produce_error(key, replicated)
                    if refused is not None:
                        outcome[key] = produce_error(part.partition, refused)
                        continue
                elif cluster is not None:  # the replicas start with the controller
                    refused = cluster.leadership_error(topic.name, part.partition)
                    if refused is not None:
                        outcome[key] = produce_error(part.partition, refused)
                        continue
                try:
                    plog = context.logs.get_log(topic.name, part.partition)
                    if not part.records:
                        outcome[key] = produce_error(
                            part.partition, (ErrorCode.CORRUPT_MESSAGE, "no record batch")
                        )
                        continue
                    state = context.partitions.get(topic.name, part.partition, plog)
                    appended = state.append_as_leader(part.records, now_ms, functools.partial(
                        self._check_txn, request.transactional_id, topic.name, part.partition))
                except (StorageError, BatchError, OSError) as exc:
                    outcome[key] = produce_error(part.partition, error_of(exc))
                    continue
                if appended.staged is not None:
                    staged.append((key, appended.staged))
                info = appended.info
                if info is None:
                    original = appended.duplicate
                    if original is None:  # refused by the producer state: nothing written
                        error = (appended.error_code, appended.message)
                        outcome[key] = produce_error(part.partition, error)
                        continue
                    outcome[key] = ProducePartitionResponse(
                        part.partition, ErrorCode.NONE, original.first_offset, -1,
                        plog.log_start_offset, duplicate=True,
                    )
                    waits.append((key, state, state.rule, original.last_offset))
                    fresh_only = False  # its original may be covered already
                    continue
                count = info.last_offset - info.base_offset + 1
                if appended.staged is None:
                    records_in += count
                    context.metrics.topic_in(topic.name, count, len(part.records))
                else:  # counted once written (a write that fails stored nothing): one
                    staged_write = appended.staged  # callback per partition and pass
                    if not staged_write.records:
                        staged_write.on_written.append(functools.partial(
                            _count_in, context.metrics, topic.name, staged_write))
                    staged_write.records += count
                    staged_write.size += len(part.records)
                outcome[key] = produce_partition_appended(
                    part.partition, info.base_offset, info.log_append_time_ms,
                    plog.log_start_offset,
                )
                waits.append((key, state, state.rule, info.last_offset))
        if records_in:
            context.metrics.records_in(records_in)
        if request.acks == ACKS_NONE:
            return None

        def unwritten() -> None:
            """A staged append whose write failed answers its error, as ``append`` would
            have (``storage/staged_appends.py``); its wait goes."""
            nonlocal waits
            if not staged:  # (after the first answer's look)
                return
            failed = {}
            for key, write in staged:  # (a loop: no generator frames on every produce)
                assert write.done, "an answer before its write"
                if write.error is not None:
                    failed[key] = write.error
            staged.clear()
            if failed:
                for key, exc in failed.items():
                    outcome[key] = produce_error(key[1], error_of(exc))
                waits = [entry for entry in waits if entry[0] not in failed]

        if not waits or (context.policy.mode is not SyncMode.ALWAYS and not replicated):
            if not staged:
                return _produce_response(request, outcome)

            def answer_written() -> ProduceResponse:
                unwritten()
                return _produce_response(request, outcome)

            async def wait_written() -> ProduceResponse:
                return answer_written()

            return Pending(wait_written, ready=answer_written,
                           provisional=lambda: _produce_response(request, outcome))

        # The deadline runs from now (or the lane's read), not from when the wait starts:
        # the connection may complete a run of pipelined produces one after another in a
        # single task.
        timeout_ms = min(request.timeout_ms, limits.produce_timeout_ms_max)
        deadline = (trio.current_time() if received_at is None else received_at) \
            + timeout_ms / 1000

        def acknowledged(partition: Partition, rule: CommitRule | None, last_offset: int) -> bool:
            if replicated:  # acks=all: on disk on every ISR member, under the same leadership
                return rule is not None and partition.rule is rule and \
                    partition.committed(last_offset)
            return partition.local_durable_end > last_offset

        async def wait() -> ProduceResponse:
            unwritten()
            with trio.CancelScope(deadline=deadline):  # move_on_at without contextlib
                for _, partition, rule, last_offset in waits:
                    if replicated:
                        await partition.wait_committed(last_offset, rule)
                    else:
                        await partition.wait_durable(last_offset)
            for key, partition, rule, last_offset in waits:
                if not acknowledged(partition, rule, last_offset):
                    outcome[key] = produce_error(key[1], unacknowledged(
                        replicated and partition.rule is not rule))
            return _produce_response(request, outcome)

        def settled(partition: Partition, rule: CommitRule | None, last_offset: int) -> bool:
            """Acknowledged, or never will be: what ``wait`` would find before its deadline."""
            return acknowledged(partition, rule, last_offset) or partition.lost(last_offset) \
                or (replicated and partition.rule is not rule)

        def ready() -> ProduceResponse | None:
            if staged:
                unwritten()
            if replicated:
                for _, partition, rule, last_offset in waits:
                    if not settled(partition, rule, last_offset):
                        return None
            else:  # ``settled`` and ``acknowledged``, inline (asked of every produce once
                lost = []  # or twice): durable here, or lost
                for key, partition, _, last_offset in waits:
                    if partition.local_durable_end <= last_offset:
                        if not partition.lost(last_offset):
                            return None
                        lost.append(key)
                context.sync_worker.check_healthy()
                for key in lost:
                    outcome[key] = produce_error(key[1], unacknowledged(False))
                return _produce_response(request, outcome)
            context.sync_worker.check_healthy()
            for key, partition, rule, last_offset in waits:
                if not acknowledged(partition, rule, last_offset):
                    outcome[key] = produce_error(key[1], unacknowledged(
                        replicated and partition.rule is not rule))
            return _produce_response(request, outcome)

        return Pending(wait, ready=ready, deadline=deadline,
                       provisional=lambda: _produce_response(request, outcome),
                       after_progress=fresh_only)

    def produce_plain(self, shape: ProduceShape, records: bytes, now_ms: int,
                      received_at: float | None
                      ) -> ProduceResponse | Pending | OnePartitionWait | None:
        """``produce`` of the request ``shape`` carrying ``records`` decodes to: the produce
        lane's commonest request, which it never decoded (``protocol/produce_shape.py``).
        Never blocks."""
        answer = self._produce_one(shape.topic, shape.partition, records, shape.acks,
                                   shape.timeout_ms, now_ms, received_at)
        if answer is _NOT_TAKEN:
            return self._produce_general(shape.request(records), now_ms, None, received_at)
        return answer  # type: ignore[return-value]

    def _produce_one_partition(self, request: Produce, now_ms: int, received_at: float | None
                               ) -> ProduceResponse | OnePartitionWait | object:
        """``_produce_general`` for the commonest request, with fewer calls: one topic, one
        partition, not transactional (then ``_produce_one``); anything else returns
        ``_NOT_TAKEN`` before doing anything (the general path then decides). Never blocks."""
        topics = request.topics
        if len(topics) != 1 or request.transactional_id is not None:
            return _NOT_TAKEN
        topic = topics[0]
        if len(topic.partitions) != 1:
            return _NOT_TAKEN
        part = topic.partitions[0]
        return self._produce_one(topic.name, part.partition, part.records, request.acks,
                                 request.timeout_ms, now_ms, received_at)

    def _produce_one(self, name: str, index: int, records: bytes, acks: int, timeout_ms: int,
                     now_ms: int, received_at: float | None
                     ) -> ProduceResponse | OnePartitionWait | object:
        """``_produce_general`` of a request of one partition's ``records``, not
        transactional, acks 1 or all, on a single node under ``sync=always``, to a topic that
        exists. Anything else returns ``_NOT_TAKEN`` before doing anything (the general path
        then decides). Same answers, same log, same producer state and same metrics as the
        general path (a differential test compares them); its one wait is a
        ``OnePartitionWait`` (``produce_answers.py``), not the general ``Pending``. Never
        blocks."""
        context = self._context
        if acks == ACKS_NONE or context.replicas is not None or context.cluster is not None \
                or name in INTERNAL_TOPICS or not context.logs.has_topic(name) \
                or context.policy.mode is not SyncMode.ALWAYS:
            return _NOT_TAKEN
        try:
            plog = context.logs.get_log(name, index)
            if not records:
                return _one_answer(name, produce_error(
                    index, (ErrorCode.CORRUPT_MESSAGE, "no record batch")))
            state = context.partitions.get(name, index, plog)
            appended = state.append_as_leader(records, now_ms, self._check_no_txn_id)
        except (StorageError, BatchError, OSError) as exc:
            return _one_answer(name, produce_error(index, error_of(exc)))
        staged = appended.staged
        info = appended.info
        if info is None:
            original = appended.duplicate
            if original is None:  # refused by the producer state: nothing written
                return _one_answer(name, produce_error(
                    index, (appended.error_code, appended.message)))
            base_offset, append_time_ms, last_offset = original.first_offset, -1, \
                original.last_offset
        else:
            count = info.last_offset - info.base_offset + 1
            if staged is None:
                context.metrics.topic_in(name, count, len(records))
                context.metrics.records_in(count)
            else:  # counted once written, as in the general path
                if not staged.records:
                    staged.on_written.append(functools.partial(
                        _count_in, context.metrics, name, staged))
                staged.records += count
                staged.size += len(records)
            base_offset, append_time_ms, last_offset = info.base_offset, \
                info.log_append_time_ms, info.last_offset
        timeout_ms = min(timeout_ms, limits.produce_timeout_ms_max)
        deadline = (trio.current_time() if received_at is None else received_at) \
            + timeout_ms / 1000
        return OnePartitionWait(state, context.sync_worker, name, index, base_offset,
                                append_time_ms, plog.log_start_offset, info is None,
                                last_offset, staged, deadline)

    def _verify_then_produce(self, request: Produce,
                             unverified: list[tuple[str, int, int, int]]) -> Pending:
        """The first batches of a transaction in partitions led here, whose coordinator is
        another broker: ask it (KIP-890; docs/adr/0003), then produce. Serial: this
        connection's next requests wait (their batches must follow these), others do not."""
        txn = self._context.txn
        assert txn is not None and request.transactional_id is not None
        transactional_id = request.transactional_id

        async def verify_and_produce() -> ProduceResponse:
            refused = await txn.verify_remote(transactional_id, unverified)
            answer = self.produce(request, self._context.env.clock.wall_ms(), refused)
            if isinstance(answer, Pending):
                return await answer.wait()
            assert answer is not None  # (a transactional producer uses acks=all)
            return answer
        return Pending(verify_and_produce, serial=True)

    def _check_no_txn_id(self, header: BatchHeader) -> ErrorCode:
        """``_check_txn`` for a request without a transactional id, whose answer names no
        partition (a transactional batch there is refused: ``INVALID_REQUEST``, or
        ``COORDINATOR_NOT_AVAILABLE`` without a coordinator): a ``TxnCheck`` as it is, with
        no ``functools.partial`` made per produce."""
        txn = self._context.txn
        if txn is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return txn.check_produce(None, header, "", -1)

    def _check_txn(self, transactional_id: str | None, topic: str, partition: int,
                   header: BatchHeader) -> ErrorCode:
        """The coordinator's check of a transactional batch for this partition (bound to
        the first three by ``functools.partial``: a ``TxnCheck``)."""
        txn = self._context.txn
        if txn is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return txn.check_produce(transactional_id, header, topic, partition)

    def _produce_topic_error(self, name: str, now_ms: int) -> PartitionError | None:
        if name in INTERNAL_TOPICS:  # written by the broker's coordinators only
            return ErrorCode.INVALID_TOPIC_NAME, f"{name!r} is an internal topic"
        if self._context.logs.has_topic(name):  # its name was checked when it was created
            return None
        if topic_name_error(name) is not None:
            return ErrorCode.INVALID_TOPIC_NAME, f"invalid topic name {name!r}"
        if not self._context.config.auto_create_topics:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}"
        return self._auto_create(name, now_ms)

    # --- fetch -----------------------------------------------------------------------------

    def fetch(self, request: Fetch) -> FetchResponse | Pending:
        """Read what is there; long-poll when it is less than ``min_bytes``. Never blocks."""
        response, total_bytes, done = self._read(request)
        if done or total_bytes >= request.min_bytes or request.max_wait_ms == 0:
            return response
        return Pending(lambda: self._long_poll(request))

    async def _long_poll(self, request: Fetch) -> FetchResponse:
        context = self._context
        wait_ms = min(request.max_wait_ms, limits.fetch_wait_ms_max)
        keys = [(t.name, p.partition) for t in request.topics for p in t.partitions]
        with trio.move_on_after(wait_ms / 1000):
            while True:
                # Read, then register, with no checkpoint in between: a poke cannot fall
                # into the gap (this task may start after the reader's first read).
                response, total_bytes, done = self._read(request)
                if done or total_bytes >= request.min_bytes:
                    return response
                event = trio.Event()
                context.waker.register(event, keys)  # poked when a high watermark moves
                try:
                    await event.wait()
                finally:
                    context.waker.unregister(event, keys)
        return self._read(request)[0]

    def _read(self, request: Fetch) -> tuple[FetchResponse, int, bool]:
        """The response, its record bytes, and whether a partition error ends the wait."""
        remaining = min(request.max_bytes, limits.fetch_bytes_max)
        committed = request.isolation_level == READ_COMMITTED
        total_bytes = 0
        failed = False
        topics = []
        for topic in request.topics:
            partitions = []
            for part in topic.partitions:
                result = self._read_partition(
                    topic.name, part, remaining, total_bytes == 0, committed
                )
                failed = failed or result.error_code != ErrorCode.NONE
                size = len(result.records)
                total_bytes += size
                remaining = max(remaining - size, 0)
                partitions.append(result)
            topics.append(FetchTopicResponse(topic.name, tuple(partitions)))
        return FetchResponse(ErrorCode.NONE, tuple(topics)), total_bytes, failed

    def _read_partition(
        self, name: str, part: FetchPartition, remaining: int, first_with_data: bool,
        committed: bool,
    ) -> FetchPartitionResponse:
        context = self._context
        partition = part.partition
        if topic_name_error(name) is not None:
            return FetchPartitionResponse(partition, ErrorCode.INVALID_TOPIC_NAME)
        aborted: tuple[AbortedTransaction, ...] = ()
        refused = context.read_refusal((name, partition), part.current_leader_epoch)
        if refused is not None:  # clients read from the leader, at its epoch
            return FetchPartitionResponse(partition, refused)
        try:
            plog = context.logs.get_log(name, partition)
            state = context.partitions.get(name, partition, plog)
            high_watermark = state.high_watermark
            stable = state.last_stable_offset(high_watermark)
            budget = min(part.partition_max_bytes, remaining, limits.fetch_partition_bytes_max)
            offset = part.fetch_offset
            if budget > 0:
                read = plog.read(offset, budget, max_offset=stable if committed else high_watermark,
                                 zero_copy=True)
                records = read.records
                if len(records) > budget and not first_with_data:
                    if type(records) is FileRegion:
                        records.close()
                    records = b""  # only the first partition with data may exceed its budget
                elif committed and records:
                    aborted = tuple(
                        AbortedTransaction(producer_id, first_offset)
                        for producer_id, first_offset in state.aborted_in(offset, read.next_offset)
                    )
            elif plog.log_start_offset <= offset <= plog.log_end_offset:
                records = b""
            else:
                return FetchPartitionResponse(partition, ErrorCode.OFFSET_OUT_OF_RANGE)
        except CorruptRecordsError as exc:
            self._report_corruption(name, partition, exc, "fetch")
            return FetchPartitionResponse(partition, ErrorCode.CORRUPT_MESSAGE)
        except (StorageError, OSError) as exc:
            return FetchPartitionResponse(partition, error_of(exc)[0])
        if records:
            context.metrics.topic_out(name, len(records))
        return FetchPartitionResponse(
            partition,
            ErrorCode.NONE,
            high_watermark,
            stable,
            plog.log_start_offset,
            records,
            aborted,
        )

    def _report_corruption(self, topic: str, partition: int, exc: CorruptRecordsError,
                           source: str) -> None:
        """Count a damaged batch; log it once per place (not once per fetch)."""
        self._context.metrics.corrupt_batch(topic, partition, source)
        place = (exc.file, exc.position)
        if place not in self._corruption_logged:
            if len(self._corruption_logged) >= _CORRUPTION_PLACES_MAX:
                self._corruption_logged.clear()
            self._corruption_logged.add(place)
            log.error("%s-%d: a stored batch is damaged: %s; fetches of offset %d answer "
                      "CORRUPT_MESSAGE (records before it are served)", topic, partition, exc,
                      exc.offset)

    # --- offsets ---------------------------------------------------------------------------

    def list_offsets(self, request: ListOffsets) -> ListOffsetsResponse:
        """Offsets by time (see the module docstring). Never blocks (reads index files)."""
        topics = []
        for topic in request.topics:
            partitions = []
            for part in topic.partitions:
                partitions.append(self._list_offset(
                    topic.name, part.partition, part.timestamp,
                    request.isolation_level == READ_COMMITTED,
                ))
            topics.append(ListOffsetsTopicResponse(topic.name, tuple(partitions)))
        return ListOffsetsResponse(tuple(topics))

    def _list_offset(
        self, name: str, partition: int, timestamp: int, committed: bool
    ) -> ListOffsetsPartitionResponse:
        if topic_name_error(name) is not None:
            return ListOffsetsPartitionResponse(partition, ErrorCode.INVALID_TOPIC_NAME)
        refused = self._context.read_refusal((name, partition))
        if refused is not None:
            return ListOffsetsPartitionResponse(partition, refused)
        try:
            plog = self._context.logs.get_log(name, partition)
            state = self._context.partitions.get(name, partition, plog)
            high_watermark = state.high_watermark
            if committed:  # read_committed readers end at the last stable offset
                high_watermark = state.last_stable_offset(high_watermark)
            record_timestamp = -1
            if timestamp == EARLIEST_TIMESTAMP:
                offset = plog.log_start_offset
            elif timestamp == LATEST_TIMESTAMP:
                offset = high_watermark
            else:
                offset, record_timestamp = _record_at_time(plog, timestamp, high_watermark)
        except (StorageError, OSError, BatchError) as exc:
            return ListOffsetsPartitionResponse(partition, error_of(exc)[0])
        return ListOffsetsPartitionResponse(partition, ErrorCode.NONE, offset, record_timestamp)

    def offsets_for_leader_epoch(
        self, request: OffsetsForLeaderEpoch
    ) -> OffsetsForLeaderEpochResponse:
        """Where each asked epoch ended (KIP-101's question). Never blocks."""
        topics = []
        for topic in request.topics:
            partitions = [self._epoch_end(topic.name, part) for part in topic.partitions]
            topics.append(OffsetsForLeaderEpochTopicResponse(topic.name, tuple(partitions)))
        return OffsetsForLeaderEpochResponse(tuple(topics))

    def _epoch_end(self, name: str, part: OffsetsForLeaderEpochPartition) -> EpochEndOffset:
        if topic_name_error(name) is not None:
            return EpochEndOffset(part.partition, ErrorCode.INVALID_TOPIC_NAME)
        refused = self._context.read_refusal((name, part.partition), part.current_leader_epoch)
        if refused is not None:
            return EpochEndOffset(part.partition, refused)
        try:
            plog = self._context.logs.get_log(name, part.partition)
        except (StorageError, OSError) as exc:
            return EpochEndOffset(part.partition, error_of(exc)[0])
        end = plog.log_end_offset
        if not plog.epochs.entries:  # a log whose leader never changed: epoch 0 throughout
            return EpochEndOffset(part.partition, ErrorCode.NONE, 0, end)
        epoch, offset = plog.epochs.end_offset_for(part.leader_epoch, end)
        return EpochEndOffset(part.partition, ErrorCode.NONE, epoch, offset)

    def describe_log_dirs(self, request: DescribeLogDirs) -> DescribeLogDirsResponse:
        """Bytes and offsets of the replicas held here (leader or follower). Never blocks."""
        topics = []
        for topic in request.topics:
            partitions = []
            for partition in topic.partitions:
                try:
                    if topic_name_error(topic.name) is not None:
                        raise UnknownTopicOrPartitionError(topic.name, partition)
                    plog = self._context.logs.get_log(topic.name, partition)
                    partitions.append(LogDirPartition(
                        partition, ErrorCode.NONE, plog.size_bytes, plog.log_start_offset,
                        plog.log_end_offset))
                except (StorageError, OSError) as exc:
                    partitions.append(LogDirPartition(partition, error_of(exc)[0]))
            topics.append(DescribeLogDirsTopicResponse(topic.name, tuple(partitions)))
        return DescribeLogDirsResponse(tuple(topics))

    def delete_records(self, request: DeleteRecords) -> DeleteRecordsResponse:
        """Advance log start offsets. Blocks on the checkpoint's fsync (rare, administrative)."""
        topics = []
        for topic in request.topics:
            partitions = []
            for part in topic.partitions:
                partitions.append(self._delete_records(topic.name, part.partition, part.offset))
            topics.append(DeleteRecordsTopicResponse(topic.name, tuple(partitions)))
        return DeleteRecordsResponse(tuple(topics))

    def _delete_records(
        self, name: str, partition: int, offset: int
    ) -> DeleteRecordsPartitionResponse:
        if topic_name_error(name) is not None:
            return DeleteRecordsPartitionResponse(partition, ErrorCode.INVALID_TOPIC_NAME)
        try:
            plog = self._context.logs.get_log(name, partition)
            high_watermark = self._context.partitions.get(name, partition, plog).high_watermark
            target = high_watermark if offset == -1 else offset
            if target > high_watermark:
                return DeleteRecordsPartitionResponse(
                    partition, ErrorCode.OFFSET_OUT_OF_RANGE, plog.log_start_offset
                )
            if target <= plog.log_start_offset:
                start = plog.log_start_offset
                return DeleteRecordsPartitionResponse(partition, ErrorCode.NONE, start)
            low_watermark = self._context.logs.with_room(lambda: plog.delete_records(target))
        except (StorageError, OSError) as exc:
            return DeleteRecordsPartitionResponse(partition, error_of(exc)[0])
        return DeleteRecordsPartitionResponse(partition, ErrorCode.NONE, low_watermark)


def _record_at_time(plog: PartitionLog, timestamp_ms: int, below: int) -> tuple[int, int]:
    """``(offset, timestamp)`` of the first record below ``below`` (the high watermark) whose
    timestamp is ``>= timestamp_ms``, or ``(-1, -1)``: Kafka's lookup. The log finds the first
    batch whose max timestamp reaches the time (timestamps need not grow with offsets); its
    records are decoded to find the record. A batch whose qualifying records lie below the
    log start (cut inside it) sends the search on to the next such batch. Blocks on reads.

    Raises:
        StorageError, BatchError: the log could not be read or a batch did not decode.
    """
    start = 0
    while True:
        base = plog.offset_for_timestamp(timestamp_ms, start)
        if base is None or base >= below:
            return -1, -1
        read = plog.read(base, 1, max_offset=below)  # the one batch holding ``base``
        records = read.records
        if not records:
            return -1, -1
        for record in iter_records(records):
            if record.offset >= base and record.timestamp_ms >= timestamp_ms:
                return (record.offset, record.timestamp_ms) if record.offset < below else (-1, -1)
        start = read.next_offset


def _count_in(metrics: BrokerMetrics, topic: str, written: StagedWrite) -> None:
    """Records in, counted when a pass's staged appends to one partition were written
    (``StagedWrite.on_written``)."""
    metrics.records_in(written.records)
    metrics.topic_in(topic, written.records, written.size)


#: The answer of a request of one topic and one partition.
_one_answer = produce_response_of_one


def _produce_response(
    request: Produce, outcome: dict[tuple[str, int], ProducePartitionResponse]
) -> ProduceResponse:
    topics = request.topics
    if len(topics) == 1 and len(topics[0].partitions) == 1:  # the commonest: no walk
        name = topics[0].name
        return produce_response_of_one(name, outcome[(name, topics[0].partitions[0].partition)])
    return produce_response_of(
        [
            (topic.name, [outcome[(topic.name, p.partition)] for p in topic.partitions])
            for topic in request.topics
        ]
    )

