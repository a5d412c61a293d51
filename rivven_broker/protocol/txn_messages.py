"""Producer-id and transaction messages: InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn,
TxnOffsetCommit, EndTxn (api keys 40-44).

Theory of operation
-------------------
These are KIP-98's transactional apis in Rivven's msgpack form. A producer first calls
``InitProducerId``: without a ``transactional_id`` it gets a fresh producer id at epoch 0 (an
idempotent producer); with one it gets the id durably mapped to that ``transactional_id`` and a
bumped epoch, which fences every older instance (a "zombie") and aborts what it left open.
A transaction then registers each partition before writing to it (``AddPartitionsToTxn``) and
each consumer group whose offsets it commits (``AddOffsetsToTxn``, then ``TxnOffsetCommit``),
and ends with ``EndTxn(committed=...)``. ``docs/exactly-once.md`` says what each error asks the
application to do.

As everywhere in the protocol, construction validates structure only: widths, list lengths,
string sizes, epochs within [-1, 32767] (producer epochs are i16 in a record batch header).
Whether a timeout is allowed (INVALID_TRANSACTION_TIMEOUT), an id is known
(TRANSACTIONAL_ID_NOT_FOUND) or an epoch current (PRODUCER_FENCED) is the coordinator's answer.
A producer id or epoch of -1 means "none".
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.message_base import (
    ApiKey,
    Request,
    Response,
    Struct,
    boolean,
    error_code,
    i32,
    i64,
    ints,
    structs,
    text,
)

__all__ = [
    "NO_PRODUCER_ID",
    "NO_PRODUCER_EPOCH",
    "InitProducerId",
    "InitProducerIdResponse",
    "AddPartitionsToTxn",
    "AddPartitionsToTxnTopic",
    "AddPartitionsToTxnResponse",
    "AddPartitionsToTxnTopicResponse",
    "AddPartitionsToTxnPartitionResponse",
    "AddOffsetsToTxn",
    "AddOffsetsToTxnResponse",
    "TxnOffsetCommit",
    "TxnOffsetCommitTopic",
    "TxnOffsetCommitPartition",
    "TxnOffsetCommitResponse",
    "TxnOffsetCommitTopicResponse",
    "TxnOffsetCommitPartitionResponse",
    "EndTxn",
    "EndTxnResponse",
]

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1

_NAME = limits.wire_name_bytes_max
_MESSAGE = limits.error_message_bytes_max
_EPOCH_MAX = limits.producer_epoch_max


def _producer_id(default: object = attrs.NOTHING) -> object:
    return i64(default, lo=NO_PRODUCER_ID)


def _producer_epoch(default: object = attrs.NOTHING) -> object:
    return i32(default, lo=NO_PRODUCER_EPOCH, hi=_EPOCH_MAX)


# --- InitProducerId --------------------------------------------------------------------------


@attrs.frozen
class InitProducerId(Request):
    """Get a producer id and epoch. ``transactional_id`` None: a new idempotent producer.
    Otherwise the id mapped to it, with the epoch bumped (fencing older instances).
    ``producer_id``/``producer_epoch`` (-1: none) let a producer name the id it holds."""

    API_KEY: ClassVar[ApiKey] = ApiKey.INIT_PRODUCER_ID
    transactional_id: str | None = text(_NAME, None, nullable=True)
    transaction_timeout_ms: int = i32(limits.transaction_timeout_ms_default)
    producer_id: int = _producer_id(NO_PRODUCER_ID)
    producer_epoch: int = _producer_epoch(NO_PRODUCER_EPOCH)


@attrs.frozen
class InitProducerIdResponse(Response):
    """The producer id and epoch to stamp on every batch, or why not (-1, -1)."""

    API_KEY: ClassVar[ApiKey] = ApiKey.INIT_PRODUCER_ID
    error_code: ErrorCode = error_code()
    error_message: str | None = text(_MESSAGE, None, nullable=True)
    producer_id: int = _producer_id(NO_PRODUCER_ID)
    producer_epoch: int = _producer_epoch(NO_PRODUCER_EPOCH)


# --- AddPartitionsToTxn ----------------------------------------------------------------------


@attrs.frozen
class AddPartitionsToTxnTopic(Struct):
    """The partitions of one topic the transaction will write to."""

    name: str = text(_NAME)
    partitions: tuple[int, ...] = ints("i32")


@attrs.frozen
class AddPartitionsToTxn(Request):
    """Register partitions with the open transaction before writing to them (begins the
    transaction when none is open)."""

    API_KEY: ClassVar[ApiKey] = ApiKey.ADD_PARTITIONS_TO_TXN
    transactional_id: str = text(_NAME)
    producer_id: int = _producer_id()
    producer_epoch: int = _producer_epoch()
    topics: tuple[AddPartitionsToTxnTopic, ...] = structs(AddPartitionsToTxnTopic)


@attrs.frozen
class AddPartitionsToTxnPartitionResponse(Struct):
    """Whether one partition joined the transaction."""

    partition: int = i32()
    error_code: ErrorCode = error_code()


@attrs.frozen
class AddPartitionsToTxnTopicResponse(Struct):
    """Per-partition outcomes in one topic."""

    name: str = text(_NAME)
    partitions: tuple[AddPartitionsToTxnPartitionResponse, ...] = structs(
        AddPartitionsToTxnPartitionResponse
    )


@attrs.frozen
class AddPartitionsToTxnResponse(Response):
    """The answer to ``AddPartitionsToTxn``: every partition gets a code (all the same when
    the request as a whole was refused)."""

    API_KEY: ClassVar[ApiKey] = ApiKey.ADD_PARTITIONS_TO_TXN
    topics: tuple[AddPartitionsToTxnTopicResponse, ...] = structs(AddPartitionsToTxnTopicResponse)


# --- AddOffsetsToTxn -------------------------------------------------------------------------


@attrs.frozen
class AddOffsetsToTxn(Request):
    """Register a consumer group whose offsets the transaction will commit
    (``TxnOffsetCommit`` follows)."""

    API_KEY: ClassVar[ApiKey] = ApiKey.ADD_OFFSETS_TO_TXN
    transactional_id: str = text(_NAME)
    producer_id: int = _producer_id()
    producer_epoch: int = _producer_epoch()
    group_id: str = text(_NAME)


@attrs.frozen
class AddOffsetsToTxnResponse(Response):
    """The answer to ``AddOffsetsToTxn``."""

    API_KEY: ClassVar[ApiKey] = ApiKey.ADD_OFFSETS_TO_TXN
    error_code: ErrorCode = error_code()
    error_message: str | None = text(_MESSAGE, None, nullable=True)


# --- TxnOffsetCommit -------------------------------------------------------------------------


@attrs.frozen
class TxnOffsetCommitPartition(Struct):
    """The next offset to consume in one partition, committed if the transaction commits."""

    partition: int = i32()
    offset: int = i64(lo=0)
    metadata: str | None = text(limits.offset_metadata_bytes_max, None, nullable=True)


@attrs.frozen
class TxnOffsetCommitTopic(Struct):
    """The partitions committed in one topic."""

    name: str = text(_NAME)
    partitions: tuple[TxnOffsetCommitPartition, ...] = structs(TxnOffsetCommitPartition)


@attrs.frozen
class TxnOffsetCommit(Request):
    """Consumed offsets of ``group_id`` that become visible only if the transaction commits.
    ``generation_id`` -1 and ``member_id`` "": no group membership check. ``group_instance_id``
    (v1): the committing consumer's static instance id, so a replaced static member is
    fenced (KIP-447)."""

    API_KEY: ClassVar[ApiKey] = ApiKey.TXN_OFFSET_COMMIT
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)
    transactional_id: str = text(_NAME)
    group_id: str = text(_NAME)
    producer_id: int = _producer_id()
    producer_epoch: int = _producer_epoch()
    generation_id: int = i32(-1)
    member_id: str = text(_NAME, "")
    topics: tuple[TxnOffsetCommitTopic, ...] = structs(TxnOffsetCommitTopic)
    group_instance_id: str | None = text(_NAME, None, nullable=True, since=1)


@attrs.frozen
class TxnOffsetCommitPartitionResponse(Struct):
    """Whether one partition's offset was recorded in the transaction."""

    partition: int = i32()
    error_code: ErrorCode = error_code()


