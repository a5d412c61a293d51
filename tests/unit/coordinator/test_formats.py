"""The two byte formats of consumer groups: consumer-protocol bytes and __consumer_offsets records.

Method: Hypothesis round trips (encode then decode gives the value back) for subscriptions,
assignments, offset and group keys and values; pinned byte examples so an accidental format
change fails loudly; and totality: arbitrary bytes either decode or raise the one documented
error (``ConsumerProtocolError`` / ``CorruptOffsetsRecordError``), never anything else.
Values written by a newer version (extra trailing fields) still decode.
"""

from __future__ import annotations

import hypothesis.strategies as st
import msgpack
import pytest
from hypothesis import given, settings

from rivven_broker.coordinator.offsets_codec import (
    CorruptOffsetsRecordError,
    GroupKey,
    GroupValue,
    MemberValue,
    OffsetKey,
    OffsetValue,
    decode_group_value,
    decode_key,
    decode_offset_value,
    encode_group_value,
    encode_key,
    encode_offset_value,
    offsets_partition_for,
)
from rivven_broker.protocol.consumer_protocol import (
    Assignment,
    ConsumerProtocolError,
    Subscription,
)
from rivven_broker.protocol.errors import ErrorCode

names = st.text(max_size=8)
pairs = st.lists(st.tuples(names, st.integers(0, 2**31 - 1)), max_size=6)
user_data = st.none() | st.binary(max_size=8)
ints64 = st.integers(-(2**63), 2**63 - 1)


@given(st.lists(names, max_size=4), pairs, st.integers(-1, 2**31 - 1), user_data)
def test_subscription_round_trip(topics, owned, generation, data):
    sub = Subscription(topics, owned, generation, data)
    assert Subscription.decode(sub.encode()) == sub
    assert list(sub.topics) == sorted(set(topics))


@given(pairs, user_data)
def test_assignment_round_trip(partitions, data):
    assignment = Assignment(partitions, data)
    assert Assignment.decode(assignment.encode()) == assignment


def test_consumer_protocol_bytes_are_pinned():
    sub = Subscription(["orders"], [("orders", 1)], 4)
    assert sub.encode() == msgpack.packb([0, ["orders"], {"orders": [1]}, 4, None])
    assert Assignment([("t", 2), ("t", 0)]).encode() == msgpack.packb([0, {"t": [0, 2]}, None])
    assert Subscription.decode(b"") == Subscription(())
    assert Assignment.decode(b"") == Assignment()
    newer = msgpack.packb([1, ["a"], {}, -1, None, "future field"])
    assert Subscription.decode(newer).topics == ("a",)


@settings(max_examples=300)
@given(st.binary(max_size=40))
def test_consumer_protocol_decoding_is_total(data):
    for cls in (Subscription, Assignment):
        try:
            cls.decode(data)
        except ConsumerProtocolError as exc:
            assert exc.code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL


def test_consumer_protocol_rejects_wrong_shapes():
    for body in ([0, "a", {}, -1, None], [0, ["a"], {"t": [-1]}, -1, None], [0, ["a"]], "x"):
        with pytest.raises(ConsumerProtocolError):
            Subscription.decode(msgpack.packb(body))
    for body in ([0, {"t": "x"}, None], [0, {"t": [1]}, 5], [-1, {}, None]):
        with pytest.raises(ConsumerProtocolError):
            Assignment.decode(msgpack.packb(body))


members = st.builds(
    MemberValue,
    names,
    st.none() | names,
    names,
    names,
    st.integers(0, 2**31 - 1),
    st.integers(0, 2**31 - 1),
    st.lists(st.tuples(names, st.binary(max_size=6)), max_size=3).map(tuple),
    st.binary(max_size=6),
)


@given(names, names, st.integers(0, 2**31 - 1))
def test_keys_round_trip(group, topic, partition):
    for key in (OffsetKey(group, topic, partition), GroupKey(group)):
        assert decode_key(encode_key(key)) == key


@given(st.integers(0, 2**63 - 1), st.none() | names, ints64)
def test_offset_values_round_trip(offset, metadata, commit_ms):
    value = OffsetValue(offset, metadata, commit_ms)
    assert decode_offset_value(encode_offset_value(value)) == value


@given(st.none() | names, st.integers(0, 2**31 - 1), st.none() | names, st.none() | names,
       ints64, st.lists(members, max_size=3).map(tuple))
def test_group_values_round_trip(protocol_type, generation, protocol, leader, state_ms, items):
    value = GroupValue(protocol_type, generation, protocol, leader, state_ms, items)
    assert decode_group_value(encode_group_value(value)) == value


def test_offsets_records_are_pinned():
    assert encode_key(OffsetKey("g", "t", 3)) == msgpack.packb([1, "g", "t", 3])
    assert encode_key(GroupKey("g")) == msgpack.packb([2, "g"])
    assert encode_offset_value(OffsetValue(7, None, 5)) == msgpack.packb([0, 7, None, 5])
    newer = msgpack.packb([3, 7, "m", 5, "leader epoch, say"])
    assert decode_offset_value(newer) == OffsetValue(7, "m", 5)
    assert 0 <= offsets_partition_for("billing", 50) < 50
    assert offsets_partition_for("billing", 1) == 0


@settings(max_examples=300)
@given(st.binary(max_size=40))
def test_offsets_decoding_is_total(data):
    for decode in (decode_key, decode_offset_value, decode_group_value):
        try:
            decode(data)
        except CorruptOffsetsRecordError:
            pass


def test_offsets_decoding_rejects_wrong_shapes():
    for key in ([3, "g"], [1, "g", "t"], [1, "g", "t", -1], [2, 5], []):
        with pytest.raises(CorruptOffsetsRecordError):
            decode_key(msgpack.packb(key))
    for value in ([0, -1, None, 5], [0, 1, 2, 5], [0, 1]):
        with pytest.raises(CorruptOffsetsRecordError):
            decode_offset_value(msgpack.packb(value))
    bad_member = [0, "consumer", 1, "range", "m", 0, [["m", None, "c", "h", 1, 1, [], "str"]]]
    with pytest.raises(CorruptOffsetsRecordError):
        decode_group_value(msgpack.packb(bad_member))
