"""The async ``Consumer`` (AnyIO: trio or asyncio): the fetch and group cores, driven by tasks.

Theory of operation
-------------------
``AsyncConsumer`` keeps a ``FetchState``; a fetch task steps the core's ``FetcherCore``: it
starts one task per position reset, sends each Fetch the step plans (one in flight per
leader) at once on its connection (``Connection.request_soon``: the reader hands the answer
to the core; a task only when the socket is busy or simulated), dials the leaders the step
names, and fires a signal when data lands. ``poll`` takes a completed fetch (making its
partition fetchable again, so the next Fetch overlaps the caller's work) and has the fetcher
step on the loop at once (``step_now``: from a blocking front's thread one ``call_soon``,
no signal and no task switch before the next Fetch leaves), decodes it and hands out up to
``max_poll_records`` records. The fetch state is touched under the ``Bridge`` lock (never
across an await): a blocking front (``_consumer.Consumer``) calls ``poll``'s part that takes
and decodes completed fetches (``fill``) and the plain methods on its caller's thread.

With a ``group_id``, ``subscribe`` makes the consumer a group member: ``poll`` awaits the
group's work (rebalances, callbacks, auto-commit) and a heartbeat task keeps the session
(``_aio_group.py``, over the ``GroupCore``).

``AsyncAdmin`` lives in ``_aio_admin.py``.
"""

from __future__ import annotations

import re
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Iterable, Mapping

import anyio
import anyio.lowlevel

