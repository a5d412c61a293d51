"""The blocking ``Consumer``: a thin layer over the async one, decoding on the caller's thread.

Theory of operation
-------------------
The consumer is ``AsyncConsumer`` (``_aio_consumer.py``), hosted on a ``LoopThread``: its
fetch task prefetches (one Fetch in flight per leader, answers stored undecoded) and its group
member heartbeats there. This class adds only what a blocking caller needs:

- ``poll`` never goes through the portal for records: on the caller's thread it runs the
  driver's ``fill`` (take a completed fetch under the ``Bridge`` lock, which makes its
  partition fetchable again and wakes the fetch task; decode it outside the lock, here; advance
  the position), and waits on the bridge's condition, which every arrival notifies. From its
  first decode until it returns, ``poll`` pauses Python's cyclic garbage collector when
  ``pause_gc_while_decoding`` asks (``CollectorPause``), never while it waits or runs group
  work.
- ``assign``, ``seek``, ``pause`` and the other plain methods are the driver's own, called
  here under its lock.
- Group work (rebalances, auto-commit, ``commit``, ``close``) runs on the loop, started through
  the portal while this thread *pumps*: the user's rebalance and ``commit_async`` callbacks are
  handed back and run here (``GroupMember.run_callback``), so a callback may call the consumer
  (``commit``, ``seek``, ``position``) as it could before.

The consumer is not thread-safe (like Kafka's): one thread calls its methods.
"""

from __future__ import annotations

import queue
import re
from concurrent.futures import Future
from typing import Any, Callable, Iterable, Iterator, Mapping

import anyio

from rivven_broker.client._aio_consumer import open_consumer
from rivven_broker.client._collector import CollectorPause
from rivven_broker.client._loop_thread import start_loop_thread
from rivven_broker.client.config import bootstrap_and_topics, deserialize
from rivven_broker.client.errors import ClientTimeoutError
from rivven_broker.client.membership import CommitCallback, ConsumerGroupMetadata
from rivven_broker.client.types import PartitionOffset, Record, TopicPartition

__all__ = ["Consumer"]

_IDLE_WAIT_S = 1.0
_IDLE_WAIT_MS = 1000


