"""Bootstrap parsing and the metadata cache.

Method: parse good and bad bootstrap strings; feed the cache real ``MetadataResponse``
messages and check partition counts, leaders, topic errors and when a refresh is due
(``now_ms`` is an argument, so time is just a number here).
"""

from __future__ import annotations

import pytest

from rivven_broker.client.metadata import Address, MetadataCache, parse_bootstrap
from rivven_broker.protocol import messages as m
from rivven_broker.protocol.errors import ErrorCode


def test_parse_bootstrap():
    assert parse_bootstrap("a:1, b:2") == (Address("a", 1), Address("b", 2))
    assert parse_bootstrap("host") == (Address("host", 9092),)
    assert parse_bootstrap("[::1]:9093") == (Address("::1", 9093),)
    assert parse_bootstrap(["x:5"]) == (Address("x", 5),)
    assert str(Address("::1", 1)) == "[::1]:1" and str(Address("h", 2)) == "h:2"


@pytest.mark.parametrize("text", ["", " , ", "h:0", "h:70000", "h:x", ":9092", "::1:9092", "[::1"])
def test_parse_bootstrap_rejects(text):
    with pytest.raises(ValueError):
        parse_bootstrap(text)


def response(*topics, brokers=((1, "h1", 9092), (2, "h2", 9092))):
    return m.MetadataResponse(
        brokers=tuple(m.BrokerMetadata(node_id=n, host=h, port=p) for n, h, p in brokers),
        controller_id=1,
        cluster_id="c",
        topics=topics,
    )


def topic(name, leaders, code=ErrorCode.NONE):
    return m.TopicMetadata(
        name=name,
        error_code=code,
        partitions=tuple(
            m.PartitionMetadata(partition=i, leader=leader, leader_epoch=0)
            for i, leader in enumerate(leaders)
        ),
    )


def test_cache_answers_partition_counts_and_leaders():
    cache = MetadataCache(parse_bootstrap("b:1"))
    cache.add_topics(["a", "bad"])
    cache.on_update(
        response(topic("a", [1, 2, -1]), topic("bad", [], ErrorCode.INVALID_TOPIC_NAME)), 0
    )
    assert cache.partition_count("a") == 3
    assert cache.leader_for("a", 0) == 1 and cache.leader_for("a", 1) == 2
    assert cache.leader_for("a", 2) is None and cache.leader_for("a", 3) is None
    assert cache.partition_count("bad") is None
    assert cache.topic_error("bad") is ErrorCode.INVALID_TOPIC_NAME
    assert cache.topic_error("a") is None
    assert cache.address_of(2) == Address("h2", 9092)
    assert cache.version == 1
    assert cache.wanted == {"a"}  # a topic with a non-retriable error is no longer asked for


def test_refresh_is_due_when_stale_or_old_but_backed_off():
    cache = MetadataCache(parse_bootstrap("b:1"), metadata_max_age_ms=1000, refresh_backoff_ms=100)
    assert cache.needs_update(0)  # never fetched
    cache.add_topics(["a"])
    cache.on_request_sent(0)
    assert not cache.needs_update(50)  # backoff
    cache.on_update(response(topic("a", [1])), 60)
    assert not cache.needs_update(500)
    assert cache.needs_update(1060)  # too old
    cache.request_update()
    assert not cache.needs_update(100) and cache.needs_update(160)


def test_a_leaderless_wanted_topic_keeps_the_cache_stale():
    cache = MetadataCache(parse_bootstrap("b:1"), refresh_backoff_ms=0)
    cache.add_topics(["a"])
    cache.on_update(response(topic("a", [-1])), 0)
    assert cache.needs_update(0)


def test_bootstrap_rotates():
    cache = MetadataCache(parse_bootstrap("a:1,b:2"))
    assert [cache.next_bootstrap().host for _ in range(3)] == ["a", "b", "a"]


def test_fetch_carries_the_leader_epoch_only_to_brokers_that_take_it() -> None:
    """KIP-320 on the wire: Fetch v1 names the epoch the metadata knows; a broker that lists
    only Fetch v0 gets the request without it (advisory), never an encoding failure."""
    from rivven_broker.client.fetch_state import FetchPlan
    from rivven_broker.client.requests import fetch_request, sendable
    from rivven_broker.client.types import TopicPartition
    from rivven_broker.protocol import codec
    from rivven_broker.protocol.message_base import ApiKey

    plan = FetchPlan(1, [(TopicPartition("t", 0), 0, 5), (TopicPartition("t", 1), 0, 7)])
    request = fetch_request(plan, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                            partition_max_bytes=1 << 20, isolation_level=0,
                            leader_epoch=lambda topic, partition: 3 + partition)
    epochs = [p.current_leader_epoch for p in request.topics[0].partitions]
    assert epochs == [3, 4]
    new, version = sendable({int(ApiKey.FETCH): (0, 1)}, request)
    assert (new, version) == (request, 1)
    old, version = sendable({int(ApiKey.FETCH): (0, 0)}, request)
    assert version == 0 and [p.current_leader_epoch for p in old.topics[0].partitions] == [-1, -1]
    codec.encode_request(old, version)  # encodable at v0 now
