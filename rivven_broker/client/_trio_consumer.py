"""The trio ``Consumer`` and ``Admin``: the blocking ones' cores, driven by tasks.

Theory of operation
-------------------
``TrioConsumer`` keeps a ``FetchState``; a fetch task resolves position resets and keeps one
Fetch in flight per leader (one task per request), exactly as the blocking fetch thread does,
and fires a signal when data lands. ``poll`` takes a completed fetch (making its partition
fetchable again, so the next Fetch overlaps the caller's work), decodes it and hands out up to
``max_poll_records`` records. No locks: state changes happen between awaits.

With a ``group_id``, ``subscribe`` makes the consumer a group member: ``poll`` awaits the
group's work (rebalances, callbacks, auto-commit) and a heartbeat task keeps the session
(``_trio_group.py``, the same ``GroupCore`` as the blocking consumer).

``TrioAdmin`` is the blocking ``Admin`` with ``await``: each method is one or two
``TrioCluster.call``s and the shared answer readers of ``requests.py`` and
``group_admin.py``.
"""

from __future__ import annotations

import re
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Iterable, Mapping

import trio

from rivven_broker.client._collector import CollectorPause
from rivven_broker.client._group import (
    CommitCallback,
    ConsumerGroupMetadata,
    RebalanceCallbacks,
    group_metadata_of,
)
from rivven_broker.client._trio_group import TrioGroupMember
from rivven_broker.client._trio_net import Background, ClientEnv, Signal, Spawner, TrioCluster
from rivven_broker.client.config import (
    ConnectionConfig,
    ConsumerConfig,
    bootstrap_and_topics,
    build_configs,
    deserialize,
)
from rivven_broker.client.consumer_core import apply_fetch_answer, apply_reset_answer
from rivven_broker.client.errors import (
    ClientTimeoutError,
    ClosedError,
    ConnectionFailedError,
    RivvenError,
    UnsupportedVersionError,
    error_for,
)
from rivven_broker.client.fetch_state import (
    EARLIEST,
    LATEST,
    FetchPlan,
    FetchState,
    consumer_metrics,
    decode_completed,
)
from rivven_broker.client.metadata import Address
from rivven_broker.client.requests import (
    ISOLATION_LEVELS,
    check_response,
    cluster_status,
    members_of,
    delete_records_request,
    delete_records_results,
    fetch_request,
    list_offsets_request,
    list_offsets_results,
    metadata_request,
    raise_for,
    topic_description,
    topic_listings,
)
from rivven_broker.client.types import (
    ClusterStatus,
    PartitionOffset,
    Record,
    TopicDescription,
    TopicListing,
    TopicPartition,
)
from rivven_broker.client.group_admin import (
    CoordinatorSearch,
    GroupDescription,
    GroupListing,
    group_description,
    group_listings,
    group_members,
    merged_listings,
    parse_reset_target,
    plan_reset,
)
from rivven_broker.client.group_core import committed_offsets
from rivven_broker.protocol import messages as m
from rivven_broker.protocol.errors import ErrorCode

__all__ = ["TrioConsumer", "TrioAdmin", "open_consumer", "open_admin"]

_IDLE_WAIT_MS = 1000


def _tp(item: Any) -> TopicPartition:
    return TopicPartition(item[0], item[1])


