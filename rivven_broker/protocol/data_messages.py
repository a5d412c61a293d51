"""Data-path messages: Produce, Fetch, ListOffsets, DeleteRecords.

Theory of operation
-------------------
Produce requests and Fetch responses carry record batches. The ``records`` field of a
partition is one or more raw record batches concatenated, exactly as they sit on disk
(``records/header.py``), travelling as one msgpack bin: the protocol layer never looks inside,
never builds an object per record, and the codec moves the bytes with at most one copy. Like
every message, these classes validate their structure on construction (types, widths, list
lengths, acks and isolation level values, non-negative byte budgets) and nothing more: an
unknown topic or a bad offset is answered per partition by the broker.

Special values: ``EARLIEST_TIMESTAMP`` (-2) and ``LATEST_TIMESTAMP`` (-1) in ListOffsets; an
offset of ``DELETE_TO_HIGH_WATERMARK`` (-1) in DeleteRecords; -1 for "none" in offsets and
timestamps of responses.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.message_base import (
    I32_MAX,
    ApiKey,
    Request,
    Response,
    Struct,
    blob,
    boolean,
    choice,
    error_code,
    i32,
    i64,
    ints,
    structs,
    text,
)

__all__ = [
    "ACKS_NONE",
    "ACKS_LEADER",
    "ACKS_ALL",
    "READ_UNCOMMITTED",
    "READ_COMMITTED",
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "DELETE_TO_HIGH_WATERMARK",
    "Produce",
    "ProduceTopic",
    "ProducePartition",
    "ProduceResponse",
    "ProduceTopicResponse",
    "ProducePartitionResponse",
    "Fetch",
    "FetchTopic",
    "FetchPartition",
    "FetchResponse",
    "FetchTopicResponse",
    "FetchPartitionResponse",
    "AbortedTransaction",
    "ListOffsets",
    "ListOffsetsTopic",
    "ListOffsetsPartition",
    "ListOffsetsResponse",
    "ListOffsetsTopicResponse",
    "ListOffsetsPartitionResponse",
    "OffsetsForLeaderEpoch",
    "OffsetsForLeaderEpochTopic",
    "OffsetsForLeaderEpochPartition",
    "OffsetsForLeaderEpochResponse",
    "OffsetsForLeaderEpochTopicResponse",
    "EpochEndOffset",
    "DescribeLogDirs",
    "DescribeLogDirsTopic",
    "DescribeLogDirsResponse",
    "DescribeLogDirsTopicResponse",
    "LogDirPartition",
    "DeleteRecords",
    "DeleteRecordsTopic",
    "DeleteRecordsPartition",
    "DeleteRecordsResponse",
    "DeleteRecordsTopicResponse",
    "DeleteRecordsPartitionResponse",
]

ACKS_NONE = 0  # no response at all
ACKS_LEADER = 1  # the leader appended
ACKS_ALL = -1  # every in-sync replica appended
READ_UNCOMMITTED = 0
READ_COMMITTED = 1
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
DELETE_TO_HIGH_WATERMARK = -1

_NAME = limits.wire_name_bytes_max
_MESSAGE = limits.error_message_bytes_max
_ISOLATION = (READ_UNCOMMITTED, READ_COMMITTED)


# --- Produce ---------------------------------------------------------------------------------


@attrs.frozen
class ProducePartition(Struct):
    """Record batches for one partition: raw bytes, one or more batches back to back."""

    partition: int = i32()
    records: bytes = blob()


@attrs.frozen
class ProduceTopic(Struct):
    """The partitions written in one topic."""

    name: str = text(_NAME)
    partitions: tuple[ProducePartition, ...] = structs(ProducePartition)


@attrs.frozen
class Produce(Request):
    """Append record batches. ``acks``: 0 none (no response is sent), 1 leader, -1 all
    in-sync replicas. ``transactional_id`` is set by transactional producers."""

    API_KEY: ClassVar[ApiKey] = ApiKey.PRODUCE
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)  # v1: responses may say ``duplicate``
    CARRIES_RECORDS: ClassVar[bool] = True
    acks: int = choice((ACKS_NONE, ACKS_LEADER, ACKS_ALL), ACKS_ALL)
    timeout_ms: int = i32(30_000, lo=0)
    topics: tuple[ProduceTopic, ...] = structs(ProduceTopic)
    transactional_id: str | None = text(_NAME, None, nullable=True)

    def expects_response(self) -> bool:
        """acks=0 produce requests are never answered."""
        return self.acks != ACKS_NONE


@attrs.frozen
class ProducePartitionResponse(Struct):
    """Where one partition's batches landed (``base_offset`` of the first), or why not.
    ``duplicate`` (v1): the batch was a retry of one already written; ``base_offset`` is where
    the original landed and nothing new was written."""

    partition: int = i32()
    error_code: ErrorCode = error_code()
    base_offset: int = i64(-1)
    log_append_time_ms: int = i64(-1)
    log_start_offset: int = i64(-1)
    error_message: str | None = text(_MESSAGE, None, nullable=True)
    duplicate: bool = boolean(False, since=1)


@attrs.frozen
class ProduceTopicResponse(Struct):
    """Per-partition outcomes in one topic."""

    name: str = text(_NAME)
    partitions: tuple[ProducePartitionResponse, ...] = structs(ProducePartitionResponse)


@attrs.frozen
class ProduceResponse(Response):
    """The answer to ``Produce`` (acks 1 or -1)."""

    API_KEY: ClassVar[ApiKey] = ApiKey.PRODUCE
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)
    topics: tuple[ProduceTopicResponse, ...] = structs(ProduceTopicResponse)
    throttle_time_ms: int = i32(0, lo=0)


# --- Fetch -----------------------------------------------------------------------------------


@attrs.frozen
class FetchPartition(Struct):
    """Read one partition from ``fetch_offset``, at most ``partition_max_bytes``.
    ``current_leader_epoch`` (v1, KIP-320): the leader epoch the client's metadata names, or
    -1; a clustered leader at another epoch answers ``FENCED_LEADER_EPOCH`` (the client's is
    older) or ``UNKNOWN_LEADER_EPOCH`` (the broker's is older)."""

    partition: int = i32()
    fetch_offset: int = i64()
    partition_max_bytes: int = i32(limits.fetch_partition_bytes_max, lo=0)
    current_leader_epoch: int = i32(-1, lo=-1, since=1)


@attrs.frozen
class FetchTopic(Struct):
    """The partitions read in one topic."""

    name: str = text(_NAME)
    partitions: tuple[FetchPartition, ...] = structs(FetchPartition)


@attrs.frozen
class Fetch(Request):
    """Read record batches. Waits up to ``max_wait_ms`` until ``min_bytes`` are available;
    returns at most ``max_bytes`` (at least one batch when any exists). ``isolation_level``:
    0 read_uncommitted, 1 read_committed."""

    API_KEY: ClassVar[ApiKey] = ApiKey.FETCH
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)  # v1: partitions carry current_leader_epoch
    max_wait_ms: int = i32(500, lo=0)
    min_bytes: int = i32(1, lo=0)
    max_bytes: int = i32(limits.fetch_bytes_max, lo=0, hi=I32_MAX)
    isolation_level: int = choice(_ISOLATION, READ_UNCOMMITTED)
    topics: tuple[FetchTopic, ...] = structs(FetchTopic)


