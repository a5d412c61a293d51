"""The SWIM messages and their msgpack payload, packed to fit one datagram.

Theory of operation
-------------------
A datagram's payload (inside the authenticated frame, ``frame.py``) is one msgpack array of
messages, each a short array led by its type number: at most one *primary* message (ping, ack,
ping-req, nack or a push-pull chunk) and then as many piggybacked *claims* (alive, suspect,
dead, left) as fit in ``payload_bytes_max``. ``pack`` adds claims in the order given and stops
at the first that does not fit, so the caller's order (least-sent first) decides who rides.

| type | fields |
| --- | --- |
| 1 ping | seq, target node id, target boot id |
| 2 ack | seq |
| 3 ping-req | seq, target node id, target boot id, target host, target port |
| 4 nack | seq |
| 5 alive | node id, boot id, incarnation, cluster host, port, client host, port, rack or nil |
| 6 suspect | node id, boot id, incarnation, accuser node id |
| 7 dead | node id, boot id, incarnation, accuser node id |
| 8 left | node id, boot id, incarnation |
| 9 push-pull | is reply, [member records]; a record: node id, boot id, incarnation, state (0-3), cluster host, port, client host, port, rack or nil |

``unpack`` is total: any payload that is not exactly this shape (types, counts, ranges) gives
``None`` and the receiver drops the datagram as malformed. It never raises.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Union

import msgpack

from rivven_cluster.membership.members import Address, Claim, MemberState

__all__ = [
    "Ping", "Ack", "PingReq", "Nack", "Alive", "Suspect", "Dead", "Left", "PushPull",
    "Record", "Message", "ClaimMessage", "pack", "unpack", "claim_of",
]

_U64 = (1 << 64) - 1
_I32 = (1 << 31) - 1
_NAME_MAX = 255
_RECORDS_MAX = 1024
_MESSAGES_MAX = 256


class Ping(NamedTuple):
    seq: int
    target: int
    target_boot: int


class Ack(NamedTuple):
    seq: int


class PingReq(NamedTuple):
    seq: int
    target: int
    target_boot: int
    address: Address


class Nack(NamedTuple):
    seq: int


class Alive(NamedTuple):
    node_id: int
    boot_id: int
    incarnation: int
    cluster_address: Address
    client_address: Address
    rack: str | None


class Suspect(NamedTuple):
    node_id: int
    boot_id: int
    incarnation: int
    accuser: int


class Dead(NamedTuple):
    node_id: int
    boot_id: int
    incarnation: int
    accuser: int


class Left(NamedTuple):
    node_id: int
    boot_id: int
    incarnation: int


class Record(NamedTuple):
    """One member's full state, as push-pull carries it."""

    node_id: int
    boot_id: int
    incarnation: int
    state: MemberState
    cluster_address: Address
    client_address: Address
    rack: str | None


class PushPull(NamedTuple):
    reply: bool
    records: tuple[Record, ...]


ClaimMessage = Union[Alive, Suspect, Dead, Left]
Message = Union[Ping, Ack, PingReq, Nack, Alive, Suspect, Dead, Left, PushPull]

_STATE_OF = {Alive: MemberState.ALIVE, Suspect: MemberState.SUSPECT, Dead: MemberState.DEAD,
             Left: MemberState.LEFT}


def claim_of(message: ClaimMessage) -> Claim:
    return Claim(message.node_id, message.boot_id, message.incarnation, _STATE_OF[type(message)])


# --- packing ---------------------------------------------------------------------------------


def _wire(message: Message) -> list[Any]:
    kind = type(message)
    if kind is Ping:
        return [1, message.seq, message.target, message.target_boot]
    if kind is Ack:
        return [2, message.seq]
    if kind is PingReq:
        return [3, message.seq, message.target, message.target_boot, message.address.host,
                message.address.port]
    if kind is Nack:
        return [4, message.seq]
    if kind is Alive:
        return [5, message.node_id, message.boot_id, message.incarnation,
                message.cluster_address.host, message.cluster_address.port,
                message.client_address.host, message.client_address.port, message.rack]
    if kind in (Suspect, Dead):
        return [6 if kind is Suspect else 7, message.node_id, message.boot_id,
                message.incarnation, message.accuser]
    if kind is Left:
        return [8, message.node_id, message.boot_id, message.incarnation]
    assert kind is PushPull, message
    return [9, message.reply, [_record_wire(r) for r in message.records]]


def _record_wire(record: Record) -> list[Any]:
    return [record.node_id, record.boot_id, record.incarnation, int(record.state),
            record.cluster_address.host, record.cluster_address.port,
            record.client_address.host, record.client_address.port, record.rack]


def size_of(message: Message) -> int:
    """Bytes ``message`` takes inside a payload."""
    return len(msgpack.packb(_wire(message)))


