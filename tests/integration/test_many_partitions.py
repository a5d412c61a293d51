"""Many partitions and segments against a real in-process broker: descriptors and the bound.

Method: found by probing (issue 16, defect 5): every segment kept its three files open, so one
1,000-partition ``CreateTopic`` from any client took 3,000 descriptors, and sealed segments
added three more each (1,000 partitions of six 1 KiB segments: 18,000) until the process ran
out. Here the test process's own descriptor limit is lowered to 1,024 (the in-process broker
shares it and derives its open-files bound from it, as at start) and a 1,000-partition topic
with 1 KiB segments is created, written (several sealed segments in each partition written)
and read back from its first offset, under both kinds of sync policy: the count of
``/proc/self/fd`` must stay far below the file count, and every read must be right. Then the
broker-wide partition bound: creations that would pass it are refused whole with
``INVALID_PARTITIONS``, and deleting a topic makes room again. No sleeps; waits are bounded
by the requests themselves.
"""

from __future__ import annotations

import os
import resource

import pytest

from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.messages import (
    CreatePartitions,
    CreateTopic,
    DeleteTopic,
    Fetch,
    FetchPartition,
    FetchTopic,
    Produce,
    ProducePartition,
    ProduceTopic,
)
from rivven_broker.records import BatchBuilder

_PARTITIONS = 1000
_WRITTEN = range(0, _PARTITIONS, 4)  # 250 partitions written, 750 left empty
_ROUNDS = 6  # 370-byte batches into 1 KiB segments: 3 segments in each partition written
_DESCRIPTOR_LIMIT = 1024


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def descriptor_limit_1024():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert _open_descriptors() < 200, "the test process already holds many descriptors"
    resource.setrlimit(resource.RLIMIT_NOFILE, (_DESCRIPTOR_LIMIT, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _batch(partition: int, round: int) -> bytes:
    builder = BatchBuilder(batch_bytes_max=1 << 16)
    builder.append(1_000, b"k", b"p%d r%d " % (partition, round) + b"v" * 300)
    return builder.build()


@pytest.mark.parametrize("sync_policy", ["always", "none"])
async def test_a_thousand_partitions_of_small_segments_fit_a_small_descriptor_limit(
    start_broker, connect, descriptor_limit_1024, sync_policy
):
    """Under ``none`` nothing is fsynced before close: files written must not stay pinned
    open waiting for a group commit that never comes (they did: every file ever written)."""
    broker = await start_broker(sync_policy=sync_policy, http=None)
    client = await connect(broker.port)
    before = _open_descriptors()
    created = await client.call(
        CreateTopic("wide", _PARTITIONS, configs={"segment.bytes": "1024"})
    )
    assert created.error_code == ErrorCode.NONE, created
    files = broker.broker.files
    assert files.open_files_max < 500  # derived from the lowered limit, as at start
    for round in range(_ROUNDS):
        produced = await client.call(Produce(acks=1, topics=(ProduceTopic("wide", tuple(
            ProducePartition(p, _batch(p, round)) for p in _WRITTEN)),)))
        assert all(p.error_code == ErrorCode.NONE for p in produced.topics[0].partitions)
        assert _open_descriptors() - before <= files.open_files_max + 20
    plog = broker.broker.context.logs.get_log("wide", _WRITTEN[-1])
    assert len(plog.segment_base_offsets) >= 3
    for first in (0, _ROUNDS - 1):  # the oldest sealed segment, then the active one
        fetched = await client.call(Fetch(max_wait_ms=0, topics=(FetchTopic("wide", tuple(
            FetchPartition(p, first, 1024) for p in _WRITTEN)),)))
        for partition, answer in zip(_WRITTEN, fetched.topics[0].partitions):
            assert answer.error_code == ErrorCode.NONE
            assert b"p%d r%d " % (partition, first) in bytes(answer.records)
    assert _open_descriptors() - before <= files.open_files_max + 20
    stats = files.statistics()
    assert stats.reopened > 0 and stats.open_now <= files.open_files_max


async def test_creations_past_the_broker_wide_partition_bound_are_refused_whole(
    start_broker, connect, monkeypatch
):
    broker = await start_broker(sync_policy="none", http=None)
    client = await connect(broker.port)
    held = sum(info.partitions for info in broker.broker.context.logs.topics().values())
    monkeypatch.setattr(limits, "partitions_per_broker_max", held + 30)  # the broker's own count

    assert (await client.call(CreateTopic("a", 20))).error_code == ErrorCode.NONE
    refused = await client.call(CreateTopic("b", 11))
    assert refused.error_code == ErrorCode.INVALID_PARTITIONS
    assert f"limit of {held + 30}" in refused.error_message
    assert (await client.call(CreateTopic("b", 11, validate_only=True))).error_code == (
        ErrorCode.INVALID_PARTITIONS)
    assert (await client.call(CreateTopic("b", 10))).error_code == ErrorCode.NONE  # exactly full
    grown = await client.call(CreatePartitions("b", 11))
    assert grown.error_code == ErrorCode.INVALID_PARTITIONS
    produced = await client.call(Produce(acks=1, topics=(ProduceTopic(  # auto-creation
        "c", (ProducePartition(0, _batch(0, 0)),)),)))
    assert produced.topics[0].partitions[0].error_code == ErrorCode.INVALID_PARTITIONS
    assert set(broker.broker.context.logs.topics()) >= {"a", "b"}
    assert "c" not in broker.broker.context.logs.topics()
    assert broker.broker.context.logs.topics()["b"].partitions == 10

    assert (await client.call(DeleteTopic("a"))).error_code == ErrorCode.NONE
    assert (await client.call(CreatePartitions("b", 30))).error_code == ErrorCode.NONE
