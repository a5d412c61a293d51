"""The small value types the client hands to users.

Theory of operation
-------------------
Everything here is an immutable ``NamedTuple``: cheap to build on the per-record path (a
consumer builds one ``Record`` per record) and easy to print, compare and pickle. Field names
follow CONTRACT.md: ``RecordMetadata(topic, partition, offset, timestamp_ms)`` and
``Record(topic, partition, offset, timestamp_ms, key, value, headers)``. The admin results
(``TopicDescription``, ``ClusterStatus`` ...) are plain data too, so the CLI can print them as
tables or JSON without knowing the wire messages.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "LogInfo",
    "TopicPartition",
    "RecordMetadata",
    "Record",
    "Header",
    "BrokerInfo",
    "PartitionInfo",
    "TopicListing",
    "TopicDescription",
    "ConfigValue",
    "ClusterStatus",
    "MemberInfo",
    "OffsetSpec",
    "PartitionOffset",
]

#: A record header: (key, value); value None is a null header value.
Header = tuple[str, "bytes | None"]


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


class RecordMetadata(NamedTuple):
    """Where an acknowledged record landed. ``offset`` is -1 for ``acks=0`` sends."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int


class Record(NamedTuple):
    """One consumed record. ``headers`` is a tuple of ``(str, bytes | None)`` pairs."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple

    @property
    def timestamp(self) -> int:
        """``timestamp_ms`` under kafka-python's name."""
        return self.timestamp_ms

    @property
    def timestamp_type(self) -> int:
        """0, CreateTime (as kafka-python): the broker keeps the producer's timestamps
        (it has no LogAppendTime topics)."""
        return 0


class BrokerInfo(NamedTuple):
    node_id: int
    host: str
    port: int
    rack: str | None


class PartitionInfo(NamedTuple):
    partition: int
    leader: int | None
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    error: str | None  # the wire error name, None when healthy


class TopicListing(NamedTuple):
    name: str
    partitions: int
    is_internal: bool


class ConfigValue(NamedTuple):
    value: str | None
    is_default: bool
    is_read_only: bool
    is_sensitive: bool


class TopicDescription(NamedTuple):
    name: str
    partitions: int
    replication_factor: int
    configs: dict[str, ConfigValue]
    partition_info: tuple[PartitionInfo, ...]


class MemberInfo(NamedTuple):
    """One cluster member as the asked broker sees it (SWIM membership)."""

    node_id: int
    state: str  # alive | suspect | dead | left
    incarnation: int
    host: str  # the client address it announced
    port: int
    cluster_host: str
    cluster_port: int
    rack: str | None


class RaftVoterInfo(NamedTuple):
    """A voter of the controller's Raft: its match index (known on the leader only, else
    None) and whether the asked broker's link to it is up."""

    node_id: int
    match_index: int | None
    connected: bool


class RaftInfo(NamedTuple):
    """The asked broker's view of the controller's Raft log (with --peers)."""

    role: str  # follower | candidate | leader | observer (follows without voting)
    leader: int | None
    term: int
    commit_index: int
    last_applied: int
    voters: tuple[RaftVoterInfo, ...]


class ClusterStatus(NamedTuple):
    cluster_id: str | None
    controller_id: int | None
    brokers: tuple[BrokerInfo, ...]
    topics: int
    partitions: int
    partitions_without_leader: int
    #: The asked broker's membership view, by node id (itself alone without --peers).
    members: tuple[MemberInfo, ...] = ()
    #: The asked broker's view of the controller's Raft (None without --peers).
    raft: RaftInfo | None = None


class OffsetSpec:
    """Special timestamps for ``Admin.list_offsets`` (Kafka's -2 / -1 convention)."""

    EARLIEST = -2
    LATEST = -1


class LogInfo(NamedTuple):
    """One replica's bytes on disk and offsets, as its broker reports them
    (``Admin.describe_logs``)."""

    size_bytes: int
    log_start_offset: int
    log_end_offset: int


class PartitionOffset(NamedTuple):
    """An offset found by ``list_offsets`` (offset -1: none) or ``delete_records``."""

    offset: int
    timestamp_ms: int