class TrioConsumer:
    """Use through ``open_consumer``; options as the blocking ``Consumer``."""

    def __init__(self, bootstrap: str, env: Any, nursery: Spawner, **options: Any) -> None:
        self.consumer_timeout_ms = options.pop("consumer_timeout_ms", None)
        self._config, conn_config = build_configs(options, ConsumerConfig, ConnectionConfig)
        self._deserializing = self._config.key_deserializer is not None or (
            self._config.value_deserializer is not None)
        self._polls = self._records_returned = 0  # for metrics()
        self._conn_config = conn_config
        self._clock = env.clock
        self._nursery = nursery
        self._cluster = TrioCluster(bootstrap, conn_config, env, nursery, in_flight_max=4)
        self._metadata = self._cluster.metadata
        self._state = FetchState(
            auto_offset_reset=self._config.auto_offset_reset,
            retry_backoff_ms=conn_config.retry_backoff_ms,
        )
        self._isolation = ISOLATION_LEVELS[self._config.isolation_level]
        self._wake = Signal()  # the fetch task has something to do
        self._arrived = Signal()  # data, a reset or an error landed
        self._fetching: set[int] = set()
        self._resetting: set[tuple[TopicPartition, int]] = set()
        self._inline: list | None = None
        self._closed = False
        self._group: TrioGroupMember | None = None
        if self._config.group_id is not None:
            self._group = TrioGroupMember(
                bootstrap, self._config, conn_config, env, nursery, self, self._arrived
            )

    # --- assignment (same meaning as the blocking Consumer) -------------------------------------
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        tps = [_tp(p) for p in partitions]
        self._state.assign(tps)
        self._metadata.add_topics(tp.topic for tp in tps)
        if self._inline is not None and self._inline[0].tp not in self._state.assignment():
            self._inline = None
        self._wake.fire()

    def assignment(self) -> set[TopicPartition]:
        return self._state.assignment()

    def subscription(self) -> set[str]:
        """As the blocking ``Consumer.subscription``: the topics subscribed to (empty
        without a subscription; a pattern lists the topics it currently matches)."""
        group = self._group
        if group is None or not group.core.subscribed:
            return set()
        return set(group.core.topics)

    async def topics(self) -> set[str]:
        """As the blocking ``Consumer.topics``: every topic the cluster has, internal ones
        left out."""
        answer = check_response(await self._cluster.call(metadata_request(None, False)),
                                m.MetadataResponse)
        return {topic.name for topic in answer.topics
                if topic.error_code == ErrorCode.NONE and not topic.is_internal}

    def subscribe(
        self,
        topics: Iterable[str] | str | re.Pattern[str] = (),
        pattern: str | re.Pattern[str] | None = None,
        *,
        listener: Any = None,
        on_assign: Callable[[set[TopicPartition]], None] | None = None,
        on_revoke: Callable[[set[TopicPartition]], None] | None = None,
        on_lost: Callable[[set[TopicPartition]], None] | None = None,
    ) -> None:
        """As the blocking ``Consumer.subscribe`` (callbacks run inside ``poll``)."""
        if isinstance(topics, re.Pattern):
            topics, pattern = (), topics
        names = [topics] if isinstance(topics, str) else list(topics)
        compiled = re.compile(pattern) if isinstance(pattern, str) else pattern
        if not names and compiled is None:
            raise ValueError("subscribe needs topics or a pattern")
        group = self._require_group("subscribe")
        callbacks = RebalanceCallbacks(listener, on_assign, on_revoke, on_lost)
        group.subscribe(names, compiled, callbacks)
        self._arrived.fire()

    async def commit(self, offsets: Any = None, *, timeout_ms: int | None = None) -> None:
        """As the blocking ``Consumer.commit``."""
        await self._require_group("commit").commit(offsets, timeout_ms)

    def commit_async(self, offsets: Any = None, callback: CommitCallback | None = None) -> None:
        """Commit in a background task; ``callback(offsets, error)`` is called there."""
        self._require_group("commit_async").commit_async(offsets, callback)

    async def committed(self, partitions: Any, *, timeout_ms: int | None = None) -> Any:
        """As the blocking ``Consumer.committed``."""
        group = self._require_group("committed")
        if isinstance(partitions, TopicPartition):
            return (await group.committed([partitions], timeout_ms))[partitions]
        return await group.committed(partitions, timeout_ms)

    def group_metadata(self) -> ConsumerGroupMetadata:
        """As the blocking ``Consumer.group_metadata`` (synchronous; never blocks).

        Raises:
            BrokerError (INVALID_GROUP_ID): the consumer has no ``group_id``.
            ClosedError: the consumer was closed.
        """
        return group_metadata_of(self._require_group("group_metadata").core)

    def _require_group(self, what: str) -> TrioGroupMember:
        self._check_open()
        if self._group is None:
            raise error_for(ErrorCode.INVALID_GROUP_ID, f"{what}() needs a consumer group_id")
        return self._group

    # --- called by the group member ---------------------------------------------------------------
    def _positions(self, partitions: set[TopicPartition] | None) -> dict:
        """``{tp: (position, None)}`` of assigned partitions (all, or these) with a position."""
        return {tp: (position, None) for tp, position in self._state.positions(partitions).items()}

    def _set_assignment(
        self, partitions: Iterable[TopicPartition], seeks: dict[TopicPartition, int]
    ) -> None:
        tps = self._state.assign_and_seek(partitions, seeks)
        self._metadata.add_topics(tp.topic for tp in tps)
        if self._inline is not None and (
            self._inline[0].tp not in self._state.assignment() or self._inline[0].tp in seeks
        ):
            self._inline = None
        self._wake.fire()

    def seek(self, partition: TopicPartition, offset: int) -> None:
        tp = _tp(partition)
        self._state.seek(tp, offset)
        self._drop_inline(tp)
        self._wake.fire()

    def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        self._reset(partitions, EARLIEST)

    def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        self._reset(partitions, LATEST)

    def _reset(self, partitions: Iterable[TopicPartition] | None, timestamp: int) -> None:
        for item in self._state.assignment() if partitions is None else partitions:
            tp = _tp(item)
            self._state.request_reset(tp, timestamp)
            self._drop_inline(tp)
        self._wake.fire()

    def _drop_inline(self, tp: TopicPartition) -> None:
        if self._inline is not None and self._inline[0].tp == tp:
            self._inline = None

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        for item in partitions:
            tp = _tp(item)
            if self._inline is not None and self._inline[0].tp == tp:
                self._inline = None
                position = self._state.position(tp)
                if position is not None:
                    self._state.seek(tp, position)
            self._state.pause([tp])

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        self._state.resume(_tp(p) for p in partitions)
        self._wake.fire()

    async def position(self, partition: TopicPartition, timeout_ms: int | None = None) -> int:
        """The next offset ``poll`` returns; waits for a pending reset (ClientTimeoutError)."""
        tp = _tp(partition)
        timeout_ms = self._conn_config.request_timeout_ms if timeout_ms is None else timeout_ms
        with trio.move_on_after(timeout_ms / 1000):
            while True:
                self._check_open()
                position = self._state.position(tp)
                if position is not None:
                    return position
                error = self._state.take_error()
                if error is not None:
                    raise error
                await self._arrived.wait()
        raise ClientTimeoutError(f"the position of {tp} did not resolve in time")

    async def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return await self._list_offsets(partitions, LATEST)

    async def beginning_offsets(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int]:
        return await self._list_offsets(partitions, EARLIEST)

    async def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, PartitionOffset | None]:
        """As the blocking ``Consumer.offsets_for_times``."""
        specs = {_tp(tp): int(ms) for tp, ms in timestamps.items()}
        if any(ms < 0 for ms in specs.values()):
            raise ValueError("offsets_for_times takes timestamps >= 0 (ms since the epoch)")
        found = await self._list_offsets_at(specs)
        return {tp: (None if at.offset < 0 else at) for tp, at in found.items()}

    async def _list_offsets(self, partitions, timestamp: int) -> dict[TopicPartition, int]:
        found = await self._list_offsets_at({_tp(item): timestamp for item in partitions})
        return {tp: at.offset for tp, at in found.items()}

    async def _list_offsets_at(
        self, specs: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, PartitionOffset]:
        by_node: dict[int, list[tuple[TopicPartition, int]]] = {}
        for tp, spec in specs.items():
            node = await self._cluster.leader_for(tp.topic, tp.partition)
            by_node.setdefault(node, []).append((tp, spec))
        out = {}
        for node, entries in by_node.items():
            request = list_offsets_request(entries, self._isolation)
            answer = await self._cluster.call(request, node_id=node)
            for tp, (code, offset) in list_offsets_results(answer).items():
                raise_for(code, None, f"list offsets of {tp}")
                out[tp] = offset
        return out

    # --- consuming -------------------------------------------------------------------------------
    async def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> list[Record]:
        """Up to ``max_records`` records, waiting up to ``timeout_ms`` for the first.
        Always a checkpoint. Raises as the blocking ``Consumer.poll``."""
        limit = self._config.max_poll_records if max_records is None else max_records
        out: list[Record] = []
        group = self._group
        await trio.lowlevel.checkpoint()
        try:
            with trio.move_on_after(max(timeout_ms, 0) / 1000) as poll_scope:
                while not out:
                    if group is not None:
                        self._check_open()
                        await group.maintain(poll_scope)
                    arrived = self._arrived.current()
                    self._fill(out, limit)
                    if not out and not (group is not None and group.wants_attention()):
                        await arrived.wait()
        finally:
            if group is not None:
                group.poll_ended()  # max_poll_interval_ms counts from here
        if not out:
            self._fill(out, limit)
        self._polls += 1
        self._records_returned += len(out)
        if self._deserializing and out:
            return deserialize(self._config, out)
        return out

    def metrics(self) -> dict[str, dict]:
        """As the blocking ``Consumer.metrics`` (synchronous; never blocks)."""
        return consumer_metrics(self._state, self._records_returned, self._polls)

    def _fill(self, out: list[Record], limit: int) -> None:
        # records cannot form cycles: see _collector.py (opt-in: process-wide)
        collector = CollectorPause(self._config.pause_gc_while_decoding)
        try:
            self._fill_paused(out, limit, collector)
        finally:
            collector.end()

    def _fill_paused(self, out: list[Record], limit: int, collector: CollectorPause) -> None:
        while len(out) < limit:
            if self._inline is None:
                self._check_open()
                if out and self._state.has_error():
                    return  # hand out what came before it; the next poll raises the error
                error = self._state.take_error()
                if error is not None:
                    raise error
                completed = self._state.take_completed()
                if completed is None:
                    return
                self._wake.fire()  # prefetch the partition's next chunk meanwhile
                collector.begin()
                records, corruption = decode_completed(completed, check_crc=self._config.check_crcs)
                if corruption is not None:  # stop at the damage; poll raises it next
                    completed = self._state.corrupted(completed, corruption)
                if not records:
                    self._state.advance(completed.tp, completed.epoch, completed.next_offset)
                    continue
                self._inline = [completed, records, 0]
            completed, records, index = self._inline
            end = min(len(records), index + limit - len(out))
            out.extend(records[index:end])
            if end == len(records):
                self._inline = None
                position = completed.next_offset
            else:
                self._inline[2] = end
                position = records[end - 1].offset + 1
            self._state.advance(completed.tp, completed.epoch, position)

    def __aiter__(self) -> AsyncIterator[Record]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Record]:
        idle = self.consumer_timeout_ms
        while not self._closed:
            records = await self.poll(_IDLE_WAIT_MS if idle is None else idle)
            if not records and idle is not None:
                return
            for record in records:
                yield record

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the consumer is closed")

    # --- the fetch task --------------------------------------------------------------------------
    async def _run_fetcher(self) -> None:
        while not self._closed:
            now = self._clock.monotonic_ms()
            want: list[int] = []

            def node_ready(node_id: int) -> bool:
                address = self._metadata.address_of(node_id)
                if address is None or node_id in self._fetching:
                    return False
                if self._cluster.connection(address) is None:
                    want.append(node_id)
                    return False
                return True

            resets = [r for r in self._state.resets_needed(now) if r[:2] not in self._resetting]
            plans, unknown = self._state.plan_fetches(now, self._metadata.leader_for, node_ready)
            if unknown:
                self._metadata.request_update()
            if self._metadata.wanted and self._metadata.needs_update(now):
                self._cluster.refresh_soon()
            self._start_resets(resets, want)
            for plan in plans:
                self._fetching.add(plan.node_id)
                self._nursery.start_soon(self._fetch, plan)
            wait_ms = _IDLE_WAIT_MS
            for node_id in dict.fromkeys(want):
                address = self._metadata.address_of(node_id)
                if self._cluster.can_dial(address, now):
                    self._nursery.start_soon(self._dial, address)
                else:
                    wait_ms = min(wait_ms, max(self._cluster.retry_at_ms(address) - now, 1))
            retry = self._state.next_retry_ms(now)
            if retry is not None:
                wait_ms = min(wait_ms, retry - now)
            if self._metadata.wanted:
                wait_ms = min(wait_ms, max(self._metadata.update_due_ms(now) - now, 1))
            await self._wake.wait(max(0, wait_ms))

    async def _dial(self, address: Address) -> None:
        try:
            await self._cluster.connect(address)
        except RivvenError:
            self._metadata.request_update()
        self._wake.fire()

    def _start_resets(self, resets: list, want: list[int]) -> None:
        by_node: dict[int, list] = {}
        for entry in resets:
            node = self._metadata.leader_for(entry[0].topic, entry[0].partition)
            if node is None:
                self._metadata.request_update()
                continue
            address = self._metadata.address_of(node)
            if self._cluster.connection(address) is None:
                want.append(node)
                continue
            by_node.setdefault(node, []).append(entry)
        for node, entries in by_node.items():
            for tp, epoch, _ in entries:
                self._resetting.add((tp, epoch))
            self._nursery.start_soon(self._reset_offsets, node, entries)

    async def _reset_offsets(self, node: int, entries: list) -> None:
        response, error = None, None
        try:
            conn = self._cluster.connection(self._metadata.address_of(node))
            if conn is None:
                raise ConnectionFailedError(f"no connection to broker {node}")
            request = list_offsets_request([(tp, ts) for tp, _, ts in entries], self._isolation)
            response = await conn.request(request, self._conn_config.request_timeout_ms)
        except RivvenError as exc:
            error = exc
        for tp, epoch, _ in entries:
            self._resetting.discard((tp, epoch))
        now = self._clock.monotonic_ms()
        if apply_reset_answer(self._state, entries, response, error, now):
            self._metadata.request_update()
        self._arrived.fire()
        self._wake.fire()

    async def _fetch(self, plan: FetchPlan) -> None:
        config = self._config
        response, error = None, None
        try:
            conn = self._cluster.connection(self._metadata.address_of(plan.node_id))
            if conn is None:
                raise ConnectionFailedError(f"no connection to broker {plan.node_id}")
            request = fetch_request(
                plan,
                max_wait_ms=config.fetch_max_wait_ms,
                min_bytes=config.fetch_min_bytes,
                max_bytes=config.fetch_max_bytes,
                partition_max_bytes=config.max_partition_fetch_bytes,
                isolation_level=self._isolation,
                leader_epoch=self._metadata.leader_epoch_for,
            )
            timeout_ms = self._conn_config.request_timeout_ms + config.fetch_max_wait_ms
            response = await conn.request(request, timeout_ms)
        except RivvenError as exc:
            error = exc
        finally:
            self._fetching.discard(plan.node_id)
        if apply_fetch_answer(self._state, plan, response, error, self._clock.monotonic_ms()):
            self._metadata.request_update()
        self._arrived.fire()
        self._wake.fire()

    async def aclose(self, autocommit: bool = True) -> None:
        """As the blocking ``Consumer.close``: commit (with auto-commit, unless
        ``autocommit=False``), leave the group, stop fetching. Idempotent; leaving the
        ``open_consumer`` block does the same with ``autocommit=True``."""
        await self._leave(autocommit)
        self._shutdown()

    async def _leave(self, autocommit: bool = True) -> None:
        """Commit, revoke and leave the group (as the blocking ``close``)."""
        if self._group is not None and not self._closed:
            with trio.CancelScope(shield=True):
                with trio.move_on_after(self._conn_config.request_timeout_ms / 1000):
                    await self._group.close(autocommit=autocommit)

    def _abandon(self) -> None:
        """Stop without committing or leaving (a crash, as the group sees it). For tests."""
        if self._group is not None:
            self._group.abandon()
        self._shutdown()

    def _shutdown(self) -> None:
        if self._group is not None:
            self._group.abandon()
        self._closed = True
        self._cluster.close()
        self._arrived.fire()
        self._wake.fire()


