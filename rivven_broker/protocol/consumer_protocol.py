"""The consumer protocol: what consumers put in JoinGroup metadata and SyncGroup assignments.

Theory of operation
-------------------
The coordinator treats a member's subscription and its assignment as opaque bytes; only the
consumers (the leader running an assignor, every member reading its share) look inside. Both
sides of that conversation are clients, but the broker decodes them too when it describes a
group (``rivven group describe``), so the format lives here, where client and broker may both
import it.

Both are one msgpack array, version first, so a later version can append fields that an
older reader ignores:

- ``Subscription``: ``[0, topics, owned, generation, user_data]`` - ``topics`` the sorted
  subscribed topic names; ``owned`` a map topic -> sorted partitions the member holds now
  (used by the cooperative protocol and by sticky assignors); ``generation`` the generation
  in which it got them (-1: none), which settles two members claiming one partition;
  ``user_data`` bin or nil, for custom assignors.
- ``Assignment``: ``[0, partitions, user_data]`` - ``partitions`` a map topic -> sorted
  partitions.

Decoding is total: malformed bytes raise ``ConsumerProtocolError`` (a
``RemoteProtocolError`` carrying INCONSISTENT_GROUP_PROTOCOL) and nothing else. Empty bytes
decode to an empty subscription or assignment, which is what a coordinator hands out for a
member the leader did not mention. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any, Iterable

import attrs
import msgpack

from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode, RemoteProtocolError

__all__ = [
    "CONSUMER_PROTOCOL_VERSION",
    "ConsumerProtocolError",
    "Subscription",
    "Assignment",
    "TopicPartitions",
    "group_partitions",
]

CONSUMER_PROTOCOL_VERSION = 0
#: A set of partitions: sorted (topic, partition) pairs.
TopicPartitions = tuple[tuple[str, int], ...]

_UNPACK_OPTIONS: dict[str, Any] = {
    "raw": False,
    "use_list": False,
    "strict_map_key": True,
    "max_str_len": limits.wire_name_bytes_max,
    "max_bin_len": limits.frame_bytes_max,
    "max_array_len": limits.list_length_max,
    "max_map_len": limits.list_length_max,
    "max_ext_len": 0,
}
_DECODE_ERRORS = (ValueError, TypeError, OverflowError, msgpack.UnpackException)


class ConsumerProtocolError(RemoteProtocolError):
    """Subscription or assignment bytes that do not decode."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ErrorCode.INCONSISTENT_GROUP_PROTOCOL)


def group_partitions(partitions: Iterable[tuple[str, int]]) -> dict[str, list[int]]:
    """Topic -> sorted partitions of an iterable of (topic, partition) pairs. Pure."""
    grouped: dict[str, list[int]] = {}
    for topic, partition in partitions:
        grouped.setdefault(topic, []).append(partition)
    for values in grouped.values():
        values.sort()
    return dict(sorted(grouped.items()))


def _flatten(grouped: object, what: str) -> TopicPartitions:
    if type(grouped) is not dict:
        raise ConsumerProtocolError(f"{what}: expected a map of topic to partitions")
    pairs = []
    for topic, partitions in grouped.items():
        if type(topic) is not str or type(partitions) is not tuple:
            raise ConsumerProtocolError(f"{what}: expected str -> array of ints")
        for partition in partitions:
            if type(partition) is not int or not 0 <= partition < 2**31:
                raise ConsumerProtocolError(f"{what}: partition {partition!r:.20} is invalid")
            pairs.append((topic, partition))
    return tuple(sorted(set(pairs)))


def _sorted_pairs(value: Iterable[tuple[str, int]]) -> TopicPartitions:
    return tuple(sorted({(str(t), int(p)) for t, p in value}))


def _sorted_names(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(set(value)))


def _unpack(data: bytes | bytearray | memoryview, what: str, fields_min: int) -> tuple:
    try:
        value = msgpack.unpackb(data, **_UNPACK_OPTIONS)
    except _DECODE_ERRORS as exc:
        raise ConsumerProtocolError(f"undecodable {what}: {exc}"[:200]) from None
    if type(value) is not tuple or len(value) < fields_min:
        raise ConsumerProtocolError(f"{what}: expected an array of at least {fields_min} items")
    if type(value[0]) is not int or value[0] < 0:
        raise ConsumerProtocolError(f"{what}: bad version {value[0]!r:.20}")
    return value


def _user_data(value: object, what: str) -> bytes | None:
    if value is None or type(value) is bytes:
        return value
    raise ConsumerProtocolError(f"{what}: user data must be bin or nil")


@attrs.frozen
class Subscription:
    """What a member asks for: topics, what it owns now (and since which generation)."""

    topics: tuple[str, ...] = attrs.field(converter=_sorted_names)
    owned_partitions: TopicPartitions = attrs.field(default=(), converter=_sorted_pairs)
    generation: int = -1
    user_data: bytes | None = None

    def encode(self) -> bytes:
        """The JoinGroup metadata bytes. Pure."""
        owned = group_partitions(self.owned_partitions)
        body = [CONSUMER_PROTOCOL_VERSION, list(self.topics), owned, self.generation]
        return msgpack.packb(body + [self.user_data])

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> Subscription:
        """Parse JoinGroup metadata; b"" is an empty subscription.

        Raises:
            ConsumerProtocolError: the bytes are not a subscription.
        """
        if len(data) == 0:
            return cls(())
        value = _unpack(data, "subscription", 5)
        _, topics, owned, generation, user_data = value[:5]
        if type(topics) is not tuple or any(type(t) is not str for t in topics):
            raise ConsumerProtocolError("subscription: topics must be an array of str")
        if type(generation) is not int or not -1 <= generation < 2**31:
            raise ConsumerProtocolError("subscription: bad generation")
        owned_pairs = _flatten(owned, "subscription owned partitions")
        return cls(topics, owned_pairs, generation, _user_data(user_data, "subscription"))


@attrs.frozen
class Assignment:
    """What a member got: (topic, partition) pairs, sorted."""

    partitions: TopicPartitions = attrs.field(default=(), converter=_sorted_pairs)
    user_data: bytes | None = None

    def encode(self) -> bytes:
        """The SyncGroup assignment bytes. Pure."""
        grouped = group_partitions(self.partitions)
        return msgpack.packb([CONSUMER_PROTOCOL_VERSION, grouped, self.user_data])

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> Assignment:
        """Parse SyncGroup assignment bytes; b"" is an empty assignment.

        Raises:
            ConsumerProtocolError: the bytes are not an assignment.
        """
        if len(data) == 0:
            return cls()
        value = _unpack(data, "assignment", 3)
        pairs = _flatten(value[1], "assignment")
        return cls(pairs, _user_data(value[2], "assignment"))