from rivven_broker.client._collector import CollectorPause
from rivven_broker.client._aio_group import GroupMember
from rivven_broker.client._aio_net import (
    Background,
    Bridge,
    ClientEnv,
    Cluster,
    Signal,
    Spawner,
    open_task_group,
)
from rivven_broker.client.config import (
    ConnectionConfig,
    ConsumerConfig,
    bootstrap_and_topics,
    build_configs,
    deserialize,
)
from rivven_broker.client.consumer_core import FetcherCore
from rivven_broker.client.membership import (
    CommitCallback,
    ConsumerGroupMetadata,
    RebalanceCallbacks,
    group_metadata_of,
)
from rivven_broker.client.errors import (
    ClientTimeoutError,
    ClosedError,
    ConnectionFailedError,
    RivvenError,
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
from rivven_broker.client.requests import (
    ISOLATION_LEVELS,
    check_response,
    list_offsets_request,
    list_offsets_results,
    metadata_request,
    raise_for,
)
from rivven_broker.client.types import PartitionOffset, Record, TopicPartition
from rivven_broker.protocol import messages as m
from rivven_broker.protocol.errors import ErrorCode

__all__ = ["AsyncConsumer", "open_consumer"]

_IDLE_WAIT_MS = 1000


def _tp(item: Any) -> TopicPartition:
    return TopicPartition(item[0], item[1])


class AsyncConsumer:
    """Use through ``open_consumer``; options as the blocking ``Consumer``."""

    def __init__(self, bootstrap: str, env: Any, nursery: Spawner, *, bridge: Bridge | None = None,
                 **options: Any) -> None:
        self.consumer_timeout_ms = options.pop("consumer_timeout_ms", None)
        self._config, conn_config = build_configs(options, ConsumerConfig, ConnectionConfig)
        self._deserializing = self._config.key_deserializer is not None or (
            self._config.value_deserializer is not None)
        self._polls = self._records_returned = 0  # for metrics()
        self._conn_config = conn_config
        self._clock = env.clock
        self._nursery = nursery
        self._bootstrap, self._env = bootstrap, env
        self._bridge = bridge = bridge or Bridge()
        self._lock = bridge.lock
        self._cluster = Cluster(bootstrap, conn_config, env, nursery, in_flight_max=4,
                                bridge=bridge)
        self._metadata = self._cluster.metadata
        self._state = FetchState(
            auto_offset_reset=self._config.auto_offset_reset,
            retry_backoff_ms=conn_config.retry_backoff_ms,
        )
        self._isolation = ISOLATION_LEVELS[self._config.isolation_level]
        self._fetcher = FetcherCore(self._config, conn_config, self._metadata, self._state)
        self._wake = Signal(bridge)  # the fetch task has something to do
        self._cluster.on_update = self._wake.fire  # a refresh or a dial ended: step again
        self._arrived = Signal(bridge)  # data, a reset or an error landed
        #: when the fetch task steps again unless woken (its last step's answer)
        self._fetcher_wake_at_ms = 0
        self._inline: list | None = None
        self._closed = False
        self._group: GroupMember | None = None
        if self._config.group_id is not None:
            self._group = self._new_group()

    def _new_group(self) -> GroupMember:
        return GroupMember(self._bootstrap, self._config, self._conn_config, self._env,
                           self._nursery, self, self._arrived, self._bridge)

    # --- assignment (same meaning as the blocking Consumer) -------------------------------------
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        tps = [_tp(p) for p in partitions]
        with self._lock:
            self._check_open()
            self._state.assign(tps)
            self._metadata.add_topics(tp.topic for tp in tps)
            if self._inline is not None and self._inline[0].tp not in self._state.assignment():
                self._inline = None
        self._wake.fire()

    def assignment(self) -> set[TopicPartition]:
        with self._lock:
            return self._state.assignment()

    def subscription(self) -> set[str]:
        """As the blocking ``Consumer.subscription``: the topics subscribed to (empty
        without a subscription; a pattern lists the topics it currently matches)."""
        group = self._group
        if group is None or not group.core.subscribed:
            return set()
        with self._lock:
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

    async def unsubscribe(self) -> None:
        """As the blocking ``Consumer.unsubscribe``: leave the group (revoking, committing as
        ``aclose`` does) or drop the manual assignment."""
        group = self._group
        if group is not None and group.core.subscribed:
            await group.close()
            self._group = self._new_group()
            self._group.run_callback = group.run_callback
        self.assign([])

    async def partitions_for_topic(self, topic: str) -> list[int]:
        """As the blocking ``Consumer.partitions_for_topic``.

        Raises:
            UnknownTopicOrPartitionError: no such topic.
        """
        answer = check_response(await self._cluster.call(metadata_request([topic], False)),
                                m.MetadataResponse)
        for entry in answer.topics:
            if entry.name == topic:
                raise_for(entry.error_code, None, f"topic {topic!r}")
                return sorted(p.partition for p in entry.partitions)
        raise error_for(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic!r}")

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

    def _require_group(self, what: str) -> GroupMember:
        self._check_open()
        if self._group is None:
            raise error_for(ErrorCode.INVALID_GROUP_ID, f"{what}() needs a consumer group_id")
        return self._group

    # --- called by the group member ---------------------------------------------------------------
    def _positions(self, partitions: set[TopicPartition] | None) -> dict:
        """``{tp: (position, None)}`` of assigned partitions (all, or these) with a position."""
        with self._lock:
            positions = self._state.positions(partitions)
        return {tp: (position, None) for tp, position in positions.items()}

    def _set_assignment(
        self, partitions: Iterable[TopicPartition], seeks: dict[TopicPartition, int]
    ) -> None:
        with self._lock:
            tps = self._state.assign_and_seek(partitions, seeks)
            self._metadata.add_topics(tp.topic for tp in tps)
            if self._inline is not None and (
                self._inline[0].tp not in self._state.assignment() or self._inline[0].tp in seeks
            ):
                self._inline = None
        self._wake.fire()

    def seek(self, partition: TopicPartition, offset: int) -> None:
        tp = _tp(partition)
        with self._lock:
            self._state.seek(tp, offset)
            self._drop_inline(tp)
        self._wake.fire()

    def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        self._reset(partitions, EARLIEST)

    def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        self._reset(partitions, LATEST)

    def _reset(self, partitions: Iterable[TopicPartition] | None, timestamp: int) -> None:
        with self._lock:
            for item in self._state.assignment() if partitions is None else partitions:
                tp = _tp(item)
                self._state.request_reset(tp, timestamp)
                self._drop_inline(tp)
        self._wake.fire()

    def _drop_inline(self, tp: TopicPartition) -> None:
        if self._inline is not None and self._inline[0].tp == tp:
            self._inline = None

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        with self._lock:
            for item in partitions:
                tp = _tp(item)
                if self._inline is not None and self._inline[0].tp == tp:
                    self._inline = None
                    position = self._state.position(tp)
                    if position is not None:
                        self._state.seek(tp, position)  # refetch from here on resume
                self._state.pause([tp])

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        with self._lock:
            self._state.resume(_tp(p) for p in partitions)
        self._wake.fire()

    def paused(self) -> set[TopicPartition]:
        with self._lock:
            return self._state.paused()

    def highwater(self, partition: TopicPartition) -> int:
        """The high watermark seen in the last fetch of ``partition`` (-1 before any)."""
        with self._lock:
            return self._state.high_watermark(_tp(partition))

    def position_now(self, partition: TopicPartition) -> int | None:
        """The position if known (None while a reset is pending); raises a failed reset's
        error. Never waits."""
        with self._lock:
            self._check_open()
            position = self._state.position(_tp(partition))
            if position is not None:
                return position
            error = self._state.take_error()
        if error is not None:
            raise error
        return None

    async def position(self, partition: TopicPartition, timeout_ms: int | None = None) -> int:
        """The next offset ``poll`` returns; waits for a pending reset (ClientTimeoutError)."""
        tp = _tp(partition)
        timeout_ms = self._conn_config.request_timeout_ms if timeout_ms is None else timeout_ms
        with anyio.move_on_after(timeout_ms / 1000):
            while True:
                arrived = self._arrived.current()
                position = self.position_now(tp)
                if position is not None:
                    return position
                await arrived.wait()
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
        await anyio.lowlevel.checkpoint()
        try:
            with anyio.move_on_after(max(timeout_ms, 0) / 1000) as poll_scope:
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
        with self._lock:
            return consumer_metrics(self._state, self._records_returned, self._polls)

    def _fill(self, out: list[Record], limit: int) -> None:
        # records cannot form cycles: see _collector.py (opt-in: process-wide)
        collector = CollectorPause(self._config.pause_gc_while_decoding)
        try:
            self.fill(out, limit, collector)
        finally:
            collector.end()

    def fill(self, out: list[Record], limit: int, collector: CollectorPause) -> None:
        """Hand out up to ``limit`` records into ``out`` from completed fetches: take one under
        the lock (its partition becomes fetchable: the next Fetch overlaps this work), decode
        it outside the lock, on the calling thread, then advance the position. Never waits.
        Raises the first partition error once the records before it are out."""
        lock, state = self._lock, self._state
        while len(out) < limit:
            if self._inline is None:
                with lock:
                    self._check_open()
                    if out and state.has_error():
                        return  # hand out what came before it; the next poll raises the error
                    error = state.take_error()
                    completed = None if error is not None else state.take_completed()
                if error is not None:
                    raise error
                if completed is None:
                    return
                # prefetch the partition's next chunk meanwhile: the fetcher steps on the
                # loop at once (from another thread, one call_soon; no signal, no task switch)
                self._bridge.call_soon(self.step_now)
                collector.begin()
                records, corruption = decode_completed(completed, check_crc=self._config.check_crcs)
                if corruption is not None or not records:
                    with lock:
                        if corruption is not None:  # stop at the damage; poll raises it next
                            completed = state.corrupted(completed, corruption)
                        if not records:
                            state.advance(completed.tp, completed.epoch, completed.next_offset)
                    if not records:
                        continue
                self._inline = [completed, records, 0]
            completed, records, index = self._inline
            end = min(len(records), index + limit - len(out))
            out.extend(records[index:end] if index or end < len(records) else records)
            if end == len(records):
                self._inline = None
                position = completed.next_offset
            else:
                self._inline[2] = end
                position = records[end - 1].offset + 1
            with lock:
                state.advance(completed.tp, completed.epoch, position)

    def has_data(self) -> bool:
        """Whether ``fill`` has something to hand out (or an error to raise) now."""
        with self._lock:
            return self._inline is not None or self._state.has_completed() or (
                self._state.has_error())

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
            wait_ms = max(0, self._step_fetcher())
            self._fetcher_wake_at_ms = self._clock.monotonic_ms() + wait_ms
            await self._wake.wait(wait_ms)

    def step_now(self) -> None:
        """Step the fetcher outside its task, on the loop (``fill`` took a completed fetch:
        its partition's next Fetch leaves at once). The task is woken only when this step
        wants an earlier next step than the one it sleeps until."""
        if self._closed:
            return
        wait_ms = self._step_fetcher()
        if self._clock.monotonic_ms() + wait_ms < self._fetcher_wake_at_ms:
            self._wake.fire()

    def _node_ready(self, node_id: int) -> bool | None:
        address = self._metadata.address_of(node_id)
        return None if self._cluster.connection(address) is None else True

    def _step_fetcher(self) -> int:
        """One step of the fetcher (never awaits): what the core says, started; returns the
        ms until the next step is due."""
        now = self._clock.monotonic_ms()
        with self._lock:
            step = self._fetcher.step(now, self._node_ready)
        if step.metadata_due:
            self._cluster.refresh_soon()  # its end wakes the fetch task (on_update)
        wake_at = step.wake_at_ms
        retry_at = self._cluster.dial_waiting(step.dial, now)  # a dial's end wakes it too
        if retry_at is not None:
            wake_at = min(wake_at, max(retry_at, now + 1))
        for node, entries in step.resets:
            self._nursery.start_soon(self._reset_offsets, node, entries)
        for plan in step.fetches:
            self._fetch_soon(plan)
        return wake_at - now

    async def _request(self, node_id: int, request: Any, timeout_ms: int) -> tuple[Any, Any]:
        """``(response, None)`` or ``(None, error)`` of one request to a connected leader."""
        try:
            conn = self._cluster.connection(self._metadata.address_of(node_id))
            if conn is None:
                raise ConnectionFailedError(f"no connection to broker {node_id}")
            return await conn.request(request, timeout_ms), None
        except RivvenError as error:
            return None, error

    async def _reset_offsets(self, node: int, entries: list) -> None:
        with self._lock:
            request = self._fetcher.reset_request(entries)
        response, error = await self._request(node, request, self._conn_config.request_timeout_ms)
        with self._lock:
            self._fetcher.on_reset_answer(entries, response, error, self._clock.monotonic_ms())
        self._arrived.fire()
        self._wake.fire()

    def _fetch_soon(self, plan: FetchPlan) -> None:
        """Send one Fetch: at once, its answer handled by the connection's reader
        (``request_soon``), or, when the connection cannot take it so, by a task."""
        conn = self._cluster.connection(self._metadata.address_of(plan.node_id))
        if conn is not None:
            with self._lock:
                request = self._fetcher.fetch_request(plan)

            def on_answer(response: Any, error: RivvenError | None) -> None:
                self._fetch_answered(plan, response, error)

            if conn.request_soon(request, self._fetcher.fetch_timeout_ms, on_answer):
                return
        self._nursery.start_soon(self._fetch, plan)

    async def _fetch(self, plan: FetchPlan) -> None:
        with self._lock:
            request = self._fetcher.fetch_request(plan)
        response, error = await self._request(plan.node_id, request,
                                              self._fetcher.fetch_timeout_ms)
        self._fetch_answered(plan, response, error)

    def _fetch_answered(self, plan: FetchPlan, response: Any, error: RivvenError | None) -> None:
        with self._lock:
            self._fetcher.on_fetch_answer(plan, response, error, self._clock.monotonic_ms())
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
            with anyio.CancelScope(shield=True):
                with anyio.move_on_after(self._conn_config.request_timeout_ms / 1000):
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


@asynccontextmanager
async def open_consumer(
    bootstrap: str | None = None, *, env: Any = None, bridge: Bridge | None = None,
    **options: Any
) -> AsyncIterator[AsyncConsumer]:
    """An async ``Consumer`` for the body of an ``async with``; options as the blocking one."""
    bootstrap, _ = bootstrap_and_topics(() if bootstrap is None else (bootstrap,), None,
                                        options, takes_topics=False)
    async with open_task_group() as nursery:
        background = Background(nursery)  # outlives an outer cancellation: _leave needs it
        consumer = AsyncConsumer(bootstrap, env or ClientEnv(), background, bridge=bridge,
                                 **options)
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
