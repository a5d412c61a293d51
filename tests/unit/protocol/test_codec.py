"""The msgpack codec: every message round-trips, and every malformed payload is refused.

Method: Hypothesis generates valid instances of every request and response (strategies derive
them from the declared field kinds) and checks ``decode(encode(m)) == m``. Malformed input is
tried class by class (truncation, trailing bytes, wrong envelope, unknown api, unsupported
version, missing fields, wrong types, out-of-range ints, bad UTF-8, ext types, size bounds),
and then blindly: arbitrary bytes, arbitrary msgpack values in every field, and single-byte
mutations of valid payloads. The property in every case: the decoder returns a valid message
or raises ``RemoteProtocolError`` with the documented code, never anything else.
"""

from __future__ import annotations

import gc
import os
from typing import Any, ClassVar

import attrs
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rivven_broker.file_region import FileRegion
from rivven_broker.protocol import codec, limits
from rivven_broker.protocol.errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from rivven_broker.protocol.message_base import ApiKey, Request, i32, text
from rivven_broker.protocol.messages import (
    REQUEST_TYPES,
    CreateTopic,
    DeleteTopic,
    ErrorResponse,
    Fetch,
    FetchPartitionResponse,
    FetchResponse,
    FetchTopicResponse,
    Ping,
    Pong,
    Produce,
    ProducePartition,
    ProduceTopic,
)

from .strategies import REQUEST_CLASSES, RESPONSE_CLASSES, any_request, struct_strategy

INVALID = ErrorCode.INVALID_REQUEST
UNSUPPORTED = ErrorCode.UNSUPPORTED_VERSION


def _refused(payload: bytes, code: ErrorCode, *, response: bool = False) -> str:
    decode = codec.decode_response if response else codec.decode_request
    with pytest.raises(RemoteProtocolError) as info:
        decode(payload)
    assert info.value.code == code, str(info.value)
    return str(info.value)


def _decodes_or_refuses(payload: bytes) -> None:
    for decode in (codec.decode_request, codec.decode_response):
        try:
            decode(payload)
        except RemoteProtocolError as exc:
            assert exc.code in (INVALID, UNSUPPORTED)


def _raw(api_key: Any, version: Any, body: Any) -> bytes:
    return msgpack.packb([api_key, version, body])


# --- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize("cls", REQUEST_CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_request_round_trips(cls, data):
    request = data.draw(struct_strategy(cls))
    payload = codec.encode_request(request)
    assert codec.decode_request(payload) == request
    assert codec.decode_request_and_version(payload) == (request, cls.VERSIONS[1])


@pytest.mark.parametrize("cls", RESPONSE_CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_response_round_trips(cls, data):
    response = data.draw(struct_strategy(cls))
    payload = codec.encode_response(response)
    assert codec.decode_response(payload) == response
    assert codec.decode_response_and_version(payload)[1] == cls.VERSIONS[1]


def test_payload_layout_is_api_key_version_body():
    payload = codec.encode_request(DeleteTopic("orders"))
    assert msgpack.unpackb(payload) == [int(ApiKey.DELETE_TOPIC), 0, {"name": "orders"}]
    assert codec.encode_request(Ping()) == bytes.fromhex("93 01 00 80")


def test_records_travel_as_bin_by_reference_and_once():
    records = bytes(range(256)) * 4096  # 1 MiB
    response = FetchResponse(
        topics=(FetchTopicResponse("t", (FetchPartitionResponse(0, records=records),)),)
    )
    parts = codec.encode_parts(response)
    assert any(part is records for part in parts)  # not copied by the codec
    assert codec.decode_response(b"".join(parts)) == response
    request = Produce(topics=(ProduceTopic("t", (ProducePartition(0, records),)),))
    parts = codec.encode_parts(request)
    assert any(part is records for part in parts)
    decoded = codec.decode_request(b"".join(parts))
    assert decoded.topics[0].partitions[0].records == records
    assert type(decoded.topics[0].partitions[0].records) is bytes


def test_encoding_records_leaves_no_reference_cycle():
    """A cycle would keep each answer's record bytes alive until the cyclic collector runs:
    hundreds of MiB of fetch answers, and fresh pages for every next one."""
    records = bytes(1 << 20)
    messages = (
        FetchResponse(topics=(FetchTopicResponse("t", (FetchPartitionResponse(0, records=records),)),)),
        Produce(topics=(ProduceTopic("t", (ProducePartition(0, records),)),)),
    )
    gc.collect()
    gc.disable()
    try:
        for message in messages:
            codec.encode_parts(message)
        assert gc.collect() == 0  # nothing was left for the collector: freed when dropped
    finally:
        gc.enable()


def test_memoryview_records_encode_like_bytes():
    records = b"\x07" * 5000
    view = memoryview(bytearray(records))
    by_bytes, by_view = (
        codec.encode_request(Produce(topics=(ProduceTopic("t", (ProducePartition(0, r),)),)))
        for r in (records, view)
    )
    assert by_bytes == by_view


def test_encoding_refuses_wrong_direction_and_versions():
    with pytest.raises(LocalProtocolError):
        codec.encode_request(Pong())  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError):
        codec.encode_response(Ping())  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError) as info:
        codec.encode_request(Ping(), version=1)
    assert info.value.code == UNSUPPORTED