class Consumer:
    """Reads records from Rivven. See docs/client.md for every option.

    ``Consumer(*topics, bootstrap=..., group_id=None, auto_offset_reset="latest",
    enable_auto_commit=True, isolation_level="read_uncommitted", max_poll_records=500,
    fetch_max_bytes=..., consumer_timeout_ms=None, ...)``; kafka-python's spelling
    (``bootstrap_servers=[...]``, topics as positional arguments) works too.

    Raises:
        ValueError / TypeError: a bad or unknown option.
    """

    def __init__(
        self,
        *args: str,
        bootstrap: str | None = None,
        consumer_timeout_ms: int | None = None,
        **options: Any,
    ) -> None:
        bootstrap, topics = bootstrap_and_topics(args, bootstrap, options, takes_topics=True)
        self.consumer_timeout_ms = consumer_timeout_ms
        self._loop = start_loop_thread("rivven-consumer")
        bridge = self._loop.bridge
        try:
            self._async = self._loop.host(open_consumer, bootstrap, bridge=bridge, **options)
        except BaseException:
            self._loop.close()
            raise
        self._bridge = bridge
        self._config = self._async._config
        self._conn_config = self._async._conn_config
        self._deserializing = self._async._deserializing
        self._callbacks: queue.SimpleQueue[Any] = self._loop.handback_queue()
        if self._async._group is not None:
            self._async._group.run_callback = self._run_callback
        self._polls = self._records_returned = 0
        self._closed = False
        if topics:
            try:
                if self._async._group is not None:
                    self.subscribe(list(topics))
                else:
                    self.assign([TopicPartition(topic, p) for topic in topics
                                 for p in self.partitions_for_topic(topic)])
            except BaseException:
                self._abandon()
                raise

    # --- the loop, and callbacks handed back to this thread ------------------------------------
    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the loop (awaited if a coroutine function), running the callbacks
        it hands back on this thread meanwhile; its result or exception."""
        done: Future = self._loop.start(fn, *args)
        done.add_done_callback(lambda _: self._callbacks.put(None))
        while not done.done():
            job = self._callbacks.get()
            if job is not None:
                callback, args_, finished = job
                try:
                    callback(*args_)
                finally:
                    self._bridge.call_soon(finished.set)
        return done.result()

    async def _run_callback(self, callback: Callable[..., Any], *args: Any) -> None:
        """(On the loop.) Hand ``callback(*args)`` to the consumer's thread; wait for it."""
        finished = anyio.Event()
        self._callbacks.put((callback, args, finished))
        await finished.wait()

    # --- assignment and positions (the driver's, under its lock) --------------------------------
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly these partitions (replacing the previous assignment)."""
        self._async.assign(partitions)

    def assignment(self) -> set[TopicPartition]:
        return self._async.assignment()

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
        this thread. Never blocks on the network.

        Raises:
            BrokerError (INVALID_GROUP_ID): the consumer has no ``group_id``.
            ValueError: neither topics nor a pattern.
        """
        self._loop.call(lambda: self._async.subscribe(
            topics, pattern, listener=listener, on_assign=on_assign, on_revoke=on_revoke,
            on_lost=on_lost))

    def subscription(self) -> set[str]:
        """The topics subscribed to (empty without a subscription; a pattern subscription
        lists the topics it currently matches)."""
        return self._async.subscription()

    def topics(self) -> set[str]:
        """Every topic the cluster has, internal ones left out (blocks on the network)."""
        return self._loop.call(self._async.topics)

    def unsubscribe(self) -> None:
        """Leave the group (revoking, committing as ``close`` does) or drop the manual
        assignment. Blocks on the coordinator when subscribed."""
        self._call(self._async.unsubscribe)

    def commit(self, offsets: Any = None, *, timeout_ms: int | None = None) -> None:
        """Commit ``offsets`` (``{tp: offset}`` or ``{tp: (offset, metadata)}``; the offset is
        the next one to read) or, by default, the current position of every assigned
        partition. Blocks until the commit is durable.

        Raises:
            BrokerError: refused (REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION,
                UNKNOWN_MEMBER_ID: the group moved on; OFFSET_OUT_OF_RANGE ...).
            ClientTimeoutError: no answer within ``timeout_ms`` (default request_timeout_ms).
        """
        self._call(lambda: self._async.commit(offsets, timeout_ms=timeout_ms))

    def commit_async(self, offsets: Any = None, callback: CommitCallback | None = None) -> None:
        """Like ``commit`` without waiting: the loop sends it; ``callback(offsets, error)`` runs
        on this thread at the next ``poll``/``commit``/``close``. Never blocks on the network.

        Raises:
            BufferExhaustedError: ``limits.async_commits_pending_max`` commits are pending.
        """
        self._loop.call(self._async.commit_async, offsets, callback)

    def committed(
        self, partitions: Any, *, timeout_ms: int | None = None
    ) -> dict[TopicPartition, int | None] | int | None:
        """The group's committed offset (None: nothing committed) of one ``TopicPartition``,
        or a dict for an iterable of them. Blocks on the coordinator."""
        return self._call(lambda: self._async.committed(partitions, timeout_ms=timeout_ms))

    def group_metadata(self) -> ConsumerGroupMetadata:
        """This member's group id, generation, member id and group instance id now, for
        ``Producer.send_offsets_to_transaction``. Generation -1 and member id "" before
        joining (or with ``assign``): no membership check. Never blocks on the network.

        Raises:
            BrokerError (INVALID_GROUP_ID): the consumer has no ``group_id``.
            ClosedError: the consumer was closed.
        """
        return self._loop.call(self._async.group_metadata)

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Read ``partition`` from ``offset`` on (what was prefetched is dropped)."""
        self._async.seek(partition, offset)

    def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        self._async.seek_to_beginning(partitions)

    def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        self._async.seek_to_end(partitions)

    def position(self, partition: TopicPartition, timeout_ms: int | None = None) -> int:
        """The offset of the next record ``poll`` returns; waits for a pending reset.

        Raises:
            KeyError: not assigned. ClientTimeoutError: the reset did not resolve in time
            (default request_timeout_ms). The partition's error, if its reset failed.
        """
        timeout_ms = self._conn_config.request_timeout_ms if timeout_ms is None else timeout_ms
        monotonic = self._loop.monotonic
        deadline = monotonic() + timeout_ms / 1000
        bridge = self._bridge
        with bridge.lock:
            while True:
                position = self._async.position_now(partition)
                if position is not None:
                    return position
                remaining = deadline - monotonic()
                if remaining <= 0:
                    tp = TopicPartition(partition[0], partition[1])
                    raise ClientTimeoutError(f"the position of {tp} did not resolve in time")
                bridge.wait(min(remaining, _IDLE_WAIT_S))

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        """Stop fetching and returning these partitions until ``resume``."""
        self._async.pause(partitions)

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        self._async.resume(partitions)

    def paused(self) -> set[TopicPartition]:
        return self._async.paused()

    def highwater(self, partition: TopicPartition) -> int:
        """The high watermark seen in the last fetch of ``partition`` (-1 before any)."""
        return self._async.highwater(partition)

    # --- offset look-ups (through the loop) --------------------------------------------------
    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The earliest retained offset per partition (blocks on the network)."""
        return self._loop.call(self._async.beginning_offsets, list(partitions))

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The high watermark per partition (blocks on the network)."""
        return self._loop.call(self._async.end_offsets, list(partitions))

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, PartitionOffset | None]:
        """Per partition, the first offset whose record's timestamp is at or after the
        timestamp (ms) given for it, with that record's timestamp; None when there is none.
        Blocks on the network.

        Raises:
            ValueError: a negative timestamp.
            BrokerError: UNKNOWN_TOPIC_OR_PARTITION and the like.
        """
        return self._loop.call(self._async.offsets_for_times, dict(timestamps))

    def partitions_for_topic(self, topic: str) -> list[int]:
        """The topic's partition numbers (blocks on the network).

        Raises:
            UnknownTopicOrPartitionError: no such topic.
        """
        return self._loop.call(self._async.partitions_for_topic, topic)

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
        consumer, bridge = self._async, self._bridge
        group = consumer._group
        monotonic = self._loop.monotonic
        deadline = monotonic() + timeout_ms / 1000
        collector = CollectorPause(self._config.pause_gc_while_decoding)
        try:
            while True:
                if group is not None:
                    consumer._check_open()
                    if group.maintenance_due():  # rebalance, callbacks, auto-commit
                        self._call(group.maintain)
                    else:
                        bridge.call_soon(group.note_poll)
                consumer.fill(out, limit, collector)
                collector.end()  # the wait below may block
                if out:
                    break
                remaining = deadline - monotonic()
                if remaining <= 0:
                    break
                with bridge.lock:
                    if not consumer.has_data() and not (
                        group is not None and group.wants_attention()
                    ):
                        consumer._check_open()
                        bridge.wait(min(remaining, _IDLE_WAIT_S))
        finally:
            collector.end()
            if group is not None:
                bridge.call_soon(group.poll_ended)  # max_poll_interval_ms counts from here
        self._polls += 1
        self._records_returned += len(out)
        consumer._polls, consumer._records_returned = self._polls, self._records_returned
        if self._deserializing and out:
            return deserialize(self._config, out)
        return out

    def metrics(self) -> dict[str, dict]:
        """Figures under kafka-python's names: records consumed, polls, assigned partitions
        and the largest lag (high watermark of the last fetch minus the position). Never
        blocks on the network."""
        return self._async.metrics()

    def __iter__(self) -> Iterator[Record]:
        """Records forever (or until ``consumer_timeout_ms`` passes without one, or close)."""
        idle_ms = self.consumer_timeout_ms
        while not self._closed:
            records = self.poll(timeout_ms=_IDLE_WAIT_MS if idle_ms is None else idle_ms)
            if not records and idle_ms is not None:
                return
            yield from records

    # --- lifecycle -----------------------------------------------------------------------------
    def close(self, autocommit: bool = True) -> None:
        """Commit (with auto-commit, unless ``autocommit=False``), leave the group (dynamic
        members), stop fetching and close connections. Idempotent; blocks until the loop
        thread exits."""
        if self._closed:
            return
        self._closed = True
        try:
            self._call(lambda: self._async.aclose(autocommit=autocommit))
        finally:
            self._loop.close()

    def _abandon(self) -> None:
        """Stop everything without committing or leaving: what a crashed process leaves
        behind (its group session simply runs out). For tests."""
        if self._closed:
            return
        self._closed = True
        try:
            self._loop.call(self._async._abandon)
        finally:
            self._loop.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
