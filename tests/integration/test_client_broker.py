"""The clients against the real broker, over loopback sockets with real files.

Goal: what issue 3 asks of the client, end to end.
- 100,000 keyed records go through the blocking ``Producer`` and come back through the
  ``Consumer`` with exact contents, per-partition order and each key in its murmur2 partition.
- A producer keeps its records through a broker restart: sends made while the broker is down
  are retried and land once it is back (the real ``rivven-broker`` as a subprocess).
- Every front end (blocking, trio, asyncio: ``on_each_front``) does a round trip and looks
  offsets up by time.
Method: the blocking clients talk to a ``broker_process`` (a subprocess, so the test's threads
and the broker do not share an event loop); the shared bodies use ``threaded_broker`` (an
in-process broker on a trio thread of its own). Futures, flushes and polls with timeouts are
the only waits.
"""

from __future__ import annotations

import collections

import anyio
import pytest

from rivven_broker.client import Admin, Consumer, Producer, TopicPartition
from rivven_broker.records import partition_for_key
from tests.frontends import on_each_front

PARTITIONS = 3


def read_all(address: str, topic: str, count: int) -> list:
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    with Consumer(address, auto_offset_reset="earliest", max_poll_records=10_000) as consumer:
        consumer.assign(tps)
        records = []
        while len(records) < count:
            batch = consumer.poll(timeout_ms=10_000)
            assert batch, f"no progress after {len(records)} of {count} records"
            records += batch
        assert consumer.poll(timeout_ms=50) == []  # nothing beyond what was produced
    return records


