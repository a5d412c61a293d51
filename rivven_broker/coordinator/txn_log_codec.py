"""The durable model of the transaction coordinator and its records in ``__transaction_state``.

Theory of operation
-------------------
The transaction coordinator keeps nothing that is not in its log. Each change of a
transactional id's metadata is one record of the internal compacted topic
``__transaction_state``, keyed by the transactional id, so replaying the topic in order and
keeping the last record per key rebuilds every transaction (``TransactionCoordinator.load``).
A second kind of record reserves blocks of producer ids, so ids stay unique across restarts
without a per-id write: the coordinator hands out ids only below the last durable block end,
and after a restart starts at that end.

Records are msgpack, with a version in every value::

    key   = [0, transactional_id]                        transaction metadata
            [1, ""]                                      producer-id block (one key)
    value = {"v": 0, "producer_id", "producer_epoch", "state", "timeout_ms", "start_ms",
             "update_ms", "partitions": [[topic, partition], ...],
             "groups": [group_id, ...],
             "offsets": [[group_id, topic, partition, offset, metadata|nil], ...]}
            {"v": 0, "block_end": N}                     ids < N are reserved
            nil                                          tombstone: the id expired (Dead)

``state`` is a ``TxnState`` number; ``start_ms`` is when the open transaction began (-1: none),
in wall-clock ms so timeouts survive restarts. ``partitions``, ``groups`` and ``offsets`` are
sorted, so equal metadata always encodes to equal bytes.

Pure: no I/O. Malformed records raise ``CorruptTxnRecordError``.
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

import attrs
import msgpack

from rivven_broker.protocol import limits
from rivven_broker.records.murmur2 import murmur2

__all__ = [
    "TRANSACTION_STATE_TOPIC",
    "TxnState",
    "PendingOffset",
    "TxnMetadata",
    "ProducerIdBlock",
    "TxnTombstone",
    "CorruptTxnRecordError",
    "encode_txn_key",
    "encode_txn_metadata",
    "encode_txn_tombstone",
    "encode_producer_id_block",
    "decode_txn_record",
    "transaction_partition_for",
]

#: The internal compacted topic holding the coordinator's records. One partition: producer-id
#: blocks must be allocated from one sequence (in a cluster, the controller will own them).
TRANSACTION_STATE_TOPIC = "__transaction_state"
_KIND_TXN = 0
_KIND_BLOCK = 1
_VERSION = 0


class TxnState(enum.IntEnum):
    """Where a transactional id's current transaction stands (numbers are persisted)."""

    EMPTY = 0  # no transaction open
    ONGOING = 1  # partitions or offsets added; writes may flow
    PREPARE_COMMIT = 2  # the commit decision is durable; markers are being written
    PREPARE_ABORT = 3  # the abort decision is durable; markers are being written
    COMPLETE_COMMIT = 4  # markers written; ready for the next transaction
    COMPLETE_ABORT = 5
    DEAD = 6  # expired: its tombstone is being written


class PendingOffset(NamedTuple):
    """A consumer offset committed inside a transaction (visible only if it commits)."""

    group_id: str
    topic: str
    partition: int
    offset: int
    metadata: str | None


def _frozen_partitions(value: Any) -> frozenset[tuple[str, int]]:
    return frozenset(value)


@attrs.frozen
class TxnMetadata:
    """The durable state of one transactional id."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: TxnState
    timeout_ms: int
    start_ms: int = -1
    update_ms: int = -1
    partitions: frozenset[tuple[str, int]] = attrs.field(
        default=frozenset(), converter=_frozen_partitions
    )
    groups: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)
    offsets: tuple[PendingOffset, ...] = ()

    def problem(self) -> str | None:
        """What makes this metadata inconsistent, or None."""
        if not 0 <= self.producer_id or not 0 <= self.producer_epoch <= limits.producer_epoch_max:
            return f"{self.transactional_id}: bad producer id or epoch"
        if not 1 <= self.timeout_ms <= limits.transaction_timeout_ms_max:
            return f"{self.transactional_id}: timeout {self.timeout_ms} out of range"
        open_ = self.state in (TxnState.ONGOING, TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)
        if open_ != (self.start_ms >= 0):
            return f"{self.transactional_id}: start time does not match state {self.state.name}"
        if open_ and not (self.partitions or self.groups):
            return f"{self.transactional_id}: open transaction holds nothing"
        if not open_ and (self.partitions or self.groups or self.offsets):
            return f"{self.transactional_id}: closed transaction still holds partitions"
        if any(o.group_id not in self.groups for o in self.offsets):
            return f"{self.transactional_id}: an offset of a group not added"
        keys = [(o.group_id, o.topic, o.partition) for o in self.offsets]
        if keys != sorted(set(keys)):
            return f"{self.transactional_id}: offsets not sorted or repeated"
        if max(len(self.partitions), len(self.offsets)) > limits.partitions_per_transaction_max:
            return f"{self.transactional_id}: too many partitions"
        return None


class ProducerIdBlock(NamedTuple):
    """Producer ids below ``block_end`` are reserved."""

    block_end: int


class TxnTombstone(NamedTuple):
    """The transactional id expired and is forgotten."""

    transactional_id: str


class CorruptTxnRecordError(Exception):
    """A ``__transaction_state`` record cannot be decoded; the coordinator must not load."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"__transaction_state record: {reason}")
        self.reason = reason