# --- malformed input, class by class ---------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(request=any_request(), data=st.data())
def test_every_truncation_is_invalid(request, data):
    payload = codec.encode_request(request)
    cut = data.draw(st.integers(0, len(payload) - 1))
    _refused(payload[:cut], INVALID)


@settings(max_examples=30, deadline=None)
@given(request=any_request(), tail=st.binary(min_size=1, max_size=8))
def test_trailing_bytes_are_invalid(request, tail):
    _refused(codec.encode_request(request) + tail, INVALID)


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        msgpack.packb({"api_key": 1}),
        msgpack.packb([1, 0]),
        msgpack.packb([1, 0, {}, 4]),
        _raw("1", 0, {}),
        _raw(1, "0", {}),
        _raw(1.0, 0, {}),
        _raw(True, 0, {}),
        _raw(1, 0, []),
        _raw(1, 0, None),
        _raw(1, 0, b"\x80"),
    ],
)
def test_bad_envelopes_are_invalid(payload):
    _refused(payload, INVALID)
    _refused(payload, INVALID, response=True)


@pytest.mark.parametrize("api_key", [15, 18, 19, 99, 2**40, -1])
def test_unknown_request_api_keys_are_unsupported(api_key):
    message = _refused(_raw(api_key, 0, {}), UNSUPPORTED)
    assert str(api_key) in message


def test_error_response_is_a_response_only():
    payload = codec.encode_response(ErrorResponse(ErrorCode.NOT_LEADER, "moved"))
    assert codec.decode_response(payload) == ErrorResponse(ErrorCode.NOT_LEADER, "moved")
    _refused(payload, UNSUPPORTED)


@pytest.mark.parametrize("version", [1, 2, -1, 2**63])
def test_unsupported_versions(version):
    _refused(_raw(int(ApiKey.PING), version, {}), UNSUPPORTED)
    _refused(_raw(int(ApiKey.PING), version, {}), UNSUPPORTED, response=True)


