"""The blocking ``Consumer``: ``poll`` on the user's thread, prefetching on a fetch thread.

Theory of operation
-------------------
A background *fetch thread* owns the network. Each loop it asks the core's ``FetcherCore.step``
(``consumer_core.py``, the same as the trio driver's) what to do: which position resets
(ListOffsets to the partition leader) and which Fetches (one per leader with none in flight)
to send, which leaders to dial, whether metadata is due and when to wake; it does that and
waits in ``NetworkClient.poll``. Answers go back to the core; fetched data is stored,
undecoded, as completed fetches; the thread then notifies ``poll``.

``poll`` takes a completed fetch under the lock (which makes its partition fetchable again and
wakes the fetch thread, so the next Fetch is in flight while the user works), decodes it
*outside* the lock into ``Record`` tuples and hands them out, up to ``max_poll_records`` per
call, advancing positions. The consumer is therefore never stop-and-wait, and the buffer is
bounded: per partition one completed fetch waiting, one being consumed, one in flight. From
its first decode until it returns, ``poll`` pauses Python's cyclic garbage collector
(``CollectorPause``: records cannot form cycles, and scanning them cost a third of the
decode), never while it waits or runs group work.

The consumer is not thread-safe (like Kafka's): one thread calls its methods; only the fetch
thread runs beside it. ``seek``/``assign``/``pause`` drop what was prefetched for the partitions
they touch (stale answers are recognised by epoch and dropped).

Consumer groups: with a ``group_id``, ``subscribe`` (topics or a regex ``pattern``) makes the
consumer a group member; the group's work (rebalances, rebalance callbacks, auto-commit) runs
inside ``poll`` on the user's thread and heartbeats run on a thread of their own
(``_group.py``). ``commit``/``commit_async``/``committed`` work for subscribed and for
consumers that ``assign`` partitions (those commit outside membership). See docs/consumer-groups.md.
"""

from __future__ import annotations

import random
import re
import threading
from typing import Any, Callable, Iterable, Iterator, Mapping

from rivven_broker.client._collector import CollectorPause
from rivven_broker.client._cluster import ClusterIO
from rivven_broker.client._group import (
    CommitCallback,
    ConsumerGroupMetadata,
    GroupMember,
    RebalanceCallbacks,
    group_metadata_of,
)
from rivven_broker.client._network import NetworkClient, monotonic_ms
from rivven_broker.client._sync import SyncClient
from rivven_broker.client.config import (
    ConnectionConfig,
    ConsumerConfig,
    bootstrap_and_topics,
    build_configs,
    deserialize,
)
from rivven_broker.client.errors import (
    ClientTimeoutError,
    ClosedError,
    RivvenError,
    error_for,
)
from rivven_broker.client.fetch_state import (
    EARLIEST,
    LATEST,
    CompletedFetch,
    FetchPlan,
    FetchState,
    consumer_metrics,
    decode_completed,
)
from rivven_broker.client.metadata import MetadataCache, parse_bootstrap
from rivven_broker.client.consumer_core import FetcherCore
from rivven_broker.client.requests import (
    ISOLATION_LEVELS,
    list_offsets_request,
    list_offsets_results,
)
from rivven_broker.client.types import PartitionOffset, Record, TopicPartition
from rivven_broker.protocol.errors import ErrorCode

__all__ = ["Consumer"]

_IDLE_WAIT_MS = 1000


