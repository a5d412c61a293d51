"""The replica fetch: what a follower asks its leader, and the answer, as msgpack documents.

A follower sends one ``ReplicaFetch`` per leader at a time over its replica link
(``link_frame``: authenticated, ordered), naming for each partition it follows the leader epoch
it believes current, the offset it wants next (its log end offset), the epoch of its last
batch and the offset below which its copy is on disk. The leader answers each partition with
news (the others are left out: the follower keeps what it was last told) with an error code, or
records from the fetch offset (whole batches, up to its log end offset, not only the high
watermark), its high watermark and log start offset — or, when the follower's
last epoch ends earlier in the leader's log (or is unknown there), the *diverging* epoch and
its end offset, where the follower must truncate before fetching again (KIP-101/KIP-595).
Pure: encoding and checking only.
"""

from __future__ import annotations

from typing import Any

import attrs
import msgpack

__all__ = ["ReplicaMessageError", "FetchedPartition", "PartitionFetch", "ReplicaFetch",
           "ReplicaFetchAnswer", "encode", "decode_fetch", "decode_answer"]

#: ``diverging_epoch`` of an answer without divergence. Not -1: -1 is a real answer (the
#: leader knows no epoch at or before the follower's last one, so everything diverges).
NO_DIVERGENCE = -2


class ReplicaMessageError(ValueError):
    """A document that is not a replica fetch or answer of this version."""


@attrs.frozen
class PartitionFetch:
    topic: str
    partition: int
    leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    durable_offset: int


@attrs.frozen
class ReplicaFetch:
    replica_id: int
    max_wait_ms: int
    max_bytes: int
    partitions: tuple[PartitionFetch, ...]


@attrs.frozen
class FetchedPartition:
    topic: str
    partition: int
    error_code: int
    high_watermark: int = -1
    log_start_offset: int = -1
    diverging_epoch: int = NO_DIVERGENCE
    diverging_end_offset: int = -1
    records: bytes = b""


@attrs.frozen
class ReplicaFetchAnswer:
    partitions: tuple[FetchedPartition, ...]


_FIELD_NAMES = {cls: tuple(field.name for field in attrs.fields(cls))
                for cls in (PartitionFetch, FetchedPartition)}


def encode(message: ReplicaFetch | ReplicaFetchAnswer) -> bytes:
    if isinstance(message, ReplicaFetch):
        return msgpack.packb({
            "replica": message.replica_id, "wait": message.max_wait_ms,
            "bytes": message.max_bytes,
            "partitions": [_fields(p) for p in message.partitions]})
    return msgpack.packb({"answers": [_fields(p) for p in message.partitions]})


def _fields(message: PartitionFetch | FetchedPartition) -> tuple[Any, ...]:
    """The fields in declaration order (``attrs.astuple`` without its recursion: hot path)."""
    return tuple(getattr(message, name) for name in _FIELD_NAMES[type(message)])


def _document(data: bytes) -> dict[str, Any]:
    try:
        document = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, msgpack.UnpackException) as exc:
        raise ReplicaMessageError(f"not a msgpack document: {exc}") from None
    if not isinstance(document, dict):
        raise ReplicaMessageError("a replica message is a map")
    return document


def _ints(values: Any, count: int) -> list[int]:
    if len(values) != count or not all(type(v) is int for v in values):
        raise ReplicaMessageError(f"expected {count} integers")
    return list(values)


def decode_fetch(data: bytes) -> ReplicaFetch:
    document = _document(data)
    try:
        partitions = []
        for row in document["partitions"]:
            topic, *numbers = row
            if not isinstance(topic, str):
                raise ReplicaMessageError("a topic name is a string")
            partitions.append(PartitionFetch(topic, *_ints(numbers, 5)))
        replica, wait, size = _ints([document["replica"], document["wait"], document["bytes"]], 3)
    except (KeyError, TypeError, ValueError) as exc:
        raise ReplicaMessageError(f"malformed replica fetch: {exc}") from None
    return ReplicaFetch(replica, wait, size, tuple(partitions))


def decode_answer(data: bytes) -> ReplicaFetchAnswer:
    document = _document(data)
    try:
        partitions = []
        for row in document["answers"]:
            topic, *numbers, records = row
            if not isinstance(topic, str) or not isinstance(records, bytes):
                raise ReplicaMessageError("a topic is a string, records are bytes")
            partitions.append(FetchedPartition(topic, *_ints(numbers, 6), records))
    except (KeyError, TypeError, ValueError) as exc:
        raise ReplicaMessageError(f"malformed replica fetch answer: {exc}") from None
    return ReplicaFetchAnswer(tuple(partitions))
