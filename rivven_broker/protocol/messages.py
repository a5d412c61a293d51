"""Every wire message, in one place: the classes, and which api key maps to which class.

Theory of operation
-------------------
The classes live in ``admin_messages`` (handshake, ping, metadata, topic administration, the
error answer) and ``data_messages`` (produce, fetch, offsets, record deletion); their building
blocks in ``message_base``. This module re-exports them and builds the registries the codec
decodes with: ``REQUEST_TYPES`` and ``RESPONSE_TYPES`` (api key -> class). A request and its
response share an api key and a version range; ``ErrorResponse`` has its own key (19) and is a
valid answer to every request. ``supported_api_versions()`` is what a broker advertises in its
``HandshakeResponse``.
"""

from __future__ import annotations

from rivven_broker.protocol.admin_messages import (
    PROTOCOL_VERSION,
    AlterTopicConfig,
    AlterTopicConfigResponse,
    BrokerMetadata,
    ConfigEntry,
    CreateTopic,
    CreateTopicResponse,
    DeleteTopic,
    DeleteTopicResponse,
    DescribeTopic,
    DescribeTopicResponse,
    ErrorResponse,
    Handshake,
    HandshakeResponse,
    ListTopics,
    ListTopicsResponse,
    Metadata,
    MetadataResponse,
    PartitionMetadata,
    Ping,
    Pong,
    TopicListing,
    TopicMetadata,
)
from rivven_broker.protocol.data_messages import (
    ACKS_ALL,
    ACKS_LEADER,
    ACKS_NONE,
    DELETE_TO_HIGH_WATERMARK,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    AbortedTransaction,
    DeleteRecords,
    DeleteRecordsPartition,
    DeleteRecordsPartitionResponse,
    DeleteRecordsResponse,
    DeleteRecordsTopic,
    DeleteRecordsTopicResponse,
    Fetch,
    FetchPartition,
    FetchPartitionResponse,
    FetchResponse,
    FetchTopic,
    FetchTopicResponse,
    ListOffsets,
    ListOffsetsPartition,
    ListOffsetsPartitionResponse,
    ListOffsetsResponse,
    ListOffsetsTopic,
    ListOffsetsTopicResponse,
    Produce,
    ProducePartition,
    ProducePartitionResponse,
    ProduceResponse,
    ProduceTopic,
    ProduceTopicResponse,
)
from rivven_broker.protocol.message_base import ApiKey, Message, Request, Response, Struct

__all__ = [
    "ApiKey",
    "Struct",
    "Message",
    "Request",
    "Response",
    "REQUEST_TYPES",
    "RESPONSE_TYPES",
    "API_PAIRS",
    "supported_api_versions",
    "PROTOCOL_VERSION",
    "ACKS_NONE",
    "ACKS_LEADER",
    "ACKS_ALL",
    "READ_UNCOMMITTED",
    "READ_COMMITTED",
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "DELETE_TO_HIGH_WATERMARK",
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
    "DeleteRecords",
    "DeleteRecordsTopic",
    "DeleteRecordsPartition",
    "DeleteRecordsResponse",
    "DeleteRecordsTopicResponse",
    "DeleteRecordsPartitionResponse",
]

#: Every api: (request class, response class), in api key order.
API_PAIRS: tuple[tuple[type[Request], type[Response]], ...] = (
    (Handshake, HandshakeResponse),
    (Ping, Pong),
    (Metadata, MetadataResponse),
    (CreateTopic, CreateTopicResponse),
    (DeleteTopic, DeleteTopicResponse),
    (ListTopics, ListTopicsResponse),
    (DescribeTopic, DescribeTopicResponse),
    (AlterTopicConfig, AlterTopicConfigResponse),
    (Produce, ProduceResponse),
    (Fetch, FetchResponse),
    (ListOffsets, ListOffsetsResponse),
    (DeleteRecords, DeleteRecordsResponse),
)

REQUEST_TYPES: dict[int, type[Request]] = {int(req.API_KEY): req for req, _ in API_PAIRS}
RESPONSE_TYPES: dict[int, type[Response]] = {int(resp.API_KEY): resp for _, resp in API_PAIRS}
RESPONSE_TYPES[int(ApiKey.ERROR)] = ErrorResponse

for _request, _response in API_PAIRS:
    assert _request.API_KEY == _response.API_KEY, _request
    assert _request.VERSIONS == _response.VERSIONS, _request
    assert 0 <= _request.VERSIONS[0] <= _request.VERSIONS[1], _request
assert len(REQUEST_TYPES) == len(API_PAIRS)
assert ErrorResponse.VERSIONS == (0, 0)  # every client must always be able to read it
assert int(ApiKey.ERROR) not in REQUEST_TYPES


def supported_api_versions() -> dict[int, tuple[int, int]]:
    """Api key -> (min, max) version this code speaks; what a broker advertises."""
    return {key: cls.VERSIONS for key, cls in REQUEST_TYPES.items()}
