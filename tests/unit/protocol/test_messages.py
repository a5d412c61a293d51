"""Message constructors validate structure, so every instance is encodable.

Method: for each kind of field (ints of each width and range, enums, bools, strings, bytes,
nested lists, maps, error codes) build messages with values just inside and just outside the
bound, and with wrong types; the outside ones must raise ``LocalProtocolError``
(INVALID_REQUEST) naming the class and field. Also: lists become tuples, ints become error
codes, names are checked for size only, instances are frozen, acks=0 expects no response.
"""

from __future__ import annotations

import attrs
import pytest

from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode, LocalProtocolError
from rivven_broker.protocol.message_base import Request, Struct
from rivven_broker.protocol.messages import (
    API_PAIRS,
    AlterTopicConfig,
    BrokerMetadata,
    CreateTopic,
    DeleteRecordsPartition,
    DeleteTopic,
    ErrorResponse,
    Fetch,
    FetchPartition,
    HandshakeResponse,
    ListOffsetsPartition,
    Metadata,
    PartitionMetadata,
    Ping,
    Produce,
    ProducePartition,
    ProduceTopic,
    TopicMetadata,
    supported_api_versions,
)


def _refused(build, field: str) -> None:
    with pytest.raises(LocalProtocolError) as info:
        build()
    assert info.value.code == ErrorCode.INVALID_REQUEST
    assert f".{field}:" in str(info.value), str(info.value)


def test_ints_check_type_and_width():
    assert ProducePartition(2**31 - 1, b"").partition == 2**31 - 1
    assert ProducePartition(-(2**31), b"").partition == -(2**31)
    for bad in (2**31, -(2**31) - 1, True, 1.0, "1", None, 10**5000):
        _refused(lambda: ProducePartition(bad, b""), "partition")
    assert FetchPartition(0, 2**63 - 1).fetch_offset == 2**63 - 1
    for bad in (2**63, -(2**63) - 1):
        _refused(lambda: FetchPartition(0, bad), "fetch_offset")


def test_ranges_and_choices():
    for acks in (0, 1, -1):
        Produce(acks=acks)
    for bad in (2, -2, False):
        _refused(lambda: Produce(acks=bad), "acks")
    _refused(lambda: Produce(timeout_ms=-1), "timeout_ms")
    for level in (0, 1):
        Fetch(isolation_level=level)
    _refused(lambda: Fetch(isolation_level=2), "isolation_level")
    for field in ("max_wait_ms", "min_bytes", "max_bytes"):
        _refused(lambda: Fetch(**{field: -1}), field)
    _refused(lambda: FetchPartition(0, 0, -1), "partition_max_bytes")
    ListOffsetsPartition(0, -2)
    _refused(lambda: ListOffsetsPartition(0, -3), "timestamp")
    DeleteRecordsPartition(0, -1)
    _refused(lambda: DeleteRecordsPartition(0, -2), "offset")
    BrokerMetadata(1, "h", 65535)
    _refused(lambda: BrokerMetadata(1, "h", 65536), "port")


def test_bools_are_strict():
    Metadata(allow_auto_topic_creation=True)
    for bad in (1, 0, None, "yes"):
        _refused(lambda: Metadata(allow_auto_topic_creation=bad), "allow_auto_topic_creation")


def test_strings_are_bounded_in_utf8_bytes():
    DeleteTopic("x" * limits.wire_name_bytes_max)
    DeleteTopic("é" * (limits.wire_name_bytes_max // 2))
    _refused(lambda: DeleteTopic("x" * (limits.wire_name_bytes_max + 1)), "name")
    _refused(lambda: DeleteTopic("é" * (limits.wire_name_bytes_max // 2 + 1)), "name")
    _refused(lambda: DeleteTopic("\ud800"), "name")  # a lone surrogate has no UTF-8 form
    _refused(lambda: DeleteTopic(b"t"), "name")
    _refused(lambda: DeleteTopic(None), "name")
    assert CreateTopic("t").configs == {}
    _refused(lambda: ErrorResponse(ErrorCode.NOT_LEADER, "m" * 4097), "message")


def test_names_are_checked_for_size_only():
    for name in ("", ".", "..", "has space", "ünïcode", "a/b", "x" * 1024):
        assert DeleteTopic(name).name == name


def test_bytes_fields():
    assert ProducePartition(0, bytearray(b"ab")).records == b"ab"
    assert ProducePartition(0, memoryview(b"ab")).records == b"ab"
    for bad in ("ab", [1, 2], memoryview(b"abcd").cast("H"), None):
        _refused(lambda: ProducePartition(0, bad), "records")
    assert "<3 bytes>" in repr(ProducePartition(0, b"abc"))


def test_nested_lists_become_tuples_and_are_checked():
    topic = ProduceTopic("t", [ProducePartition(0, b"")])
    assert topic.partitions == (ProducePartition(0, b""),)
    assert Metadata(["a", "b"]).topics == ("a", "b")
    assert PartitionMetadata(0, replicas=[1, 2]).replicas == (1, 2)
    _refused(lambda: ProduceTopic("t", [FetchPartition(0, 0)]), "partitions")
    _refused(lambda: ProduceTopic("t", ProducePartition(0, b"")), "partitions")
    _refused(lambda: Produce(topics=({"name": "t"},)), "topics")
    _refused(lambda: PartitionMetadata(0, replicas=(1, "2")), "replicas")
    _refused(lambda: Metadata(("a", 1)), "topics")
    too_many = [ProducePartition(i, b"") for i in range(limits.list_length_max + 1)]
    _refused(lambda: ProduceTopic("t", too_many), "partitions")
    ProduceTopic("t", too_many[:-1])


def test_maps():
    AlterTopicConfig("t", {"retention.ms": None, "cleanup.policy": "compact"})
    _refused(lambda: CreateTopic("t", configs={"retention.ms": None}), "configs")
    _refused(lambda: CreateTopic("t", configs={1: "x"}), "configs")
    _refused(lambda: CreateTopic("t", configs=[("k", "v")]), "configs")
    _refused(lambda: CreateTopic("t", configs={"k": "v" * 4097}), "configs")
    HandshakeResponse(api_versions=supported_api_versions())
    for bad in ({0: (1, 0)}, {0: [0, 1]}, {-1: (0, 0)}, {0: (0, 0, 0)}, {"0": (0, 0)}):
        _refused(lambda: HandshakeResponse(api_versions=bad), "api_versions")


def test_error_codes_convert_from_ints():
    assert TopicMetadata("t", 3).error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert TopicMetadata("t", 12345).error_code is ErrorCode.UNKNOWN_SERVER_ERROR
    for bad in ("3", None, 3.0, 2**40):
        _refused(lambda: TopicMetadata("t", bad), "error_code")


def test_messages_are_frozen_and_slotted():
    message = DeleteTopic("t")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        message.name = "u"  # type: ignore[misc]
    assert not hasattr(message, "__dict__")


def test_only_acks_zero_produce_expects_no_response():
    assert not Produce(acks=0).expects_response()
    assert Produce(acks=1).expects_response()
    assert Ping().expects_response()


def test_every_class_is_a_validated_attrs_struct():
    for request, response in API_PAIRS:
        for cls in (request, response):
            assert attrs.has(cls) and issubclass(cls, Struct)
            for attribute in attrs.fields(cls):
                assert "kind" in attribute.metadata, (cls, attribute.name)
                assert attribute.validator is not None, (cls, attribute.name)
        assert issubclass(request, Request)
    assert supported_api_versions() == {int(r.API_KEY): r.VERSIONS for r, _ in API_PAIRS}
