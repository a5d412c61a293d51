"""The producer's exactly-once core: producer ids, sequences, retries in order, transactions.

Method: a ``TransactionManager`` alone (time is a number, answers are real response
messages), and a ``ProducerCore`` with it over a metadata cache, as in
test_producer_core.py. Each test drives the calls a sender would make and checks the stamps,
the coordinator requests asked for, and the errors the user would see. No I/O.
"""

from __future__ import annotations

import random

import pytest

from rivven_broker.client.accumulator import ProducerBatch, stamp_producer
from rivven_broker.client.config import ConnectionConfig, ProducerConfig
from rivven_broker.client.errors import (
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    TransactionAbortedError,
)
from rivven_broker.client.metadata import MetadataCache, parse_bootstrap
from rivven_broker.client.producer_core import ProducerCore
from rivven_broker.client.transaction_manager import TransactionManager, TxnPhase
from rivven_broker.client.types import TopicPartition
from rivven_broker.protocol import messages as m
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.txn_messages import (
    AddOffsetsToTxn,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxn,
    AddPartitionsToTxnPartitionResponse,
    AddPartitionsToTxnResponse,
    AddPartitionsToTxnTopicResponse,
    EndTxn,
    EndTxnResponse,
    InitProducerId,
    InitProducerIdResponse,
    TxnOffsetCommit,
    TxnOffsetCommitResponse,
)
from rivven_broker.records import BatchBuilder, decode_records
from rivven_broker.records.header import parse_header, validate

COORDINATOR = ("coordinator-host", 9092)


def batch_of(n: int, partition: int = 0) -> ProducerBatch:
    builder = BatchBuilder(batch_bytes_max=4096)
    batch = ProducerBatch("t", partition, builder, 1, 0, 10**9)
    for i in range(n):
        builder.append(1000 + i, None, b"v%d" % i)
        batch.tokens.append(i)
        batch.timestamps.append(1000 + i)
    return batch


def init(txn: TransactionManager, pid: int = 7, epoch: int = 0, now: int = 0) -> None:
    call = txn.next_call(now)
    assert isinstance(call.request, InitProducerId)
    txn.on_call_done(call.call_id, InitProducerIdResponse(producer_id=pid, producer_epoch=epoch),
                     None, now)


def added(request: AddPartitionsToTxn, code: ErrorCode = ErrorCode.NONE):
    return AddPartitionsToTxnResponse(topics=tuple(
        AddPartitionsToTxnTopicResponse(t.name, tuple(
            AddPartitionsToTxnPartitionResponse(p, code) for p in t.partitions))
        for t in request.topics))


def test_an_idempotent_producer_waits_for_its_id_then_numbers_batches_per_partition():
    txn = TransactionManager(transactional_id=None)
    assert not txn.can_drain(("t", 0))
    init(txn, pid=42)
    assert txn.can_drain(("t", 0)) and txn.next_call(0) is None
    a, b, c = batch_of(3), batch_of(2), batch_of(5, partition=1)
    for batch in (a, b, c):
        txn.assign(batch)
    assert [(x.producer_id, x.producer_epoch, x.base_sequence) for x in (a, b, c)] == [
        (42, 0, 0), (42, 0, 3), (42, 0, 0)]
    txn.returned(a)
    txn.assign(a)  # a retry keeps its stamp
    assert a.base_sequence == 0 and txn.in_flight_batches == 3
    assert txn.is_oldest(a) and not txn.is_oldest(b)
    txn.acknowledged(a)
    assert txn.is_oldest(b)
    txn.check_invariants()


def test_seal_stamps_the_header_and_keeps_the_batch_valid():
    batch = batch_of(4)
    batch.producer_id, batch.producer_epoch, batch.base_sequence = 9, 2, 100
    batch.transactional = True
    data = batch.seal()
    header = validate(data)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (9, 2, 100)
    assert header.is_transactional and len(decode_records(data)) == 4
    assert batch.seal() is data  # sealed once: a retry resends the same bytes
    batch.base_sequence = 0  # re-stamped after a producer id reset
    assert parse_header(batch.seal()).base_sequence == 0
    plain = stamp_producer(data, 1, 0, 5, False)
    assert not validate(plain).is_transactional


