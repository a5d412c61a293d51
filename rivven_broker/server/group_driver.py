"""The group coordinator's trio driver: requests, timers and ``__consumer_offsets``.

Theory of operation
-------------------
``GroupDriver`` runs the pure ``GroupCoordinator`` (``coordinator/group_coordinator.py``; the
contract is in docs/consumer-groups.md, "Driver contract") and carries out its instructions.
It keeps no group state of its own.

- *Shards*: a group belongs to one partition of ``__consumer_offsets``
  (``offsets_partition_for``), and each partition coordinated here has its own
  ``GroupCoordinator``, durability FIFO and timer (``_Shard``; Kafka's coordinator shards its
  state the same way). A single node coordinates every partition: ``open`` (before the client
  listener starts) creates the topic if missing (``cleanup.policy=compact``,
  ``offsets_topic_partitions`` partitions) and replays each partition into its shard - the log
  is the source of truth. A clustered broker coordinates exactly the partitions it *leads*
  (``own``, after every applied metadata change): a partition gained is loaded from its
  replicated log in a task (requests meanwhile: COORDINATOR_LOAD_IN_PROGRESS); a partition
  lost, or led again at another epoch, drops its shard and answers what it held
  NOT_COORDINATOR. A group led nowhere here is NOT_COORDINATOR; ``FindCoordinator`` names the
  partition's leader.
- *Requests* (JoinGroup ... DeleteGroup): ``begin`` feeds the group's shard a
  ``GroupRequest`` carrying a fresh token, the client id of the connection's Handshake and its
  peer host. An answer emitted at once is returned; otherwise a ``Pending`` waits on the
  token's slot. A held JoinGroup or SyncGroup therefore only delays later answers on *its own*
  connection (answers stay in request order there). When the connection closes, the pending
  wait is cancelled and its slot dropped; a later answer for that token is dropped too.
  ListGroups merges the shards' answers.
- ``Persist``: the records become one batch (``BatchBuilder``) appended at once, in emission
  order, to the shard's partition (through the partition's producer state, like every
  append). The append is queued in the shard's FIFO; a task takes the head, waits until the
  partition's high watermark passes it (``Partition.wait_committed``: a single node's under
  ``sync=always`` after the fsync, under the other policies at once, as for data; in a
  cluster, on disk on every in-sync replica: ``acks=all``), then feeds ``Persisted`` (or, for
  an append that failed or a leadership lost, ``PersistFailed`` with its code). One FIFO per shard keeps its coordinator's view equal to a replay of its partition,
  whose order is the append order.
- *Timers*: a task per shard feeds ``Tick`` when ``next_deadline_ms`` comes; every fed event
  re-arms it (a new session may bring the deadline forward). Times are wall-clock ms
  (``env.clock.wall_ms``): commit times are persisted and compared after restarts.
- *Transactions* (``commit_txn_offsets``, the transaction driver's ``offsets_sink``): a
  committed transaction's consumer offsets are appended as one plain batch through the same
  FIFO and, once durable, fed as ``TxnOffsetsCommitted``.

``log_end_offset(topic, partition)`` for commit validation is the partition's high watermark
(a consumer never read beyond it); in a cluster, a partition led by another broker is not
checked (this broker's copy may lag; Kafka checks none). ``lag_rows`` serves the consumer-lag gauges of /metrics:
committed offset against high watermark for every committed partition of every group.

Internal topics (``__consumer_offsets``, ``__transaction_state``) are hidden from ListTopics
and from an all-topics Metadata answer unless asked for by name (``is_internal_topic``).
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, NamedTuple

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
from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.group_messages import (
    COORDINATOR_KEY_GROUP,
    DeleteGroup,
    DeleteGroupResponse,
    DescribeGroup,
    DescribeGroupResponse,
    FindCoordinator,
    FindCoordinatorResponse,
    GroupListing,
    Heartbeat,
    HeartbeatResponse,
    JoinGroup,
    JoinGroupResponse,
    LeaveGroup,
    LeaveGroupResponse,
    ListGroups,
    ListGroupsResponse,
    OffsetCommit,
    OffsetCommitPartitionResponse,
    OffsetCommitResponse,
    OffsetCommitTopicResponse,
    OffsetFetch,
    OffsetFetchResponse,
    SyncGroup,
    SyncGroupResponse,
)
from rivven_broker.protocol.message_base import Request, Response
from rivven_broker.protocol.names import group_id_error
from rivven_broker.records.builder import BatchBuilder
from rivven_broker.server.context import Pending, RequestContext
from rivven_broker.server.coordinator_shards import ownership_changes
from rivven_broker.server.internal_topics import offsets_topic_config
from rivven_broker.server.log_replay import keyed_records, replay
from rivven_broker.storage.errors import StorageError, SyncFailedError, TopicExistsError
from rivven_broker.storage.partition import CommitRule, Partition

if TYPE_CHECKING:
    from rivven_broker.server.context import ServerContext

__all__ = [
    "GroupDriver",
    "GroupDriverSettings",
    "LagRow",
    "GroupLagCollector",
]

log = logging.getLogger(__name__)

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
    """Where a request's answer lands (and what to refuse it with if its shard goes)."""

    __slots__ = ("event", "response", "request")

    def __init__(self, request: Any) -> None:
        self.event = trio.Event()
        self.response: Response | None = None
        self.request = request