@attrs.frozen
class TxnOffsetCommitTopicResponse(Struct):
    """Per-partition outcomes in one topic."""

    name: str = text(_NAME)
    partitions: tuple[TxnOffsetCommitPartitionResponse, ...] = structs(
        TxnOffsetCommitPartitionResponse
    )


@attrs.frozen
class TxnOffsetCommitResponse(Response):
    """The answer to ``TxnOffsetCommit``."""

    API_KEY: ClassVar[ApiKey] = ApiKey.TXN_OFFSET_COMMIT
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)  # v1 answers v1 requests; same fields
    topics: tuple[TxnOffsetCommitTopicResponse, ...] = structs(TxnOffsetCommitTopicResponse)


# --- EndTxn ----------------------------------------------------------------------------------


@attrs.frozen
class EndTxn(Request):
    """Commit (``committed`` true) or abort the open transaction. Answered once the decision
    is durable; the markers are written to every partition afterwards."""

    API_KEY: ClassVar[ApiKey] = ApiKey.END_TXN
    transactional_id: str = text(_NAME)
    producer_id: int = _producer_id()
    producer_epoch: int = _producer_epoch()
    committed: bool = boolean()


@attrs.frozen
class EndTxnResponse(Response):
    """The answer to ``EndTxn``."""

    API_KEY: ClassVar[ApiKey] = ApiKey.END_TXN
    error_code: ErrorCode = error_code()
    error_message: str | None = text(_MESSAGE, None, nullable=True)