def make_core(**overrides) -> ProducerCore:
    config = ProducerConfig(**{"linger_ms": 0, **overrides})
    connection = ConnectionConfig(retry_backoff_ms=10, retry_backoff_max_ms=10)
    cache = MetadataCache(parse_bootstrap("h:1"), refresh_backoff_ms=0)
    cache.add_topics(["t"])
    cache.on_update(m.MetadataResponse(
        brokers=(m.BrokerMetadata(node_id=1, host="h", port=1),),
        topics=(m.TopicMetadata(name="t", partitions=(
            m.PartitionMetadata(partition=0, leader=1, leader_epoch=0),)),)), 0)
    return ProducerCore(config, connection, cache, random.Random(3))


def produce_answer(code=ErrorCode.NONE, base=0, duplicate=False):
    return m.ProduceResponse(topics=(m.ProduceTopicResponse(name="t", partitions=(
        m.ProducePartitionResponse(partition=0, error_code=code, base_offset=base,
                                   duplicate=duplicate),)),))


def send_batch(core: ProducerCore, now: int, n: int = 2):
    for i in range(n):
        core.accumulator.append("t", 0, 1000, None, b"x", (), i, now, 1)
    core.accumulator.flushes_in_progress = 1
    step = core.step(now, lambda node: True)
    core.accumulator.flushes_in_progress = 0
    [plan] = step.plans
    for batch in plan.batches:
        batch.seal()
    return plan


def test_the_core_retries_out_of_order_answers_behind_a_retried_batch_in_order():
    core = make_core()
    init(core.txn)
    first = send_batch(core, 0)
    second = send_batch(core, 0)
    assert [p.batches[0].base_sequence for p in (first, second)] == [0, 2]
    assert core.on_response(first, produce_answer(ErrorCode.NOT_LEADER), 1) == []
    # The second landed behind the missing first: retried too, not failed.
    assert core.on_response(second, produce_answer(ErrorCode.OUT_OF_ORDER_SEQUENCE), 1) == []
    retry = core.step(1_000, lambda node: True).plans[0]
    assert retry.batches[0] is first.batches[0] and retry.batches[0].base_sequence == 0
    [done] = core.on_response(retry, produce_answer(base=10, duplicate=True), 1_001)
    assert done.error is None and done.base_offset == 10
    again = core.step(2_000, lambda node: True).plans[0]
    assert again.batches[0].base_sequence == 2
    [old] = core.on_response(again, produce_answer(ErrorCode.DUPLICATE_SEQUENCE), 2_001)
    assert old.error is None and old.base_offset == -1


def test_a_sequence_gap_makes_an_idempotent_producer_take_a_new_id():
    core = make_core()
    init(core.txn, pid=5)
    plan = send_batch(core, 0)
    [failed] = core.on_response(plan, produce_answer(ErrorCode.OUT_OF_ORDER_SEQUENCE), 1)
    assert isinstance(failed.error, OutOfOrderSequenceError)
    core.accumulator.append("t", 0, 1000, None, b"y", (), 9, 2, 1)
    assert core.step(3, lambda node: True).plans == []  # held until the new id
    call = core.next_coordinator_call(3)
    assert isinstance(call.request, InitProducerId)
    core.on_coordinator_answer(call, InitProducerIdResponse(producer_id=6, producer_epoch=0),
                               None, 4)
    core.accumulator.flushes_in_progress = 1
    [plan] = core.step(5, lambda node: True).plans
    assert (plan.batches[0].producer_id, plan.batches[0].base_sequence) == (6, 0)


