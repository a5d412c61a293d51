"""Record keys and values of the internal compacted topic ``__consumer_offsets``.

Theory of operation
-------------------
The group coordinator keeps no state of its own on disk: everything it must survive a restart
with is a record in ``__consumer_offsets``, and it rebuilds itself by replaying that topic
(``GroupCoordinator.load``). The topic is compacted, so for every key only the latest record
matters, and a tombstone (a record whose value is null) deletes the key. Two kinds of key
exist, each a msgpack array whose first item says which:

==================== =================================== =======================================
key                  value                               written when
==================== =================================== =======================================
``[1, group, topic,  ``[0, offset, metadata, commit_ms]``  an offset commit is accepted
partition]``                                             (tombstone: expired, group deleted)
``[2, group]``       ``[0, protocol_type, generation,     a rebalance completes (SyncGroup), a
                     protocol, leader, state_ms,          static member is replaced, the group
                     members]``                           empties (tombstone: group deleted or
                                                          expired)
==================== =================================== =======================================

``members`` is an array of ``[member_id, group_instance_id, client_id, client_host,
session_timeout_ms, rebalance_timeout_ms, protocols, assignment]`` with ``protocols`` an
array of ``[name, metadata]``. ``state_ms`` is when the group entered its state (for an empty
group: when it became empty, which starts its offsets' retention clock). Values start with a
version (0); a reader accepts longer arrays (fields a later version appended), so the format
can grow without a flag day. Anything else (not msgpack, unknown key kind, wrong types) is
``CorruptOffsetsRecordError``: the log is the source of truth, and a record we cannot read
must stop the load rather than be skipped silently.

Groups map to partitions of the topic by ``offsets_partition_for`` (murmur2 of the group id,
as Kafka's key partitioner would place the key). Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

import attrs
import msgpack

from rivven_broker.protocol import limits
from rivven_broker.records.murmur2 import murmur2

__all__ = [
    "OFFSETS_TOPIC",
    "CorruptOffsetsRecordError",
    "OffsetKey",
    "GroupKey",
    "OffsetValue",
    "GroupValue",
    "MemberValue",
    "encode_key",
    "decode_key",
    "encode_offset_value",
    "decode_offset_value",
    "encode_group_value",
    "decode_group_value",
    "offsets_partition_for",
]

OFFSETS_TOPIC = "__consumer_offsets"
_OFFSET_KEY = 1
_GROUP_KEY = 2
_VALUE_VERSION = 0
_UNPACK_OPTIONS: dict[str, Any] = {
    "raw": False,
    "use_list": False,
    "strict_map_key": True,
    "max_str_len": limits.config_value_bytes_max,
    "max_bin_len": limits.frame_bytes_max,
    "max_array_len": limits.list_length_max,
    "max_map_len": limits.list_length_max,
    "max_ext_len": 0,
}
_DECODE_ERRORS = (ValueError, TypeError, OverflowError, msgpack.UnpackException)


class CorruptOffsetsRecordError(Exception):
    """A ``__consumer_offsets`` key or value that does not decode."""


@attrs.frozen
class OffsetKey:
    """The key of one committed offset."""

    group_id: str
    topic: str
    partition: int


@attrs.frozen
class GroupKey:
    """The key of a group's metadata."""

    group_id: str


@attrs.frozen
class OffsetValue:
    """A committed offset: the next offset to read, the commit's metadata and time."""

    offset: int
    metadata: str | None
    commit_timestamp_ms: int


@attrs.frozen
class MemberValue:
    """A member as persisted with its group."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]
    assignment: bytes


@attrs.frozen
class GroupValue:
    """A group's metadata after a completed rebalance (or when it emptied)."""

    protocol_type: str | None
    generation: int
    protocol_name: str | None
    leader: str | None
    state_timestamp_ms: int
    members: tuple[MemberValue, ...] = ()


def _unpack(data: bytes | bytearray | memoryview, what: str) -> tuple:
    try:
        value = msgpack.unpackb(data, **_UNPACK_OPTIONS)
    except _DECODE_ERRORS as exc:
        raise CorruptOffsetsRecordError(f"undecodable {what}: {exc}"[:200]) from None
    if type(value) is not tuple or not value:
        raise CorruptOffsetsRecordError(f"{what}: expected a non-empty array")
    return value


def _expect(condition: bool, what: str) -> None:
    if not condition:
        raise CorruptOffsetsRecordError(what)


def _is_int(value: object) -> bool:
    return type(value) is int


def _is_opt_str(value: object) -> bool:
    return value is None or type(value) is str


def encode_key(key: OffsetKey | GroupKey) -> bytes:
    """The record key bytes of ``key``. Pure."""
    if isinstance(key, OffsetKey):
        return msgpack.packb([_OFFSET_KEY, key.group_id, key.topic, key.partition])
    assert isinstance(key, GroupKey), key
    return msgpack.packb([_GROUP_KEY, key.group_id])


