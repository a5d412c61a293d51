"""Every wire message, in one place: the classes, and which api key maps to which class.

Theory of operation
-------------------
The classes live in ``admin_messages`` (handshake, ping, metadata, topic administration, the
error answer), ``data_messages`` (produce, fetch, offsets, record deletion), ``group_messages``
(consumer groups), ``txn_messages`` (producer ids and transactions) and ``cluster_messages``
(the cluster's members); their building blocks in ``message_base``. This module re-exports
every name each of them lists in its ``__all__`` (so a new message is exported by adding it
there, once) and builds the registries the codec decodes with: ``REQUEST_TYPES`` and
``RESPONSE_TYPES`` (api key -> class). A request and its response share an api key and a
version range; ``ErrorResponse`` has its own key (19) and is a valid answer to every request.
``supported_api_versions()`` is what a broker advertises in its ``HandshakeResponse``.
"""

from __future__ import annotations

from rivven_broker.protocol import (
    admin_messages,
    cluster_messages,
    data_messages,
    group_messages,
    txn_messages,
)
from rivven_broker.protocol.admin_messages import *  # noqa: F403 (its ``__all__``)
from rivven_broker.protocol.cluster_messages import *  # noqa: F403
from rivven_broker.protocol.data_messages import *  # noqa: F403
from rivven_broker.protocol.group_messages import *  # noqa: F403
from rivven_broker.protocol.message_base import ApiKey, Message, Request, Response, Struct
from rivven_broker.protocol.txn_messages import *  # noqa: F403

__all__ = [
    "ApiKey",
    "Struct",
    "Message",
    "Request",
    "Response",
    *admin_messages.__all__,
    *cluster_messages.__all__,
    *data_messages.__all__,
    *group_messages.__all__,
    *txn_messages.__all__,
    "API_PAIRS",
    "REQUEST_TYPES",
    "RESPONSE_TYPES",
    "supported_api_versions",
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
    (CreatePartitions, CreatePartitionsResponse),
    (OffsetsForLeaderEpoch, OffsetsForLeaderEpochResponse),
    (DescribeLogDirs, DescribeLogDirsResponse),
    (JoinGroup, JoinGroupResponse),
    (SyncGroup, SyncGroupResponse),
    (Heartbeat, HeartbeatResponse),
    (LeaveGroup, LeaveGroupResponse),
    (OffsetCommit, OffsetCommitResponse),
    (OffsetFetch, OffsetFetchResponse),
    (ListGroups, ListGroupsResponse),
    (DescribeGroup, DescribeGroupResponse),
    (DeleteGroup, DeleteGroupResponse),
    (FindCoordinator, FindCoordinatorResponse),
    (InitProducerId, InitProducerIdResponse),
    (AddPartitionsToTxn, AddPartitionsToTxnResponse),
    (AddOffsetsToTxn, AddOffsetsToTxnResponse),
    (TxnOffsetCommit, TxnOffsetCommitResponse),
    (EndTxn, EndTxnResponse),
    (DescribeCluster, DescribeClusterResponse),
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
