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

An answer's records are not inside its msgpack document: the answer is a 4-byte big-endian
length, the document (each partition's fields with its records' *length* last), then every
partition's records one after the other. So the leader hands the records it read to the link
as they are (``answer_parts``: the link seals the parts with one copy into the frame) and the
follower's records are ``memoryview`` slices of the payload it received: a megabyte of batches
is not copied in and out of msgpack on either side.
"""

from __future__ import annotations

import struct
from typing import Any

import attrs
import msgpack

__all__ = ["ReplicaMessageError", "FetchedPartition", "PartitionFetch", "ReplicaFetch",
           "ReplicaFetchAnswer", "answer_parts", "encode", "decode_fetch", "decode_answer"]

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
    #: Whole batches; a ``memoryview`` of the received payload in a decoded answer. On a
    #: leader it may be any sized buffer the link can send (a file region of the log).
    records: Any = b""


@attrs.frozen
class ReplicaFetchAnswer:
    partitions: tuple[FetchedPartition, ...]


_FIELD_NAMES = {cls: tuple(field.name for field in attrs.fields(cls))
                for cls in (PartitionFetch, FetchedPartition)}


_DOCUMENT_LENGTH = struct.Struct(">I")


def encode(message: ReplicaFetch | ReplicaFetchAnswer) -> bytes:
    if isinstance(message, ReplicaFetch):
        return msgpack.packb({
            "replica": message.replica_id, "wait": message.max_wait_ms,
            "bytes": message.max_bytes,
            "partitions": [_fields(p) for p in message.partitions]})
    return b"".join(answer_parts(message))


def answer_parts(answer: ReplicaFetchAnswer) -> list[Any]:
    """The answer's bytes in pieces, records as given (not copied): what the link seals."""
    rows = [(*_fields(p)[:-1], len(p.records)) for p in answer.partitions]
    document = msgpack.packb({"answers": rows})
    return [_DOCUMENT_LENGTH.pack(len(document)), document,
            *(p.records for p in answer.partitions if p.records)]


def _fields(message: PartitionFetch | FetchedPartition) -> tuple[Any, ...]:
    """The fields in declaration order (``attrs.astuple`` without its recursion: hot path)."""
    return tuple(getattr(message, name) for name in _FIELD_NAMES[type(message)])


def _document(data: bytes | memoryview) -> dict[str, Any]:
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


def decode_answer(data: bytes | memoryview) -> ReplicaFetchAnswer:
    """The answer ``answer_parts`` wrote; its records are slices of ``data`` (not copies)."""
    view = memoryview(data)
    if len(view) < _DOCUMENT_LENGTH.size:
        raise ReplicaMessageError("a replica fetch answer is too short")
    (length,) = _DOCUMENT_LENGTH.unpack_from(view)
    position = _DOCUMENT_LENGTH.size + length
    if position > len(view):
        raise ReplicaMessageError("a replica fetch answer's document is cut short")
    document = _document(view[_DOCUMENT_LENGTH.size:position])
    try:
        partitions = []
        for row in document["answers"]:
            topic, *numbers = row
            if not isinstance(topic, str):
                raise ReplicaMessageError("a topic name is a string")
            *fields, size = _ints(numbers, 7)
            if not 0 <= size <= len(view) - position:
                raise ReplicaMessageError("a partition's records run past the answer")
            records = view[position:position + size] if size else b""
            position += size
            partitions.append(FetchedPartition(topic, *fields, records))
    except (KeyError, TypeError, ValueError) as exc:
        raise ReplicaMessageError(f"malformed replica fetch answer: {exc}") from None
    if position != len(view):
        raise ReplicaMessageError("bytes after a replica fetch answer's records")
    return ReplicaFetchAnswer(tuple(partitions))
