"""The client's public surface is deliberate and matches CONTRACT.md.

Method: the ``__all__`` of ``rivven_broker.client``, ``rivven_broker.client.aio`` and
``rivven_broker.client.trio`` equal the agreed sets (the trio names are the aio objects), every name resolves, every error class is a ``RivvenError``, and the
signatures CONTRACT.md shows accept its example arguments.
"""

from __future__ import annotations

import inspect

import rivven_broker.client as client
import rivven_broker.client.aio as aio_client
import rivven_broker.client.trio as trio_client

EXPECTED = {
    "Producer", "Consumer", "Admin", "TopicPartition", "RecordMetadata", "Record", "OffsetSpec",
    "PartitionOffset", "TopicListing", "TopicDescription", "PartitionInfo", "ConfigValue",
    "BrokerInfo", "ClusterStatus", "MemberInfo", "RaftInfo", "RaftVoterInfo", "RivvenError", "BrokerError", "UnknownTopicOrPartitionError",
    "NotLeaderError", "LeaderNotAvailableError", "CorruptMessageError", "MessageTooLargeError",
    "OffsetOutOfRangeError", "TopicAlreadyExistsError", "InvalidTopicNameError",
    "InvalidPartitionsError", "InvalidReplicationFactorError", "InvalidConfigError",
    "InvalidRequestError", "RequestTimedOutError", "UnsupportedVersionError",
    "ConnectionFailedError", "ClientTimeoutError", "DeliveryTimeoutError",
    "BufferExhaustedError", "ClosedError", "FeatureNotAvailableError", "error_for",
    "ProducerFencedError", "OutOfOrderSequenceError", "UnknownProducerIdError",
    "InvalidTxnStateError", "TransactionAbortedError", "CommitFailedError",
    "ConsumerGroupMetadata",
    "GroupListing", "GroupDescription", "GroupMemberInfo", "GroupPartitionOffset", "LogInfo",
}
EXPECTED_TRIO = {
    "open_producer", "open_consumer", "open_admin", "TrioProducer", "TrioConsumer", "TrioAdmin",
    "Delivery", "ClientEnv",
}
EXPECTED_AIO = {
    "open_producer", "open_consumer", "open_admin", "AsyncProducer", "AsyncConsumer",
    "AsyncAdmin", "Delivery", "ClientEnv",
}


def test_all_is_the_agreed_surface():
    assert len(client.__all__) == len(set(client.__all__))
    assert set(client.__all__) == EXPECTED
    assert set(trio_client.__all__) == EXPECTED_TRIO
    assert set(aio_client.__all__) == EXPECTED_AIO
    for module in (client, trio_client, aio_client):
        for name in module.__all__:
            assert getattr(module, name) is not None


def test_the_trio_front_is_the_one_async_driver():
    assert trio_client.TrioProducer is aio_client.AsyncProducer
    assert trio_client.TrioConsumer is aio_client.AsyncConsumer
    assert trio_client.TrioAdmin is aio_client.AsyncAdmin
    for name in ("open_producer", "open_consumer", "open_admin", "Delivery", "ClientEnv"):
        assert getattr(trio_client, name) is getattr(aio_client, name)


def test_every_error_is_a_rivven_error():
    for name in client.__all__:
        value = getattr(client, name)
        if inspect.isclass(value) and issubclass(value, Exception):
            assert issubclass(value, client.RivvenError), name


def test_contract_field_names():
    assert client.RecordMetadata._fields == ("topic", "partition", "offset", "timestamp_ms")
    assert client.Record._fields == (
        "topic", "partition", "offset", "timestamp_ms", "key", "value", "headers")
    assert client.TopicPartition("t", 1) == ("t", 1)


def test_contract_signatures():
    send = inspect.signature(client.Producer.send)
    assert list(send.parameters)[1:] == [
        "topic", "value", "key", "headers", "partition", "timestamp_ms", "on_delivery"]
    create = inspect.signature(client.Admin.create_topic)
    assert list(create.parameters)[1:5] == ["name", "partitions", "replication_factor", "config"]
    for method in ("assign", "assignment", "seek", "seek_to_beginning", "seek_to_end", "position",
                   "poll", "close", "subscribe", "commit", "committed", "__iter__", "__enter__"):
        assert hasattr(client.Consumer, method), method
    for method in ("list_topics", "describe_topic", "alter_topic_config", "delete_topic",
                   "delete_records", "list_offsets", "cluster_status", "list_groups",
                   "describe_group", "close"):
        assert hasattr(client.Admin, method), method