class TrioAdmin:
    """Use through ``open_admin``; methods as the blocking ``Admin``, awaited."""

    def __init__(self, bootstrap: str, env: Any, nursery: trio.Nursery,
                 *, connect_attempts_max: int = 3, **options: Any) -> None:
        (config,) = build_configs(options, ConnectionConfig)
        self._cluster = TrioCluster(bootstrap, config, env, nursery, in_flight_max=8,
                                    connect_attempts_max=connect_attempts_max)
        self._rng = env.rng("admin-retry")

    async def create_topic(self, name: str, partitions: int = 3, replication_factor: int = 1,
                           config: Mapping[str, str] | None = None, *,
                           validate_only: bool = False) -> None:
        request = m.CreateTopic(name=name, partitions=partitions,
                                replication_factor=replication_factor,
                                configs=dict(config or {}), validate_only=validate_only)
        response = check_response(await self._cluster.call(request), m.CreateTopicResponse)
        raise_for(response.error_code, response.error_message, f"create topic {name!r}")

    async def list_topics(self, *, include_internal: bool = False) -> list[TopicListing]:
        request = m.ListTopics(include_internal=include_internal)
        return topic_listings(await self._cluster.call(request))

    async def describe_topic(self, name: str) -> TopicDescription:
        describe = await self._cluster.call(m.DescribeTopic(name=name))
        metadata = await self._cluster.call(metadata_request([name], False))
        return topic_description(describe, metadata)

    async def alter_topic_config(self, name: str, config: Mapping[str, str | None]) -> None:
        request = m.AlterTopicConfig(name=name, configs=dict(config))
        response = check_response(await self._cluster.call(request), m.AlterTopicConfigResponse)
        raise_for(response.error_code, response.error_message, f"alter topic {name!r}")

    async def create_partitions(self, topic: str, total_count: int, *,
                                validate_only: bool = False) -> None:
        request = m.CreatePartitions(name=topic, count=total_count, validate_only=validate_only)
        response = check_response(await self._cluster.call(request), m.CreatePartitionsResponse)
        raise_for(response.error_code, response.error_message, f"create partitions of {topic!r}")

    async def delete_topic(self, name: str) -> None:
        response = check_response(
            await self._cluster.call(m.DeleteTopic(name=name)), m.DeleteTopicResponse
        )
        raise_for(response.error_code, response.error_message, f"delete topic {name!r}")

    async def list_offsets(
        self, specs: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, PartitionOffset]:
        out = {}
        for node, entries in (await self._by_leader(specs)).items():
            answer = await self._cluster.call(list_offsets_request(entries), node_id=node)
            for tp, (code, offset) in list_offsets_results(answer).items():
                raise_for(code, None, f"list offsets of {tp}")
                out[tp] = offset
        return out

    async def delete_records(self, offsets: Mapping[TopicPartition, int], *,
                             timeout_ms: int = 30_000) -> dict[TopicPartition, int]:
        out: dict[TopicPartition, int] = {}
        for node, entries in (await self._by_leader(offsets)).items():
            request = delete_records_request(dict(entries), timeout_ms)
            out.update(delete_records_results(await self._cluster.call(request, node_id=node)))
        return out

    async def _by_leader(self, items: Mapping[TopicPartition, int]) -> dict[int, list]:
        by_node: dict[int, list] = {}
        for item, value in items.items():
            tp = _tp(item)
            node = await self._cluster.leader_for(tp.topic, tp.partition)
            by_node.setdefault(node, []).append((tp, value))
        return by_node

    async def cluster_status(self) -> ClusterStatus:
        try:
            members, raft = members_of(await self._cluster.call(m.DescribeCluster()))
        except UnsupportedVersionError:  # a broker older than membership: no members to show
            members, raft = (), None
        return cluster_status(await self._cluster.call(metadata_request(None, False)), members,
                              raft)

    async def ping(self) -> None:
        check_response(await self._cluster.call(m.Ping()), m.Pong)

    async def _coordinator_call(self, group_id: str, request: Any) -> Any:
        """As the blocking ``Admin``'s: found again while the coordinator moves or loads."""
        search = CoordinatorSearch(group_id, self._cluster.now_ms(), self._rng)
        while True:
            try:
                answer = await self._cluster.call(m.FindCoordinator(group_id, 0))
                failure = search.answered(answer, "find")
                if failure is None:
                    if self._cluster.metadata.address_of(answer.node_id) is None:
                        metadata = await self._cluster.call(metadata_request([], False))
                        self._cluster.metadata.on_update(metadata, self._cluster.now_ms())
                    response = await self._cluster.call(request, node_id=answer.node_id)
                    failure = search.answered(response, "call")
                    if failure is None:
                        return response
            except RivvenError as error:
                failure = error
            await trio.sleep(search.retry_in_ms(failure, self._cluster.now_ms()) / 1000)

    async def list_groups(self) -> list[GroupListing]:
        metadata = await self._cluster.call(metadata_request([], False))
        brokers = [b.node_id for b in metadata.brokers]
        if len(brokers) <= 1:
            return group_listings(await self._cluster.call(m.ListGroups()))
        return merged_listings([await self._cluster.call(m.ListGroups(), node_id=node)
                                for node in brokers])

    async def describe_group(self, group_id: str) -> GroupDescription:
        describe = await self._coordinator_call(group_id, m.DescribeGroup(group_id))
        members = group_members(describe)
        answer = await self._coordinator_call(group_id, m.OffsetFetch(group_id, all_topics=True))
        committed = committed_offsets(answer)
        wanted = set(committed) | {tp for member in members for tp in member.assignment}
        ends = {}
        for tp in sorted(wanted):
            try:
                ends[tp] = (await self.list_offsets({tp: -1}))[tp].offset
            except RivvenError:
                continue
        return group_description(describe, committed, ends)

    async def delete_group(self, group_id: str) -> None:
        answer = await self._coordinator_call(group_id, m.DeleteGroup(group_id))
        raise_for(answer.error_code, None, f"delete group {group_id!r}")

    async def reset_offsets(self, group_id: str, topic: str, to: Any, *,
                            dry_run: bool = False) -> dict[TopicPartition, int]:
        """As the blocking ``Admin.reset_offsets``."""
        target = parse_reset_target(to)
        describe = await self._coordinator_call(group_id, m.DescribeGroup(group_id))
        if describe.error_code == ErrorCode.NONE and describe.members:
            raise error_for(ErrorCode.NON_EMPTY_GROUP, f"group {group_id!r} has members")
        metadata = check_response(
            await self._cluster.call(metadata_request([topic], False)), m.MetadataResponse
        )
        (entry,) = [t for t in metadata.topics if t.name == topic]
        raise_for(entry.error_code, None, f"topic {topic!r}")
        tps = [TopicPartition(topic, p.partition) for p in entry.partitions]

        async def offsets_at(spec: int) -> dict[TopicPartition, int]:
            found = await self.list_offsets({tp: spec for tp in tps})
            return {tp: o.offset for tp, o in found.items()}

        earliest, latest = await offsets_at(-2), await offsets_at(-1)
        at_timestamp = await offsets_at(target.value) if target.kind == "timestamp" else {}
        committed = {}
        if target.kind == "shift":
            answer = await self._coordinator_call(
                group_id, m.OffsetFetch(group_id, all_topics=True))
            committed = committed_offsets(answer)
        offsets = plan_reset(target, tps, committed, earliest, latest, at_timestamp)
        if dry_run:
            return offsets
        parts = tuple(m.OffsetCommitPartition(tp.partition, o) for tp, o in sorted(offsets.items()))
        answer = await self._coordinator_call(
            group_id, m.OffsetCommit(group_id, topics=(m.OffsetCommitTopic(topic, parts),))
        )
        for part in answer.topics[0].partitions:
            raise_for(part.error_code, None, f"reset {topic}-{part.partition} of {group_id!r}")
        return offsets


