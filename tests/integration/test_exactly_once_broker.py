"""The broker's side of exactly-once, over the raw protocol: idempotence, transactions, LSO.

Goal: every rule of docs/exactly-once.md that the broker enforces, seen from the wire. Method:
an in-process broker on loopback and real files (``start_broker``), a raw client building
batches with explicit producer ids, epochs and sequences, and checks of what the log then
holds (fetched back and decoded). Restarts reuse the data directory: graceful ones (snapshots)
and crashes (the broker's task cancelled: every log abandoned, as a process death leaves it).
"""

from __future__ import annotations

import pytest
import trio

from rivven_broker.client.fetch_state import CompletedFetch, decode_completed
from rivven_broker.client.types import TopicPartition
from rivven_broker.protocol import messages as m
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.txn_messages import (
    AddOffsetsToTxn,
    AddPartitionsToTxn,
    AddPartitionsToTxnTopic,
    EndTxn,
    InitProducerId,
)
from rivven_broker.records import BatchBuilder, decode_records
from rivven_broker.records.control import ControlType, build_control_batch
from rivven_broker.server.broker import Broker
from rivven_broker.server.config import BrokerConfig, HostPort
from rivven_broker.server.env import RealEnv


def batch(pid: int, epoch: int, seq: int, *values: bytes, txn: bool = False) -> bytes:
    builder = BatchBuilder(batch_bytes_max=1 << 20, producer_id=pid, producer_epoch=epoch,
                           base_sequence=seq, transactional=txn)
    for value in values:
        builder.append(1_000, None, value)
    return builder.build()


def produce(topic: str, partition: int, records: bytes, txn: str | None = None) -> m.Produce:
    return m.Produce(acks=-1, timeout_ms=10_000, transactional_id=txn,
                     topics=(m.ProduceTopic(topic, (m.ProducePartition(partition, records),)),))


def fetch(topic: str, partition: int, isolation: int, offset: int = 0) -> m.Fetch:
    return m.Fetch(max_wait_ms=0, isolation_level=isolation,
                   topics=(m.FetchTopic(topic, (m.FetchPartition(partition, offset),)),))


def add(txn: str, pid: int, epoch: int, topic: str, *partitions: int) -> AddPartitionsToTxn:
    return AddPartitionsToTxn(txn, pid, epoch, (AddPartitionsToTxnTopic(topic, partitions),))


async def answer_of(client, request):
    return (await client.call(request)).topics[0].partitions[0]


async def values(client, topic: str, partition: int, isolation: int) -> list[bytes]:
    """What a consumer of that isolation level gets: through the client's own decoding."""
    part = await answer_of(client, fetch(topic, partition, isolation))
    assert part.error_code == ErrorCode.NONE
    aborted = tuple((a.producer_id, a.first_offset) for a in part.aborted_transactions)
    completed = CompletedFetch(TopicPartition(topic, partition), 0, 0, part.records, 0,
                               part.high_watermark, aborted)
    return [record.value for record in decode_completed(completed)[0]]


async def open_client(connect, running, topic: str = "t", partitions: int = 2):
    client = await connect(running.port)
    await client.call(m.Handshake())
    created = await client.call(m.CreateTopic(topic, partitions))
    assert created.error_code in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS)
    return client


async def wait_until_stable(client, topic: str, partition: int) -> m.FetchPartitionResponse:
    """Markers are written after the EndTxn answer: wait until the LSO reaches the HWM."""
    with trio.fail_after(10):
        while True:
            part = await answer_of(client, fetch(topic, partition, m.READ_COMMITTED))
            if part.last_stable_offset == part.high_watermark:
                return part
            await trio.sleep(0.01)


