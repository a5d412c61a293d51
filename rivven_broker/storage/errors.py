"""Typed operating errors of the storage layer.

Theory of operation
-------------------
Everything that can go wrong with stored data or with a storage request for reasons outside
the program (bad input, a full or failing disk, corruption found on disk) is one of these
exceptions. Each names the ``ErrorCode`` the server puts on the wire for it, so handlers map
errors with ``exc.code`` instead of a table of ``isinstance`` checks. Programmer errors are
``assert`` statements, never these.
"""

from __future__ import annotations

import errno

from rivven_broker.protocol.errors import ErrorCode

__all__ = [
    "StorageError",
    "InvalidConfigError",
    "InvalidTopicNameError",
    "TopicExistsError",
    "InvalidPartitionsError",
    "InvalidReplicationFactorError",
    "UnknownTopicOrPartitionError",
    "SyncFailedError",
    "stop_on_io_error",
    "OffsetOutOfRangeError",
    "RecordTooLargeError",
    "CorruptLogError",
    "CorruptRecordsError",
    "LogFailedError",
]


class StorageError(Exception):
    """Base of every storage operating error."""

    code: ErrorCode = ErrorCode.KAFKA_STORAGE_ERROR


# --- topics and group commit (topic_config, registry, log_manager, sync_worker) -------------


class InvalidConfigError(StorageError):
    """A topic configuration key is unknown or its value is out of range."""

    code = ErrorCode.INVALID_CONFIG

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"invalid config {key!r}: {reason}")
        self.key = key
        self.reason = reason


class InvalidTopicNameError(StorageError):
    """A topic name is empty, too long, or uses characters outside ``[A-Za-z0-9._-]``."""

    code = ErrorCode.INVALID_TOPIC_NAME

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"invalid topic name {name!r}: {reason}")
        self.name = name
        self.reason = reason


class TopicExistsError(StorageError):
    """A topic with this name already exists."""

    code = ErrorCode.TOPIC_ALREADY_EXISTS

    def __init__(self, name: str) -> None:
        super().__init__(f"topic {name!r} already exists")
        self.name = name


class InvalidPartitionsError(StorageError):
    """A partition count is out of range."""

    code = ErrorCode.INVALID_PARTITIONS

    def __init__(self, partitions: int, reason: str) -> None:
        super().__init__(f"invalid partition count {partitions}: {reason}")
        self.partitions = partitions


class InvalidReplicationFactorError(StorageError):
    """A replication factor is out of range."""

    code = ErrorCode.INVALID_REPLICATION_FACTOR

    def __init__(self, replication_factor: int, reason: str) -> None:
        super().__init__(f"invalid replication factor {replication_factor}: {reason}")
        self.replication_factor = replication_factor


class UnknownTopicOrPartitionError(StorageError):
    """The topic, or this partition of it, does not exist here."""

    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    def __init__(self, topic: str, partition: int | None = None) -> None:
        what = f"topic {topic!r}" if partition is None else f"partition {topic}-{partition}"
        super().__init__(f"unknown {what}")
        self.topic = topic
        self.partition = partition


class SyncFailedError(StorageError):
    """An fsync failed (or the sync worker stopped): the data is not known to be durable.

    After this the node must stop; retrying an fsync after a failure is not safe.
    """

    code = ErrorCode.KAFKA_STORAGE_ERROR


def stop_on_io_error(exc: BaseException, what: str) -> None:
    """For code that may skip a failed disk operation and try it again later (a checkpoint,
    a topic's directory): raises ``SyncFailedError`` — the node stops — when ``exc`` is, or
    was caused by, an I/O error (``EIO``, ``EROFS``: what a failed fsync reports, after
    which nothing written may be trusted and an fsync must never be retried); returns for
    anything else (a full disk, a missing file, an error that is not I/O), which the caller
    reports and may retry."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__
    if isinstance(cause, OSError) and cause.errno in (errno.EIO, errno.EROFS):
        raise SyncFailedError(f"{what}: {cause}") from exc


# --- the partition log (partition_log, segment, recovery) -------------------------------------


class OffsetOutOfRangeError(StorageError):
    """An offset is below the log start offset or above the log end offset."""

    code = ErrorCode.OFFSET_OUT_OF_RANGE

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int) -> None:
        super().__init__(
            f"offset {offset} is outside the log's range "
            f"[{log_start_offset}, {log_end_offset}]"
        )
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class RecordTooLargeError(StorageError):
    """A record batch is larger than the topic's ``max.message.bytes``."""

    code = ErrorCode.MESSAGE_TOO_LARGE

    def __init__(self, size_bytes: int, max_bytes: int) -> None:
        super().__init__(f"record batch of {size_bytes} bytes exceeds max.message.bytes {max_bytes}")
        self.size_bytes = size_bytes
        self.max_bytes = max_bytes


class CorruptLogError(StorageError):
    """Data the log had declared good (below its recovery point) is damaged on disk.

    Recovery never cuts such data away silently; the partition stays offline until an
    operator looks at ``file`` at byte ``position``.
    """

    code = ErrorCode.KAFKA_STORAGE_ERROR

    def __init__(self, file: str, position: int, reason: str) -> None:
        super().__init__(f"{file} is corrupt at byte {position}: {reason}")
        self.file = file
        self.position = position
        self.reason = reason


class CorruptRecordsError(StorageError):
    """A batch the log holds is damaged (a sealed segment changed on disk): its header does not
    chain, its length runs past the segment, or its CRC does not match. Reads stop before it;
    the fetch of ``offset`` is answered ``CORRUPT_MESSAGE``; nothing is cut or skipped."""

    code = ErrorCode.CORRUPT_MESSAGE

    def __init__(self, file: str, position: int, offset: int, reason: str) -> None:
        super().__init__(f"{file} is corrupt at byte {position} (offset {offset}): {reason}")
        self.file = file
        self.position = position
        self.offset = offset
        self.reason = reason


class LogFailedError(StorageError):
    """The store failed while the log was changing; the log refuses changes until reopened."""

    code = ErrorCode.KAFKA_STORAGE_ERROR