def encode_txn_key(transactional_id: str) -> bytes:
    """The record key of a transactional id. Pure."""
    return msgpack.packb([_KIND_TXN, transactional_id])


def encode_txn_metadata(metadata: TxnMetadata) -> tuple[bytes, bytes]:
    """``(key, value)`` of the record holding ``metadata``. Pure."""
    assert metadata.problem() is None, metadata.problem()
    assert metadata.state != TxnState.DEAD
    value = {
        "v": _VERSION,
        "producer_id": metadata.producer_id,
        "producer_epoch": metadata.producer_epoch,
        "state": int(metadata.state),
        "timeout_ms": metadata.timeout_ms,
        "start_ms": metadata.start_ms,
        "update_ms": metadata.update_ms,
        "partitions": sorted([topic, partition] for topic, partition in metadata.partitions),
        "groups": sorted(metadata.groups),
        "offsets": [list(offset) for offset in metadata.offsets],
    }
    return encode_txn_key(metadata.transactional_id), msgpack.packb(value)


def encode_txn_tombstone(transactional_id: str) -> tuple[bytes, None]:
    """``(key, None)``: the record that forgets an expired transactional id. Pure."""
    return encode_txn_key(transactional_id), None


def encode_producer_id_block(block_end: int) -> tuple[bytes, bytes]:
    """``(key, value)`` of the record reserving producer ids below ``block_end``. Pure."""
    assert block_end > 0
    return msgpack.packb([_KIND_BLOCK, ""]), msgpack.packb({"v": _VERSION, "block_end": block_end})


def _unpack(data: bytes, what: str) -> Any:
    try:
        return msgpack.unpackb(data, use_list=True, strict_map_key=True)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise CorruptTxnRecordError(f"undecodable {what}: {exc!r:.120}") from None


def _int(body: dict[str, Any], name: str) -> int:
    value = body.get(name)
    if type(value) is not int:
        raise CorruptTxnRecordError(f"field {name!r} is not an integer")
    return value


def decode_txn_record(
    key: bytes, value: bytes | None
) -> TxnMetadata | TxnTombstone | ProducerIdBlock:
    """Decode one ``__transaction_state`` record. Pure.

    Raises:
        CorruptTxnRecordError: the key or value is malformed, of an unknown kind or version,
            or describes inconsistent metadata.
    """
    decoded_key = _unpack(key, "key")
    if type(decoded_key) is not list or len(decoded_key) != 2 or type(decoded_key[1]) is not str:
        raise CorruptTxnRecordError("key is not [kind, id]")
    kind, name = decoded_key
    if kind == _KIND_BLOCK:
        body = _body(value)
        block_end = _int(body, "block_end")
        if block_end <= 0:
            raise CorruptTxnRecordError(f"block end {block_end}")
        return ProducerIdBlock(block_end)
    if kind != _KIND_TXN:
        raise CorruptTxnRecordError(f"unknown record kind {kind!r}")
    if value is None:
        return TxnTombstone(name)
    return _decode_metadata(name, _body(value))


def _body(value: bytes | None) -> dict[str, Any]:
    if value is None:
        raise CorruptTxnRecordError("unexpected tombstone")
    body = _unpack(value, "value")
    if type(body) is not dict or body.get("v") != _VERSION:
        raise CorruptTxnRecordError("value is not a map of version 0")
    return body


def _decode_metadata(transactional_id: str, body: dict[str, Any]) -> TxnMetadata:
    try:
        state = TxnState(_int(body, "state"))
        partitions = [(topic, partition) for topic, partition in body["partitions"]]
        groups = list(body["groups"])
        offsets = tuple(PendingOffset(*item) for item in body["offsets"])
    except (KeyError, ValueError, TypeError) as exc:
        raise CorruptTxnRecordError(f"{transactional_id}: {exc!r:.120}") from None
    if state == TxnState.DEAD:
        raise CorruptTxnRecordError(f"{transactional_id}: a Dead state is written as a tombstone")
    if not all(type(t) is str and type(p) is int for t, p in partitions):
        raise CorruptTxnRecordError(f"{transactional_id}: malformed partitions")
    if not all(type(g) is str for g in groups):
        raise CorruptTxnRecordError(f"{transactional_id}: malformed group ids")
    for offset in offsets:
        shape = (type(offset.group_id), type(offset.topic), type(offset.partition))
        metadata_ok = offset.metadata is None or type(offset.metadata) is str
        if shape != (str, str, int) or type(offset.offset) is not int or not metadata_ok:
            raise CorruptTxnRecordError(f"{transactional_id}: malformed offset {offset!r:.80}")
    metadata = TxnMetadata(
        transactional_id=transactional_id,
        producer_id=_int(body, "producer_id"),
        producer_epoch=_int(body, "producer_epoch"),
        state=state,
        timeout_ms=_int(body, "timeout_ms"),
        start_ms=_int(body, "start_ms"),
        update_ms=_int(body, "update_ms"),
        partitions=partitions,
        groups=groups,
        offsets=offsets,
    )
    problem = metadata.problem()
    if problem is not None:
        raise CorruptTxnRecordError(problem)
    return metadata


def transaction_partition_for(transactional_id: str, partition_count: int) -> int:
    """The ``__transaction_state`` partition holding ``transactional_id``'s records (a
    clustered broker's; a single node keeps one partition). Pure."""
    assert partition_count > 0
    return (murmur2(transactional_id.encode("utf-8")) & 0x7FFFFFFF) % partition_count