def decode_key(data: bytes | bytearray | memoryview) -> OffsetKey | GroupKey:
    """Parse a record key.

    Raises:
        CorruptOffsetsRecordError: not a key this code writes.
    """
    value = _unpack(data, "key")
    kind = value[0]
    if kind == _OFFSET_KEY and len(value) == 4:
        _, group_id, topic, partition = value
        _expect(type(group_id) is str and type(topic) is str, "offset key: names must be str")
        _expect(_is_int(partition) and partition >= 0, "offset key: bad partition")
        return OffsetKey(group_id, topic, partition)
    if kind == _GROUP_KEY and len(value) == 2:
        _expect(type(value[1]) is str, "group key: group id must be str")
        return GroupKey(value[1])
    raise CorruptOffsetsRecordError(f"unknown key kind {kind!r:.20} with {len(value)} items")


def encode_offset_value(value: OffsetValue) -> bytes:
    """The record value of a committed offset. Pure."""
    return msgpack.packb(
        [_VALUE_VERSION, value.offset, value.metadata, value.commit_timestamp_ms]
    )


def decode_offset_value(data: bytes | bytearray | memoryview) -> OffsetValue:
    """Parse an offset value. Raises CorruptOffsetsRecordError."""
    value = _unpack(data, "offset value")
    _expect(_is_int(value[0]) and value[0] >= 0 and len(value) >= 4, "offset value: bad shape")
    _, offset, metadata, commit_ms = value[:4]
    _expect(_is_int(offset) and offset >= 0, "offset value: bad offset")
    _expect(_is_opt_str(metadata), "offset value: metadata must be str or nil")
    _expect(_is_int(commit_ms), "offset value: bad commit timestamp")
    return OffsetValue(offset, metadata, commit_ms)


def _member_wire(member: MemberValue) -> list[Any]:
    return [
        member.member_id,
        member.group_instance_id,
        member.client_id,
        member.client_host,
        member.session_timeout_ms,
        member.rebalance_timeout_ms,
        [[name, metadata] for name, metadata in member.protocols],
        member.assignment,
    ]


def encode_group_value(value: GroupValue) -> bytes:
    """The record value of a group's metadata. Pure."""
    return msgpack.packb(
        [
            _VALUE_VERSION,
            value.protocol_type,
            value.generation,
            value.protocol_name,
            value.leader,
            value.state_timestamp_ms,
            [_member_wire(member) for member in value.members],
        ]
    )


def _member_from_wire(item: object) -> MemberValue:
    _expect(type(item) is tuple and len(item) >= 8, "group value: bad member")
    assert isinstance(item, tuple)
    member_id, instance_id, client_id, client_host, session_ms, rebalance_ms = item[:6]
    protocols, assignment = item[6:8]
    _expect(type(member_id) is str and _is_opt_str(instance_id), "member: bad ids")
    _expect(type(client_id) is str and type(client_host) is str, "member: bad client")
    _expect(_is_int(session_ms) and _is_int(rebalance_ms), "member: bad timeouts")
    _expect(type(assignment) is bytes and type(protocols) is tuple, "member: bad protocols")
    pairs = []
    for pair in protocols:
        _expect(type(pair) is tuple and len(pair) == 2, "member: bad protocol")
        _expect(type(pair[0]) is str and type(pair[1]) is bytes, "member: bad protocol")
        pairs.append((pair[0], pair[1]))
    return MemberValue(
        member_id,
        instance_id,
        client_id,
        client_host,
        session_ms,
        rebalance_ms,
        tuple(pairs),
        assignment,
    )


def decode_group_value(data: bytes | bytearray | memoryview) -> GroupValue:
    """Parse a group value. Raises CorruptOffsetsRecordError."""
    value = _unpack(data, "group value")
    _expect(_is_int(value[0]) and value[0] >= 0 and len(value) >= 7, "group value: bad shape")
    _, protocol_type, generation, protocol, leader, state_ms, members = value[:7]
    _expect(_is_opt_str(protocol_type) and _is_opt_str(protocol), "group value: bad protocol")
    _expect(_is_opt_str(leader), "group value: bad leader")
    _expect(_is_int(generation) and _is_int(state_ms), "group value: bad generation or time")
    _expect(type(members) is tuple, "group value: members must be an array")
    decoded = tuple(_member_from_wire(item) for item in members)
    return GroupValue(protocol_type, generation, protocol, leader, state_ms, decoded)


def offsets_partition_for(group_id: str, partition_count: int) -> int:
    """The ``__consumer_offsets`` partition holding ``group_id``'s records. Pure."""
    assert partition_count > 0
    return (murmur2(group_id.encode("utf-8")) & 0x7FFFFFFF) % partition_count
