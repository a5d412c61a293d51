"""Produce and fetch over a real socket: acks 0/1/all, ordering, long polls, offsets, deletion.

Method: an in-process broker on loopback with real files; batches built with the project's
``BatchBuilder``; requests sent with the raw protocol client. Long-poll tests start a fetch,
then produce, and check that the fetch completes with the new data (no sleeps, no timing
assertions: a fetch that was not woken would wait its full ``max_wait_ms`` of 30 s and fail
the ``fail_after`` bound, which is far above any real scheduling delay).
"""

from __future__ import annotations

import trio

from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.messages import (
    CreateTopic,
    DeleteRecords,
    DeleteRecordsPartition,
    DeleteRecordsTopic,
    Fetch,
    FetchPartition,
    FetchTopic,
    ListOffsets,
    ListOffsetsPartition,
    ListOffsetsTopic,
    Ping,
    Pong,
    Produce,
    ProducePartition,
    ProduceTopic,
)
from rivven_broker.records import BatchBuilder, decode_records, iter_batches

_LONG_WAIT_MS = 30_000


def batch(*values: bytes, timestamp_ms: int = 1_000) -> bytes:
    builder = BatchBuilder(batch_bytes_max=1 << 20)
    for value in values:
        assert builder.append(timestamp_ms, None, value)
    return builder.build()


def produce(topic: str, partition: int, records: bytes, acks: int = -1) -> Produce:
    return Produce(acks=acks, timeout_ms=10_000,
                   topics=(ProduceTopic(topic, (ProducePartition(partition, records),)),))


def fetch(topic: str, partition: int, offset: int, *, max_wait_ms: int = 0, min_bytes: int = 1,
          max_bytes: int = 1 << 20, partition_max_bytes: int = 1 << 20) -> Fetch:
    return Fetch(max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes,
                 topics=(FetchTopic(topic, (FetchPartition(partition, offset, partition_max_bytes),)),))


def values_of(records: bytes) -> list[bytes]:
    return [record.value for record in decode_records(records)]


def only_partition(response):
    (topic,) = response.topics
    (partition,) = topic.partitions
    return partition


async def test_produce_then_fetch_round_trip_with_every_acks(broker, connect):
    client = await connect(broker.port)
    await client.call(CreateTopic("t", 1))
    first = only_partition(await client.call(produce("t", 0, batch(b"a", b"b"), acks=-1)))
    assert (first.error_code, first.base_offset) == (ErrorCode.NONE, 0)
    assert first.log_append_time_ms > 0 and first.log_start_offset == 0
    second = only_partition(await client.call(produce("t", 0, batch(b"c"), acks=1)))
    assert (second.error_code, second.base_offset) == (ErrorCode.NONE, 2)
    await client.send(produce("t", 0, batch(b"d"), acks=0))  # no answer to wait for
    assert isinstance(await client.call(Ping()), Pong)  # ... and the next answer is the ping's
    # Under sync=always the acks=0 batch is visible once durable; the next acks=all batch
    # is durable only after everything before it.
    last = only_partition(await client.call(produce("t", 0, batch(b"e"), acks=-1)))
    assert last.base_offset == 4

    fetched = only_partition(await client.call(fetch("t", 0, 0)))
    assert fetched.error_code == ErrorCode.NONE
    assert fetched.high_watermark == 5 and fetched.last_stable_offset == 5
    assert values_of(fetched.records) == [b"a", b"b", b"c", b"d", b"e"]
    assert [record.offset for record in decode_records(fetched.records)] == [0, 1, 2, 3, 4]

    from_middle = only_partition(await client.call(fetch("t", 0, 3)))
    assert values_of(from_middle.records) == [b"d", b"e"]
    at_end = only_partition(await client.call(fetch("t", 0, 5)))
    assert at_end.error_code == ErrorCode.NONE and at_end.records == b""


async def test_a_partition_named_twice_in_one_produce_is_refused_whole(broker, connect):
    client = await connect(broker.port)
    await client.call(CreateTopic("t", 2))
    twice = Produce(acks=-1, timeout_ms=10_000, topics=(
        ProduceTopic("t", (ProducePartition(0, batch(b"a")), ProducePartition(1, batch(b"b")))),
        ProduceTopic("t", (ProducePartition(0, batch(b"c")),)),
    ))
    answer = await client.call(twice)
    assert answer.error_code == ErrorCode.INVALID_REQUEST  # the whole request, at decoding
    fetched = only_partition(await client.call(fetch("t", 0, 0)))
    assert fetched.high_watermark == 0 and fetched.records == b""  # nothing of it appended
    assert only_partition(await client.call(fetch("t", 1, 0))).records == b""