@pytest.mark.slow
def test_100k_keyed_records_round_trip(broker_process):
    proc = broker_process("--sync-policy", "interval_ms=50")
    with Admin(proc.address) as admin:
        admin.create_topic("keyed", partitions=PARTITIONS)
    count = 100_000
    sent: dict[int, list[bytes]] = collections.defaultdict(list)
    with Producer(proc.address, linger_ms=20, compression="zstd") as producer:
        futures = []
        for i in range(count):
            key = b"key-%d" % (i % 997)
            value = b"value-%06d-" % i + b"x" * 40
            futures.append(producer.send("keyed", value=value, key=key))
        producer.flush()
        metas = [f.result() for f in futures]
    for i, meta in enumerate(metas):
        key = b"key-%d" % (i % 997)
        assert meta.partition == partition_for_key(key, PARTITIONS)
        sent[meta.partition].append(b"value-%06d-" % i)
    records = read_all(proc.address, "keyed", count)
    assert len(records) == count
    by_partition: dict[int, list] = collections.defaultdict(list)
    for record in records:
        assert record.partition == partition_for_key(record.key, PARTITIONS)
        by_partition[record.partition].append(record)
    for partition, got in by_partition.items():
        assert [r.offset for r in got] == list(range(len(got)))  # in order, no gaps
        assert [r.value[:13] for r in got] == sent[partition]  # send order kept per partition
        assert all(r.value.endswith(b"x" * 40) for r in got)
    for i in (0, 1, count // 2, count - 1):
        meta = metas[i]
        record = by_partition[meta.partition][meta.offset]
        assert record.value.startswith(b"value-%06d-" % i) and record.key == b"key-%d" % (i % 997)
        assert record.timestamp_ms == meta.timestamp_ms


@pytest.mark.slow
def test_producer_retries_across_a_broker_restart(broker_process):
    proc = broker_process()
    port, data_dir = proc.port, proc.data_dir
    with Admin(proc.address) as admin:
        admin.create_topic("restart", partitions=1)
    producer = Producer(proc.address, linger_ms=0, retry_backoff_ms=20,
                        reconnect_backoff_ms=20, reconnect_backoff_max_ms=200,
                        delivery_timeout_ms=60_000)
    try:
        assert producer.send("restart", value=b"before").result(timeout=30).offset == 0
        assert proc.terminate() == 0
        futures = [producer.send("restart", value=b"during-%d" % i) for i in range(50)]
        restarted = broker_process("--listen", f"127.0.0.1:{port}", data_dir=data_dir)
        assert restarted.port == port
        offsets = [f.result(timeout=60).offset for f in futures]
    finally:
        producer.close()
    assert sorted(offsets) == list(range(1, 51))
    records = read_all(restarted.address, "restart", 51)
    assert sorted(r.value for r in records[1:]) == sorted(b"during-%d" % i for i in range(50))


@on_each_front
async def test_client_round_trip(front, threaded_broker):
    broker = threaded_broker()
    with anyio.fail_after(60):
        async with front.open_admin(broker.address) as admin:
            await admin.create_topic("trio", partitions=PARTITIONS)
            description = await admin.describe_topic("trio")
            assert description.partitions == PARTITIONS
        async with front.open_producer(broker.address, linger_ms=2) as producer:
            metas = [await producer.send("trio", value=b"v%d" % i, key=b"k%d" % i)
                     for i in range(20)]
            handles = [await producer.enqueue("trio", value=b"w%d" % i) for i in range(500)]
            await producer.flush()
            metas += [await handle for handle in handles]
        async with front.open_consumer(broker.address, auto_offset_reset="earliest") as consumer:
            consumer.assign([TopicPartition("trio", p) for p in range(PARTITIONS)])
            records = []
            while len(records) < len(metas):
                records += await consumer.poll(timeout_ms=5000)
    found = {(r.partition, r.offset): r.value for r in records}
    for i, meta in enumerate(metas[:20]):
        assert meta.partition == partition_for_key(b"k%d" % i, PARTITIONS)
        assert found[(meta.partition, meta.offset)] == b"v%d" % i
    for i, meta in enumerate(metas[20:]):
        assert found[(meta.partition, meta.offset)] == b"w%d" % i


@on_each_front
async def test_offsets_for_times(front, threaded_broker):
    """kafka-python's offsets_for_times: the first offset at or after a time per partition;
    None when no record is that late. Every front alike."""
    broker = threaded_broker()
    tp = TopicPartition("times", 0)
    with anyio.fail_after(60):
        async with front.open_admin(broker.address) as admin:
            await admin.create_topic("times", partitions=1)
        async with front.open_producer(broker.address) as producer:
            for i in range(4):
                await producer.send("times", value=b"%d" % i, partition=0,
                                    timestamp_ms=1_000 * (i + 1))
        async with front.open_consumer(broker.address) as consumer:
            found = await consumer.offsets_for_times({tp: 2_500})
            assert found[tp] == (2, 3_000)  # the record's offset and its timestamp
            assert (await consumer.offsets_for_times({tp: 9_000})) == {tp: None}
            with pytest.raises(ValueError):
                await consumer.offsets_for_times({tp: -1})
            consumer.assign([tp])
            consumer.seek(tp, 0)
            got = []
            while len(got) < 4:
                got += await consumer.poll(timeout_ms=5_000)
            figures = consumer.metrics()
            assert figures["consumer-fetch-manager-metrics"]["records-consumed-total"] == 4
            assert figures["consumer-fetch-manager-metrics"]["records-lag-max"] == 0
            assert (await consumer.offsets_for_times({tp: 0}))[tp].offset == 0
            assert (await consumer.offsets_for_times({tp: 4_000}))[tp].offset == 3
            assert await consumer.offsets_for_times({tp: 4_001}) == {tp: None}


def test_offsets_for_times_find_the_record_inside_a_batch(broker_process):
    """Kafka's lookup by time answers the first *record* (in offset order) whose timestamp
    reaches the time, with that record's timestamp, even inside one compressed batch whose
    timestamps do not grow with the offsets, and past a log start cut inside the batch."""
    proc = broker_process()
    tp = TopicPartition("stamps", 0)
    stamps = [1_000, 3_000, 2_000, 4_000, 2_500, 5_000]
    with Admin(proc.address) as admin:
        admin.create_topic("stamps", partitions=1)
    with Producer(proc.address, linger_ms=200, compression="zstd") as producer:
        futures = [producer.send("stamps", value=b"v%d" % i, partition=0, timestamp_ms=ms)
                   for i, ms in enumerate(stamps)]
        producer.flush()
    assert [f.result().offset for f in futures] == list(range(6))
    with Consumer(proc.address) as consumer:
        def at(ms: int) -> tuple[int, int] | None:
            found = consumer.offsets_for_times({tp: ms})[tp]
            return None if found is None else tuple(found)

        assert consumer.end_offsets([tp]) == {tp: 6}
        assert at(0) == (0, 1_000)
        assert at(1_500) == (1, 3_000)  # not offset 0, the batch's first
        assert at(3_500) == (3, 4_000)
        assert at(4_001) == (5, 5_000)
        assert at(5_001) is None
        with Admin(proc.address) as admin:
            admin.delete_records({tp: 2})  # the log now starts inside the batch
        assert at(0) == (2, 2_000)
        assert at(2_100) == (3, 4_000)
        assert at(4_500) == (5, 5_000)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4"])
def test_each_codec_through_a_real_broker(broker_process, codec):
    """Records produced with each Kafka codec (ids 1-3, through cramjam) are stored as sent
    and read back whole, by the blocking and the CLI's path alike."""
    proc = broker_process()
    with Producer(proc.address, linger_ms=10, compression=codec) as producer:
        metas = [producer.send("codec", value=b"event %05d " % i * 4, key=b"k%d" % (i % 5),
                               partition=0) for i in range(2_000)]
        producer.flush()
    assert [m.result().offset for m in metas] == list(range(2_000))
    with Consumer(proc.address, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("codec", 0)])
        got = []
        while len(got) < 2_000:
            got += consumer.poll(timeout_ms=5_000)
    assert [r.value for r in got] == [b"event %05d " % i * 4 for i in range(2_000)]
