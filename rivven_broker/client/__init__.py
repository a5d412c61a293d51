"""Rivven's Python client: ``Producer``, ``Consumer`` and ``Admin`` (blocking).

Theory of operation
-------------------
One sans-I/O core (``rivven_broker.client.core``) makes every decision: metadata, partitioning,
batching, retries with backoff, fetch positions. Two drivers run it: the blocking one exported
here (threads and sockets) and ``rivven_broker.client.trio`` for trio programs. Every error is
a ``RivvenError`` carrying ``.code`` (the wire error code name) and ``.retriable``. See
docs/client.md.
"""

from __future__ import annotations

from rivven_broker.client.blocking import Admin, Consumer, Producer
from rivven_broker.client.errors import (
    BrokerError,
    BufferExhaustedError,
    ClientTimeoutError,
    ClosedError,
    ConnectionFailedError,
    CommitFailedError,
    CorruptMessageError,
    DeliveryTimeoutError,
    FeatureNotAvailableError,
    InvalidConfigError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    TransactionAbortedError,
    UnknownProducerIdError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicNameError,
    LeaderNotAvailableError,
    MessageTooLargeError,
    NotLeaderError,
    OffsetOutOfRangeError,
    RequestTimedOutError,
    RivvenError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
    error_for,
)
from rivven_broker.client._group import ConsumerGroupMetadata
from rivven_broker.client.group_admin import (
    GroupDescription,
    GroupListing,
    GroupMemberInfo,
    GroupPartitionOffset,
)
from rivven_broker.client.types import (
    BrokerInfo,
    ClusterStatus,
    MemberInfo,
    ConfigValue,
    OffsetSpec,
    PartitionInfo,
    PartitionOffset,
    Record,
    RecordMetadata,
    TopicDescription,
    TopicListing,
    TopicPartition,
)

__all__ = [
    "Producer",
    "Consumer",
    "Admin",
    "TopicPartition",
    "RecordMetadata",
    "Record",
    "OffsetSpec",
    "PartitionOffset",
    "TopicListing",
    "TopicDescription",
    "PartitionInfo",
    "ConfigValue",
    "BrokerInfo",
    "ClusterStatus",
    "MemberInfo",
    "GroupListing",
    "GroupDescription",
    "GroupMemberInfo",
    "GroupPartitionOffset",
    "RivvenError",
    "BrokerError",
    "UnknownTopicOrPartitionError",
    "NotLeaderError",
    "LeaderNotAvailableError",
    "CorruptMessageError",
    "MessageTooLargeError",
    "OffsetOutOfRangeError",
    "TopicAlreadyExistsError",
    "InvalidTopicNameError",
    "InvalidPartitionsError",
    "InvalidReplicationFactorError",
    "InvalidConfigError",
    "InvalidRequestError",
    "RequestTimedOutError",
    "UnsupportedVersionError",
    "ConnectionFailedError",
    "ClientTimeoutError",
    "DeliveryTimeoutError",
    "BufferExhaustedError",
    "ClosedError",
    "FeatureNotAvailableError",
    "ProducerFencedError",
    "OutOfOrderSequenceError",
    "UnknownProducerIdError",
    "InvalidTxnStateError",
    "TransactionAbortedError",
    "CommitFailedError",
    "ConsumerGroupMetadata",
    "error_for",
]
