"""Growing a topic's partition count (CreatePartitions) over real sockets and real files.

Method: an in-process broker driven with the raw protocol client checks every answer code
(grow, validate only, not growing, over the limit, unknown and internal topics, bad names) and
that Metadata then lists the new count; the async ``Admin`` grows a topic too (trio and asyncio). A broker
subprocess driven by the blocking clients checks the whole story: a topic grown 2 -> 5 keeps its
old records, keyed records produced afterwards land where murmur2 with 5 partitions says (in
all 5), and after a restart the count and every record are still there. Last, the CLI's
``topic alter --partitions`` (with and without ``--config``) round trips with ``--json`` and
exits 1 on a refusal.
"""

from __future__ import annotations

import collections
import json

import anyio
import pytest

from rivven_broker.cli.rivven_main import main
from rivven_broker.client import Admin, Consumer, InvalidPartitionsError, Producer, TopicPartition
from rivven_broker.client import UnknownTopicOrPartitionError
from rivven_broker.client.aio import open_admin
from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.messages import (
    CreatePartitions,
    CreateTopic,
    DescribeTopic,
    Metadata,
)
from rivven_broker.records import partition_for_key
from tests.integration.test_client_driver import consume_all
from tests.loops import on_each_loop


async def _count(client, name: str) -> int:
    answer = await client.call(Metadata((name,)))
    return len(answer.topics[0].partitions)


async def test_grow_and_every_refusal_over_the_wire(broker, connect):
    client = await connect(broker.port)
    assert (await client.call(CreateTopic("t", 2))).error_code == ErrorCode.NONE

    checked = await client.call(CreatePartitions("t", 4, validate_only=True))
    assert (checked.error_code, checked.count) == (ErrorCode.NONE, 4)
    assert await _count(client, "t") == 2

    grown = await client.call(CreatePartitions("t", 5))
    assert (grown.name, grown.error_code, grown.count) == ("t", ErrorCode.NONE, 5)
    assert await _count(client, "t") == 5
    assert (await client.call(DescribeTopic("t"))).partitions == 5

    for count in (5, 3, 0, -1, limits.partitions_per_topic_max + 1):
        refused = await client.call(CreatePartitions("t", count))
        assert refused.error_code == ErrorCode.INVALID_PARTITIONS, count
        assert refused.count == 5 and refused.error_message
    same = await client.call(CreatePartitions("t", 5, validate_only=True))
    assert same.error_code == ErrorCode.INVALID_PARTITIONS
    assert "only grow" in same.error_message

    unknown = await client.call(CreatePartitions("ghost", 3))
    assert (unknown.error_code, unknown.count) == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1)
    for internal in ("__consumer_offsets", "__transaction_state"):
        answer = await client.call(CreatePartitions(internal, 200))
        assert answer.error_code == ErrorCode.POLICY_VIOLATION
    bad = await client.call(CreatePartitions("bad name", 3))
    assert bad.error_code == ErrorCode.INVALID_TOPIC_NAME
    assert await _count(client, "t") == 5


@on_each_loop
async def test_async_admin_grows_a_topic(threaded_broker):
    broker = threaded_broker()
    with anyio.fail_after(30):
        async with open_admin(broker.address) as admin:
            await admin.create_topic("async-grow", partitions=1)
            await admin.create_partitions("async-grow", 3, validate_only=True)
            assert (await admin.describe_topic("async-grow")).partitions == 1
            await admin.create_partitions("async-grow", 3)
            assert (await admin.describe_topic("async-grow")).partitions == 3
            with pytest.raises(InvalidPartitionsError):
                await admin.create_partitions("async-grow", 2)


def _send_keyed(address: str, keys: list[bytes], tag: bytes) -> list:
    with Producer(address, linger_ms=5) as producer:
        futures = [producer.send("grow", key=key, value=tag + key) for key in keys]
        producer.flush()
        return [future.result(timeout=30) for future in futures]


def test_grow_two_to_five_produce_restart(broker_process):
    proc = broker_process()  # sync policy "always": new logs join the group commit
    keys = [b"key-%d" % i for i in range(60)]
    with Admin(proc.address) as admin:
        admin.create_topic("grow", partitions=2)
        before = _send_keyed(proc.address, keys, b"old-")
        admin.create_partitions("grow", 5)
        assert admin.describe_topic("grow").partitions == 5
        with pytest.raises(InvalidPartitionsError):
            admin.create_partitions("grow", 4)
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.create_partitions("ghost", 4)
    assert {meta.partition for meta in before} == {0, 1}
    after = _send_keyed(proc.address, keys, b"new-")
    for key, meta in zip(keys, after):
        assert meta.partition == partition_for_key(key, 5)
    assert {meta.partition for meta in after} == {0, 1, 2, 3, 4}
    new_partitions = [meta for meta in after if meta.partition >= 2]
    assert min(meta.offset for meta in new_partitions) == 0  # new partitions start at 0

    def check(address: str) -> None:
        records = consume_all(address, [TopicPartition("grow", p) for p in range(5)],
                              2 * len(keys))
        assert len(records) == 2 * len(keys)
        by_partition = collections.defaultdict(list)
        for record in records:
            by_partition[record.partition].append(record)
            if record.value.startswith(b"old-"):
                assert record.partition == partition_for_key(record.key, 2)
            else:
                assert record.partition == partition_for_key(record.key, 5)
        for got in by_partition.values():
            assert [r.offset for r in got] == list(range(len(got)))
        assert sorted(r.value for r in records) == sorted(
            [b"old-" + k for k in keys] + [b"new-" + k for k in keys]
        )

    check(proc.address)
    assert proc.terminate() == 0
    restarted = broker_process(data_dir=proc.data_dir)
    with Admin(restarted.address) as admin:
        assert admin.describe_topic("grow").partitions == 5
    check(restarted.address)


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_topic_alter_partitions(broker_process, capsys):
    proc = broker_process("--sync-policy", "none")
    b = ("--bootstrap", proc.address, "--json")
    assert _cli(capsys, *b, "topic", "create", "c", "--partitions", "2")[0] == 0
    code, out, _ = _cli(capsys, *b, "topic", "alter", "c", "--partitions", "4")
    assert code == 0 and json.loads(out) == {"topic": "c", "partitions": 4}
    code, out, _ = _cli(capsys, *b, "topic", "alter", "c", "--partitions", "6",
                        "--config", "retention.ms=60000")
    assert code == 0
    assert json.loads(out) == {"topic": "c", "partitions": 6, "configs": {"retention.ms": "60000"}}
    code, out, _ = _cli(capsys, *b, "topic", "describe", "c")
    doc = json.loads(out)
    assert doc["partitions"] == 6 and doc["configs"]["retention.ms"]["value"] == "60000"

    # A refused count changes nothing, not even the configs given with it.
    code, out, err = _cli(capsys, *b, "topic", "alter", "c", "--partitions", "3",
                          "--config", "retention.ms=1000")
    assert code == 1 and out == "" and "only grow" in json.loads(err)["error"]
    code, out, _ = _cli(capsys, *b, "topic", "describe", "c")
    doc = json.loads(out)
    assert doc["partitions"] == 6 and doc["configs"]["retention.ms"]["value"] == "60000"
    assert _cli(capsys, *b, "topic", "alter", "ghost", "--partitions", "3")[0] == 1

    code, out, _ = _cli(capsys, "--bootstrap", proc.address, "topic", "alter", "c",
                        "--partitions", "7")
    assert code == 0 and "7 partitions" in out
