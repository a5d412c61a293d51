"""The produce fast paths of the codec agree with the generic field walk.

Method: Hypothesis draws valid ``Produce`` requests and ``ProduceResponse`` answers (from the
declared field kinds) and checks that the fast decoder builds an equal message from the same
decoded body, and the fast encoder the same map in the same key order, as the generic path.
Hand-made bad bodies must be refused by the fast decoder (returning None), so the codec's
error for them is the generic one, which the codec tests pin.
"""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rivven_broker.protocol import codec, fast_codec
from rivven_broker.protocol.errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from rivven_broker.protocol.messages import (
    Produce,
    ProducePartition,
    ProducePartitionResponse,
    ProduceResponse,
    ProduceTopic,
    ProduceTopicResponse,
)

from .strategies import struct_strategy


def _body(request: Produce, version: int) -> object:
    payload = codec.encode_request(request, version)
    return msgpack.unpackb(payload, raw=False, use_list=False, strict_map_key=False)[2]


@settings(max_examples=150)
@given(request=struct_strategy(Produce), version=st.sampled_from([0, 1]))
def test_fast_produce_decoding_equals_the_generic_one(request: Produce, version: int) -> None:
    body = _body(request, version)
    fast = fast_codec.decode_produce(body, version)
    generic = codec.struct_from_wire(Produce, body, version)
    assert generic == request
    names_ascii = all(topic.name.isascii() for topic in request.topics) and (
        request.transactional_id is None or request.transactional_id.isascii()
    )
    if names_ascii:
        assert fast == generic
        assert type(fast.topics) is tuple and all(type(t) is ProduceTopic for t in fast.topics)
    else:
        assert fast is None or fast == generic
    assert codec.decode_request(codec.encode_request(request, version)) == request


@settings(max_examples=150)
@given(response=struct_strategy(ProduceResponse), version=st.sampled_from([0, 1]))
def test_fast_produce_response_map_equals_the_generic_one(
    response: ProduceResponse, version: int
) -> None:
    fast = fast_codec.produce_response_to_wire(response, version)
    try:
        generic = codec.struct_to_wire(response, version)
    except LocalProtocolError:
        assert fast is None  # a v1 field set at v0: the generic path raises, and still does
        with pytest.raises(LocalProtocolError):
            codec.encode_response(response, version)
        return
    assert fast is not None
    assert msgpack.packb(fast) == msgpack.packb(generic)  # same keys, same order, same values
    assert codec.decode_response(codec.encode_response(response, version)) == response
    templated = fast_codec.produce_answer_payload(response, version)
    if templated is not None:  # byte for byte what the generic path packs
        assert templated == msgpack.packb((int(response.API_KEY), version, generic))


@settings(max_examples=150)
@given(name=st.text(min_size=1, max_size=20), partition=st.integers(0, 2**31 - 1),
       base_offset=st.integers(0, 2**63 - 1), append_time=st.integers(-1, 2**63 - 1),
       version=st.sampled_from([0, 1]))