@pytest.mark.parametrize(
    "body",
    [
        {},  # name missing
        {"name": 7},
        {"name": b"orders"},  # bin where str is meant
        {"name": None},
        {"name": "x" * (limits.wire_name_bytes_max + 1)},
        {"name": "é" * (limits.wire_name_bytes_max // 2 + 1)},  # chars fit, bytes do not
    ],
)
def test_bad_fields_are_invalid(body):
    _refused(_raw(int(ApiKey.DELETE_TOPIC), 0, body), INVALID)


def _produce_body(**changes: Any) -> dict[str, Any]:
    produce = Produce(topics=(ProduceTopic("t", (ProducePartition(0, b"r"),)),))
    body = codec.struct_to_wire(produce, 0)
    body.update(changes)
    return body


@pytest.mark.parametrize(
    "changes",
    [
        {"acks": 2},
        {"acks": True},
        {"acks": 1.0},
        {"timeout_ms": -1},
        {"timeout_ms": 2**31},
        {"timeout_ms": 2**64 - 1},
        {"topics": {}},
        {"topics": [1]},
        {"topics": [{"name": "t"}]},  # partitions missing
        {"topics": [{"name": "t", "partitions": [{"partition": 0, "records": "text"}]}]},
        {"topics": [{"name": "t", "partitions": [{"partition": 2**31, "records": b""}]}]},
        {"topics": [{"name": "t", "partitions": [[0, b""]]}]},
        {"transactional_id": 5},
    ],
)
def test_bad_produce_fields_are_invalid(changes):
    _refused(_raw(int(ApiKey.PRODUCE), 0, _produce_body(**changes)), INVALID)


@pytest.mark.parametrize(
    "changes",
    [{"isolation_level": 2}, {"max_bytes": -1}, {"min_bytes": -5}, {"max_wait_ms": "1"}],
)
def test_bad_fetch_fields_are_invalid(changes):
    body = codec.struct_to_wire(Fetch(), 0)
    body.update(changes)
    _refused(_raw(int(ApiKey.FETCH), 0, body), INVALID)


def test_unknown_keys_are_ignored():
    body = {"name": "orders", "added_in_the_future": [1, 2, {"x": b"y"}], 7: "non-str key"}
    assert codec.decode_request(_raw(int(ApiKey.DELETE_TOPIC), 0, body)) == DeleteTopic("orders")


def test_size_bounds_apply_while_unpacking():
    too_many = list(range(limits.list_length_max + 1))
    body = {"topics": too_many, "allow_auto_topic_creation": False}
    _refused(_raw(int(ApiKey.METADATA), 0, body), INVALID)
    long_string = "x" * 5000  # over every string bound: refused by the unpacker itself
    _refused(_raw(int(ApiKey.DELETE_TOPIC), 0, {"name": long_string}), INVALID)
    ext = msgpack.packb([int(ApiKey.DELETE_TOPIC), 0, {"name": msgpack.ExtType(1, b"x")}])
    _refused(ext, INVALID)
    bad_utf8 = bytes.fromhex("93 04 00 81 a4") + b"name" + bytes.fromhex("a2 ff fe")
    _refused(bad_utf8, INVALID)
    deep = b"\x91" * 5000 + b"\xc0"
    _refused(deep, INVALID)


def test_configs_maps_are_checked():
    body = codec.struct_to_wire(CreateTopic("t"), 0)
    for configs in ({"k": 1}, {1: "v"}, {"k": None}, ["k", "v"]):
        _refused(_raw(int(ApiKey.CREATE_TOPIC), 0, {**body, "configs": configs}), INVALID)


def test_handshake_response_version_map_is_checked():
    base = {"error_code": 0, "server_version": 1, "compatible": True, "message": ""}
    for versions in ({0: (2, 1)}, {0: (0,)}, {0: [0, 1]}, {"0": (0, 1)}, {0: (0, 2**16)}):
        payload = _raw(0, 0, {**base, "api_versions": versions})
        if versions == {0: [0, 1]}:  # arrays decode as tuples: this one is fine
            assert codec.decode_response(payload).api_versions == {0: (0, 1)}
            continue
        _refused(payload, INVALID, response=True)


def test_unknown_error_numbers_read_as_unknown_server_error():
    payload = _raw(int(ApiKey.ERROR), 0, {"error_code": 31337, "message": "?"})
    assert codec.decode_response(payload).error_code == ErrorCode.UNKNOWN_SERVER_ERROR
    for bad in ("x", 2**40, None):
        body = {"error_code": bad, "message": ""}
        _refused(_raw(int(ApiKey.ERROR), 0, body), INVALID, response=True)


# --- versioning rules, on a test-only message with a field added in version 1 ---------------


@attrs.frozen
class _Evolving(Request):
    API_KEY: ClassVar[ApiKey] = ApiKey.PING
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)
    name: str = text(10)
    extra: int = i32(-1, since=1)


def test_fields_added_later_are_omitted_and_defaulted():
    assert codec.struct_to_wire(_Evolving("a", 5), 1) == {"name": "a", "extra": 5}
    assert codec.struct_to_wire(_Evolving("a"), 0) == {"name": "a"}
    assert codec.struct_from_wire(_Evolving, {"name": "a"}, 0) == _Evolving("a", -1)
    assert codec.struct_from_wire(_Evolving, {"name": "a", "extra": 5}, 0) == _Evolving("a", -1)
    assert codec.struct_from_wire(_Evolving, {"name": "a", "extra": 5}, 1) == _Evolving("a", 5)
    with pytest.raises(RemoteProtocolError) as info:
        codec.struct_from_wire(_Evolving, {"name": "a"}, 1)
    assert info.value.code == INVALID
    with pytest.raises(LocalProtocolError) as local:
        codec.struct_to_wire(_Evolving("a", 5), 0)
    assert local.value.code == UNSUPPORTED
    (payload,) = codec.encode_parts(_Evolving("a", 5), 1)
    assert msgpack.unpackb(payload) == [int(ApiKey.PING), 1, {"name": "a", "extra": 5}]
    (payload,) = codec.encode_parts(_Evolving("a"), 0)
    assert msgpack.unpackb(payload) == [int(ApiKey.PING), 0, {"name": "a"}]


# --- blind fuzzing ---------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_garbage_bytes_never_escape(payload):
    _decodes_or_refuses(payload)


_MSGPACK_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=6) | st.integers(0, 3), children, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_arbitrary_values_in_every_field_never_escape(data):
    """Valid envelope, right field names, arbitrary msgpack values (nested too)."""
    cls = data.draw(st.sampled_from(sorted(REQUEST_TYPES.values(), key=lambda c: c.API_KEY)))
    version = cls.VERSIONS[1]  # the newest: every field of the class is on the wire
    body = codec.struct_to_wire(data.draw(struct_strategy(cls)), version)
    for name in list(body):
        if data.draw(st.booleans()):
            body[name] = data.draw(_MSGPACK_VALUES)
    _decodes_or_refuses(_raw(int(cls.API_KEY), version, body))