def test_a_transaction_adds_partitions_offsets_and_commits():
    txn = TransactionManager(transactional_id="app", transaction_timeout_ms=5_000)
    txn.coordinator = COORDINATOR  # found (test_a_transactional_producer_finds_its_coordinator)
    assert txn.next_call(0) is None  # a transactional producer waits for init_transactions
    with pytest.raises(InvalidTxnStateError):
        txn.check_send()
    result = txn.init_transactions()
    init(txn, pid=3, epoch=1)
    assert result.done and result.error is None and txn.phase == TxnPhase.READY
    txn.begin_transaction()
    txn.check_send()
    assert not txn.can_drain(("t", 0))  # not added yet: asks for it
    call = txn.next_call(0)
    assert isinstance(call.request, AddPartitionsToTxn)
    assert call.request.producer_epoch == 1
    txn.on_call_done(call.call_id, added(call.request), None, 1)
    assert txn.can_drain(("t", 0))
    batch = batch_of(2)
    txn.assign(batch)
    assert batch.transactional and batch.base_sequence == 0
    txn.returned(batch)
    txn.acknowledged(batch)
    offsets = txn.send_offsets({TopicPartition("in", 0): 17}, "group")
    call = txn.next_call(2)
    assert isinstance(call.request, AddOffsetsToTxn)
    txn.on_call_done(call.call_id, AddOffsetsToTxnResponse(), None, 3)
    call = txn.next_call(3)
    assert isinstance(call.request, TxnOffsetCommit)
    assert call.request.topics[0].partitions[0].offset == 17
    txn.on_call_done(call.call_id, TxnOffsetCommitResponse(), None, 4)
    assert offsets.done and offsets.error is None
    commit = txn.begin_commit()
    call = txn.next_call(5)
    assert isinstance(call.request, EndTxn) and call.request.committed
    txn.on_call_done(call.call_id, EndTxnResponse(ErrorCode.CONCURRENT_TRANSACTIONS), None, 6)
    assert txn.next_call(7) is None  # retried after a short backoff (2 ms)
    call = txn.next_call(8)
    assert isinstance(call.request, EndTxn)
    txn.on_call_done(call.call_id, EndTxnResponse(ErrorCode.CONCURRENT_TRANSACTIONS), None, 8)
    assert txn.next_call(11) is None  # doubled: 4 ms
    call = txn.next_call(12)
    txn.on_call_done(call.call_id, EndTxnResponse(ErrorCode.CONCURRENT_TRANSACTIONS), None, 12)
    assert txn.next_call(19) is None  # 8 ms
    call = txn.next_call(20)
    txn.on_call_done(call.call_id, EndTxnResponse(), None, 31)
    assert commit.done and commit.error is None and txn.phase == TxnPhase.READY
    txn.check_invariants()


def test_an_abort_bumps_the_epoch_so_sequences_restart():
    txn = TransactionManager(transactional_id="app")
    txn.coordinator = COORDINATOR  # found (test_a_transactional_producer_finds_its_coordinator)
    txn.init_transactions()
    init(txn, pid=3, epoch=1)
    txn.begin_transaction()
    txn.can_drain(("t", 0))
    call = txn.next_call(0)
    txn.on_call_done(call.call_id, added(call.request), None, 0)
    batch = batch_of(4)
    txn.assign(batch)
    txn.returned(batch)
    txn.failed(batch, TransactionAbortedError("aborted"))
    assert txn.phase == TxnPhase.ABORTABLE_ERROR
    with pytest.raises(TransactionAbortedError):
        txn.begin_commit()
    result = txn.begin_abort()
    call = txn.next_call(1)
    assert isinstance(call.request, EndTxn) and not call.request.committed
    txn.on_call_done(call.call_id, EndTxnResponse(), None, 2)
    call = txn.next_call(2)
    assert isinstance(call.request, InitProducerId)
    assert (call.request.producer_id, call.request.producer_epoch) == (3, 1)
    txn.on_call_done(call.call_id, InitProducerIdResponse(producer_id=3, producer_epoch=2),
                     None, 3)
    assert result.done and txn.phase == TxnPhase.READY
    txn.begin_transaction()
    txn.can_drain(("t", 0))
    call = txn.next_call(4)
    txn.on_call_done(call.call_id, added(call.request), None, 4)
    fresh = batch_of(1)
    txn.assign(fresh)
    assert (fresh.producer_epoch, fresh.base_sequence) == (2, 0)