@attrs.frozen
class AbortedTransaction(Struct):
    """An aborted transaction overlapping the returned batches (read_committed filtering)."""

    producer_id: int = i64()
    first_offset: int = i64()


@attrs.frozen
class FetchPartitionResponse(Struct):
    """One partition's batches (raw bytes; the last batch may be partial) and watermarks. On
    the broker's side ``records`` may be a ``FileRegion`` naming them in a segment file."""

    partition: int = i32()
    error_code: ErrorCode = error_code()
    high_watermark: int = i64(-1)
    last_stable_offset: int = i64(-1)
    log_start_offset: int = i64(-1)
    records: bytes = blob(b"")
    aborted_transactions: tuple[AbortedTransaction, ...] = structs(AbortedTransaction)


@attrs.frozen
class FetchTopicResponse(Struct):
    """Per-partition results in one topic."""

    name: str = text(_NAME)
    partitions: tuple[FetchPartitionResponse, ...] = structs(FetchPartitionResponse)


@attrs.frozen
class FetchResponse(Response):
    """The answer to ``Fetch``. ``error_code`` is for the request as a whole."""

    API_KEY: ClassVar[ApiKey] = ApiKey.FETCH
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)
    CARRIES_RECORDS: ClassVar[bool] = True
    error_code: ErrorCode = error_code()
    topics: tuple[FetchTopicResponse, ...] = structs(FetchTopicResponse)
    throttle_time_ms: int = i32(0, lo=0)


