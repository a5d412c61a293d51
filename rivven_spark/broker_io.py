"""The data source's conversations with the broker, over the blocking client.

Theory of operation
-------------------
``BrokerIO`` wraps one ``SyncClient`` (the request/response engine of the blocking client, the
one under ``Admin``) and speaks three requests:

- ``snapshot``: which partitions a subscription covers and their offsets. One ``Metadata``
  round trip (all topics for a pattern, else the named ones) gives the partitions and their
  leaders; then one ``ListOffsets`` per leader broker (one in a single-node cluster) gives
  the latest offset of each (the high watermark, or the last stable offset under
  ``read_committed``) and, when asked, the earliest, both in the same request. That is the
  whole cost of Spark's ``latestOffset``: two round trips.
- ``fetch``: one partition from an offset, up to a byte budget, returning the broker's raw
  batches untouched (``RangeDecoder`` turns them into Arrow).
- ``read_records``: a small range as ``Record`` tuples (the sink's ledger).

Retriable failures of a whole request are retried by the ``SyncClient`` within
``request_timeout_ms``; retriable per-partition errors (no leader yet, not the leader) are
retried here with a capped exponential backoff inside the same deadline, refreshing metadata
between attempts. Everything else raises the client's typed ``RivvenError``.

A ``BrokerIO`` holds sockets: it is created lazily inside a driver or executor process and is
never pickled (readers and writers drop it in ``__getstate__``). Every method blocks.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

from rivven_broker.client import RivvenError, TopicPartition, error_for
from rivven_broker.client.blocking import SyncClient
from rivven_broker.client.config import ConnectionConfig
from rivven_broker.client.requests import ISOLATION_LEVELS, raise_for
from rivven_broker.client.types import Record
from rivven_broker.protocol import messages as m
from rivven_broker.protocol.errors import ErrorCode

from rivven_spark.arrow_records import AbortedTxn, RangeDecoder
from rivven_spark.offsets import PartitionSnapshot
from rivven_spark.options import Subscription

__all__ = ["BrokerIO", "FetchResult"]

_BACKOFF_MS_FIRST = 50
_BACKOFF_MS_MAX = 1000


class FetchResult:
    """One partition's fetch answer: raw batches plus the watermarks that came with it."""

    __slots__ = ("records", "high_watermark", "last_stable_offset", "log_start_offset",
                 "aborted")

    def __init__(self, part: m.FetchPartitionResponse) -> None:
        self.records: bytes = part.records
        self.high_watermark: int = part.high_watermark
        self.last_stable_offset: int = part.last_stable_offset
        self.log_start_offset: int = part.log_start_offset
        self.aborted = tuple(
            AbortedTxn(a.producer_id, a.first_offset) for a in part.aborted_transactions
        )


