"""The public surface of rivven_broker.protocol is deliberate.

Method: pin ``__all__`` of the package to the list below (an addition or removal must edit
this test), check every listed name resolves, and check every module of the package says what
it owns: a "Theory of operation" docstring, an ``__all__`` whose names exist, and a size
under the house limit.
"""

from __future__ import annotations

import importlib
import pathlib

import attrs
import pytest

import rivven_broker.protocol as protocol

PACKAGE_DIR = pathlib.Path(protocol.__file__).parent
MODULES = sorted(p.stem for p in PACKAGE_DIR.glob("*.py") if p.stem != "__init__")

EXPECTED = """
ACKS_ALL ACKS_LEADER ACKS_NONE API_PAIRS AbortedTransaction AlterTopicConfig
AlterTopicConfigResponse ApiKey BadRequest BrokerMetadata CONNECTION_ERROR_CORRELATION_ID
ClientConnection ConfigEntry CreatePartitions CreatePartitionsResponse CreateTopic
CreateTopicResponse DELETE_TO_HIGH_WATERMARK
DeleteRecords DeleteRecordsPartition DeleteRecordsPartitionResponse DeleteRecordsResponse
DeleteRecordsTopic DeleteRecordsTopicResponse DeleteTopic DeleteTopicResponse DescribeTopic
DescribeTopicResponse EARLIEST_TIMESTAMP ErrorCode ErrorResponse FORMAT_MSGPACK
FORMAT_POSTCARD FORMAT_PROTOBUF Fetch FetchPartition FetchPartitionResponse FetchResponse
FetchTopic FetchTopicResponse Frame FrameDecoder Handshake HandshakeResponse LATEST_TIMESTAMP
ListOffsets ListOffsetsPartition ListOffsetsPartitionResponse ListOffsetsResponse
ListOffsetsTopic ListOffsetsTopicResponse ListTopics ListTopicsResponse LocalProtocolError
Message Metadata MetadataResponse PROTOCOL_VERSION PartitionMetadata Ping Pong Produce
ProducePartition ProducePartitionResponse ProduceResponse ProduceTopic ProduceTopicResponse
ProtocolError READ_COMMITTED READ_UNCOMMITTED REQUEST_TYPES RESPONSE_TYPES
RemoteProtocolError Request RequestReceived Response ResponseReceived ServerConnection Struct
TopicListing TopicMetadata decode_request decode_request_and_version decode_response
decode_response_and_version encode_frame encode_frame_parts encode_parts encode_request
encode_response group_id_error supported_api_versions topic_name_error
NO_PRODUCER_ID NO_PRODUCER_EPOCH InitProducerId InitProducerIdResponse AddPartitionsToTxn
AddPartitionsToTxnTopic AddPartitionsToTxnResponse AddPartitionsToTxnTopicResponse
AddPartitionsToTxnPartitionResponse AddOffsetsToTxn AddOffsetsToTxnResponse TxnOffsetCommit
TxnOffsetCommitTopic TxnOffsetCommitPartition TxnOffsetCommitResponse
TxnOffsetCommitTopicResponse TxnOffsetCommitPartitionResponse EndTxn EndTxnResponse
CONSUMER_PROTOCOL_TYPE NO_GENERATION COORDINATOR_KEY_GROUP COORDINATOR_KEY_TRANSACTION
GROUP_STATES JoinGroup JoinGroupProtocol JoinGroupResponse JoinGroupMember SyncGroup
SyncGroupAssignment SyncGroupResponse Heartbeat HeartbeatResponse LeaveGroup LeaveGroupMember
LeaveGroupResponse LeaveGroupMemberResponse OffsetCommit OffsetCommitTopic
OffsetCommitPartition OffsetCommitResponse OffsetCommitTopicResponse
OffsetCommitPartitionResponse OffsetFetch OffsetFetchTopic OffsetFetchResponse
OffsetFetchTopicResponse OffsetFetchPartitionResponse ListGroups ListGroupsResponse
GroupListing DescribeGroup DescribeGroupResponse GroupMemberDescription DeleteGroup
DeleteGroupResponse FindCoordinator FindCoordinatorResponse
OffsetsForLeaderEpoch OffsetsForLeaderEpochTopic OffsetsForLeaderEpochPartition
OffsetsForLeaderEpochResponse OffsetsForLeaderEpochTopicResponse EpochEndOffset
DescribeLogDirs DescribeLogDirsResponse DescribeLogDirsTopic DescribeLogDirsTopicResponse
LogDirPartition DescribeCluster DescribeClusterResponse ClusterMember RaftVoter MEMBER_STATES
RAFT_ROLES
""".split()


def test_all_is_pinned():
    assert sorted(protocol.__all__) == sorted(EXPECTED)
    assert len(protocol.__all__) == len(set(protocol.__all__))


def test_every_message_of_the_registry_is_exported():
    """A message class its module forgot to list would be missing from the package (as a
    whole api's classes once were): every request and response the codec knows, and every
    struct a message's fields hold, is exported under its own name."""
    from rivven_broker.protocol import message_base, messages

    classes = {cls for pair in messages.API_PAIRS for cls in pair} | {protocol.ErrorResponse}
    seen = set()
    while classes:
        cls = classes.pop()
        seen.add(cls)
        assert getattr(protocol, cls.__name__, None) is cls, cls.__name__
        for attribute in attrs.fields(cls):
            kind = message_base.field_kind(attribute)
            if kind.cls is not None and kind.cls not in seen:
                classes.add(kind.cls)
    assert len(seen) > 2 * len(messages.API_PAIRS)  # (structs were walked too)


def test_every_exported_name_resolves():
    for name in protocol.__all__:
        assert getattr(protocol, name, None) is not None, name


@pytest.mark.parametrize("name", MODULES)
def test_every_module_says_what_it_owns(name):
    module = importlib.import_module(f"rivven_broker.protocol.{name}")
    assert module.__doc__ and "Theory of operation" in module.__doc__, name
    if name != "limits":  # plain constants, no API list
        assert module.__all__, name
        for exported in module.__all__:
            assert hasattr(module, exported), (name, exported)
    lines = (PACKAGE_DIR / f"{name}.py").read_text().count("\n")
    assert lines < 650, f"{name}.py has {lines} lines"