async def test_a_retried_batch_is_answered_with_its_offsets_and_written_once(
    start_broker, connect
):
    client = await open_client(connect, await start_broker())
    init = await client.call(InitProducerId())
    assert init.error_code == ErrorCode.NONE and init.producer_epoch == 0
    pid = init.producer_id
    first = await answer_of(client, produce("t", 0, batch(pid, 0, 0, b"a", b"b")))
    again = await answer_of(client, produce("t", 0, batch(pid, 0, 0, b"a", b"b")))
    assert (first.base_offset, first.duplicate) == (0, False)
    assert (again.error_code, again.base_offset, again.duplicate) == (ErrorCode.NONE, 0, True)
    gap = await answer_of(client, produce("t", 0, batch(pid, 0, 5, b"x")))
    assert gap.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE
    unknown = await answer_of(client, produce("t", 0, batch(pid + 1, 0, 3, b"y")))
    assert unknown.error_code == ErrorCode.UNKNOWN_PRODUCER_ID
    nxt = await answer_of(client, produce("t", 0, batch(pid, 0, 2, b"c")))
    assert (nxt.error_code, nxt.base_offset) == (ErrorCode.NONE, 2)
    # The same producer is tracked per partition: partition 1 starts at sequence 0.
    other = await answer_of(client, produce("t", 1, batch(pid, 0, 0, b"p1")))
    assert other.error_code == ErrorCode.NONE
    assert await values(client, "t", 0, m.READ_UNCOMMITTED) == [b"a", b"b", b"c"]
    two = batch(pid, 0, 3, b"d") + batch(pid, 0, 4, b"e")
    refused = await answer_of(client, produce("t", 0, two))
    assert refused.error_code == ErrorCode.INVALID_REQUEST  # one idempotent batch at a time


async def test_producer_ids_are_unique_across_restarts_and_dedup_survives_a_crash(
    start_broker, connect, tmp_path
):
    directory = tmp_path / "data"
    running = await start_broker(data_dir=directory)
    client = await open_client(connect, running)
    pid = (await client.call(InitProducerId())).producer_id
    for seq in range(0, 30, 3):
        part = await answer_of(client, produce("t", 0, batch(pid, 0, seq, b"1", b"2", b"3")))
        assert part.error_code == ErrorCode.NONE
    running.broker.request_shutdown()  # graceful: snapshots at the log ends
    await running.broker.wait_stopped()

    again = await start_broker(data_dir=directory)
    client = await open_client(connect, again)
    pids = {pid}
    for seq in (27, 24):  # two of the last five batches: answered from the rebuilt state
        part = await answer_of(client, produce("t", 0, batch(pid, 0, seq, b"1", b"2", b"3")))
        assert (part.base_offset, part.duplicate) == (seq, True)
    part = await answer_of(client, produce("t", 0, batch(pid, 0, 30, b"4")))
    assert part.base_offset == 30
    pids.add((await client.call(InitProducerId())).producer_id)

    # A crash: cancel the broker without a graceful stop (no snapshot of the last append).
    crash = trio.CancelScope()
    config = BrokerConfig(data_dir=str(tmp_path / "crash"), listen=HostPort("127.0.0.1", 0),
                          http=None)

    async def run_crashing(task_status=trio.TASK_STATUS_IGNORED):
        with crash:
            await Broker(RealEnv(config.data_dir), config).serve(task_status=task_status)

    async with trio.open_nursery() as nursery:
        addresses = await nursery.start(run_crashing)
        client = await connect(addresses.listen.port)
        await client.call(m.CreateTopic("t", 1))
        crash_pid = (await client.call(InitProducerId())).producer_id
        for seq in range(5):
            part = await answer_of(client, produce("t", 0, batch(crash_pid, 0, seq, b"%d" % seq)))
            assert part.error_code == ErrorCode.NONE
        crash.cancel()
    recovered = Broker(RealEnv(config.data_dir), config)
    async with trio.open_nursery() as nursery:
        addresses = await nursery.start(recovered.serve)
        client = await connect(addresses.listen.port)
        part = await answer_of(client, produce("t", 0, batch(crash_pid, 0, 4, b"4")))
        assert (part.base_offset, part.duplicate) == (4, True)
        fresh = (await client.call(InitProducerId())).producer_id
        assert fresh > crash_pid  # ids are never handed out twice across a crash
        assert await values(client, "t", 0, m.READ_UNCOMMITTED) == [b"%d" % i for i in range(5)]
        recovered.request_shutdown()
    assert len(pids) == 2


