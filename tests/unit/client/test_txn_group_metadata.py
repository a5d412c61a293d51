"""``send_offsets_to_transaction`` with a consumer's group metadata (KIP-447), client side.

Method: a ``TransactionManager`` alone (time is a number, answers are real response
messages): check that the TxnOffsetCommit carries the generation and member id of a
``ConsumerGroupMetadata`` (and -1 / "" for a plain group id), that a membership refusal
becomes a ``CommitFailedError`` leaving the transaction abortable (not fatal) and that the
abort then works; plus ``error_for``'s mapping of the three membership codes.
"""

from __future__ import annotations

import pytest

from rivven_broker.client import CommitFailedError, ConsumerGroupMetadata, error_for
from rivven_broker.client.transaction_manager import TransactionManager, TxnPhase
from rivven_broker.client.types import TopicPartition
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.txn_messages import (
    AddOffsetsToTxn,
    AddOffsetsToTxnResponse,
    EndTxn,
    EndTxnResponse,
    InitProducerId,
    InitProducerIdResponse,
    TxnOffsetCommit,
    TxnOffsetCommitPartitionResponse,
    TxnOffsetCommitResponse,
    TxnOffsetCommitTopicResponse,
)

MEMBERSHIP = (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION,
              ErrorCode.FENCED_INSTANCE_ID)

COORDINATOR = ("coordinator-host", 9092)


def _open(pid: int = 3, epoch: int = 1) -> TransactionManager:
    txn = TransactionManager(transactional_id="app")
    txn.coordinator = COORDINATOR  # found (test_a_transactional_producer_finds_its_coordinator)
    txn.init_transactions()
    call = txn.next_call(0)
    assert isinstance(call.request, InitProducerId)
    txn.on_call_done(call.call_id, InitProducerIdResponse(producer_id=pid, producer_epoch=epoch),
                     None, 0)
    txn.begin_transaction()
    return txn


def _offset_commit(txn: TransactionManager, group) -> tuple[object, TxnOffsetCommit, int]:
    result = txn.send_offsets({TopicPartition("in", 0): 17, TopicPartition("in", 1): 4}, group)
    call = txn.next_call(1)
    assert isinstance(call.request, AddOffsetsToTxn) and call.request.group_id == "g"
    txn.on_call_done(call.call_id, AddOffsetsToTxnResponse(), None, 1)
    call = txn.next_call(2)
    assert isinstance(call.request, TxnOffsetCommit)
    return result, call.request, call.call_id


def _refused(request: TxnOffsetCommit, code: ErrorCode) -> TxnOffsetCommitResponse:
    return TxnOffsetCommitResponse(topics=tuple(
        TxnOffsetCommitTopicResponse(t.name, tuple(
            TxnOffsetCommitPartitionResponse(p.partition, code) for p in t.partitions))
        for t in request.topics))


def test_group_metadata_travels_in_the_txn_offset_commit():
    txn = _open()
    meta = ConsumerGroupMetadata("g", 5, "member-1", None)
    result, request, call_id = _offset_commit(txn, meta)
    assert (request.group_id, request.generation_id, request.member_id) == ("g", 5, "member-1")
    txn.on_call_done(call_id, TxnOffsetCommitResponse(), None, 3)
    assert result.done and result.error is None and txn.phase == TxnPhase.IN_TRANSACTION


def test_a_plain_group_id_asks_for_no_membership_check():
    txn = _open()
    _, request, _ = _offset_commit(txn, "g")
    assert (request.generation_id, request.member_id) == (-1, "")


def test_something_else_is_a_type_error():
    txn = _open()
    with pytest.raises(TypeError):
        txn.send_offsets({TopicPartition("in", 0): 1}, 42)
    with pytest.raises(TypeError):
        txn.send_offsets({TopicPartition("in", 0): 1}, ConsumerGroupMetadata("g", "5", "m"))
    assert txn.next_call(0) is None  # nothing was queued


@pytest.mark.parametrize("code", MEMBERSHIP)
def test_a_membership_refusal_is_abortable_not_fatal(code):
    txn = _open()
    result, request, call_id = _offset_commit(txn, ConsumerGroupMetadata("g", 5, "m"))
    txn.on_call_done(call_id, _refused(request, code), None, 3)
    assert result.done and isinstance(result.error, CommitFailedError)
    assert result.error.error_code == code and not result.error.retriable
    assert txn.phase == TxnPhase.ABORTABLE_ERROR and txn.fatal_error is None
    with pytest.raises(CommitFailedError):
        txn.begin_commit()
    aborted = txn.begin_abort()
    call = txn.next_call(4)
    assert isinstance(call.request, EndTxn) and not call.request.committed
    txn.on_call_done(call.call_id, EndTxnResponse(), None, 4)
    call = txn.next_call(5)  # the epoch bump after every abort
    assert isinstance(call.request, InitProducerId)
    txn.on_call_done(call.call_id, InitProducerIdResponse(producer_id=3, producer_epoch=2),
                     None, 5)
    assert aborted.done and aborted.error is None and txn.phase == TxnPhase.READY
    txn.check_invariants()


@pytest.mark.parametrize("code", MEMBERSHIP)
def test_error_for_maps_membership_codes_to_commit_failed(code):
    error = error_for(code)
    assert isinstance(error, CommitFailedError) and error.code == code.name
