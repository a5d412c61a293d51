"""The group coordinator's trio driver: requests, timers and ``__consumer_offsets``.

Theory of operation
-------------------
``GroupDriver`` runs the pure ``GroupCoordinator`` (``coordinator/group_coordinator.py``; the
contract is in docs/consumer-groups.md, "Driver contract") and carries out its instructions.
It keeps no group state of its own.

- *Opening* (``open``, before the client listener starts): the internal topic
  ``__consumer_offsets`` is created if missing (``cleanup.policy=compact``,
  ``offsets_topic_partitions`` partitions); every record of it is replayed through
  ``coordinator.load`` - the log is the source of truth.
- *Requests* (JoinGroup ... DeleteGroup): ``begin`` feeds a ``GroupRequest`` carrying a fresh
  token, the client id of the connection's Handshake and its peer host. An answer emitted at
  once is returned; otherwise a ``Pending`` waits on the token's slot. A held JoinGroup or
  SyncGroup therefore only delays later answers on *its own* connection (answers stay in
  request order there). When the connection closes, the pending wait is cancelled and its
  slot dropped; a later answer for that token is dropped too.
- ``Persist``: the records become one batch (``BatchBuilder``) appended at once, in emission
  order, to partition ``offsets_partition_for(group_id, n)`` (through the partition's producer
  state, like every append). The append is queued in one FIFO; a task takes the head, waits
  until it is durable (``SyncWorker.wait_durable``: under ``sync=always`` an fsync; the other
  policies acknowledge on append, as they do for data) and feeds ``Persisted`` (or, for an
  append that failed, ``PersistFailed`` with its code). One FIFO for everything keeps the
  coordinator's view equal to a replay of the log, whose order is the append order.
- *Timers*: a task feeds ``Tick`` when ``next_deadline_ms`` comes; every fed event re-arms it
  (a new session may bring the deadline forward). Times are wall-clock ms
  (``env.clock.wall_ms``): commit times are persisted and compared after restarts.
- *Transactions* (``commit_txn_offsets``, the transaction driver's ``offsets_sink``): a
  committed transaction's consumer offsets are appended as one plain batch through the same
  FIFO and, once durable, fed as ``TxnOffsetsCommitted``.

``log_end_offset(topic, partition)`` for commit validation is the partition's high watermark
(a consumer never read beyond it). ``lag_rows`` serves the consumer-lag gauges of /metrics:
committed offset against high watermark for every committed partition of every group.

Internal topics (``__consumer_offsets``, ``__transaction_state``) are hidden from ListTopics
and from an all-topics Metadata answer unless asked for by name (``is_internal_topic``).
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Hashable, Iterable, Iterator, NamedTuple

import attrs
import trio
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from rivven_broker.coordinator.group_coordinator import GroupCoordinator
from rivven_broker.coordinator.group_events import (
    GROUP_REQUEST_TYPES,
    GroupCoordinatorConfig,
    GroupRequest,
    Instruction,
    Persist,
    Persisted,
    PersistFailed,
    Respond,
    Tick,
    TxnOffsetsCommitted,
)
from rivven_broker.coordinator.offsets_codec import (
    OFFSETS_TOPIC,
    OffsetKey,
    OffsetValue,
    encode_key,
    encode_offset_value,
    offsets_partition_for,
)
from rivven_broker.coordinator.txn_log_codec import TRANSACTION_STATE_TOPIC
from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.group_messages import (
    COORDINATOR_KEY_GROUP,
    FindCoordinator,
    FindCoordinatorResponse,
    ListGroups,
    OffsetFetch,
)
from rivven_broker.protocol.message_base import Request, Response
from rivven_broker.protocol.names import group_id_error
from rivven_broker.records.builder import BatchBuilder
from rivven_broker.records.reader import decode_records
from rivven_broker.server.context import Pending, RequestContext
from rivven_broker.storage.errors import StorageError, SyncFailedError, TopicExistsError

if TYPE_CHECKING:
    from rivven_broker.server.context import ServerContext
    from rivven_broker.storage.partition_log import PartitionLog

__all__ = [
    "GroupDriver",
    "GroupDriverSettings",
    "LagRow",
    "GroupLagCollector",
    "INTERNAL_TOPICS",
    "is_internal_topic",
    "offsets_topic_config",
]

log = logging.getLogger(__name__)

INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})
_OFFSETS_SEGMENT_BYTES = 100 * 1024 * 1024
_READ_BYTES = 1 << 20


def is_internal_topic(name: str) -> bool:
    """True for the broker's own topics (hidden from listings, refused to producers)."""
    return name in INTERNAL_TOPICS