async def test_offsets_for_leader_epoch_on_a_single_broker(broker, connect):
    """A log whose leader never changed: epoch 0 ends at the log end."""
    from rivven_broker.protocol.messages import (
        OffsetsForLeaderEpoch,
        OffsetsForLeaderEpochPartition,
        OffsetsForLeaderEpochTopic,
    )
    client = await connect(broker.port)
    await client.call(CreateTopic("t", 1))
    await client.call(produce("t", 0, batch(b"a", b"b", b"c")))
    answer = await client.call(OffsetsForLeaderEpoch((OffsetsForLeaderEpochTopic("t", (
        OffsetsForLeaderEpochPartition(0, 0), OffsetsForLeaderEpochPartition(7, 0))),)))
    (ended, unknown) = answer.topics[0].partitions
    assert (ended.error_code, ended.leader_epoch, ended.end_offset) == (ErrorCode.NONE, 0, 3)
    assert unknown.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_produce_auto_creates_the_topic(broker, connect):
    client = await connect(broker.port)
    answer = only_partition(await client.call(produce("fresh", 2, batch(b"x"))))
    assert answer.error_code == ErrorCode.NONE
    missing = only_partition(await client.call(produce("fresh", 3, batch(b"x"))))
    assert missing.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION  # 3 partitions: 0..2


async def test_unknown_topics_and_partitions(start_broker, connect):
    broker = await start_broker(auto_create_topics=False)
    client = await connect(broker.port)
    assert only_partition(await client.call(produce("ghost", 0, batch(b"x")))).error_code == \
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    await client.call(CreateTopic("t", 2))
    for partition in (2, -1, 1000):
        produced = only_partition(await client.call(produce("t", partition, batch(b"x"))))
        assert produced.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        fetched = only_partition(await client.call(fetch("t", partition, 0)))
        assert fetched.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert only_partition(await client.call(fetch("ghost", 0, 0))).error_code == \
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    bad = only_partition(await client.call(produce("bad name", 0, batch(b"x"))))
    assert bad.error_code == ErrorCode.INVALID_TOPIC_NAME
    assert only_partition(await client.call(fetch("bad name", 0, 0))).error_code == \
        ErrorCode.INVALID_TOPIC_NAME


async def test_pipelined_requests_are_answered_in_order(broker, connect):
    client = await connect(broker.port)
    await client.call(CreateTopic("t", 1))
    sent = []
    for index in range(40):
        if index % 5 == 4:
            sent.append((await client.send(Ping()), "ping"))
        else:
            sent.append((await client.send(produce("t", 0, batch(b"%d" % index))), "produce"))
    offsets = []
    for correlation_id, kind in sent:
        event = await client.receive()
        assert event.correlation_id == correlation_id
        if kind == "produce":
            offsets.append(only_partition(event.response).base_offset)
        else:
            assert isinstance(event.response, Pong)
    assert offsets == list(range(32))  # appended in request order
    fetched = only_partition(await client.call(fetch("t", 0, 0)))
    assert values_of(fetched.records) == [b"%d" % i for i in range(40) if i % 5 != 4]


async def test_long_poll_returns_when_data_arrives(broker, connect):
    consumer = await connect(broker.port)
    producer = await connect(broker.port)
    await producer.call(CreateTopic("t", 1))
    with trio.fail_after(_LONG_WAIT_MS / 1000 / 2):
        await consumer.send(fetch("t", 0, 0, max_wait_ms=_LONG_WAIT_MS))
        await producer.call(produce("t", 0, batch(b"hello")))
        answer = only_partition((await consumer.receive()).response)
    assert values_of(answer.records) == [b"hello"]


async def test_long_poll_woken_by_acks_zero_under_sync_always(broker, connect):
    # Nobody waits for durability of an acks=0 batch: the fetch itself must see it through.
    consumer = await connect(broker.port)
    producer = await connect(broker.port)
    await producer.call(CreateTopic("t", 1))
    with trio.fail_after(_LONG_WAIT_MS / 1000 / 2):
        await consumer.send(fetch("t", 0, 0, max_wait_ms=_LONG_WAIT_MS))
        await producer.send(produce("t", 0, batch(b"quiet"), acks=0))
        answer = only_partition((await consumer.receive()).response)
    assert values_of(answer.records) == [b"quiet"]