class Consumer:
    """Reads records from assigned partitions. See docs/client.md for every option.

    ``Consumer(bootstrap, group_id=None, auto_offset_reset="latest", enable_auto_commit=True,
    isolation_level="read_uncommitted", fetch_max_wait_ms=500, fetch_min_bytes=1,
    fetch_max_bytes=50 MiB, max_partition_fetch_bytes=1 MiB, max_poll_records=500,
    consumer_timeout_ms=None, ...)``. Construction starts the fetch thread; no network I/O
    happens until partitions are assigned.

    As kafka-python: ``Consumer(*topics, bootstrap_servers="h:9092", group_id=...)``
    subscribes to the topics (with a ``group_id``) or assigns all their partitions (without;
    this asks the broker for the partition counts). A single argument without a port is
    refused at once: ``Consumer("orders")`` would otherwise connect to a host "orders".
    """

    def __init__(
        self,
        *args: str,
        bootstrap: str | None = None,
        consumer_timeout_ms: int | None = None,
        **options: Any,
    ) -> None:
        bootstrap, topics = bootstrap_and_topics(args, bootstrap, options, takes_topics=True)
        self._config, self._conn_config = build_configs(options, ConsumerConfig, ConnectionConfig)
        self._deserializing = self._config.key_deserializer is not None or (
            self._config.value_deserializer is not None)
        self._bootstrap = bootstrap
        self.consumer_timeout_ms = consumer_timeout_ms
        self._cond = threading.Condition(threading.Lock())
        self._metadata = MetadataCache(
            parse_bootstrap(bootstrap),
            metadata_max_age_ms=self._conn_config.metadata_max_age_ms,
            refresh_backoff_ms=self._conn_config.retry_backoff_ms,
        )
        self._state = FetchState(
            auto_offset_reset=self._config.auto_offset_reset,
            retry_backoff_ms=self._conn_config.retry_backoff_ms,
        )
        self._isolation = ISOLATION_LEVELS[self._config.isolation_level]
        self._fetcher = FetcherCore(self._config, self._conn_config, self._metadata, self._state)
        self._net = NetworkClient(self._conn_config, in_flight_max=8, rng=random.Random())
        self._cluster = ClusterIO(
            self._net, self._metadata, self._cond, allow_auto_topic_creation=False
        )
        self._polls = self._records_returned = 0  # for metrics()
        self._inline: list | None = None  # [completed, records, index] being handed out
        self._sync: SyncClient | None = None
        self._closed = False
        self._fatal: BaseException | None = None
        self._group: GroupMember | None = None
        if self._config.group_id is not None:
            self._group = GroupMember(bootstrap, self._config, self._conn_config, self._cond, self)
        self._thread = threading.Thread(target=self._run, name="rivven-consumer", daemon=True)
        self._thread.start()
        if topics:
            try:
                if self._group is not None:
                    self.subscribe(list(topics))
                else:
                    self.assign([TopicPartition(topic, p) for topic in topics
                                 for p in self.partitions_for_topic(topic)])
            except BaseException:
                self._shutdown()
                raise

    # --- assignment and positions --------------------------------------------------------------
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly these partitions (replacing the previous assignment)."""
        tps = [TopicPartition(tp[0], tp[1]) for tp in partitions]
        with self._cond:
            self._check_open()
            self._state.assign(tps)
            self._metadata.add_topics(tp.topic for tp in tps)
            if self._inline is not None and self._inline[0].tp not in self._state.assignment():
                self._inline = None
        self._net.wakeup()

    def assignment(self) -> set[TopicPartition]:
        with self._cond:
            return self._state.assignment()

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
        """Join the group of ``group_id`` for ``topics`` (or every topic whose whole name
        matches the regex ``pattern``; a compiled pattern may also be passed as ``topics``).
        The partitions arrive through rebalances inside ``poll``; the callbacks (or a
        ``listener`` with ``on_partitions_assigned``/``_revoked``/``_lost``) run there, on
        this thread. Never blocks.

        Raises:
            BrokerError (INVALID_GROUP_ID): the consumer has no ``group_id``.
            ValueError: neither topics nor a pattern.
        """
        if isinstance(topics, re.Pattern):
            topics, pattern = (), topics
        names = [topics] if isinstance(topics, str) else list(topics)
        compiled = re.compile(pattern) if isinstance(pattern, str) else pattern
        if not names and compiled is None:
            raise ValueError("subscribe needs topics or a pattern")
        group = self._require_group("subscribe")
        callbacks = RebalanceCallbacks(listener, on_assign, on_revoke, on_lost)
        with self._cond:
            self._check_open()
            group.subscribe(names, compiled, callbacks)
            self._cond.notify_all()

    def subscription(self) -> set[str]:
        """The topics subscribed to (empty without a subscription; a pattern subscription
        lists the topics it currently matches)."""
        group = self._group
        if group is None or not group.core.subscribed:
            return set()
        with self._cond:
            return set(group.core.topics)

    def topics(self) -> set[str]:
        """Every topic the cluster has, internal ones left out (blocks on the network)."""
        answer = self._sync_client().fetch_metadata(None)
        return {topic.name for topic in answer.topics
                if topic.error_code == ErrorCode.NONE and not topic.is_internal}

    def unsubscribe(self) -> None:
        """Leave the group (revoking, committing as ``close`` does) or drop the manual
        assignment. Blocks on the coordinator when subscribed."""
        if self._group is not None and self._group.core.subscribed:
            group, self._group = self._group, None
            group.close()
            self._group = GroupMember(
                self._bootstrap, self._config, self._conn_config, self._cond, self
            )
        self.assign([])

    def commit(self, offsets: Any = None, *, timeout_ms: int | None = None) -> None:
        """Commit ``offsets`` (``{tp: offset}`` or ``{tp: (offset, metadata)}``; the offset is
        the next one to read) or, by default, the current position of every assigned
        partition. Blocks until the commit is durable.

        Raises:
            BrokerError: refused (REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION,
                UNKNOWN_MEMBER_ID: the group moved on; OFFSET_OUT_OF_RANGE ...).
            ClientTimeoutError: no answer within ``timeout_ms`` (default request_timeout_ms).
        """
        self._require_group("commit").commit(offsets, timeout_ms)

    def commit_async(
        self, offsets: Any = None, callback: CommitCallback | None = None
    ) -> None:
        """Like ``commit`` without waiting: a background thread sends it; ``callback(offsets,
        error)`` runs on this thread at the next ``poll``/``commit``/``close``. Never blocks."""
        self._require_group("commit_async").commit_async(offsets, callback)

    def committed(
        self, partitions: Any, *, timeout_ms: int | None = None
    ) -> dict[TopicPartition, int | None] | int | None:
        """The group's committed offset (None: nothing committed) of one ``TopicPartition``,
        or a dict for an iterable of them. Blocks on the coordinator."""
        group = self._require_group("committed")
        if isinstance(partitions, TopicPartition):
            return group.committed([partitions], timeout_ms)[partitions]
        return group.committed(partitions, timeout_ms)

    def group_metadata(self) -> ConsumerGroupMetadata:
        """This member's group id, generation, member id and group instance id now, for
        ``Producer.send_offsets_to_transaction`` (the broker then refuses the offsets once the
        member has left that generation). Generation -1 and member id "" before joining (or
        with ``assign``): no membership check. Never blocks.

        Raises:
            BrokerError (INVALID_GROUP_ID): the consumer has no ``group_id``.
            ClosedError: the consumer was closed.
        """
        group = self._require_group("group_metadata")
        with self._cond:
            return group_metadata_of(group.core)

    def _require_group(self, what: str) -> GroupMember:
        self._check_open()
        if self._group is None:
            raise error_for(ErrorCode.INVALID_GROUP_ID, f"{what}() needs a consumer group_id")
        return self._group

    # --- called by the group member, under the lock ---------------------------------------------
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
        self._net.wakeup()

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """The next ``poll`` returns ``partition`` from ``offset``.

        Raises:
            KeyError: the partition is not assigned. ValueError: a negative offset.
        """
        tp = TopicPartition(partition[0], partition[1])
        with self._cond:
            self._state.seek(tp, offset)
            self._drop_inline(tp)
        self._net.wakeup()

    def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Move to the earliest retained offset (resolved lazily by the fetch thread)."""
        self._reset(partitions, EARLIEST)

    def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Move to the high watermark (resolved lazily by the fetch thread)."""
        self._reset(partitions, LATEST)

    def _reset(self, partitions: Iterable[TopicPartition] | None, timestamp: int) -> None:
        with self._cond:
            tps = self._state.assignment() if partitions is None else partitions
            for tp in tps:
                tp = TopicPartition(tp[0], tp[1])
                self._state.request_reset(tp, timestamp)
                self._drop_inline(tp)
        self._net.wakeup()

    def _drop_inline(self, tp: TopicPartition) -> None:
        if self._inline is not None and self._inline[0].tp == tp:
            self._inline = None

    def position(self, partition: TopicPartition, timeout_ms: int | None = None) -> int:
        """The offset of the next record ``poll`` returns; waits for a pending reset.

        Raises:
            KeyError: not assigned. ClientTimeoutError: the reset did not resolve in time
            (default request_timeout_ms). The partition's error, if its reset failed.
        """
        tp = TopicPartition(partition[0], partition[1])
        timeout_ms = self._conn_config.request_timeout_ms if timeout_ms is None else timeout_ms
        deadline = monotonic_ms() + timeout_ms
        with self._cond:
            while True:
                self._check_open()
                position = self._state.position(tp)
                if position is not None:
                    return position
                error = self._state.take_error()
                if error is not None:
                    raise error
                remaining = deadline - monotonic_ms()
                if remaining <= 0:
                    raise ClientTimeoutError(f"the position of {tp} did not resolve in time")
                self._cond.wait(remaining / 1000)

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        """Stop fetching and returning these partitions until ``resume``."""
        with self._cond:
            for tp in partitions:
                tp = TopicPartition(tp[0], tp[1])
                if self._inline is not None and self._inline[0].tp == tp:
                    position = self._state.position(tp)
                    self._inline = None
                    if position is not None:
                        self._state.seek(tp, position)  # refetch from here on resume
                self._state.pause([tp])

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        with self._cond:
            self._state.resume(TopicPartition(tp[0], tp[1]) for tp in partitions)
        self._net.wakeup()

    def paused(self) -> set[TopicPartition]:
        with self._cond:
            return self._state.paused()

    def highwater(self, partition: TopicPartition) -> int:
        """The high watermark seen in the last fetch of ``partition`` (-1 before any)."""
        with self._cond:
            return self._state.high_watermark(TopicPartition(partition[0], partition[1]))

    # --- offset look-ups (the user's thread, a private connection) -----------------------------
    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The earliest retained offset per partition (blocks on the network)."""
        return self._list_offsets(partitions, EARLIEST)

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The high watermark per partition (blocks on the network)."""
        return self._list_offsets(partitions, LATEST)

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, PartitionOffset | None]:
        """Per partition, the first offset whose record's timestamp is at or after the
        timestamp (ms) given for it, with that record's timestamp; None when there is none
        (as kafka-python and Kafka's ``offsetsForTimes``: exact inside a batch too). Blocks
        on the network.

        Raises:
            ValueError: a negative timestamp.
            BrokerError: UNKNOWN_TOPIC_OR_PARTITION and the like.
        """
        specs = {TopicPartition(tp[0], tp[1]): int(ms) for tp, ms in timestamps.items()}
        if any(ms < 0 for ms in specs.values()):
            raise ValueError("offsets_for_times takes timestamps >= 0 (ms since the epoch)")
        found = self._list_offsets_at(specs)
        return {tp: (None if at.offset < 0 else at) for tp, at in found.items()}

    def partitions_for_topic(self, topic: str) -> list[int]:
        """The topic's partition numbers (blocks on the network).

        Raises:
            UnknownTopicOrPartitionError: no such topic.
        """
        client = self._sync_client()
        response = client.fetch_metadata([topic])
        for entry in response.topics:
            if entry.name == topic:
                if entry.error_code != ErrorCode.NONE:
                    raise error_for(entry.error_code, f"topic {topic!r}")
                return sorted(p.partition for p in entry.partitions)
        raise error_for(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic!r}")

    def _list_offsets(
        self, partitions: Iterable[TopicPartition], timestamp: int
    ) -> dict[TopicPartition, int]:
        specs = {TopicPartition(tp[0], tp[1]): timestamp for tp in partitions}
        return {tp: found.offset for tp, found in self._list_offsets_at(specs).items()}

    def _list_offsets_at(
        self, specs: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, PartitionOffset]:
        """ListOffsets per partition (a timestamp, or EARLIEST / LATEST), by leader."""
        client = self._sync_client()
        by_node: dict[int, list[tuple[TopicPartition, int]]] = {}
        for tp, spec in specs.items():
            node = client.leader_for(tp.topic, tp.partition)
            by_node.setdefault(node, []).append((tp, spec))
        out = {}
        for node, entries in by_node.items():
            request = list_offsets_request(entries, self._isolation)
            answer = client.call(request, node_id=node)
            for tp, (code, offset) in list_offsets_results(answer).items():
                if code != ErrorCode.NONE:
                    raise error_for(code, f"list offsets of {tp}")
                out[tp] = offset
        return out

    def _sync_client(self) -> SyncClient:
        self._check_open()
        if self._sync is None:
            self._sync = SyncClient(self._bootstrap, self._conn_config)
        return self._sync

    # --- consuming -----------------------------------------------------------------------------
    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> list[Record]:
        """Up to ``max_records`` (default ``max_poll_records``) records; waits up to
        ``timeout_ms`` for the first one. Returns [] on timeout.

        Raises:
            OffsetOutOfRangeError: a position is out of range and auto_offset_reset is "none".
            CorruptMessageError: a fetched batch failed its CRC or framing check.
            BrokerError: another non-retriable partition error. ClosedError: closed.
        """
        limit = self._config.max_poll_records if max_records is None else max_records
        assert limit > 0
        out: list[Record] = []
        deadline = monotonic_ms() + timeout_ms
        group = self._group
        collector = CollectorPause(self._config.pause_gc_while_decoding)
        try:
            while len(out) < limit:
                if group is not None and not out:
                    collector.end()  # group work may block and runs user callbacks
                    self._check_open()
                    group.maintain()  # rebalance, callbacks, auto-commit: between two batches
                if self._inline is not None:
                    self._take_inline(out, limit)
                    continue
                if not out:
                    collector.end()  # the wait below may block
                elif self._state.has_error():
                    break  # hand out what came before it; the next poll raises the error
                completed = self._next_completed(deadline if not out else 0)
                if completed is None:
                    if out or group is None or monotonic_ms() >= deadline:
                        break
                    continue  # the group wants attention: maintain, then wait on
                collector.begin()
                records, corruption = decode_completed(completed, check_crc=self._config.check_crcs)
                if corruption is not None:  # stop at the damage; poll raises it next
                    with self._cond:
                        completed = self._state.corrupted(completed, corruption)
                if records:
                    self._inline = [completed, records, 0]
                else:
                    with self._cond:
                        self._state.advance(completed.tp, completed.epoch, completed.next_offset)
        finally:
            collector.end()
            if group is not None:
                group.poll_ended()  # max_poll_interval_ms counts from here
        self._polls += 1
        self._records_returned += len(out)
        if self._deserializing and out:
            return deserialize(self._config, out)
        return out

    def metrics(self) -> dict[str, dict]:
        """Figures under kafka-python's names: records consumed, polls, assigned partitions
        and the largest lag (high watermark of the last fetch minus the position). Never
        blocks on the network."""
        with self._cond:
            return consumer_metrics(self._state, self._records_returned, self._polls)

    def _next_completed(self, deadline: int) -> CompletedFetch | None:
        with self._cond:
            while True:
                self._check_open()
                error = self._state.take_error()
                if error is not None:
                    raise error
                completed = self._state.take_completed()
                if completed is not None:
                    break
                remaining = deadline - monotonic_ms()
                if remaining <= 0 or (self._group is not None and self._group.wants_attention()):
                    return None
                self._cond.wait(remaining / 1000)
        self._net.wakeup()  # its partition is fetchable again: prefetch the next chunk
        return completed

    def _take_inline(self, out: list[Record], limit: int) -> None:
        completed, records, index = self._inline
        end = min(len(records), index + limit - len(out))
        out.extend(records[index:end] if index or end < len(records) else records)
        if end == len(records):
            self._inline = None
            position = completed.next_offset
        else:
            self._inline[2] = end
            position = records[end - 1].offset + 1
        with self._cond:
            self._state.advance(completed.tp, completed.epoch, position)

    def __iter__(self) -> Iterator[Record]:
        """Records forever (or until ``consumer_timeout_ms`` passes without one, or close)."""
        idle_ms = self.consumer_timeout_ms
        while not self._closed:
            records = self.poll(timeout_ms=_IDLE_WAIT_MS if idle_ms is None else idle_ms)
            if not records and idle_ms is not None:
                return
            yield from records

    # --- lifecycle -----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._fatal is not None:
            raise ClosedError(f"the fetch thread failed: {self._fatal!r}") from self._fatal
        if self._closed:
            raise ClosedError("the consumer is closed")

    def close(self, autocommit: bool = True) -> None:
        """Commit (with auto-commit, unless ``autocommit=False``), leave the group (dynamic
        members), stop fetching and close connections. Idempotent; blocks until the threads
        exit."""
        if self._group is not None and not self._closed and self._fatal is None:
            self._group.close(autocommit=autocommit)
        self._shutdown()

    def _abandon(self) -> None:
        """Stop everything without committing or leaving: what a crashed process leaves
        behind (its group session simply runs out). For tests."""
        if self._group is not None:
            self._group.abandon()
        self._shutdown()

    def _shutdown(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._net.wakeup()
        if self._thread is not threading.current_thread():
            self._thread.join()
        if self._sync is not None:
            self._sync.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- the fetch thread ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._loop_once():
                pass
        except BaseException as exc:  # a bug: make poll fail instead of waiting forever
            self._fatal = exc
            raise
        finally:
            self._net.close(ClosedError("the consumer is closed"))
            with self._cond:
                self._cond.notify_all()

    def _loop_once(self) -> bool:
        net = self._net

        def node_ready(node_id: int) -> bool | None:
            address = self._metadata.address_of(node_id)
            if not net.is_connected(address):
                return None
            return net.is_ready(address)

        with self._cond:
            if self._closed:
                return False
            now = monotonic_ms()
            step = self._fetcher.step(now, node_ready)
        if step.metadata_due:
            self._cluster.refresh_if_due(now)
        dialled, retry_at = self._cluster.dial_waiting(step.dial, now)
        wake_at = step.wake_at_ms if retry_at is None else min(step.wake_at_ms, retry_at)
        for node, entries in step.resets:
            self._send_resets(node, entries)
        for plan in step.fetches:
            self._send_fetch(plan)
        self._net.poll(0 if dialled else max(0, wake_at - now))
        return True

    def _send_resets(self, node: int, entries: list[tuple[TopicPartition, int, int]]) -> None:
        with self._cond:
            address = self._metadata.address_of(node)
            request = self._fetcher.reset_request(entries)

        def on_answer(response: Any, error: RivvenError | None) -> None:
            with self._cond:
                self._fetcher.on_reset_answer(entries, response, error, monotonic_ms())
                self._cond.notify_all()

        self._net.send(address, request, on_answer)

    def _send_fetch(self, plan: FetchPlan) -> None:
        with self._cond:
            address = self._metadata.address_of(plan.node_id)
            request = self._fetcher.fetch_request(plan)

        def on_answer(response: Any, error: RivvenError | None) -> None:
            with self._cond:
                self._fetcher.on_fetch_answer(plan, response, error, monotonic_ms())
                self._cond.notify_all()

        self._net.send(address, request, on_answer, timeout_ms=self._fetcher.fetch_timeout_ms)