class BrokerIO:
    """Blocking requests for the data source (see the module docstring). Not thread-safe
    beyond what ``SyncClient`` gives; one per process or per task."""

    def __init__(self, bootstrap: str, *, request_timeout_ms: int = 30_000,
                 client_id: str = "rivven-spark") -> None:
        config = ConnectionConfig(client_id=client_id, request_timeout_ms=request_timeout_ms)
        self._client = SyncClient(bootstrap, config)
        self._timeout_ms = request_timeout_ms

    def close(self) -> None:
        """Close the sockets. Idempotent."""
        self._client.close()

    # --- partitions and offsets -------------------------------------------------------------
    def snapshot(
        self, subscription: Subscription, isolation_level: str, *, earliest: bool = True
    ) -> list[PartitionSnapshot]:
        """The subscribed partitions that have a leader, with their offsets. A subscribed
        topic that does not exist yet contributes nothing. Without ``earliest`` the snapshot's
        ``earliest`` fields are -1 (one request fewer per partition entry, not per trip).

        Blocks for two round trips (see the module docstring).

        Raises:
            RivvenError: a non-retriable error, or retriable ones past the timeout.
        """
        return self._retrying(self._snapshot_once, subscription, isolation_level, earliest)

    def _retrying(self, once: Any, *args: Any) -> Any:
        """``once(*args)`` again after retriable errors, until the request timeout."""
        deadline = _now_ms() + self._timeout_ms
        attempt = 0
        while True:
            try:
                return once(*args)
            except RivvenError as error:
                attempt = self._backoff_or_raise(error, attempt, deadline)

    def offsets_at(
        self, times: Mapping[tuple[str, int], int], isolation_level: str
    ) -> dict[tuple[str, int], int]:
        """The first offset at or after each partition's time (ms), -1 when no record is
        that late. Blocks (Metadata, then ListOffsets per leader and distinct time).

        Raises:
            RivvenError: a non-retriable error, or retriable ones past the timeout.
        """
        return self._retrying(self._offsets_at_once, times, isolation_level)

    def _offsets_at_once(
        self, times: Mapping[tuple[str, int], int], isolation_level: str
    ) -> dict[tuple[str, int], int]:
        topics = sorted({topic for topic, _ in times})
        metadata = self._client.fetch_metadata(topics) if topics else None
        leaders = {}
        for topic in metadata.topics if metadata is not None else ():
            raise_for(topic.error_code, None, f"metadata of topic {topic.name!r}")
            for part in topic.partitions:
                leaders[(topic.name, part.partition)] = part.leader
        groups: dict[tuple[int, int], list[TopicPartition]] = {}
        for key, ms in sorted(times.items()):
            leader = leaders.get(key, -1)
            if leader < 0:
                raise error_for(ErrorCode.LEADER_NOT_AVAILABLE, f"{key[0]}/{key[1]}")
            groups.setdefault((leader, ms), []).append(TopicPartition(*key))
        found = {}
        for (leader, ms), tps in sorted(groups.items()):
            for tp, offset in self._list_offsets(leader, tps, isolation_level, ms).items():
                found[(tp.topic, tp.partition)] = offset
        return found

    def _snapshot_once(
        self, subscription: Subscription, isolation_level: str, earliest: bool
    ) -> list[PartitionSnapshot]:
        topics = subscription.fixed_topics()
        metadata = self._client.fetch_metadata(None if topics is None else list(topics))
        by_leader: dict[int, list[TopicPartition]] = {}
        for topic in metadata.topics:
            if topic.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                continue  # not created yet: picked up by a later batch
            if topic.error_code != ErrorCode.NONE:
                raise error_for(topic.error_code, f"metadata of topic {topic.name!r}")
            if topic.is_internal or not subscription.matches(topic.name):
                continue
            for part in topic.partitions:
                if part.leader < 0 or not subscription.wants(topic.name, part.partition):
                    continue
                tp = TopicPartition(topic.name, part.partition)
                by_leader.setdefault(part.leader, []).append(tp)
        out = []
        for leader, tps in sorted(by_leader.items()):
            out.extend(self._offsets(leader, sorted(tps), isolation_level, earliest))
        return sorted(out)

    def _offsets(
        self, leader: int, tps: list[TopicPartition], isolation_level: str, earliest: bool
    ) -> list[PartitionSnapshot]:
        # One request per kind: a request may name each partition once (the broker refuses
        # repeats with INVALID_REQUEST).
        latest = self._list_offsets(leader, tps, isolation_level, m.LATEST_TIMESTAMP)
        first = (self._list_offsets(leader, tps, isolation_level, m.EARLIEST_TIMESTAMP)
                 if earliest else {})
        return [PartitionSnapshot(tp.topic, tp.partition, first.get(tp, -1), latest[tp])
                for tp in tps]

    def _list_offsets(
        self, leader: int, tps: list[TopicPartition], isolation_level: str, timestamp: int
    ) -> dict[TopicPartition, int]:
        by_topic: dict[str, list[m.ListOffsetsPartition]] = {}
        for tp in tps:
            by_topic.setdefault(tp.topic, []).append(m.ListOffsetsPartition(tp.partition, timestamp))
        request = m.ListOffsets(
            isolation_level=ISOLATION_LEVELS[isolation_level],
            topics=tuple(m.ListOffsetsTopic(name, tuple(p)) for name, p in by_topic.items()),
        )
        response = self._client.call(request, node_id=leader)
        if not isinstance(response, m.ListOffsetsResponse):
            raise RivvenError(f"expected ListOffsetsResponse, got {type(response).__name__}")
        found: dict[TopicPartition, int] = {}
        for topic in response.topics:
            for part in topic.partitions:
                if part.error_code != ErrorCode.NONE:
                    raise error_for(part.error_code, f"offsets of {topic.name}-{part.partition}")
                found[TopicPartition(topic.name, part.partition)] = part.offset
        missing = [tp for tp in tps if tp not in found]
        if missing:
            raise RivvenError(f"ListOffsets answered nothing for {missing}")
        return found

    # --- reading ----------------------------------------------------------------------------
    def fetch(
        self, topic: str, partition: int, offset: int, bytes_max: int, isolation_level: str
    ) -> FetchResult:
        """One Fetch of one partition from ``offset`` (no long poll). Blocks.

        Raises:
            OffsetOutOfRangeError: ``offset`` is outside the retained range.
            RivvenError: other non-retriable errors, or retriable ones past the timeout.
        """
        deadline = _now_ms() + self._timeout_ms
        attempt = 0
        request = m.Fetch(
            max_wait_ms=0,
            min_bytes=0,
            max_bytes=bytes_max,
            isolation_level=ISOLATION_LEVELS[isolation_level],
            topics=(m.FetchTopic(topic, (m.FetchPartition(partition, offset, bytes_max),)),),
        )
        while True:
            try:
                leader = self._client.leader_for(topic, partition)
                response = self._client.call(request, node_id=leader)
                return FetchResult(_only_partition(response, topic, partition))
            except RivvenError as error:
                if error.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
                    raise
                attempt = self._backoff_or_raise(error, attempt, deadline)

    def offsets_of(self, topic: str, partition: int, isolation_level: str) -> PartitionSnapshot:
        """Earliest and latest offset of one partition. Blocks (two round trips at most)."""
        deadline = _now_ms() + self._timeout_ms
        attempt = 0
        while True:
            try:
                leader = self._client.leader_for(topic, partition)
                tp = TopicPartition(topic, partition)
                return self._offsets(leader, [tp], isolation_level, True)[0]
            except RivvenError as error:
                attempt = self._backoff_or_raise(error, attempt, deadline)

    def read_records(
        self, topic: str, partition: int, start: int, end: int, isolation_level: str
    ) -> list[Record]:
        """The records of ``[start, end)`` (aborted ones left out under read_committed).

        For small ranges (one tuple per record). Blocks.
        """
        out: list[Record] = []
        decoder = RangeDecoder(topic, partition, start, end,
                               read_committed=isolation_level == "read_committed")
        while not decoder.done:
            result = self.fetch(topic, partition, decoder.position, 1 << 20, isolation_level)
            before = decoder.position
            decoder.feed(result.records, result.aborted)
            if decoder.position == before:
                break  # nothing more below ``end`` is readable now
            batch = decoder.take_batch()
            if batch is not None:
                columns = batch.to_pydict()
                micros = batch.column("timestamp").cast("int64").to_pylist()
                for i in range(batch.num_rows):
                    headers = tuple((h["key"], h["value"]) for h in columns["headers"][i] or ())
                    out.append(Record(topic, partition, columns["offset"][i], micros[i] // 1000,
                                      columns["key"][i], columns["value"][i], headers))
        return out

    # --- retries ----------------------------------------------------------------------------
    def _backoff_or_raise(self, error: RivvenError, attempt: int, deadline: int) -> int:
        """Sleep before the next attempt of a retriable error; raise otherwise."""
        delay_ms = min(_BACKOFF_MS_FIRST << attempt, _BACKOFF_MS_MAX)
        if not error.retriable or _now_ms() + delay_ms > deadline:
            raise error
        self._client.metadata.request_update()
        time.sleep(delay_ms / 1000)
        return attempt + 1


def _only_partition(response: Any, topic: str, partition: int) -> m.FetchPartitionResponse:
    if not isinstance(response, m.FetchResponse):
        raise RivvenError(f"expected FetchResponse, got {type(response).__name__}")
    if response.error_code != ErrorCode.NONE:
        raise error_for(response.error_code, f"fetch {topic}-{partition}")
    for entry in response.topics:
        for part in entry.partitions:
            if entry.name == topic and part.partition == partition:
                if part.error_code != ErrorCode.NONE:
                    raise error_for(part.error_code, f"fetch {topic}-{partition}")
                return part
    raise RivvenError(f"the fetch answer has no {topic}-{partition}")


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000
