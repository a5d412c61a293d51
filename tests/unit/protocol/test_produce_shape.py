"""``ProduceShape`` and ``ServerConnection.next_plain_produce`` against the full decoder.

Method: Hypothesis builds one-partition produce requests (topics, partitions, acks, time-outs,
versions, records of every msgpack bin size class) and learns a shape from one of them. The
properties: a payload of the same request with other records matches and yields exactly them,
and the request the shape rebuilds is the full decoder's; and, for any payload at all (other
requests, byte flips, cuts, insertions), whenever ``match`` yields records the full decoder
decodes the payload to the shape's request carrying them, at the shape's version. Then the
connection core: a produce of the learned shape is taken undecoded and answered in order
between requests that are decoded; anything else is left for ``next_event``; a client whose
produces change shape learns again.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rivven_broker.protocol import codec
from rivven_broker.protocol.connection import RequestReceived, ServerConnection
from rivven_broker.protocol.errors import RemoteProtocolError
from rivven_broker.protocol.framing import FORMAT_MSGPACK, FORMAT_POSTCARD, encode_frame
from rivven_broker.protocol.messages import (
    ErrorResponse,
    Fetch,
    FetchPartition,
    FetchTopic,
    Produce,
    ProducePartition,
    ProduceResponse,
    ProduceTopic,
)
from rivven_broker.protocol.produce_shape import LEARN_EVERY_MISSES, ProduceShape

_records = st.one_of(
    st.binary(min_size=0, max_size=300),
    st.integers(250, 70_000).map(lambda size: bytes(range(256)) * (size // 256) + b"r"),
)
_requests = st.builds(
    lambda topic, partition, acks, timeout_ms, records: Produce(
        acks=acks, timeout_ms=timeout_ms,
        topics=(ProduceTopic(topic, (ProducePartition(partition, records),)),)),
    topic=st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=40),
    partition=st.integers(0, 2**31 - 1),
    acks=st.sampled_from([-1, 1]),
    timeout_ms=st.integers(0, 2**31 - 1),
    records=st.binary(min_size=0, max_size=200),
)


def _payload(request: Produce, version: int | None = None) -> bytes:
    payload = codec.encode_request(request) if version is None \
        else codec.encode_request(request, version)
    assert type(payload) is bytes
    return payload


def _with_records(request: Produce, records: bytes) -> Produce:
    [topic] = request.topics
    part = ProducePartition(topic.partitions[0].partition, records)
    return Produce(acks=request.acks, timeout_ms=request.timeout_ms,
                   topics=(ProduceTopic(topic.name, (part,)),))


def _learned(request: Produce) -> ProduceShape:
    payload = _payload(request)
    decoded, version = codec.decode_request_and_version(payload)
    assert decoded == request
    shape = ProduceShape.learn(payload, request, version)
    assert shape is not None
    return shape


def _sound(shape: ProduceShape, payload: bytes) -> bytes | None:
    """``match``, checked against the full decoder whenever it matches."""
    records = shape.match(payload)
    if records is not None:
        decoded, version = codec.decode_request_and_version(payload)
        assert version == shape.version and decoded == shape.request(records)
    return records


@settings(max_examples=200, deadline=None)
@given(request=_requests, records=_records)
def test_the_same_request_with_other_records_matches(request: Produce, records: bytes) -> None:
    shape = _learned(request)
    assert _sound(shape, _payload(_with_records(request, records))) == records
    assert shape.request(request.topics[0].partitions[0].records) == request


@settings(max_examples=200, deadline=None)
@given(request=_requests, other=_requests, records=_records, version=st.sampled_from([0, 1]))
def test_another_request_matches_only_if_it_decodes_to_the_shape(
        request: Produce, other: Produce, records: bytes, version: int) -> None:
    shape = _learned(request)
    _sound(shape, _payload(_with_records(other, records), version))


@settings(max_examples=300, deadline=None)
@given(request=_requests, records=_records, data=st.data())
def test_a_damaged_payload_never_matches_as_something_else(
        request: Produce, records: bytes, data: st.DataObject) -> None:
    shape = _learned(request)
    payload = bytearray(_payload(_with_records(request, records)))
    for _ in range(data.draw(st.integers(1, 3))):
        where = data.draw(st.integers(0, len(payload)))
        change = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if change == "flip" and where < len(payload):
            payload[where] ^= data.draw(st.integers(1, 255))
        elif change == "cut":
            del payload[where:where + data.draw(st.integers(1, 8))]
        else:
            payload[where:where] = data.draw(st.binary(min_size=1, max_size=8))
    try:
        _sound(shape, bytes(payload))
    except RemoteProtocolError:  # the full decoder refused it: then it must not have matched
        assert shape.match(bytes(payload)) is None


def test_no_shape_without_a_cut_the_decoder_confirms() -> None:
    """``learn`` refuses what the lane cannot take, and a cut it cannot prove."""
    plain = Produce(acks=-1, timeout_ms=5, topics=(ProduceTopic("t", (ProducePartition(0, b"r"),)),))
    payload = _payload(plain)
    assert ProduceShape.learn(payload, plain, 1) is not None
    assert ProduceShape.learn(payload, plain, 0) is None  # decodes at another version
    for request in (
        Produce(acks=0, timeout_ms=5, topics=plain.topics),
        Produce(acks=-1, timeout_ms=5, topics=plain.topics, transactional_id="x"),
        Produce(acks=-1, timeout_ms=5, topics=(ProduceTopic("t", (
            ProducePartition(0, b"r"), ProducePartition(1, b"s"))),)),
        _with_records(plain, bytes(5000)),  # too long to be the lane's
    ):
        assert ProduceShape.learn(_payload(request), request, 1) is None
    other = _with_records(plain, b"q")  # records the payload does not hold
    assert ProduceShape.learn(payload, other, 1) is None


def _frame(correlation_id: int, request: object) -> bytes:
    return encode_frame(FORMAT_MSGPACK, correlation_id, codec.encode_request(request))


def _produce(topic: str, records: bytes, partition: int = 0) -> Produce:
    return Produce(acks=-1, timeout_ms=30_000,
                   topics=(ProduceTopic(topic, (ProducePartition(partition, records),)),))


def test_a_learned_produce_is_taken_undecoded_and_answered_in_order() -> None:
    core = ServerConnection()
    fetch = Fetch(topics=(FetchTopic("t", (FetchPartition(0, 0, 1024),)),))
    core.receive_data(_frame(1, _produce("t", b"a" * 80)))
    assert core.next_plain_produce() is None  # nothing learned yet
    first = core.next_event()
    assert type(first) is RequestReceived and first.request == _produce("t", b"a" * 80)
    core.receive_data(_frame(2, _produce("t", b"b" * 90)) + _frame(3, fetch)
                      + _frame(4, _produce("t", b"c" * 70)) + b"\x00\x00")
    correlation_id, shape, records = core.next_plain_produce()  # type: ignore[misc]
    assert (correlation_id, shape.topic, shape.partition, records) == (2, "t", 0, b"b" * 90)
    assert core.next_plain_produce() is None  # a fetch: decoded
    assert core.next_event().request == fetch  # type: ignore[union-attr]
    assert core.next_plain_produce()[0] == 4  # type: ignore[index]
    assert core.next_plain_produce() is None and core.next_event() is None  # a partial frame
    assert core.pending_responses == 4
    answer = ProduceResponse(topics=())
    for correlation_id in (1, 2):
        assert core.send_response(correlation_id, answer)
    core.send_error(3, ErrorResponse(error_code=0, message="").error_code, "")
    assert core.send_response(4, answer) and core.pending_responses == 0


def test_a_client_whose_produces_change_shape_learns_again() -> None:
    core = ServerConnection()
    core.receive_data(_frame(1, _produce("t", b"a" * 80)))
    assert core.next_plain_produce() is None  # (asked, as the lane asks: the first learns)
    core.next_event()
    correlation_id = 2
    for _ in range(LEARN_EVERY_MISSES):  # another partition: decoded, until learned again
        core.receive_data(_frame(correlation_id, _produce("t", b"b" * 80, partition=1)))
        assert core.next_plain_produce() is None
        assert type(core.next_event()) is RequestReceived
        correlation_id += 1
    core.receive_data(_frame(correlation_id, _produce("t", b"c" * 80, partition=1)))
    taken = core.next_plain_produce()
    assert taken is not None and taken[1].partition == 1 and taken[2] == b"c" * 80


def test_a_connection_never_asked_for_a_match_learns_nothing() -> None:
    """A connection its own task reads (never the lane's) pays no learning decode."""
    core = ServerConnection()
    for correlation_id in range(1, 3 * LEARN_EVERY_MISSES):
        core.receive_data(_frame(correlation_id, _produce("t", b"a" * 80)))
        assert type(core.next_event()) is RequestReceived
    core.receive_data(_frame(99, _produce("t", b"b" * 80)))
    assert core.next_plain_produce() is None  # nothing learned; this one is now
    assert type(core.next_event()) is RequestReceived
    core.receive_data(_frame(100, _produce("t", b"c" * 80)))
    assert core.next_plain_produce()[0] == 100  # type: ignore[index]


def test_another_format_or_a_failed_connection_is_never_taken() -> None:
    core = ServerConnection()
    core.receive_data(_frame(1, _produce("t", b"a" * 80)))
    assert core.next_plain_produce() is None
    core.next_event()
    core.receive_data(encode_frame(FORMAT_POSTCARD, 2,
                                   codec.encode_request(_produce("t", b"a" * 80))))
    assert core.next_plain_produce() is None  # the core answers UNSUPPORTED_FORMAT
    assert core.next_event().correlation_id == 2  # type: ignore[union-attr]
    core.receive_data(b"\xff\xff\xff\xff\x01")  # a length past the frame limit: fatal
    assert core.next_event().fatal  # type: ignore[union-attr]
    core.receive_data(_frame(3, _produce("t", b"a" * 80)))
    assert core.next_plain_produce() is None