async def test_open_transactions_are_invisible_to_read_committed_until_the_commit(
    start_broker, connect
):
    client = await open_client(connect, await start_broker())
    init = await client.call(InitProducerId("tx", 30_000))
    pid, epoch = init.producer_id, init.producer_epoch
    plain = (await client.call(InitProducerId())).producer_id
    await answer_of(client, produce("t", 0, batch(plain, 0, 0, b"before")))
    assert (await client.call(add("tx", pid, epoch, "t", 0, 1))).topics[0].partitions[0] \
        .error_code == ErrorCode.NONE
    for partition in (0, 1):
        part = await answer_of(client, produce("t", partition, batch(pid, epoch, 0, b"in-txn",
                                                                      txn=True), "tx"))
        assert part.error_code == ErrorCode.NONE
    await answer_of(client, produce("t", 0, batch(plain, 0, 1, b"after")))

    part = await answer_of(client, fetch("t", 0, m.READ_COMMITTED))
    assert (part.high_watermark, part.last_stable_offset) == (3, 1)
    assert await values(client, "t", 0, m.READ_COMMITTED) == [b"before"]
    assert await values(client, "t", 0, m.READ_UNCOMMITTED) == [b"before", b"in-txn", b"after"]
    latest = await client.call(m.ListOffsets(isolation_level=m.READ_COMMITTED, topics=(
        m.ListOffsetsTopic("t", (m.ListOffsetsPartition(0, -1),)),)))
    assert latest.topics[0].partitions[0].offset == 1

    assert (await client.call(EndTxn("tx", pid, epoch, True))).error_code == ErrorCode.NONE
    await wait_until_stable(client, "t", 0)
    assert await values(client, "t", 0, m.READ_COMMITTED) == [b"before", b"in-txn", b"after"]
    assert await values(client, "t", 1, m.READ_COMMITTED) == [b"in-txn"]
    # Control batches are never records, under either isolation level.
    assert await values(client, "t", 1, m.READ_UNCOMMITTED) == [b"in-txn"]
    raw = (await answer_of(client, fetch("t", 1, m.READ_UNCOMMITTED))).records
    assert len(decode_records(raw)) == 1 and raw.count(b"in-txn") == 1


async def test_aborted_transactions_are_listed_and_dropped_by_read_committed(
    start_broker, connect
):
    client = await open_client(connect, await start_broker())
    init = await client.call(InitProducerId("tx", 30_000))
    pid, epoch = init.producer_id, init.producer_epoch
    await client.call(add("tx", pid, epoch, "t", 0))
    await answer_of(client, produce("t", 0, batch(pid, epoch, 0, b"x1", txn=True), "tx"))
    await answer_of(client, produce("t", 0, batch(pid, epoch, 1, b"x2", txn=True), "tx"))
    assert (await client.call(EndTxn("tx", pid, epoch, False))).error_code == ErrorCode.NONE
    part = await wait_until_stable(client, "t", 0)
    assert [(a.producer_id, a.first_offset) for a in part.aborted_transactions] == [(pid, 0)]
    # The next transaction (sequences go on) commits; only it is visible.
    await client.call(add("tx", pid, epoch, "t", 0))
    with trio.fail_after(10):  # the abort's markers may still be completing
        while (await client.call(add("tx", pid, epoch, "t", 0))).topics[0].partitions[0] \
                .error_code != ErrorCode.NONE:
            await trio.sleep(0.01)
    await answer_of(client, produce("t", 0, batch(pid, epoch, 2, b"y", txn=True), "tx"))
    await client.call(EndTxn("tx", pid, epoch, True))
    await wait_until_stable(client, "t", 0)
    assert await values(client, "t", 0, m.READ_COMMITTED) == [b"y"]
    assert await values(client, "t", 0, m.READ_UNCOMMITTED) == [b"x1", b"x2", b"y"]