async def test_min_bytes_is_honoured(start_broker, connect):
    broker = await start_broker(sync_policy="none")
    consumer = await connect(broker.port)
    producer = await connect(broker.port)
    await producer.call(CreateTopic("t", 1))
    small = batch(b"x")
    with trio.fail_after(_LONG_WAIT_MS / 1000 / 2):
        await consumer.send(fetch("t", 0, 0, max_wait_ms=_LONG_WAIT_MS, min_bytes=3 * len(small)))
        await producer.call(produce("t", 0, small))
        await producer.call(produce("t", 0, small))
        # Not yet 3 batches: the fetch is still waiting, and a ping on the same connection
        # queues behind it (answers stay in request order).
        ping_id = await consumer.send(Ping())
        await producer.call(produce("t", 0, small))
        first = await consumer.receive()
        second = await consumer.receive()
    assert len(only_partition(first.response).records) >= 3 * len(small)
    assert second.correlation_id == ping_id


async def test_max_wait_expires_with_what_there_is(broker, connect):
    client = await connect(broker.port)
    await client.call(CreateTopic("t", 1))
    with trio.fail_after(10):
        answer = only_partition(await client.call(fetch("t", 0, 0, max_wait_ms=50)))
    assert answer.error_code == ErrorCode.NONE and answer.records == b""


async def test_fetch_byte_limits(start_broker, connect):
    broker = await start_broker(sync_policy="none")
    client = await connect(broker.port)
    await client.call(CreateTopic("t", 2))
    big = batch(b"v" * 5000)
    for _ in range(3):
        await client.call(produce("t", 0, big))
        await client.call(produce("t", 1, big))
    # A budget smaller than one batch still returns one whole batch (progress) ...
    small_budget = only_partition(await client.call(fetch("t", 0, 0, max_bytes=100, partition_max_bytes=100)))
    assert small_budget.records == big[:0] + small_budget.records
    assert len(list(iter_batches(small_budget.records))) == 1
    # ... but only for the first partition with data; the total stays within max_bytes.
    request = Fetch(max_wait_ms=0, min_bytes=1, max_bytes=len(big) * 2,
                    topics=(FetchTopic("t", (FetchPartition(0, 0, 1 << 20), FetchPartition(1, 0, 1 << 20))),))
    response = await client.call(request)
    sizes = [len(p.records) for p in response.topics[0].partitions]
    assert sizes == [len(big) * 2, 0]


async def test_offset_out_of_range(broker, connect):
    client = await connect(broker.port)
    await client.call(CreateTopic("t", 1))
    await client.call(produce("t", 0, batch(b"a")))
    assert only_partition(await client.call(fetch("t", 0, 5))).error_code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert only_partition(await client.call(fetch("t", 0, -1))).error_code == ErrorCode.OFFSET_OUT_OF_RANGE


async def test_list_offsets_and_delete_records(broker, connect):
    client = await connect(broker.port)
    await client.call(CreateTopic("t", 1))
    await client.call(produce("t", 0, batch(b"a", b"b", timestamp_ms=1_000)))
    await client.call(produce("t", 0, batch(b"c", timestamp_ms=2_000)))

    async def list_offset(timestamp: int):
        request = ListOffsets(topics=(ListOffsetsTopic("t", (ListOffsetsPartition(0, timestamp),)),))
        return only_partition(await client.call(request))

    assert (await list_offset(-2)).offset == 0
    assert (await list_offset(-1)).offset == 3
    assert (await list_offset(1_500)).offset == 2
    assert (await list_offset(500)).offset == 0
    assert (await list_offset(9_999)).offset == -1

    def delete(offset: int) -> DeleteRecords:
        return DeleteRecords(topics=(DeleteRecordsTopic("t", (DeleteRecordsPartition(0, offset),)),))

    assert only_partition(await client.call(delete(99))).error_code == ErrorCode.OFFSET_OUT_OF_RANGE
    moved = only_partition(await client.call(delete(2)))
    assert (moved.error_code, moved.low_watermark) == (ErrorCode.NONE, 2)
    assert (await list_offset(-2)).offset == 2
    assert only_partition(await client.call(fetch("t", 0, 0))).error_code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert values_of(only_partition(await client.call(fetch("t", 0, 2))).records) == [b"c"]
    to_end = only_partition(await client.call(delete(-1)))
    assert to_end.low_watermark == 3


