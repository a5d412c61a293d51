"""Core and admin messages: handshake, ping, metadata, topic administration, the error answer.

Theory of operation
-------------------
Each api is a request class and a response class (frozen, slotted attrs; fields declared with
the validating constructors of ``message_base``), plus the nested parts they hold. A class says
which ``ApiKey`` it answers to and which versions it speaks. Constructing one validates it, so
an instance is always encodable; the codec builds instances from decoded maps, so a decoded
message is always valid too. Everything here is pure data: no I/O, no behaviour beyond
``expects_response``.

Names inside messages are checked only for size; whether a topic name is *legal* is answered
per topic by the broker with INVALID_TOPIC_NAME (see ``names.py``).
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.message_base import (
    ApiKey,
    Request,
    Response,
    Struct,
    boolean,
    error_code,
    i32,
    ints,
    str_map,
    structs,
    text,
    texts,
    version_map,
)

__all__ = [
    "PROTOCOL_VERSION",
    "ErrorResponse",
    "Handshake",
    "HandshakeResponse",
    "Ping",
    "Pong",
    "Metadata",
    "MetadataResponse",
    "BrokerMetadata",
    "TopicMetadata",
    "PartitionMetadata",
    "CreateTopic",
    "CreateTopicResponse",
    "DeleteTopic",
    "DeleteTopicResponse",
    "ListTopics",
    "ListTopicsResponse",
    "TopicListing",
    "DescribeTopic",
    "DescribeTopicResponse",
    "ConfigEntry",
    "AlterTopicConfig",
    "AlterTopicConfigResponse",
    "CreatePartitions",
    "CreatePartitionsResponse",
]

#: The protocol generation this code speaks, exchanged in the handshake.
PROTOCOL_VERSION = 1

_NAME = limits.wire_name_bytes_max
_MESSAGE = limits.error_message_bytes_max
_KEY = limits.config_key_bytes_max
_VALUE = limits.config_value_bytes_max


@attrs.frozen
class ErrorResponse(Response):
    """The frame-level answer when a request cannot be handled at all: undecodable payload,
    unsupported format, api or version, frame too large. Always version 0, so every client
    can read it whatever it asked for."""

    API_KEY: ClassVar[ApiKey] = ApiKey.ERROR
    error_code: ErrorCode = error_code(attrs.NOTHING)
    message: str = text(_MESSAGE, "")


@attrs.frozen
class Handshake(Request):
    """The first request on a connection: who the client is and what it speaks."""

    API_KEY: ClassVar[ApiKey] = ApiKey.HANDSHAKE
    protocol_version: int = i32(PROTOCOL_VERSION, lo=0)
    client_id: str = text(limits.client_id_bytes_max, "")


@attrs.frozen
class HandshakeResponse(Response):
    """The broker's protocol version, whether it accepts the client's, and the (min, max)
    version of every api it supports, keyed by api key."""

    API_KEY: ClassVar[ApiKey] = ApiKey.HANDSHAKE
    error_code: ErrorCode = error_code()
    server_version: int = i32(PROTOCOL_VERSION, lo=0)
    compatible: bool = boolean(True)
    message: str = text(_MESSAGE, "")
    api_versions: dict[int, tuple[int, int]] = version_map()


@attrs.frozen
class Ping(Request):
    """A liveness probe; answered with ``Pong``."""

    API_KEY: ClassVar[ApiKey] = ApiKey.PING


@attrs.frozen
class Pong(Response):
    """The answer to ``Ping``."""

    API_KEY: ClassVar[ApiKey] = ApiKey.PING


@attrs.frozen
class Metadata(Request):
    """Brokers and topic layout. ``topics`` None means every topic."""

    API_KEY: ClassVar[ApiKey] = ApiKey.METADATA
    topics: tuple[str, ...] | None = texts(_NAME, None, nullable=True)
    allow_auto_topic_creation: bool = boolean(False)


@attrs.frozen
class BrokerMetadata(Struct):
    """One broker: where clients reach it."""

    node_id: int = i32()
    host: str = text(limits.host_bytes_max)
    port: int = i32(lo=0, hi=65535)
    rack: str | None = text(_NAME, None, nullable=True)


@attrs.frozen
class PartitionMetadata(Struct):
    """One partition's leader (-1: none), leader epoch and replica sets."""

    partition: int = i32()
    error_code: ErrorCode = error_code()
    leader: int = i32(-1)
    leader_epoch: int = i32(-1)
    replicas: tuple[int, ...] = ints()
    isr: tuple[int, ...] = ints()
    offline_replicas: tuple[int, ...] = ints()


@attrs.frozen
class TopicMetadata(Struct):
    """One topic; ``error_code`` says why it has no partitions listed (e.g. unknown)."""

    name: str = text(_NAME)
    error_code: ErrorCode = error_code()
    is_internal: bool = boolean(False)
    partitions: tuple[PartitionMetadata, ...] = structs(PartitionMetadata)