def test_fencing_is_fatal_for_the_producer():
    txn = TransactionManager(transactional_id="app")
    txn.coordinator = COORDINATOR  # found (test_a_transactional_producer_finds_its_coordinator)
    txn.init_transactions()
    init(txn)
    txn.begin_transaction()
    txn.can_drain(("t", 0))
    call = txn.next_call(0)
    fenced = AddPartitionsToTxnResponse(topics=(AddPartitionsToTxnTopicResponse("t", (
        AddPartitionsToTxnPartitionResponse(0, ErrorCode.PRODUCER_FENCED),)),))
    txn.on_call_done(call.call_id, fenced, None, 1)
    assert isinstance(txn.fatal_error, ProducerFencedError)
    for operation in (txn.check_send, txn.begin_commit, txn.begin_abort, txn.begin_transaction):
        with pytest.raises(ProducerFencedError):
            operation()
    assert txn.next_call(100) is None


def test_an_empty_transaction_ends_without_the_coordinator():
    txn = TransactionManager(transactional_id="app")
    txn.coordinator = COORDINATOR  # found (test_a_transactional_producer_finds_its_coordinator)
    txn.init_transactions()
    init(txn)
    txn.begin_transaction()
    result = txn.begin_commit()
    assert result.done and txn.next_call(0) is None and txn.phase == TxnPhase.READY
    txn.begin_transaction()
    assert txn.begin_abort().done


def test_a_broker_without_init_producer_id_turns_default_idempotence_off():
    txn = TransactionManager(transactional_id=None, fallback_allowed=True)
    call = txn.next_call(0)
    txn.on_call_done(call.call_id, m.ErrorResponse(ErrorCode.UNSUPPORTED_VERSION, "old"), None,
                     0)
    assert txn.disabled and txn.can_drain(("t", 0))
    batch = batch_of(1)
    txn.assign(batch)
    assert batch.base_sequence == -1  # not stamped
    strict = TransactionManager(transactional_id=None)
    call = strict.next_call(0)
    strict.on_call_done(call.call_id, m.ErrorResponse(ErrorCode.UNSUPPORTED_VERSION, "old"),
                        None, 0)
    assert not strict.disabled and not strict.can_drain(("t", 0))


def test_a_transactional_producer_finds_its_coordinator_and_finds_it_again():
    """FindCoordinator (key type 1, to any broker) before the first coordinator request; the
    requests then go to that address; a retriable failure (it moved) asks again."""
    from rivven_broker.client.errors import error_for
    from rivven_broker.protocol.group_messages import FindCoordinator, FindCoordinatorResponse

    txn = TransactionManager(transactional_id="app")
    txn.init_transactions()
    find = txn.next_call(0)
    assert find.request == FindCoordinator("app", 1) and find.address is None
    txn.on_call_done(find.call_id, FindCoordinatorResponse(ErrorCode.COORDINATOR_NOT_AVAILABLE),
                     None, 0)
    assert txn.next_call(0) is None  # a backoff first
    find = txn.next_call(txn.retry_at_ms)
    txn.on_call_done(find.call_id, FindCoordinatorResponse(ErrorCode.NONE, 2, "b2", 9002),
                     None, txn.retry_at_ms)
    call = txn.next_call(txn.retry_at_ms)
    assert isinstance(call.request, InitProducerId) and call.address == ("b2", 9002)
    moved = error_for(ErrorCode.NOT_COORDINATOR, "moved")
    txn.on_call_done(call.call_id, None, moved, 0)
    again = txn.next_call(txn.retry_at_ms)
    assert isinstance(again.request, FindCoordinator)
    txn.on_call_done(again.call_id, FindCoordinatorResponse(ErrorCode.NONE, 3, "b3", 9003),
                     None, txn.retry_at_ms)
    call = txn.next_call(txn.retry_at_ms)
    assert isinstance(call.request, InitProducerId) and call.address == ("b3", 9003)


def test_an_idempotent_producer_asks_any_broker():
    txn = TransactionManager(transactional_id=None)
    call = txn.next_call(0)
    assert isinstance(call.request, InitProducerId) and call.address is None