async def test_deleting_a_topic_wakes_its_long_polls(broker, connect):
    consumer = await connect(broker.port)
    admin = await connect(broker.port)
    await admin.call(CreateTopic("t", 1))
    from rivven_broker.protocol.messages import DeleteTopic

    with trio.fail_after(_LONG_WAIT_MS / 1000 / 2):
        await consumer.send(fetch("t", 0, 0, max_wait_ms=_LONG_WAIT_MS))
        assert (await admin.call(DeleteTopic("t"))).error_code == ErrorCode.NONE
        answer = only_partition((await consumer.receive()).response)
    assert answer.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_eight_pipelined_acks_all_produces_share_group_commits(broker, connect):
    client = await connect(broker.port)
    await client.call(CreateTopic("t", 1))
    worker = broker.broker.context.sync_worker
    before = worker.statistics().groups
    ids = [await client.send(produce("t", 0, batch(b"%d" % i))) for i in range(8)]
    answers = [await client.receive() for _ in ids]
    assert [a.correlation_id for a in answers] == ids
    assert all(only_partition(a.response).error_code == ErrorCode.NONE for a in answers)
    assert worker.statistics().groups - before < 8


async def test_large_batches_are_sent_from_the_segment_file_byte_for_byte(start_broker, connect):
    # Batches of 100 KiB and more go out with os.sendfile (file_region.py); small ones are
    # read and copied. Mixed in one answer, in pipelined answers and under byte budgets, every
    # record must arrive intact (decode_records checks each batch's CRC).
    broker = await start_broker(sync_policy="none")
    client = await connect(broker.port)
    await client.call(CreateTopic("t", 2))
    large = [bytes([i]) * (150_000 + i) for i in range(4)]
    for value in large[:2]:
        await client.call(produce("t", 0, batch(value)))
    await client.call(produce("t", 0, batch(b"small-1", b"small-2")))
    for value in large[2:]:
        await client.call(produce("t", 0, batch(value)))
    await client.call(produce("t", 1, batch(b"p1")))
    values = [*large[:2], b"small-1", b"small-2", *large[2:]]

    whole = only_partition(await client.call(fetch("t", 0, 0, max_bytes=1 << 22,
                                                    partition_max_bytes=1 << 22)))
    assert values_of(whole.records) == values
    ids = [await client.send(fetch("t", 0, offset, max_bytes=200_000, partition_max_bytes=200_000))
           for offset in range(6)]
    answers = [await client.receive() for _ in ids]
    assert [a.correlation_id for a in answers] == ids
    for offset, answer in enumerate(answers):  # whole batches from the one holding offset
        records = decode_records(only_partition(answer.response).records)
        got = [(r.offset, r.value) for r in records if r.offset >= offset]
        assert got and got == list(enumerate(values))[offset: offset + len(got)]
    both = await client.call(Fetch(max_wait_ms=0, min_bytes=1, max_bytes=1 << 22, topics=(
        FetchTopic("t", (FetchPartition(0, 4, 1 << 22), FetchPartition(1, 0, 1 << 22))),)))
    first, second = both.topics[0].partitions
    assert values_of(first.records) == large[2:] and values_of(second.records) == [b"p1"]


async def test_describe_log_dirs_reports_bytes_and_offsets_of_local_replicas(broker, connect):
    from rivven_broker.protocol.messages import DescribeLogDirs, DescribeLogDirsTopic

    client = await connect(broker.port)
    await client.call(CreateTopic("sized", 2))
    await client.call(produce("sized", 1, batch(b"a" * 100, b"b" * 100)))
    answer = await client.call(DescribeLogDirs((DescribeLogDirsTopic("sized", (0, 1, 7)),
                                                DescribeLogDirsTopic("nope", (0,)))))
    (sized, nope) = answer.topics
    empty, full, missing = sized.partitions
    assert (empty.error_code, empty.size_bytes, empty.log_end_offset) == (ErrorCode.NONE, 0, 0)
    assert full.error_code == ErrorCode.NONE and full.size_bytes > 200
    assert (full.log_start_offset, full.log_end_offset) == (0, 2)
    assert missing.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and missing.size_bytes == -1
    assert nope.partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