# --- ListOffsets -----------------------------------------------------------------------------


@attrs.frozen
class ListOffsetsPartition(Struct):
    """``timestamp``: -2 earliest, -1 latest, else the first offset with timestamp >= it."""

    partition: int = i32()
    timestamp: int = i64(LATEST_TIMESTAMP, lo=EARLIEST_TIMESTAMP)


@attrs.frozen
class ListOffsetsTopic(Struct):
    """The partitions asked about in one topic."""

    name: str = text(_NAME)
    partitions: tuple[ListOffsetsPartition, ...] = structs(ListOffsetsPartition)


@attrs.frozen
class ListOffsets(Request):
    """Find offsets by time. read_committed bounds "latest" by the last stable offset."""

    API_KEY: ClassVar[ApiKey] = ApiKey.LIST_OFFSETS
    isolation_level: int = choice(_ISOLATION, READ_UNCOMMITTED)
    topics: tuple[ListOffsetsTopic, ...] = structs(ListOffsetsTopic)


@attrs.frozen
class ListOffsetsPartitionResponse(Struct):
    """The offset found (-1 when none) and its record's timestamp (-1 when not applicable)."""

    partition: int = i32()
    error_code: ErrorCode = error_code()
    offset: int = i64(-1, lo=-1)
    timestamp: int = i64(-1)


@attrs.frozen
class ListOffsetsTopicResponse(Struct):
    """Per-partition results in one topic."""

    name: str = text(_NAME)
    partitions: tuple[ListOffsetsPartitionResponse, ...] = structs(ListOffsetsPartitionResponse)


@attrs.frozen
class ListOffsetsResponse(Response):
    """The answer to ``ListOffsets``."""

    API_KEY: ClassVar[ApiKey] = ApiKey.LIST_OFFSETS
    topics: tuple[ListOffsetsTopicResponse, ...] = structs(ListOffsetsTopicResponse)


# --- OffsetsForLeaderEpoch ------------------------------------------------------------------


@attrs.frozen
class OffsetsForLeaderEpochPartition(Struct):
    """Where did ``leader_epoch`` end in the leader's log? ``current_leader_epoch``: the
    asker's view of the leader's epoch (-1: not given), fenced as in ``Fetch``."""

    partition: int = i32()
    leader_epoch: int = i32(lo=0)
    current_leader_epoch: int = i32(-1, lo=-1)


@attrs.frozen
class OffsetsForLeaderEpochTopic(Struct):
    """The partitions asked about in one topic."""

    name: str = text(_NAME)
    partitions: tuple[OffsetsForLeaderEpochPartition, ...] = structs(
        OffsetsForLeaderEpochPartition)


@attrs.frozen
class OffsetsForLeaderEpoch(Request):
    """KIP-101/KIP-320: the end offset of a leader epoch, so a consumer that read from a
    deposed leader can tell whether its position is still in the log (truncation detection)."""

    API_KEY: ClassVar[ApiKey] = ApiKey.OFFSETS_FOR_LEADER_EPOCH
    topics: tuple[OffsetsForLeaderEpochTopic, ...] = structs(OffsetsForLeaderEpochTopic)


@attrs.frozen
class EpochEndOffset(Struct):
    """The largest epoch at most the one asked that the log knows, and the offset where it
    ended (the start of the next epoch, or the log end offset for the latest); -1 and -1 when
    every epoch the log knows is newer."""

    partition: int = i32()
    error_code: ErrorCode = error_code()
    leader_epoch: int = i32(-1, lo=-1)
    end_offset: int = i64(-1, lo=-1)