def test_a_one_partition_success_answer_comes_from_its_template_byte_for_byte(
    name: str, partition: int, base_offset: int, append_time: int, version: int
) -> None:
    answer = ProducePartitionResponse(partition, ErrorCode.NONE, base_offset, append_time,
                                      base_offset // 2)
    response = ProduceResponse((ProduceTopicResponse(name, (answer,)),))
    templated = fast_codec.produce_answer_payload(response, version)
    assert templated is not None
    generic = msgpack.packb((int(response.API_KEY), version, codec.struct_to_wire(response, version)))
    assert templated == generic
    assert fast_codec.produce_answer_payload(response, version) == templated  # cached
    failed = ProducePartitionResponse(partition, ErrorCode.NOT_LEADER, -1, -1, -1)
    assert fast_codec.produce_answer_payload(
        ProduceResponse((ProduceTopicResponse(name, (failed,)),)), version) is None


def _good_body() -> dict[str, object]:
    return {
        "acks": -1,
        "timeout_ms": 1000,
        "topics": ({"name": "t", "partitions": ({"partition": 0, "records": b"x"},)},),
        "transactional_id": None,
    }


def _with(path: tuple[object, ...], value: object) -> dict[str, object]:
    """A good body with one field replaced (``path`` walks maps by key, tuples by index)."""

    def rebuild(node: object, rest: tuple[object, ...]) -> object:
        if not rest:
            return value
        head, tail = rest[0], rest[1:]
        if isinstance(node, dict):
            copy = dict(node)
            copy[head] = rebuild(node[head], tail)
            return copy
        assert isinstance(node, tuple) and isinstance(head, int)
        items = list(node)
        items[head] = rebuild(items[head], tail)
        return tuple(items)

    result = rebuild(_good_body(), path)
    assert isinstance(result, dict)
    return result


_MISSING = object()
BAD_BODIES = [
    (("acks",), 2),
    (("acks",), True),
    (("acks",), _MISSING),
    (("timeout_ms",), -1),
    (("timeout_ms",), 2**31),
    (("timeout_ms",), 1.5),
    (("transactional_id",), 7),
    (("transactional_id",), _MISSING),
    (("transactional_id",), "x" * 10_000),
    (("topics",), [1]),
    (("topics", 0), "topic"),
    (("topics", 0, "name"), None),
    (("topics", 0, "name"), "n" * 10_000),
    (("topics", 0, "partitions"), ()),  # valid: the fast path must accept it
    (("topics", 0, "partitions", 0), 3),
    (("topics", 0, "partitions", 0, "partition"), -(2**31) - 1),
    (("topics", 0, "partitions", 0, "records"), "text"),
    (("topics", 0, "partitions", 0, "records"), _MISSING),
]


@pytest.mark.parametrize(("path", "value"), BAD_BODIES)
def test_bad_bodies_go_the_generic_way(path: tuple[object, ...], value: object) -> None:
    body = _with(path, value)
    if value is _MISSING:
        parent = body
        for key in path[:-1]:
            parent = parent[key]  # type: ignore[index]
        del parent[path[-1]]  # type: ignore[attr-defined]
    try:
        generic = codec.struct_from_wire(Produce, body, 1)
    except RemoteProtocolError:
        assert fast_codec.decode_produce(body, 1) is None
        return
    assert fast_codec.decode_produce(body, 1) == generic


def test_a_good_body_takes_the_fast_path() -> None:
    fast = fast_codec.decode_produce(_good_body(), 0)
    assert fast == Produce(-1, 1000, (ProduceTopic("t", (ProducePartition(0, b"x"),)),), None)
    response = ProduceResponse((ProduceTopicResponse("t", (ProducePartitionResponse(0),)),))
    wire = fast_codec.produce_response_to_wire(response, 1)
    assert wire == codec.struct_to_wire(response, 1)


@settings(max_examples=100)
@given(
    partitions=st.lists(
        st.tuples(
            st.integers(0, 2**31 - 1),
            st.integers(0, 2**62),
            st.integers(-1, 2**62),
            st.integers(0, 2**62),
        ),
        max_size=4,
    ),
    name=st.text("abcXYZ09._-", min_size=1, max_size=20),
)
def test_the_unvalidated_produce_answers_equal_the_validated_ones(partitions, name) -> None:
    trusted, checked = [], []
    for partition, base_offset, append_ms, start in partitions:
        start = min(start, base_offset)
        trusted.append(
            fast_codec.produce_partition_appended(partition, base_offset, append_ms, start)
        )
        checked.append(
            ProducePartitionResponse(partition, ErrorCode.NONE, base_offset, append_ms, start)
        )
    fast = fast_codec.produce_response_of([(name, trusted)])
    assert fast == ProduceResponse((ProduceTopicResponse(name, tuple(checked)),))
    for version in (0, 1):
        assert codec.encode_response(fast, version) == codec.encode_response(
            ProduceResponse((ProduceTopicResponse(name, tuple(checked)),)), version
        )
    for one, expected in zip(trusted, checked):  # the one-partition answer's builder
        alone = fast_codec.produce_response_of_one(name, one)
        assert alone == ProduceResponse((ProduceTopicResponse(name, (expected,)),))


def _response_body(response: ProduceResponse, version: int) -> object:
    payload = codec.encode_response(response, version)
    return msgpack.unpackb(payload, raw=False, use_list=False, strict_map_key=False)[2]


@settings(max_examples=150)
@given(response=struct_strategy(ProduceResponse), version=st.sampled_from([0, 1]))
def test_fast_produce_response_decoding_equals_the_generic_one(
    response: ProduceResponse, version: int
) -> None:
    try:
        body = _response_body(response, version)
    except LocalProtocolError:
        return  # a v1 field set at v0: not sendable, nothing to decode
    fast = fast_codec.decode_produce_response(body, version)
    generic = codec.struct_from_wire(ProduceResponse, body, version)
    plain = all(topic.name.isascii() and all(
        p.error_message is None or p.error_message.isascii() for p in topic.partitions)
        for topic in response.topics)
    if plain:
        assert fast == generic
        assert all(type(p.error_code) is ErrorCode for t in fast.topics for p in t.partitions)
    else:
        assert fast is None or fast == generic
    assert codec.decode_response(codec.encode_response(response, version)) == generic


def _good_response_body() -> dict[str, object]:
    return {"topics": ({"name": "t", "partitions": ({
        "partition": 0, "error_code": 0, "base_offset": 5, "log_append_time_ms": -1,
        "log_start_offset": 0, "error_message": None, "duplicate": False},)},),
        "throttle_time_ms": 0}


BAD_RESPONSE_BODIES = [
    (("throttle_time_ms",), -1),
    (("throttle_time_ms",), _MISSING),
    (("topics",), [1]),
    (("topics", 0), "topic"),
    (("topics", 0, "name"), None),
    (("topics", 0, "name"), "n" * 10_000),
    (("topics", 0, "partitions"), ()),  # valid: the fast path must accept it
    (("topics", 0, "partitions", 0), 3),
    (("topics", 0, "partitions", 0, "partition"), 2**31),
    (("topics", 0, "partitions", 0, "partition"), True),
    (("topics", 0, "partitions", 0, "base_offset"), 2**63),
    (("topics", 0, "partitions", 0, "base_offset"), _MISSING),
    (("topics", 0, "partitions", 0, "error_code"), 2**31),
    (("topics", 0, "partitions", 0, "error_code"), 9999),  # valid: UNKNOWN_SERVER_ERROR
    (("topics", 0, "partitions", 0, "error_code"), 1.0),
    (("topics", 0, "partitions", 0, "error_message"), 7),
    (("topics", 0, "partitions", 0, "error_message"), _MISSING),
    (("topics", 0, "partitions", 0, "error_message"), "e" * 100_000),
    (("topics", 0, "partitions", 0, "duplicate"), 1),
    (("topics", 0, "partitions", 0, "duplicate"), _MISSING),
]


def _response_with(path: tuple[object, ...], value: object) -> dict[str, object]:
    def rebuild(node: object, rest: tuple[object, ...]) -> object:
        if not rest:
            return value
        head, tail = rest[0], rest[1:]
        if isinstance(node, dict):
            copy = dict(node)
            if tail or value is not _MISSING:
                copy[head] = rebuild(node[head], tail)
            else:
                del copy[head]
            return copy
        items = list(node)  # type: ignore[call-overload]
        items[head] = rebuild(items[head], tail)  # type: ignore[index]
        return tuple(items)

    result = rebuild(_good_response_body(), path)
    assert isinstance(result, dict)
    return result


@pytest.mark.parametrize(("path", "value"), BAD_RESPONSE_BODIES)
@pytest.mark.parametrize("version", [0, 1])
def test_bad_response_bodies_go_the_generic_way(path, value, version) -> None:
    body = _response_with(path, value)
    fast = fast_codec.decode_produce_response(body, version)
    try:
        generic = codec.struct_from_wire(ProduceResponse, body, version)
    except RemoteProtocolError:
        assert fast is None
        return
    assert fast == generic  # a valid body takes the fast path (at v0, "duplicate" is ignored)


def test_a_good_response_body_takes_the_fast_path() -> None:
    fast = fast_codec.decode_produce_response(_good_response_body(), 1)
    assert fast == ProduceResponse((ProduceTopicResponse("t", (ProducePartitionResponse(
        0, ErrorCode.NONE, 5, -1, 0),)),))
    failed = _response_with(("topics", 0, "partitions", 0, "error_code"), 9999)
    answer = fast_codec.decode_produce_response(failed, 1).topics[0].partitions[0]
    assert answer.error_code is ErrorCode.UNKNOWN_SERVER_ERROR


_ONE_PARTITION_PARTS = {
    "name": st.one_of(st.text(max_size=300), st.integers(), st.none()),
    "partition": st.one_of(st.integers(-(2**32), 2**32), st.booleans(), st.text(max_size=2)),
    "records": st.one_of(st.binary(max_size=8), st.text(max_size=4), st.none()),
}


@settings(max_examples=300)
@given(name=_ONE_PARTITION_PARTS["name"], partition=_ONE_PARTITION_PARTS["partition"],
       records=_ONE_PARTITION_PARTS["records"], shape=st.sampled_from(
           ["plain", "list-topics", "two-partitions", "no-partitions", "extra-key"]))
def test_the_one_partition_shortcut_decides_as_the_topic_walk(name, partition, records,
                                                               shape) -> None:
    """``decode_produce``'s shortcut for one topic of one partition gives what the walk
    (``decode_topics``) gives, and the generic decoder decides the same, for generated bodies
    plain and odd."""
    part = {"partition": partition, "records": records}
    topic: dict[str, object] = {"name": name, "partitions": (part,)}
    if shape == "two-partitions":
        topic["partitions"] = (part, {"partition": 1, "records": b"y"})
    elif shape == "no-partitions":
        topic["partitions"] = ()
    elif shape == "extra-key":
        topic["other"] = 1
    topics: object = [topic] if shape == "list-topics" else (topic,)
    short = fast_codec._one_partition(topics)
    walked = fast_codec.decode_topics(
        topics, fast_codec._TOPICS_MAX, fast_codec._NAME_BYTES_MAX, fast_codec._PARTITIONS_MAX,
        fast_codec._partition, ProduceTopic)
    if short is not None:
        assert short == walked
    body = {"acks": 1, "timeout_ms": 100, "topics": topics, "transactional_id": None}
    fast = fast_codec.decode_produce(body, 1)
    try:
        generic = codec.struct_from_wire(Produce, body, 1)
    except RemoteProtocolError:
        assert fast is None
        return
    assert fast is None or fast == generic
    if shape == "plain" and walked is not None:
        assert short is not None and fast == generic