def offsets_topic_config() -> dict[str, str]:
    """The topic configs ``__consumer_offsets`` is created with."""
    return {
        "cleanup.policy": "compact",
        "segment.bytes": str(_OFFSETS_SEGMENT_BYTES),
        "max.message.bytes": str(limits.batch_bytes_max),
    }


@attrs.frozen
class GroupDriverSettings:
    """The broker settings the group side obeys."""

    offsets_topic_partitions: int = 4
    coordinator: GroupCoordinatorConfig = GroupCoordinatorConfig()

    def __attrs_post_init__(self) -> None:
        assert 1 <= self.offsets_topic_partitions <= limits.partitions_per_topic_max

    @classmethod
    def from_broker_config(cls, config: Any) -> GroupDriverSettings:
        """From a ``BrokerConfig`` (fields missing there keep their defaults)."""
        defaults = GroupCoordinatorConfig()
        retention_minutes = getattr(config, "offsets_retention_minutes", None)
        coordinator = GroupCoordinatorConfig(
            initial_rebalance_delay_ms=getattr(
                config, "group_initial_rebalance_delay_ms", defaults.initial_rebalance_delay_ms
            ),
            offsets_retention_ms=(
                defaults.offsets_retention_ms if retention_minutes is None
                else retention_minutes * 60_000
            ),
        )
        return cls(getattr(config, "offsets_topic_partitions", 4), coordinator)


class LagRow(NamedTuple):
    """One committed partition of one group, as /metrics reports it."""

    group_id: str
    topic: str
    partition: int
    committed_offset: int
    high_watermark: int

    @property
    def lag(self) -> int:
        return max(self.high_watermark - self.committed_offset, 0)


class _Slot:
    """Where a request's answer lands."""

    __slots__ = ("event", "response")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.response: Response | None = None


@attrs.define
class _Appended:
    """One append waiting in the durability FIFO, and what to feed once it is durable."""

    plog: PartitionLog | None  # None: the append failed
    last_offset: int
    on_durable: Callable[[], None]
    on_failure: Callable[[ErrorCode], None]
    error: ErrorCode | None = None