async def test_transactional_writes_need_the_partition_added_and_the_current_epoch(
    start_broker, connect
):
    client = await open_client(connect, await start_broker())
    init = await client.call(InitProducerId("tx", 30_000))
    pid, epoch = init.producer_id, init.producer_epoch
    not_added = await answer_of(client, produce("t", 0, batch(pid, epoch, 0, b"x", txn=True),
                                                "tx"))
    assert not_added.error_code == ErrorCode.INVALID_TXN_STATE
    no_id = await answer_of(client, produce("t", 0, batch(pid, epoch, 0, b"x", txn=True)))
    assert no_id.error_code == ErrorCode.INVALID_REQUEST
    marker = build_control_batch(ControlType.COMMIT, pid, epoch, 1_000)
    forged = await answer_of(client, produce("t", 0, marker, "tx"))
    assert forged.error_code == ErrorCode.INVALID_REQUEST  # clients never write markers
    assert await values(client, "t", 0, m.READ_UNCOMMITTED) == []

    await client.call(add("tx", pid, epoch, "t", 0))
    await answer_of(client, produce("t", 0, batch(pid, epoch, 0, b"zombie", txn=True), "tx"))
    # A new instance: the open transaction is aborted with the epoch bumped, then it may go.
    with trio.fail_after(10):
        while True:
            again = await client.call(InitProducerId("tx", 30_000))
            if again.error_code == ErrorCode.NONE:
                break
            assert again.error_code == ErrorCode.CONCURRENT_TRANSACTIONS
            await trio.sleep(0.01)
    assert again.producer_id == pid and again.producer_epoch > epoch + 1
    late = await answer_of(client, produce("t", 0, batch(pid, epoch, 1, b"late", txn=True), "tx"))
    assert late.error_code in (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_TXN_STATE)
    old_end = await client.call(EndTxn("tx", pid, epoch, True))
    assert old_end.error_code == ErrorCode.PRODUCER_FENCED
    offsets = await client.call(AddOffsetsToTxn("tx", pid, epoch, "g"))
    assert offsets.error_code == ErrorCode.PRODUCER_FENCED
    await wait_until_stable(client, "t", 0)
    assert await values(client, "t", 0, m.READ_COMMITTED) == []


async def test_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced(
    start_broker, connect
):
    client = await open_client(connect, await start_broker())
    init = await client.call(InitProducerId("slow", 300))
    pid, epoch = init.producer_id, init.producer_epoch
    await client.call(add("slow", pid, epoch, "t", 0))
    await answer_of(client, produce("t", 0, batch(pid, epoch, 0, b"late", txn=True), "slow"))
    part = await wait_until_stable(client, "t", 0)  # the coordinator's tick aborts it
    assert [a.producer_id for a in part.aborted_transactions] == [pid]
    assert (await client.call(EndTxn("slow", pid, epoch, True))).error_code \
        == ErrorCode.PRODUCER_FENCED
    assert await values(client, "t", 0, m.READ_COMMITTED) == []


@pytest.mark.parametrize("graceful", [True, False])
async def test_the_aborted_index_and_lso_survive_a_restart(
    start_broker, connect, tmp_path, graceful
):
    config = BrokerConfig(data_dir=str(tmp_path / "d"), listen=HostPort("127.0.0.1", 0),
                          http=None)
    scope = trio.CancelScope()

    async def run(broker, task_status=trio.TASK_STATUS_IGNORED):
        with scope:
            await broker.serve(task_status=task_status)

    first = Broker(RealEnv(config.data_dir), config)
    async with trio.open_nursery() as nursery:
        addresses = await nursery.start(run, first)
        client = await connect(addresses.listen.port)
        await client.call(m.CreateTopic("t", 1))
        a = await client.call(InitProducerId("a", 30_000))
        b = await client.call(InitProducerId("b", 30_000))
        await client.call(add("a", a.producer_id, 0, "t", 0))
        await client.call(add("b", b.producer_id, 0, "t", 0))
        await answer_of(client, produce("t", 0, batch(a.producer_id, 0, 0, b"a1", txn=True), "a"))
        await answer_of(client, produce("t", 0, batch(b.producer_id, 0, 0, b"b1", txn=True), "b"))
        await client.call(EndTxn("a", a.producer_id, 0, False))
        with trio.fail_after(10):  # the abort marker is written; b stays open
            while not (await answer_of(client, fetch("t", 0, 1))).aborted_transactions:
                await trio.sleep(0.01)
        if graceful:
            first.request_shutdown()
        else:
            scope.cancel()
    scope = trio.CancelScope()
    second = Broker(RealEnv(config.data_dir), config)
    async with trio.open_nursery() as nursery:
        addresses = await nursery.start(run, second)
        client = await connect(addresses.listen.port)
        part = await answer_of(client, fetch("t", 0, m.READ_COMMITTED))
        assert part.last_stable_offset == 1  # b's transaction is still open after the restart
        await client.call(EndTxn("b", b.producer_id, 0, True))
        part = await wait_until_stable(client, "t", 0)
        assert [a_.producer_id for a_ in part.aborted_transactions] == [a.producer_id]
        assert await values(client, "t", 0, m.READ_COMMITTED) == [b"b1"]
        second.request_shutdown()
