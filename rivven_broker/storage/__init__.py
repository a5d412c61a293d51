"""Storage: the partition log over a FileStore seam, topics, recovery and group commit.

``PartitionLog`` is a synchronous core that does all of its I/O through a ``FileStore``
(``OsFileStore`` in production, ``MemoryFileStore`` in tests and the simulator). ``LogManager``
owns every partition log and the topic registry. ``SyncWorker`` is the one trio driver here:
it runs group commit, one fsync thread hop shared by every waiting append.
"""

from rivven_broker.storage.errors import (
    CorruptLogError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidTopicNameError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    StorageError,
    SyncFailedError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)
from rivven_broker.storage.file_store import FileStore, OsFileStore
from rivven_broker.storage.log_config import LogConfig
from rivven_broker.storage.log_manager import LogManager
from rivven_broker.storage.log_results import AppendInfo, LogStatistics, ReadResult, SyncTicket
from rivven_broker.storage.memory_store import MemoryFileStore
from rivven_broker.storage.partition_log import PartitionLog
from rivven_broker.storage.recovery import Cut, RecoveryReport
from rivven_broker.storage.registry import TopicInfo
from rivven_broker.storage.sync_worker import SyncPolicy, SyncWorker
from rivven_broker.storage.topic_config import ConfigEntry, TopicConfig

__all__ = [
    "AppendInfo",
    "ConfigEntry",
    "CorruptLogError",
    "Cut",
    "FileStore",
    "InvalidConfigError",
    "InvalidPartitionsError",
    "InvalidReplicationFactorError",
    "InvalidTopicNameError",
    "LogConfig",
    "LogManager",
    "LogStatistics",
    "MemoryFileStore",
    "OffsetOutOfRangeError",
    "OsFileStore",
    "PartitionLog",
    "ReadResult",
    "RecordTooLargeError",
    "RecoveryReport",
    "StorageError",
    "SyncFailedError",
    "SyncPolicy",
    "SyncTicket",
    "SyncWorker",
    "TopicConfig",
    "TopicExistsError",
    "TopicInfo",
    "UnknownTopicOrPartitionError",
]
