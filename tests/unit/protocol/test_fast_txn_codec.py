"""The AddPartitionsToTxn fast paths of the codec agree with the generic field walk.

Method: Hypothesis draws valid ``AddPartitionsToTxn`` requests and answers (from the declared
field kinds) and checks that the fast decoders build an equal message from the same decoded
body as the generic path, and that the broker's unvalidated answer equals the validated one
(and encodes to the same bytes). Hand-made bad bodies must be refused by the fast decoders
(returning None), so the codec's error for them is the generic one.
"""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rivven_broker.protocol import codec, fast_txn_codec
from rivven_broker.protocol.errors import ErrorCode, RemoteProtocolError
from rivven_broker.protocol.txn_messages import (
    AddPartitionsToTxn,
    AddPartitionsToTxnPartitionResponse,
    AddPartitionsToTxnResponse,
    AddPartitionsToTxnTopic,
    AddPartitionsToTxnTopicResponse,
)

from .strategies import struct_strategy


def _body(payload: bytes) -> object:
    return msgpack.unpackb(payload, raw=False, use_list=False, strict_map_key=False)[2]


@settings(max_examples=150)
@given(request=struct_strategy(AddPartitionsToTxn))
def test_fast_request_decoding_equals_the_generic_one(request: AddPartitionsToTxn) -> None:
    body = _body(codec.encode_request(request))
    fast = fast_txn_codec.decode_add_partitions(body, 0)
    generic = codec.struct_from_wire(AddPartitionsToTxn, body, 0)
    assert generic == request
    if request.transactional_id.isascii() and all(t.name.isascii() for t in request.topics):
        assert fast == generic
        assert all(type(t) is AddPartitionsToTxnTopic for t in fast.topics)
    else:
        assert fast is None or fast == generic


@settings(max_examples=150)
@given(response=struct_strategy(AddPartitionsToTxnResponse))
def test_fast_response_decoding_equals_the_generic_one(
        response: AddPartitionsToTxnResponse) -> None:
    body = _body(codec.encode_response(response))
    fast = fast_txn_codec.decode_add_partitions_response(body, 0)
    generic = codec.struct_from_wire(AddPartitionsToTxnResponse, body, 0)
    assert generic == response
    if all(t.name.isascii() for t in response.topics):
        assert fast == generic
        assert all(type(p.error_code) is ErrorCode for t in fast.topics for p in t.partitions)
    else:
        assert fast is None or fast == generic


@settings(max_examples=150)
@given(request=struct_strategy(AddPartitionsToTxn), code=st.sampled_from(list(ErrorCode)))
def test_the_unvalidated_answer_equals_the_validated_one(request, code) -> None:
    fast = fast_txn_codec.add_partitions_response_of(request, code)
    checked = AddPartitionsToTxnResponse(tuple(
        AddPartitionsToTxnTopicResponse(topic.name, tuple(
            AddPartitionsToTxnPartitionResponse(p, code) for p in topic.partitions))
        for topic in request.topics))
    assert fast == checked
    assert codec.encode_response(fast) == codec.encode_response(checked)


def _good_request() -> dict[str, object]:
    return {"transactional_id": "x", "producer_id": 7, "producer_epoch": 0,
            "topics": ({"name": "t", "partitions": (0, 1)},)}


def _good_response() -> dict[str, object]:
    return {"topics": ({"name": "t", "partitions": ({"partition": 0, "error_code": 51},)},)}


_MISSING = object()


def _with(good: dict[str, object], path: tuple[object, ...], value: object) -> dict[str, object]:
    def rebuild(node: object, rest: tuple[object, ...]) -> object:
        head, tail = rest[0], rest[1:]
        if isinstance(node, dict):
            copy = dict(node)
            if tail:
                copy[head] = rebuild(node[head], tail)
            elif value is _MISSING:
                del copy[head]
            else:
                copy[head] = value
            return copy
        items = list(node)  # type: ignore[call-overload]
        items[head] = rebuild(items[head], tail) if tail else value  # type: ignore[index]
        return tuple(items)

    result = rebuild(good, path)
    assert isinstance(result, dict)
    return result


BAD_REQUESTS = [
    (("transactional_id",), None),
    (("transactional_id",), "x" * 10_000),
    (("transactional_id",), _MISSING),
    (("producer_id",), -2),
    (("producer_id",), 2**63),
    (("producer_id",), True),
    (("producer_epoch",), 2**15),
    (("producer_epoch",), 1.0),
    (("topics",), [1]),
    (("topics", 0), "t"),
    (("topics", 0, "name"), 5),
    (("topics", 0, "partitions"), [0]),
    (("topics", 0, "partitions"), ()),  # valid: the fast path must accept it
    (("topics", 0, "partitions", 0), 2**31),
    (("topics", 0, "partitions", 0), -1),  # valid (the coordinator refuses it, not the codec)
    (("topics", 0, "partitions", 0), "0"),
]
BAD_RESPONSES = [
    (("topics",), [1]),
    (("topics", 0), 3),
    (("topics", 0, "name"), None),
    (("topics", 0, "name"), _MISSING),
    (("topics", 0, "partitions", 0), "p"),
    (("topics", 0, "partitions", 0, "partition"), 2**31),
    (("topics", 0, "partitions", 0, "partition"), False),
    (("topics", 0, "partitions", 0, "error_code"), 2**31),
    (("topics", 0, "partitions", 0, "error_code"), 9999),  # valid: UNKNOWN_SERVER_ERROR
    (("topics", 0, "partitions", 0, "error_code"), _MISSING),
]


@pytest.mark.parametrize(("cls", "good", "fast", "path", "value"), [
    *((AddPartitionsToTxn, _good_request, fast_txn_codec.decode_add_partitions, p, v)
      for p, v in BAD_REQUESTS),
    *((AddPartitionsToTxnResponse, _good_response,
       fast_txn_codec.decode_add_partitions_response, p, v) for p, v in BAD_RESPONSES),
])
def test_bad_bodies_go_the_generic_way(cls, good, fast, path, value) -> None:
    body = _with(good(), path, value)
    decoded = fast(body, 0)
    try:
        generic = codec.struct_from_wire(cls, body, 0)
    except RemoteProtocolError:
        assert decoded is None
        return
    # a valid body takes the fast path; a list (the wire's arrays decode as tuples) need not
    assert decoded == generic or (decoded is None and type(value) is list)


def test_good_bodies_take_the_fast_path() -> None:
    request = fast_txn_codec.decode_add_partitions(_good_request(), 0)
    assert request == AddPartitionsToTxn("x", 7, 0, (AddPartitionsToTxnTopic("t", (0, 1)),))
    response = fast_txn_codec.decode_add_partitions_response(_good_response(), 0)
    assert response.topics[0].partitions[0].error_code is ErrorCode.CONCURRENT_TRANSACTIONS