@asynccontextmanager
async def open_consumer(
    bootstrap: str | None = None, *, env: Any = None, **options: Any
) -> AsyncIterator[TrioConsumer]:
    """A trio ``Consumer`` for the body of an ``async with``; options as the blocking one."""
    bootstrap, _ = bootstrap_and_topics(() if bootstrap is None else (bootstrap,), None,
                                        options, takes_topics=False)
    async with trio.open_nursery() as nursery:
        background = Background(nursery)  # outlives an outer cancellation: _leave needs it
        consumer = TrioConsumer(bootstrap, env or ClientEnv(), background, **options)
        background.start_soon(consumer._run_fetcher)
        try:
            yield consumer
        finally:
            try:
                await consumer._leave()
            finally:
                consumer._shutdown()
                background.stop()
                nursery.cancel_scope.cancel()


@asynccontextmanager
async def open_admin(
    bootstrap: str | None = None, *, env: Any = None, **options: Any
) -> AsyncIterator[TrioAdmin]:
    """A trio ``Admin`` for the body of an ``async with``."""
    bootstrap, _ = bootstrap_and_topics(() if bootstrap is None else (bootstrap,), None,
                                        options, takes_topics=False)
    async with trio.open_nursery() as nursery:
        admin = TrioAdmin(bootstrap, env or ClientEnv(), nursery, **options)
        try:
            yield admin
        finally:
            admin._cluster.close()
            nursery.cancel_scope.cancel()