@attrs.define
class _Appended:
    """One append waiting in a shard's durability FIFO, and what to feed once it is durable."""

    partition: Partition | None  # None: the append failed
    rule: CommitRule | None  # the leadership it was appended under (None: a single node)
    last_offset: int
    on_durable: Callable[[], None]
    on_failure: Callable[[ErrorCode], None]
    error: ErrorCode | None = None


class _Shard:
    """The groups of one ``__consumer_offsets`` partition, coordinated here: their pure
    coordinator (None while it loads), its durability FIFO and timer, and the tokens of the
    requests it has not answered yet."""

    def __init__(self, partition: int, epoch: int) -> None:
        self.partition = partition
        self.epoch = epoch  # the partition's leader epoch it was loaded at (-1: a single node)
        self.coordinator: GroupCoordinator | None = None
        self.fifo: deque[_Appended] = deque()
        self.fifo_wakeup = trio.Event()
        self.rearm = trio.Event()
        self.scope = trio.CancelScope()
        self.tokens: set[int] = set()
        self.gone = False  # unloaded: nothing is fed to its coordinator any more


class GroupDriver:
    """Runs the group coordinators of one broker. See the module docstring."""

    def __init__(self, context: ServerContext, settings: GroupDriverSettings) -> None:
        self._context = context
        self.settings = settings
        self.partitions = settings.offsets_topic_partitions
        self._rng = context.env.rng("groups")
        self._shards: dict[int, _Shard] = {}
        self._slots: dict[int, _Slot] = {}
        self._tokens = itertools.count(1)
        self._nursery: trio.Nursery | None = None
        self._loaded = False
        #: With --peers: shards come and go with the leadership of the partitions (``own``).
        self.clustered = False

    def _coordinator(self) -> GroupCoordinator:
        return GroupCoordinator(self._rng, self._log_end_offset, self.settings.coordinator)

    # --- opening -------------------------------------------------------------------------

    def open(self, now_ms: int) -> int:
        """Create ``__consumer_offsets`` if missing and load every partition's groups from it.
        Call once, before requests arrive. Blocks on file I/O. Returns the records replayed.
        A clustered broker (``context.cluster`` set) loads nothing here: it coordinates the
        partitions it leads, as the metadata gives them (``own``).

        Raises:
            CorruptOffsetsRecordError: a record of the topic does not decode.
            StorageError, OSError: the topic could not be created or read.
        """
        assert not self._loaded
        self._loaded = True
        if self._context.cluster is not None:
            self.clustered = True
            return 0
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
        replayed = 0
        for partition in range(self.partitions):
            shard = self._shards[partition] = _Shard(partition, -1)
            records = _keyed(keyed_records(logs.get_log(OFFSETS_TOPIC, partition)))
            shard.coordinator = self._coordinator()
            shard.coordinator.load(records, now_ms)
            replayed += len(records)
        stats = self.statistics()
        log.info("group coordinator loaded %d records: %d groups, %d committed offsets",
                 replayed, stats["groups"], stats["committed_offsets"])
        return replayed

    # --- ownership (clustered) ------------------------------------------------------------

    def own(self, partitions: int, leading: dict[int, int]) -> None:
        """Coordinate the groups of exactly the ``__consumer_offsets`` partitions this broker
        leads (``leading``: partition -> leader epoch; ``partitions``: how many the topic has).
        A partition lost, or led again at another epoch, drops its shard: what it had not
        answered is answered NOT_COORDINATOR, and the new leader loads from the replicated
        log. A partition gained is loaded in a task; requests meanwhile are answered
        COORDINATOR_LOAD_IN_PROGRESS. Never blocks."""
        assert self.clustered
        self.partitions = partitions
        drop, start = ownership_changes({p: s.epoch for p, s in self._shards.items()}, leading)
        for partition in drop:
            self._unload(self._shards[partition])
        for partition, epoch in start:
            shard = self._shards[partition] = _Shard(partition, epoch)
            if self._nursery is not None:  # (else run() starts it)
                self._nursery.start_soon(self._serve, shard)

    def _unload(self, shard: _Shard) -> None:
        del self._shards[shard.partition]
        shard.gone = True
        shard.scope.cancel()
        while shard.fifo:  # persists: dropped with the coordinator; transactional offsets:
            shard.fifo.popleft().on_failure(ErrorCode.NOT_COORDINATOR)  # the caller retries
        for token in shard.tokens:
            slot = self._slots.get(token)
            if slot is not None and slot.response is None:
                slot.response = refusal(slot.request, ErrorCode.NOT_COORDINATOR)
                slot.event.set()
        log.info("%s-%d: no longer coordinating its groups", OFFSETS_TOPIC, shard.partition)

    async def _load(self, shard: _Shard) -> None:
        """Replay the partition up to its log end, a chunk at a time (the loop stays
        responsive), into a fresh coordinator."""
        plog = self._context.logs.get_log(OFFSETS_TOPIC, shard.partition)
        records = _keyed(await replay(plog))
        replicas = self._context.replicas
        if replicas is not None and replicas.config.faults.coordinator_skips_load:
            records = []  # (the simulator's planted bug: nothing is loaded)
        coordinator = self._coordinator()
        coordinator.load(records, self._context.env.clock.wall_ms())
        shard.coordinator = coordinator
        log.info("%s-%d: coordinating its groups at leader epoch %d (%d records loaded)",
                 OFFSETS_TOPIC, shard.partition, shard.epoch, len(records))

    # --- requests --------------------------------------------------------------------------

    def handlers(self) -> dict[type[Request], Callable[[Any, RequestContext], Response | Pending]]:
        """The request handlers this driver serves, for the broker's dispatch table."""
        table: dict[type[Request], Callable[[Any, RequestContext], Response | Pending]] = {
            cls: self.begin for cls in GROUP_REQUEST_TYPES
        }
        table[ListGroups] = self.list_groups
        table[FindCoordinator] = self.find_coordinator
        return table

    def _shard_of(self, group_id: str) -> _Shard | ErrorCode:
        """The loaded shard coordinating ``group_id`` here, or why there is none."""
        shard = self._shards.get(offsets_partition_for(group_id, self.partitions))
        if shard is None:
            return ErrorCode.NOT_COORDINATOR
        if shard.coordinator is None:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return shard

    def begin(self, request: Any, call: RequestContext) -> Response | Pending:
        """Hand a group request to the coordinator of its group. Never blocks.

        Raises:
            SyncFailedError: an fsync failed earlier (the broker must stop).
        """
        assert self._loaded, "open() first"
        invalid = group_id_error(request.group_id)
        if invalid is not None:
            return refusal(request, invalid)
        shard = self._shard_of(request.group_id)
        if isinstance(shard, ErrorCode):
            return refusal(request, shard)
        token = next(self._tokens)
        slot = self._slots[token] = _Slot(request)
        self._feed(shard, GroupRequest(token, request, call.client_id, call.client_host),
                   call.now_ms)
        if slot.response is not None:
            del self._slots[token]
            return slot.response
        shard.tokens.add(token)

        async def wait() -> Response:
            try:
                await slot.event.wait()
            finally:
                self._slots.pop(token, None)
                shard.tokens.discard(token)
            assert slot.response is not None
            return slot.response

        return Pending(wait)

    def list_groups(self, request: ListGroups, call: RequestContext) -> ListGroupsResponse:
        """The groups of every shard loaded here, sorted by id (in a cluster each broker
        lists the groups it coordinates; ``Admin.list_groups`` asks them all)."""
        assert self._loaded, "open() first"
        groups: list[GroupListing] = []
        for shard in list(self._shards.values()):
            if shard.coordinator is not None:
                groups.extend(self._ask(shard, request, call.now_ms).groups)
        return ListGroupsResponse(ErrorCode.NONE, tuple(sorted(groups, key=_group_id)))

    def find_coordinator(self, request: FindCoordinator,
                         call: RequestContext) -> FindCoordinatorResponse:
        """A single node coordinates every group and transactional id; in a cluster a group's
        coordinator is the leader of its ``__consumer_offsets`` partition, a transactional
        id's the leader of its ``__transaction_state`` partition."""
        if request.key_type == COORDINATOR_KEY_GROUP and group_id_error(request.key) is not None:
            return FindCoordinatorResponse(ErrorCode.INVALID_GROUP_ID)
        context = self._context
        if self.clustered:
            assert context.cluster is not None
            if request.key_type == COORDINATOR_KEY_GROUP:
                partition = offsets_partition_for(request.key, self.partitions)
                where = context.cluster.leader_address(OFFSETS_TOPIC, partition)
            elif context.txn is not None:
                where = context.txn.coordinator_address(request.key)
            else:  # pragma: no cover - a broker always has a transaction driver
                where = None
            if where is None:
                return FindCoordinatorResponse(ErrorCode.COORDINATOR_NOT_AVAILABLE)
            return FindCoordinatorResponse(ErrorCode.NONE, *where)
        return FindCoordinatorResponse(
            ErrorCode.NONE, context.config.node_id, context.advertised_host,
            context.advertised_port,
        )

    def coordinates(self, group_id: str) -> bool:
        """Whether ``group_id``'s coordinator is a loaded shard of this broker. Never blocks."""
        return not isinstance(self._shard_of(group_id), ErrorCode)

    def check_txn_member(self, group_id: str, generation_id: int, member_id: str,
                         group_instance_id: str | None) -> ErrorCode | None:
        """The KIP-447 membership check of a transactional offset commit, by the coordinator
        of ``group_id`` (NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS when that is not a
        loaded shard here). Never blocks."""
        shard = self._shard_of(group_id)
        if isinstance(shard, ErrorCode):
            return shard
        assert shard.coordinator is not None
        return shard.coordinator.check_txn_member(
            group_id, generation_id, member_id, group_instance_id)

    # --- transactions --------------------------------------------------------------------

    async def commit_txn_offsets(
        self, group_id: str, offsets: Iterable[Any], commit_timestamp_ms: int
    ) -> None:
        """Make a committed transaction's offsets (``PendingOffset``-like: topic, partition,
        offset, metadata) durable in ``__consumer_offsets`` and visible to the group
        coordinator. Blocks until durable. The transaction driver's ``offsets_sink``.

        Raises:
            StorageError: the append failed, or the group is not coordinated here (nothing
                became visible).
            SyncFailedError: an fsync failed (the broker must stop).
        """
        shard = self._shard_of(group_id)
        if isinstance(shard, ErrorCode):
            raise StorageError(f"transactional offsets of {group_id} not written: {shard.name}")
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
            self._feed(shard, event, self._context.env.clock.wall_ms())
            done.set()

        def failed(code: ErrorCode) -> None:
            failure.append(code)
            done.set()

        self._append(shard, records, self._context.env.clock.wall_ms(), durable, failed)
        await done.wait()  # (an unloaded shard fails what its FIFO held: see _unload)
        if failure:
            raise StorageError(
                f"transactional offsets of {group_id} not written: {failure[0].name}")

    # --- tasks ---------------------------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Every shard's timer and durability tasks; run in the broker's nursery until
        cancelled.

        Raises:
            SyncFailedError: an fsync failed (the broker must stop).
        """
        assert self._loaded, "open() first"
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for shard in list(self._shards.values()):
                nursery.start_soon(self._serve, shard)
            task_status.started()
            await trio.sleep_forever()

    async def _serve(self, shard: _Shard) -> None:
        with shard.scope:
            if shard.coordinator is None:
                await self._load(shard)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._timer_loop, shard)
                nursery.start_soon(self._durability_loop, shard)

    async def _timer_loop(self, shard: _Shard) -> None:
        clock = self._context.env.clock
        coordinator = shard.coordinator
        assert coordinator is not None
        while True:
            shard.rearm = trio.Event()
            deadline = coordinator.next_deadline_ms()
            now_ms = clock.wall_ms()
            if deadline is not None and deadline <= now_ms:
                self._feed(shard, Tick(), now_ms)
                await trio.lowlevel.checkpoint()
                continue
            if deadline is None:
                await shard.rearm.wait()
            else:
                with trio.move_on_after((deadline - now_ms) / 1000):
                    await shard.rearm.wait()

    async def _durability_loop(self, shard: _Shard) -> None:
        while True:
            if not shard.fifo:
                shard.fifo_wakeup = trio.Event()
                await shard.fifo_wakeup.wait()
                continue
            head = shard.fifo[0]
            if head.error is None:
                assert head.partition is not None
                # durable (a cluster: on disk on every in-sync replica — bounded, a lagging
                # follower leaves the ISR after replica.lag.time.max.ms), or leadership lost
                if not await head.partition.wait_committed(head.last_offset, head.rule):
                    head.error = ErrorCode.NOT_COORDINATOR
            if shard.gone or not shard.fifo or shard.fifo[0] is not head:
                return  # unloaded while it waited: _unload answered everything queued
            shard.fifo.popleft()
            if head.error is None:
                head.on_durable()
            else:
                head.on_failure(head.error)

    # --- plumbing ------------------------------------------------------------------------

    def _feed(self, shard: _Shard, event: Any, now_ms: int) -> None:
        if shard.gone:
            return
        assert shard.coordinator is not None
        self._execute(shard, shard.coordinator.handle(event, now_ms), now_ms)
        shard.rearm.set()

    def _execute(self, shard: _Shard, instructions: list[Instruction], now_ms: int) -> None:
        for instruction in instructions:
            if isinstance(instruction, Respond):
                slot = self._slots.get(instruction.token)
                if slot is not None:  # else its connection closed: drop the answer
                    slot.response = instruction.response
                    slot.event.set()
            else:
                assert isinstance(instruction, Persist)
                self._persist(shard, instruction, now_ms)

    def _persist(self, shard: _Shard, instruction: Persist, now_ms: int) -> None:
        persist_id = instruction.persist_id

        def durable() -> None:
            self._feed(shard, Persisted(persist_id), self._context.env.clock.wall_ms())

        def failed(code: ErrorCode) -> None:
            self._feed(shard, PersistFailed(persist_id, code), self._context.env.clock.wall_ms())

        self._append(shard, instruction.records, now_ms, durable, failed)

    def _append(
        self,
        shard: _Shard,
        records: tuple[tuple[bytes, bytes | None], ...],
        now_ms: int,
        on_durable: Callable[[], None],
        on_failure: Callable[[ErrorCode], None],
    ) -> None:
        """Append ``records`` as one batch to the shard's partition now; queue the outcome in
        its FIFO."""
        partition = shard.partition
        context = self._context
        entry = _Appended(None, None, -1, on_durable, on_failure)
        try:
            state = context.partition(OFFSETS_TOPIC, partition)
            if self.clustered and state.rule is None:
                raise _NotLeading()
            builder = BatchBuilder(batch_bytes_max=limits.batch_bytes_max)
            for key, value in records:
                if not builder.append(now_ms, key, value):
                    raise _TooLarge()
            batch = builder.build()
            outcome = state.append_as_leader(batch, now_ms, _no_transactions)
            assert outcome.info is not None, outcome  # a plain batch is never refused
            info = outcome.info
        except _TooLarge:
            entry.error = ErrorCode.RECORD_LIST_TOO_LARGE
        except _NotLeading:
            entry.error = ErrorCode.NOT_COORDINATOR
        except SyncFailedError:
            raise
        except (StorageError, OSError) as exc:
            log.error("appending to %s-%d failed: %s", OFFSETS_TOPIC, partition, exc)
            entry.error = getattr(exc, "code", ErrorCode.KAFKA_STORAGE_ERROR)
            if entry.error == ErrorCode.NONE:  # pragma: no cover - defensive
                entry.error = ErrorCode.COORDINATOR_NOT_AVAILABLE
        else:
            entry.partition, entry.rule, entry.last_offset = state, state.rule, info.last_offset
        shard.fifo.append(entry)
        shard.fifo_wakeup.set()

    def _log_end_offset(self, topic: str, partition: int) -> int | None:
        context = self._context
        info = context.logs.topics().get(topic)
        if info is None or not 0 <= partition < info.partitions:
            return None
        state = context.partition(topic, partition)
        if self.clustered and state.rule is None:
            return _UNCHECKED  # led elsewhere: this broker's copy may lag; Kafka checks nothing
        return state.high_watermark

    # --- introspection -------------------------------------------------------------------

    def lag_rows(self) -> list[LagRow]:
        """Committed offset and high watermark of every committed partition of every group
        coordinated here. Never blocks (reads the coordinators' views and the logs' offsets)."""
        if not self._loaded:
            return []
        now_ms = self._context.env.clock.wall_ms()
        rows = []
        for shard in list(self._shards.values()):
            if shard.coordinator is None:
                continue
            for group in self._ask(shard, ListGroups(), now_ms).groups:
                answer = self._ask(shard, OffsetFetch(group.group_id, all_topics=True), now_ms)
                for topic in answer.topics:
                    for part in topic.partitions:
                        high = self._log_end_offset(topic.name, part.partition)
                        if part.offset >= 0 and high is not None and high != _UNCHECKED:
                            rows.append(LagRow(group.group_id, topic.name, part.partition,
                                               part.offset, high))
        return rows

    @staticmethod
    def _ask(shard: _Shard, request: Any, now_ms: int) -> Any:
        """Answer a read-only request synchronously (ListGroups, OffsetFetch)."""
        assert shard.coordinator is not None
        (answer,) = shard.coordinator.handle(GroupRequest(("metrics",), request), now_ms)
        assert isinstance(answer, Respond)
        return answer.response

    def statistics(self) -> dict[str, int]:
        """The coordinators' counts plus this driver's queues. Never blocks."""
        totals = {"groups": 0, "members": 0, "committed_offsets": 0, "persists_in_flight": 0,
                  "held_responses": 0}
        for shard in self._shards.values():
            if shard.coordinator is None:
                continue
            stats = shard.coordinator.statistics()
            totals["groups"] += stats.groups
            totals["members"] += stats.members
            totals["committed_offsets"] += stats.committed_offsets
            totals["persists_in_flight"] += stats.persists_in_flight
            totals["held_responses"] += stats.held_responses
        totals["answers_waiting"] = len(self._slots)
        totals["appends_waiting"] = sum(len(s.fifo) for s in self._shards.values())
        totals["shards"] = len(self._shards)
        return totals

    def check_invariants(self) -> None:
        """Every shard's coordinator invariants, and that a shard holds only its partition's
        groups. For tests and the simulator."""
        for partition, shard in self._shards.items():
            assert shard.partition == partition
            if shard.coordinator is not None:
                shard.coordinator.check_invariants()
                for group_id in shard.coordinator.group_ids():
                    assert offsets_partition_for(group_id, self.partitions) == partition


def refusal(request: Any, code: ErrorCode) -> Response:
    """The answer to a group request this broker does not coordinate (``code`` for the group,
    or for every partition of an OffsetCommit)."""
    if isinstance(request, JoinGroup):
        return JoinGroupResponse(code, member_id=request.member_id)
    if isinstance(request, SyncGroup):
        return SyncGroupResponse(code)
    if isinstance(request, Heartbeat):
        return HeartbeatResponse(code)
    if isinstance(request, LeaveGroup):
        return LeaveGroupResponse(code)
    if isinstance(request, OffsetCommit):
        return OffsetCommitResponse(tuple(
            OffsetCommitTopicResponse(topic.name, tuple(
                OffsetCommitPartitionResponse(p.partition, code) for p in topic.partitions))
            for topic in request.topics))
    if isinstance(request, OffsetFetch):
        return OffsetFetchResponse(code)
    if isinstance(request, DescribeGroup):
        return DescribeGroupResponse(request.group_id, code)
    assert isinstance(request, DeleteGroup), type(request)
    return DeleteGroupResponse(request.group_id, code)


def _group_id(listing: GroupListing) -> str:
    return listing.group_id


#: ``_log_end_offset`` of a partition led by another broker: commits are not checked against it.
_UNCHECKED = 1 << 62


class _NotLeading(Exception):
    """A clustered broker's shard outlived its leadership (the metadata moved on)."""



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


def _keyed(records: list[tuple[bytes | None, bytes | None]]
           ) -> list[tuple[bytes, bytes | None]]:
    """The records of ``__consumer_offsets`` that mean something (they all have a key)."""
    return [(key, value) for key, value in records if key is not None]


class _TooLarge(Exception):
    """The records of one persist do not fit one batch."""


def _no_transactions(header: Any) -> ErrorCode:
    raise AssertionError("the group coordinator appends plain batches only")
