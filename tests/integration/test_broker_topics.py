"""Topic administration over a real socket: create, list, describe, alter, delete, metadata.

Method: start an in-process broker on loopback with a temporary data directory, drive it with
the raw protocol client (``connect`` fixture) and check each answer's codes and contents,
including the per-topic error codes for bad names, partition counts and replication factors.
"""

from __future__ import annotations

import pytest

from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.messages import (
    AlterTopicConfig,
    CreateTopic,
    DeleteTopic,
    DescribeTopic,
    Handshake,
    ListTopics,
    Metadata,
    Ping,
    Pong,
)
from rivven_broker.protocol import limits


async def test_handshake_and_ping(broker, connect):
    client = await connect(broker.port)
    response = await client.call(Handshake(client_id="test"))
    assert response.error_code == ErrorCode.NONE
    assert response.compatible
    assert 8 in response.api_versions and 9 in response.api_versions  # produce, fetch
    assert isinstance(await client.call(Ping()), Pong)


async def test_create_list_describe_alter_delete(broker, connect):
    client = await connect(broker.port)
    created = await client.call(CreateTopic("orders", 4, 1, {"retention.ms": "1000"}))
    assert created.error_code == ErrorCode.NONE
    assert (created.partitions, created.replication_factor) == (4, 1)

    again = await client.call(CreateTopic("orders", 4, 1))
    assert again.error_code == ErrorCode.TOPIC_ALREADY_EXISTS

    listing = await client.call(ListTopics())
    assert [(t.name, t.partitions) for t in listing.topics] == [("orders", 4)]

    described = await client.call(DescribeTopic("orders"))
    assert described.error_code == ErrorCode.NONE
    assert described.partitions == 4 and described.replication_factor == 1
    configs = {entry.name: entry for entry in described.configs}
    assert configs["retention.ms"].value == "1000" and not configs["retention.ms"].is_default
    assert configs["cleanup.policy"].is_default

    altered = await client.call(AlterTopicConfig("orders", {"retention.ms": None, "segment.bytes": "4096"}))
    assert altered.error_code == ErrorCode.NONE
    configs = {e.name: e for e in (await client.call(DescribeTopic("orders"))).configs}
    assert configs["retention.ms"].is_default
    assert configs["segment.bytes"].value == "4096"

    bad = await client.call(AlterTopicConfig("orders", {"no.such.key": "1"}))
    assert bad.error_code == ErrorCode.INVALID_CONFIG
    bad_value = await client.call(AlterTopicConfig("orders", {"retention.ms": "soon"}))
    assert bad_value.error_code == ErrorCode.INVALID_CONFIG

    deleted = await client.call(DeleteTopic("orders"))
    assert deleted.error_code == ErrorCode.NONE
    assert (await client.call(ListTopics())).topics == ()
    assert (await client.call(DeleteTopic("orders"))).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert (await client.call(DescribeTopic("orders"))).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    # The name is free again, and the new topic starts empty.
    assert (await client.call(CreateTopic("orders", 1))).error_code == ErrorCode.NONE


@pytest.mark.parametrize("name", ["", "bad name", "a/b", ".", "..", "x" * (limits.topic_name_bytes_max + 1), "ünï"])
async def test_invalid_topic_names(broker, connect, name):
    client = await connect(broker.port)
    assert (await client.call(CreateTopic(name, 1))).error_code == ErrorCode.INVALID_TOPIC_NAME
    assert (await client.call(DescribeTopic(name))).error_code == ErrorCode.INVALID_TOPIC_NAME
    assert (await client.call(DeleteTopic(name))).error_code == ErrorCode.INVALID_TOPIC_NAME
    metadata = await client.call(Metadata((name,)))
    assert metadata.topics[0].error_code == ErrorCode.INVALID_TOPIC_NAME


@pytest.mark.parametrize("partitions", [0, -5, limits.partitions_per_topic_max + 1])
async def test_partition_count_out_of_range(broker, connect, partitions):
    client = await connect(broker.port)
    response = await client.call(CreateTopic("t", partitions))
    assert response.error_code == ErrorCode.INVALID_PARTITIONS
    assert (await client.call(ListTopics())).topics == ()


async def test_replication_factor_must_be_one_on_a_single_node(broker, connect):
    client = await connect(broker.port)
    assert (await client.call(CreateTopic("t", 1, 3))).error_code == ErrorCode.INVALID_REPLICATION_FACTOR
    assert (await client.call(CreateTopic("t", 1, 0))).error_code == ErrorCode.INVALID_REPLICATION_FACTOR
    defaults = await client.call(CreateTopic("t", -1, -1))
    assert defaults.error_code == ErrorCode.NONE
    assert (defaults.partitions, defaults.replication_factor) == (3, 1)


async def test_create_with_bad_config_creates_nothing(broker, connect):
    client = await connect(broker.port)
    response = await client.call(CreateTopic("t", 1, 1, {"retention.ms": "-7"}))
    assert response.error_code == ErrorCode.INVALID_CONFIG
    assert (await client.call(ListTopics())).topics == ()


async def test_validate_only_creates_nothing(broker, connect):
    client = await connect(broker.port)
    response = await client.call(CreateTopic("t", 2, 1, {}, validate_only=True))
    assert response.error_code == ErrorCode.NONE
    assert (await client.call(ListTopics())).topics == ()


async def test_metadata_lists_this_node_as_leader_of_everything(broker, connect):
    client = await connect(broker.port)
    await client.call(CreateTopic("a", 2))
    metadata = await client.call(Metadata())
    assert [(b.node_id, b.host, b.port) for b in metadata.brokers] == [(1, "127.0.0.1", broker.port)]
    assert metadata.controller_id == 1
    (topic,) = metadata.topics
    assert topic.name == "a" and topic.error_code == ErrorCode.NONE
    for index, partition in enumerate(topic.partitions):
        assert partition.partition == index
        assert (partition.leader, partition.leader_epoch) == (1, 0)
        assert partition.replicas == (1,) and partition.isr == (1,)


async def test_metadata_unknown_topic_and_auto_creation(broker, connect):
    client = await connect(broker.port)
    unknown = await client.call(Metadata(("ghost",)))
    assert unknown.topics[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    created = await client.call(Metadata(("ghost",), allow_auto_topic_creation=True))
    assert created.topics[0].error_code == ErrorCode.NONE
    assert len(created.topics[0].partitions) == 3  # default_partitions


async def test_no_auto_creation_when_disabled(start_broker, connect):
    broker = await start_broker(auto_create_topics=False)
    client = await connect(broker.port)
    response = await client.call(Metadata(("ghost",), allow_auto_topic_creation=True))
    assert response.topics[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_topics_survive_a_restart(start_broker, connect, tmp_path):
    first = await start_broker(data_dir=tmp_path / "d")
    client = await connect(first.port)
    await client.call(CreateTopic("kept", 2, 1, {"retention.ms": "5000"}))
    first.broker.request_shutdown()
    await first.broker.wait_stopped()
    second = await start_broker(data_dir=tmp_path / "d")
    client = await connect(second.port)
    described = await client.call(DescribeTopic("kept"))
    assert described.partitions == 2
    assert {e.name: e.value for e in described.configs}["retention.ms"] == "5000"