@attrs.frozen
class OffsetsForLeaderEpochTopicResponse(Struct):
    """Per-partition answers in one topic."""

    name: str = text(_NAME)
    partitions: tuple[EpochEndOffset, ...] = structs(EpochEndOffset)


@attrs.frozen
class OffsetsForLeaderEpochResponse(Response):
    """The answer to ``OffsetsForLeaderEpoch``."""

    API_KEY: ClassVar[ApiKey] = ApiKey.OFFSETS_FOR_LEADER_EPOCH
    topics: tuple[OffsetsForLeaderEpochTopicResponse, ...] = structs(
        OffsetsForLeaderEpochTopicResponse)


# --- DeleteRecords ---------------------------------------------------------------------------


@attrs.frozen
class DeleteRecordsPartition(Struct):
    """Delete every record below ``offset`` (-1: below the high watermark)."""

    partition: int = i32()
    offset: int = i64(lo=DELETE_TO_HIGH_WATERMARK)


@attrs.frozen
class DeleteRecordsTopic(Struct):
    """The partitions trimmed in one topic."""

    name: str = text(_NAME)
    partitions: tuple[DeleteRecordsPartition, ...] = structs(DeleteRecordsPartition)


@attrs.frozen
class DeleteRecords(Request):
    """Advance log start offsets (records below become unreadable and are deleted)."""

    API_KEY: ClassVar[ApiKey] = ApiKey.DELETE_RECORDS
    timeout_ms: int = i32(30_000, lo=0)
    topics: tuple[DeleteRecordsTopic, ...] = structs(DeleteRecordsTopic)


@attrs.frozen
class DeleteRecordsPartitionResponse(Struct):
    """The partition's new log start offset (low watermark), or why not."""

    partition: int = i32()
    error_code: ErrorCode = error_code()
    low_watermark: int = i64(-1)


@attrs.frozen
class DeleteRecordsTopicResponse(Struct):
    """Per-partition results in one topic."""

    name: str = text(_NAME)
    partitions: tuple[DeleteRecordsPartitionResponse, ...] = structs(DeleteRecordsPartitionResponse)


@attrs.frozen
class DeleteRecordsResponse(Response):
    """The answer to ``DeleteRecords``."""

    API_KEY: ClassVar[ApiKey] = ApiKey.DELETE_RECORDS
    topics: tuple[DeleteRecordsTopicResponse, ...] = structs(DeleteRecordsTopicResponse)


# --- DescribeLogDirs -------------------------------------------------------------------------


@attrs.frozen
class DescribeLogDirsTopic(Struct):
    """The partitions asked about in one topic."""

    name: str = text(_NAME)
    partitions: tuple[int, ...] = ints()


@attrs.frozen
class DescribeLogDirs(Request):
    """The bytes and offsets of the replicas this broker holds (Kafka's DescribeLogDirs, for
    our one log directory): what ``rivven topic describe`` shows per partition."""

    API_KEY: ClassVar[ApiKey] = ApiKey.DESCRIBE_LOG_DIRS
    topics: tuple[DescribeLogDirsTopic, ...] = structs(DescribeLogDirsTopic)


@attrs.frozen
class LogDirPartition(Struct):
    """One replica held here: its bytes on disk (segments), its log start and log end
    offsets; -1 with an error (UNKNOWN_TOPIC_OR_PARTITION: no replica here)."""

    partition: int = i32()
    error_code: ErrorCode = error_code()
    size_bytes: int = i64(-1, lo=-1)
    log_start_offset: int = i64(-1, lo=-1)
    log_end_offset: int = i64(-1, lo=-1)


@attrs.frozen
class DescribeLogDirsTopicResponse(Struct):
    """Per-partition answers in one topic."""

    name: str = text(_NAME)
    partitions: tuple[LogDirPartition, ...] = structs(LogDirPartition)


@attrs.frozen
class DescribeLogDirsResponse(Response):
    """The answer to ``DescribeLogDirs``."""

    API_KEY: ClassVar[ApiKey] = ApiKey.DESCRIBE_LOG_DIRS
    topics: tuple[DescribeLogDirsTopicResponse, ...] = structs(DescribeLogDirsTopicResponse)