def pack(primary: Message | None, claims: list[ClaimMessage], payload_bytes_max: int
         ) -> tuple[bytes, int]:
    """The payload of ``primary`` and as many of ``claims`` (in order) as fit; returns it and
    how many claims it took. ``primary`` alone must fit."""
    parts = [] if primary is None else [msgpack.packb(_wire(primary))]
    size = 3 + sum(len(p) for p in parts)  # the array header, at most 3 bytes here
    assert size <= payload_bytes_max, "a primary message must fit a datagram alone"
    taken = 0
    for claim in claims:
        if len(parts) >= _MESSAGES_MAX:
            break
        packed = msgpack.packb(_wire(claim))
        if size + len(packed) > payload_bytes_max:
            break
        parts.append(packed)
        size += len(packed)
        taken += 1
    header = msgpack.Packer().pack_array_header(len(parts))
    return header + b"".join(parts), taken


def split_records(records: list[Record], reply: bool, payload_bytes_max: int
                  ) -> list[PushPull]:
    """``records`` as push-pull chunks that each fit a payload."""
    chunks: list[PushPull] = []
    current: list[Record] = []
    size = 16
    for record in records:
        record_size = len(msgpack.packb(_record_wire(record)))
        if current and size + record_size > payload_bytes_max:
            chunks.append(PushPull(reply, tuple(current)))
            current, size = [], 16
        current.append(record)
        size += record_size
    if current or not chunks:
        chunks.append(PushPull(reply, tuple(current)))
    return chunks


# --- unpacking -------------------------------------------------------------------------------


def _int(value: object, high: int = _U64) -> bool:
    return type(value) is int and 0 <= value <= high


def _name(value: object) -> bool:
    return type(value) is str and 0 < len(value) <= _NAME_MAX


def _port(value: object) -> bool:
    return type(value) is int and 0 <= value <= 65_535


def _rack(value: object) -> bool:
    return value is None or _name(value)


def _message(item: object) -> Message | None:
    if type(item) is not list or not item or type(item[0]) is not int:
        return None
    kind, fields = item[0], item[1:]
    if kind in (2, 4):
        if len(fields) == 1 and _int(fields[0]):
            return Ack(fields[0]) if kind == 2 else Nack(fields[0])
        return None
    if kind == 1:
        if len(fields) == 3 and _int(fields[0]) and _int(fields[1], _I32) and _int(fields[2]):
            return Ping(*fields)
        return None
    if kind == 3:
        if (len(fields) == 5 and _int(fields[0]) and _int(fields[1], _I32) and _int(fields[2])
                and _name(fields[3]) and _port(fields[4])):
            return PingReq(fields[0], fields[1], fields[2], Address(fields[3], fields[4]))
        return None
    if kind == 5:
        return _alive(fields)
    if kind in (6, 7):
        if len(fields) == 4 and _int(fields[0], _I32) and _int(fields[1]) and _int(
                fields[2], _I32) and _int(fields[3], _I32):
            return (Suspect if kind == 6 else Dead)(*fields)
        return None
    if kind == 8:
        if len(fields) == 3 and _int(fields[0], _I32) and _int(fields[1]) and _int(fields[2], _I32):
            return Left(*fields)
        return None
    if kind == 9:
        if len(fields) != 2 or type(fields[0]) is not bool or type(fields[1]) is not list:
            return None
        if len(fields[1]) > _RECORDS_MAX:
            return None
        records = [_record(raw) for raw in fields[1]]
        if any(record is None for record in records):
            return None
        return PushPull(fields[0], tuple(records))  # type: ignore[arg-type]
    return None


def _alive(fields: list[Any]) -> Alive | None:
    if not (len(fields) == 8 and _int(fields[0], _I32) and _int(fields[1]) and _int(fields[2], _I32)
            and _name(fields[3]) and _port(fields[4]) and _name(fields[5]) and _port(fields[6])
            and _rack(fields[7])):
        return None
    return Alive(fields[0], fields[1], fields[2], Address(fields[3], fields[4]),
                 Address(fields[5], fields[6]), fields[7])


def _record(raw: object) -> Record | None:
    if type(raw) is not list or len(raw) != 9:
        return None
    if not (_int(raw[0], _I32) and _int(raw[1]) and _int(raw[2], _I32) and _int(raw[3], 3)
            and _name(raw[4]) and _port(raw[5]) and _name(raw[6]) and _port(raw[7])
            and _rack(raw[8])):
        return None
    return Record(raw[0], raw[1], raw[2], MemberState(raw[3]), Address(raw[4], raw[5]),
                  Address(raw[6], raw[7]), raw[8])


def unpack(payload: bytes) -> list[Message] | None:
    """The messages of a payload, or None when it is malformed in any way. Never raises."""
    try:
        items = msgpack.unpackb(payload, use_list=True, raw=False, strict_map_key=True,
                                max_bin_len=0, max_ext_len=0, max_str_len=_NAME_MAX,
                                max_array_len=max(_RECORDS_MAX, _MESSAGES_MAX),
                                max_map_len=0)
    except (ValueError, TypeError):  # msgpack's errors on garbage (all ValueError subclasses)
        return None
    if type(items) is not list or len(items) > _MESSAGES_MAX:
        return None
    messages = []
    for item in items:
        message = _message(item)
        if message is None:
            return None
        messages.append(message)
    return messages