@attrs.frozen
class MetadataResponse(Response):
    """The cluster as this broker sees it. ``controller_id`` -1: unknown."""

    API_KEY: ClassVar[ApiKey] = ApiKey.METADATA
    brokers: tuple[BrokerMetadata, ...] = structs(BrokerMetadata)
    controller_id: int = i32(-1)
    cluster_id: str | None = text(_NAME, None, nullable=True)
    topics: tuple[TopicMetadata, ...] = structs(TopicMetadata)


@attrs.frozen
class CreateTopic(Request):
    """Create one topic. ``validate_only``: check everything, create nothing."""

    API_KEY: ClassVar[ApiKey] = ApiKey.CREATE_TOPIC
    name: str = text(_NAME)
    partitions: int = i32(1)
    replication_factor: int = i32(1)
    configs: dict[str, str] = str_map(_KEY, _VALUE)
    validate_only: bool = boolean(False)


@attrs.frozen
class CreateTopicResponse(Response):
    """The outcome of ``CreateTopic`` with the partition count and replication actually used."""

    API_KEY: ClassVar[ApiKey] = ApiKey.CREATE_TOPIC
    name: str = text(_NAME)
    error_code: ErrorCode = error_code()
    error_message: str | None = text(_MESSAGE, None, nullable=True)
    partitions: int = i32(-1)
    replication_factor: int = i32(-1)


@attrs.frozen
class DeleteTopic(Request):
    """Delete one topic and its data."""

    API_KEY: ClassVar[ApiKey] = ApiKey.DELETE_TOPIC
    name: str = text(_NAME)


@attrs.frozen
class DeleteTopicResponse(Response):
    """The outcome of ``DeleteTopic``."""

    API_KEY: ClassVar[ApiKey] = ApiKey.DELETE_TOPIC
    name: str = text(_NAME)
    error_code: ErrorCode = error_code()
    error_message: str | None = text(_MESSAGE, None, nullable=True)


@attrs.frozen
class ListTopics(Request):
    """Names of all topics; internal ones only when asked."""

    API_KEY: ClassVar[ApiKey] = ApiKey.LIST_TOPICS
    include_internal: bool = boolean(False)


@attrs.frozen
class TopicListing(Struct):
    """One topic in a listing."""

    name: str = text(_NAME)
    partitions: int = i32(0, lo=0)
    is_internal: bool = boolean(False)


@attrs.frozen
class ListTopicsResponse(Response):
    """Every topic, sorted by name."""

    API_KEY: ClassVar[ApiKey] = ApiKey.LIST_TOPICS
    topics: tuple[TopicListing, ...] = structs(TopicListing)


@attrs.frozen
class DescribeTopic(Request):
    """One topic's shape and effective configuration."""

    API_KEY: ClassVar[ApiKey] = ApiKey.DESCRIBE_TOPIC
    name: str = text(_NAME)


@attrs.frozen
class ConfigEntry(Struct):
    """One configuration key. ``value`` is None for sensitive keys."""

    name: str = text(_KEY)
    value: str | None = text(_VALUE, None, nullable=True)
    is_default: bool = boolean(False)
    is_read_only: bool = boolean(False)
    is_sensitive: bool = boolean(False)


@attrs.frozen
class DescribeTopicResponse(Response):
    """The answer to ``DescribeTopic``: partitions, replication and every config entry."""

    API_KEY: ClassVar[ApiKey] = ApiKey.DESCRIBE_TOPIC
    name: str = text(_NAME)
    error_code: ErrorCode = error_code()
    error_message: str | None = text(_MESSAGE, None, nullable=True)
    partitions: int = i32(0, lo=0)
    replication_factor: int = i32(0, lo=0)
    configs: tuple[ConfigEntry, ...] = structs(ConfigEntry)


@attrs.frozen
class AlterTopicConfig(Request):
    """Set topic config keys; a None value resets the key to its default."""

    API_KEY: ClassVar[ApiKey] = ApiKey.ALTER_TOPIC_CONFIG
    name: str = text(_NAME)
    configs: dict[str, str | None] = str_map(_KEY, _VALUE, nullable_values=True)
    validate_only: bool = boolean(False)


@attrs.frozen
class AlterTopicConfigResponse(Response):
    """The outcome of ``AlterTopicConfig`` (all keys or none are applied)."""

    API_KEY: ClassVar[ApiKey] = ApiKey.ALTER_TOPIC_CONFIG
    name: str = text(_NAME)
    error_code: ErrorCode = error_code()
    error_message: str | None = text(_MESSAGE, None, nullable=True)


@attrs.frozen
class CreatePartitions(Request):
    """Grow a topic to ``count`` partitions in total (never shrink). ``validate_only``: check
    everything, create nothing."""

    API_KEY: ClassVar[ApiKey] = ApiKey.CREATE_PARTITIONS
    name: str = text(_NAME)
    count: int = i32(1)
    validate_only: bool = boolean(False)


@attrs.frozen
class CreatePartitionsResponse(Response):
    """The outcome of ``CreatePartitions`` with the topic's partition count afterwards (-1:
    unknown topic)."""

    API_KEY: ClassVar[ApiKey] = ApiKey.CREATE_PARTITIONS
    name: str = text(_NAME)
    error_code: ErrorCode = error_code()
    error_message: str | None = text(_MESSAGE, None, nullable=True)
    count: int = i32(-1)
