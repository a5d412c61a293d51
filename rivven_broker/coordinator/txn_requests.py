"""What AddPartitionsToTxn, AddOffsetsToTxn and TxnOffsetCommit make of a transaction, and
how any transaction request is refused.

Theory of operation
-------------------
Helpers of ``transaction_coordinator``: each takes the current durable ``TxnMetadata`` (already
found, with a matching producer id and epoch, no append or markers outstanding) and returns
``(target, code)``. ``code`` NONE and ``target`` different from the input: the coordinator
appends ``target`` and answers once it is durable; ``target`` equal to the input: nothing to
persist, answer at once. The first partition or group added to a closed (Empty/Complete*)
transactional id begins a transaction (state Ongoing, start time ``now_ms``).

``error_response`` builds the response of any of the five requests carrying one code (for
per-partition responses, every partition gets it).

Pure: no I/O, no clocks.
"""

from __future__ import annotations

from typing import Union

import attrs

from rivven_broker.coordinator.txn_log_codec import PendingOffset, TxnMetadata, TxnState
from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.fast_txn_codec import add_partitions_response_of
from rivven_broker.protocol.message_base import Response
from rivven_broker.protocol.txn_messages import (
    AddOffsetsToTxn,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxn,
    EndTxn,
    EndTxnResponse,
    InitProducerId,
    InitProducerIdResponse,
    TxnOffsetCommit,
    TxnOffsetCommitPartitionResponse,
    TxnOffsetCommitResponse,
    TxnOffsetCommitTopicResponse,
)

__all__ = ["error_response", "add_partitions", "add_group", "commit_offsets"]

_AnyRequest = Union[InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn]


def error_response(request: _AnyRequest, code: ErrorCode) -> Response:
    """The response to ``request`` carrying ``code`` (for every partition it names)."""
    if isinstance(request, AddPartitionsToTxn):  # per partition: built without validators
        return add_partitions_response_of(request, code)
    if isinstance(request, TxnOffsetCommit):
        return TxnOffsetCommitResponse(
            topics=tuple(
                TxnOffsetCommitTopicResponse(
                    topic.name,
                    tuple(
                        TxnOffsetCommitPartitionResponse(p.partition, code)
                        for p in topic.partitions
                    ),
                )
                for topic in request.topics
            )
        )
    message = None if code == ErrorCode.NONE else code.description
    if isinstance(request, AddOffsetsToTxn):
        return AddOffsetsToTxnResponse(error_code=code, error_message=message)
    if isinstance(request, EndTxn):
        return EndTxnResponse(error_code=code, error_message=message)
    assert isinstance(request, InitProducerId), request
    return InitProducerIdResponse(error_code=code, error_message=message)


def _begin(meta: TxnMetadata, now_ms: int) -> TxnMetadata:
    """``meta`` as an Ongoing transaction (begun now if it was closed)."""
    if meta.state == TxnState.ONGOING:
        return attrs.evolve(meta, update_ms=now_ms)
    assert meta.state in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
    return attrs.evolve(meta, state=TxnState.ONGOING, start_ms=now_ms, update_ms=now_ms)


def add_partitions(
    meta: TxnMetadata, request: AddPartitionsToTxn, now_ms: int
) -> tuple[TxnMetadata, ErrorCode]:
    """Add the request's partitions (UNKNOWN_TOPIC_OR_PARTITION for a negative partition,
    POLICY_VIOLATION past ``partitions_per_transaction_max``)."""
    requested = {(topic.name, p) for topic in request.topics for p in topic.partitions}
    if any(p < 0 for _, p in requested):
        return meta, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if not requested or (meta.state == TxnState.ONGOING and requested <= meta.partitions):
        return meta, ErrorCode.NONE
    partitions = meta.partitions | requested
    if len(partitions) > limits.partitions_per_transaction_max:
        return meta, ErrorCode.POLICY_VIOLATION
    return attrs.evolve(_begin(meta, now_ms), partitions=partitions), ErrorCode.NONE


def add_group(meta: TxnMetadata, group_id: str, now_ms: int) -> tuple[TxnMetadata, ErrorCode]:
    """Add a consumer group whose offsets the transaction will commit."""
    if meta.state == TxnState.ONGOING and group_id in meta.groups:
        return meta, ErrorCode.NONE
    return attrs.evolve(_begin(meta, now_ms), groups=meta.groups | {group_id}), ErrorCode.NONE


def commit_offsets(
    meta: TxnMetadata, request: TxnOffsetCommit, now_ms: int
) -> tuple[TxnMetadata, ErrorCode]:
    """Record the request's offsets in the transaction. INVALID_TXN_STATE unless it is
    Ongoing and the group was added (AddOffsetsToTxn); POLICY_VIOLATION past the bound."""
    if meta.state != TxnState.ONGOING or request.group_id not in meta.groups:
        return meta, ErrorCode.INVALID_TXN_STATE
    offsets = {(o.group_id, o.topic, o.partition): o for o in meta.offsets}
    for topic in request.topics:
        for part in topic.partitions:
            key = (request.group_id, topic.name, part.partition)
            offsets[key] = PendingOffset(*key, part.offset, part.metadata)
    if len(offsets) > limits.partitions_per_transaction_max:
        return meta, ErrorCode.POLICY_VIOLATION
    merged = tuple(offsets[key] for key in sorted(offsets))
    if merged == meta.offsets:
        return meta, ErrorCode.NONE
    return attrs.evolve(meta, offsets=merged, update_ms=now_ms), ErrorCode.NONE