@settings(max_examples=300, deadline=None)
@given(request=any_request(), data=st.data())
def test_byte_mutations_never_escape(request, data):
    payload = bytearray(codec.encode_request(request))
    position = data.draw(st.integers(0, len(payload) - 1))
    payload[position] = data.draw(st.integers(0, 255))
    _decodes_or_refuses(bytes(payload))


@pytest.mark.parametrize("size", [3, 100_000])  # a region goes by reference whatever its size
def test_a_file_region_in_a_fetch_answer_is_a_piece_of_its_own(tmp_path, size):
    data = bytes(range(256)) * (size // 256 + 1)
    path = tmp_path / "segment"
    path.write_bytes(data)
    handle = os.open(path, os.O_RDONLY)
    region = FileRegion.of(handle, 1, size)
    os.close(handle)

    def answer(records) -> FetchResponse:
        part = FetchPartitionResponse(0, ErrorCode.NONE, 5, 5, 0, records)
        return FetchResponse(ErrorCode.NONE, (FetchTopicResponse("t", (part,)),))

    parts = codec.encode_parts(answer(region))
    assert [part for part in parts if type(part) is FileRegion] == [region]
    expected = codec.encode_response(answer(data[1 : 1 + size]))
    assert codec.encode_response(answer(region)) == expected  # read in where it must be bytes
    decoded = codec.decode_response(expected)
    assert decoded.topics[0].partitions[0].records == data[1 : 1 + size]
    region.close()


def test_every_request_that_names_partitions_refuses_a_repeated_one():
    """Each request whose topics are name + partitions: a partition named twice, in one topic
    entry or across two entries of the same topic, is INVALID_REQUEST; distinct ones pass."""
    from rivven_broker.protocol.codec import PARTITIONED_REQUESTS, repeated_partition
    from rivven_broker.protocol.message_base import field_kind

    names = sorted(cls.__name__ for cls in PARTITIONED_REQUESTS)
    assert names == ["AddPartitionsToTxn", "DeleteRecords", "DescribeLogDirs", "Fetch",
                     "ListOffsets", "OffsetCommit", "OffsetFetch", "OffsetsForLeaderEpoch",
                     "Produce", "TxnOffsetCommit"]
    for cls in PARTITIONED_REQUESTS:
        topic_cls = field_kind(attrs.fields_dict(cls)["topics"]).cls
        part_kind = field_kind(attrs.fields_dict(topic_cls)["partitions"])

        def part(number, part_kind=part_kind):
            if part_kind.tag == "ints":
                return number
            return _minimal(part_kind.cls, partition=number)

        def request(*topics, cls=cls, topic_cls=topic_cls):
            built = tuple(_minimal(topic_cls, name=name, partitions=tuple(part(n) for n in ns))
                          for name, ns in topics)
            return _minimal(cls, topics=built)

        for bad in (request(("a", (0, 1, 0))), request(("a", (0,)), ("b", (0,)), ("a", (0,)))):
            assert repeated_partition(bad) == ("a", 0)
            with pytest.raises(RemoteProtocolError) as raised:
                codec.decode_request(codec.encode_request(bad))
            assert raised.value.code == ErrorCode.INVALID_REQUEST
        good = request(("a", (0, 1)), ("b", (0,)))
        assert repeated_partition(good) is None
        assert codec.decode_request(codec.encode_request(good)) == good


def _minimal(cls, **given_fields):
    """An instance of ``cls`` with ``given_fields`` and the simplest valid value elsewhere."""
    from rivven_broker.protocol.message_base import field_kind

    values = dict(given_fields)
    for field in attrs.fields(cls):
        if field.name in values or field.default is not attrs.NOTHING:
            continue
        kind = field_kind(field)
        simplest = {"int": kind.choices[0] if kind.choices else max(kind.lo, min(0, kind.hi)),
                    "bool": False, "str": "x", "bin": b"", "error_code": ErrorCode.NONE,
                    "structs": (), "ints": (), "strs": (), "str_map": {}, "version_map": {}}
        values[field.name] = simplest[kind.tag]
    return cls(**values)