class GroupDriver:
    """Runs the group coordinator of one broker. See the module docstring."""

    def __init__(self, context: ServerContext, settings: GroupDriverSettings) -> None:
        self._context = context
        self.settings = settings
        self.partitions = settings.offsets_topic_partitions
        self.coordinator = GroupCoordinator(
            context.env.rng("groups"), self._log_end_offset, settings.coordinator
        )
        self._slots: dict[Hashable, _Slot] = {}
        self._tokens = itertools.count(1)
        self._fifo: deque[_Appended] = deque()
        self._fifo_wakeup = trio.Event()
        self._rearm = trio.Event()
        self._loaded = False

    # --- opening -------------------------------------------------------------------------

    def open(self, now_ms: int) -> int:
        """Create ``__consumer_offsets`` if missing and load the coordinator from it. Call
        once, before requests arrive. Blocks on file I/O. Returns the records replayed.

        Raises:
            CorruptOffsetsRecordError: a record of the topic does not decode.
            StorageError, OSError: the topic could not be created or read.
        """
        assert not self._loaded
        logs = self._context.logs
        info = logs.topics().get(OFFSETS_TOPIC)
        if info is None:
            try:
                info = logs.create_topic(
                    OFFSETS_TOPIC, self.partitions, 1, offsets_topic_config(), now_ms
                )
                log.info("created %s with %d partitions", OFFSETS_TOPIC, self.partitions)
            except TopicExistsError:  # pragma: no cover - checked just above
                info = logs.topics()[OFFSETS_TOPIC]
        if info.partitions != self.partitions:
            log.warning("%s has %d partitions (offsets_topic_partitions is %d): keeping %d",
                        OFFSETS_TOPIC, info.partitions, self.partitions, info.partitions)
            self.partitions = info.partitions
        records = list(self._stored_records())
        self.coordinator.load(records, now_ms)
        self._loaded = True
        stats = self.coordinator.statistics()
        log.info("group coordinator loaded %d records: %d groups, %d committed offsets",
                 len(records), stats.groups, stats.committed_offsets)
        return len(records)

    def _stored_records(self) -> Iterator[tuple[bytes, bytes | None]]:
        logs = self._context.logs
        for partition in range(self.partitions):
            plog = logs.get_log(OFFSETS_TOPIC, partition)
            offset = plog.log_start_offset
            while offset < plog.log_end_offset:
                result = plog.read(offset, _READ_BYTES)
                for record in decode_records(result.records, min_offset=offset):
                    if record.key is not None:
                        yield record.key, record.value
                offset = result.next_offset

    # --- requests --------------------------------------------------------------------------

    def handlers(self) -> dict[type[Request], Callable[[Any, RequestContext], Response | Pending]]:
        """The request handlers this driver serves, for the broker's dispatch table."""
        table: dict[type[Request], Callable[[Any, RequestContext], Response | Pending]] = {
            cls: self.begin for cls in GROUP_REQUEST_TYPES
        }
        table[FindCoordinator] = self.find_coordinator
        return table

    def begin(self, request: Any, call: RequestContext) -> Response | Pending:
        """Hand a group request to the coordinator. Never blocks.

        Raises:
            SyncFailedError: an fsync failed earlier (the broker must stop).
        """
        assert self._loaded, "open() first"
        token = next(self._tokens)
        slot = self._slots[token] = _Slot()
        self._feed(GroupRequest(token, request, call.client_id, call.client_host), call.now_ms)
        if slot.response is not None:
            del self._slots[token]
            return slot.response

        async def wait() -> Response:
            try:
                await slot.event.wait()
            finally:
                self._slots.pop(token, None)
            assert slot.response is not None
            return slot.response

        return Pending(wait)

    def find_coordinator(self, request: FindCoordinator,
                         call: RequestContext) -> FindCoordinatorResponse:
        """This broker coordinates every group and transactional id (a single node)."""
        if request.key_type == COORDINATOR_KEY_GROUP and group_id_error(request.key) is not None:
            return FindCoordinatorResponse(ErrorCode.INVALID_GROUP_ID)
        context = self._context
        return FindCoordinatorResponse(
            ErrorCode.NONE, context.config.node_id, context.advertised_host,
            context.advertised_port,
        )

    # --- transactions --------------------------------------------------------------------

    async def commit_txn_offsets(
        self, group_id: str, offsets: Iterable[Any], commit_timestamp_ms: int
    ) -> None:
        """Make a committed transaction's offsets (``PendingOffset``-like: topic, partition,
        offset, metadata) durable in ``__consumer_offsets`` and visible to the group
        coordinator. Blocks until durable. The transaction driver's ``offsets_sink``.

        Raises:
            StorageError: the append failed (nothing became visible).
            SyncFailedError: an fsync failed (the broker must stop).
        """
        entries = tuple((o.topic, o.partition, o.offset, o.metadata) for o in offsets)
        records = tuple(
            (encode_key(OffsetKey(group_id, topic, partition)),
             encode_offset_value(OffsetValue(offset, metadata, commit_timestamp_ms)))
            for topic, partition, offset, metadata in entries
        )
        done = trio.Event()
        failure: list[ErrorCode] = []
        event = TxnOffsetsCommitted(group_id, entries, commit_timestamp_ms)

        def durable() -> None:
            self._feed(event, self._context.env.clock.wall_ms())
            done.set()

        def failed(code: ErrorCode) -> None:
            failure.append(code)
            done.set()

        self._append(group_id, records, self._context.env.clock.wall_ms(), durable, failed)
        await done.wait()
        if failure:
            raise StorageError(f"transactional offsets of {group_id} not written: {failure[0]}")

    # --- tasks ---------------------------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """The timer and durability tasks; run in the broker's nursery until cancelled.

        Raises:
            SyncFailedError: an fsync failed (the broker must stop).
        """
        assert self._loaded, "open() first"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._timer_loop)
            nursery.start_soon(self._durability_loop)
            task_status.started()

    async def _timer_loop(self) -> None:
        clock = self._context.env.clock
        while True:
            self._rearm = trio.Event()
            deadline = self.coordinator.next_deadline_ms()
            now_ms = clock.wall_ms()
            if deadline is not None and deadline <= now_ms:
                self._feed(Tick(), now_ms)
                await trio.lowlevel.checkpoint()
                continue
            if deadline is None:
                await self._rearm.wait()
            else:
                with trio.move_on_after((deadline - now_ms) / 1000):
                    await self._rearm.wait()

    async def _durability_loop(self) -> None:
        sync_worker = self._context.sync_worker
        while True:
            if not self._fifo:
                self._fifo_wakeup = trio.Event()
                await self._fifo_wakeup.wait()
                continue
            head = self._fifo[0]
            if head.error is None:
                assert head.plog is not None
                await sync_worker.wait_durable(head.plog, head.last_offset)
            self._fifo.popleft()
            if head.error is None:
                head.on_durable()
            else:
                head.on_failure(head.error)

    # --- plumbing ------------------------------------------------------------------------

    def _feed(self, event: Any, now_ms: int) -> None:
        self._execute(self.coordinator.handle(event, now_ms), now_ms)
        self._rearm.set()

    def _execute(self, instructions: list[Instruction], now_ms: int) -> None:
        for instruction in instructions:
            if isinstance(instruction, Respond):
                slot = self._slots.get(instruction.token)
                if slot is not None:  # else its connection closed: drop the answer
                    slot.response = instruction.response
                    slot.event.set()
            else:
                assert isinstance(instruction, Persist)
                self._persist(instruction, now_ms)

    def _persist(self, instruction: Persist, now_ms: int) -> None:
        persist_id = instruction.persist_id

        def durable() -> None:
            self._feed(Persisted(persist_id), self._context.env.clock.wall_ms())

        def failed(code: ErrorCode) -> None:
            self._feed(PersistFailed(persist_id, code), self._context.env.clock.wall_ms())

        self._append(instruction.group_id, instruction.records, now_ms, durable, failed)

    def _append(
        self,
        group_id: str,
        records: tuple[tuple[bytes, bytes | None], ...],
        now_ms: int,
        on_durable: Callable[[], None],
        on_failure: Callable[[ErrorCode], None],
    ) -> None:
        """Append ``records`` as one batch now; queue the outcome in the FIFO."""
        partition = offsets_partition_for(group_id, self.partitions)
        context = self._context
        entry = _Appended(None, -1, on_durable, on_failure)
        try:
            plog = context.logs.get_log(OFFSETS_TOPIC, partition)
            builder = BatchBuilder(batch_bytes_max=limits.batch_bytes_max)
            for key, value in records:
                if not builder.append(now_ms, key, value):
                    raise _TooLarge()
            batch = builder.build()
            states = getattr(context, "producer_states", None)
            if states is None:
                info = plog.append(batch, now_ms)
            else:
                outcome = states.get(OFFSETS_TOPIC, partition, plog).append(
                    batch, now_ms, _no_transactions
                )
                assert outcome.info is not None, outcome  # a plain batch is never refused
                info = outcome.info
        except _TooLarge:
            entry.error = ErrorCode.RECORD_LIST_TOO_LARGE
        except SyncFailedError:
            raise
        except (StorageError, OSError) as exc:
            log.error("appending to %s-%d failed: %s", OFFSETS_TOPIC, partition, exc)
            entry.error = getattr(exc, "code", ErrorCode.KAFKA_STORAGE_ERROR)
            if entry.error == ErrorCode.NONE:  # pragma: no cover - defensive
                entry.error = ErrorCode.COORDINATOR_NOT_AVAILABLE
        else:
            context.sync_worker.mark_dirty(plog)
            context.waker.poke((OFFSETS_TOPIC, partition))
            entry.plog, entry.last_offset = plog, info.last_offset
        self._fifo.append(entry)
        self._fifo_wakeup.set()

    def _log_end_offset(self, topic: str, partition: int) -> int | None:
        context = self._context
        info = context.logs.topics().get(topic)
        if info is None or not 0 <= partition < info.partitions:
            return None
        return context.high_watermark(context.logs.get_log(topic, partition))

    # --- introspection -------------------------------------------------------------------

    def lag_rows(self) -> list[LagRow]:
        """Committed offset and high watermark of every committed partition of every group.
        Never blocks (reads the coordinator's view and the logs' offsets)."""
        if not self._loaded:
            return []
        now_ms = self._context.env.clock.wall_ms()
        rows = []
        listing = self._ask(ListGroups(), now_ms)
        for group in listing.groups:
            answer = self._ask(OffsetFetch(group.group_id, all_topics=True), now_ms)
            for topic in answer.topics:
                for part in topic.partitions:
                    high = self._log_end_offset(topic.name, part.partition)
                    if part.offset >= 0 and high is not None:
                        rows.append(LagRow(group.group_id, topic.name, part.partition,
                                           part.offset, high))
        return rows

    def _ask(self, request: Any, now_ms: int) -> Any:
        """Answer a read-only request synchronously (ListGroups, OffsetFetch)."""
        (answer,) = self.coordinator.handle(GroupRequest(("metrics",), request), now_ms)
        assert isinstance(answer, Respond)
        return answer.response

    def statistics(self) -> dict[str, int]:
        """The coordinator's counts plus this driver's queues. Never blocks."""
        stats = self.coordinator.statistics()
        return {
            "groups": stats.groups,
            "members": stats.members,
            "committed_offsets": stats.committed_offsets,
            "persists_in_flight": stats.persists_in_flight,
            "held_responses": stats.held_responses,
            "answers_waiting": len(self._slots),
            "appends_waiting": len(self._fifo),
        }


class GroupLagCollector(Collector):
    """Consumer lag gauges, read from ``rows()`` at every scrape (nothing is pushed)."""

    def __init__(self, rows: Callable[[], Iterable[LagRow]]) -> None:
        self._rows = rows

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["group", "topic", "partition"]
        lag = GaugeMetricFamily(
            "rivven_consumer_lag", "High watermark minus the group's committed offset.",
            labels=labels,
        )
        committed = GaugeMetricFamily(
            "rivven_consumer_committed_offset", "The group's committed offset (next to read).",
            labels=labels,
        )
        for row in self._rows():
            values = [row.group_id, row.topic, str(row.partition)]
            lag.add_metric(values, row.lag)
            committed.add_metric(values, row.committed_offset)
        yield lag
        yield committed


class _TooLarge(Exception):
    """The records of one persist do not fit one batch."""


def _no_transactions(header: Any) -> ErrorCode:
    raise AssertionError("the group coordinator appends plain batches only")
