"""Connection cores: pipelining, ordering, acks=0, and what bad input costs.

Method: a ClientConnection and a ServerConnection are wired back to back through plain byte
strings (no sockets, no trio). Example tests cover each rule of connection.py's docstring:
responses pair with requests in order, acks=0 produce is never registered, correlation ids
wrap and skip 0, the server answers bad formats and payloads without closing but an oversized
frame fatally in correlation id 0, and the client breaks on a mismatched correlation id or api.
A Hypothesis state machine then interleaves sends, partial deliveries in both directions and
answers (responses and errors), checking against a queue model that every response reaches
the request it answers, in order, and that the in-flight counts agree.
"""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rivven_broker.protocol import codec
from rivven_broker.protocol.connection import (
    BadRequest,
    ClientConnection,
    RequestReceived,
    ResponseReceived,
    ServerConnection,
)
from rivven_broker.protocol.errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from rivven_broker.protocol.framing import encode_frame
from rivven_broker.protocol.messages import (
    API_PAIRS,
    DeleteTopic,
    DeleteTopicResponse,
    ErrorResponse,
    Metadata,
    MetadataResponse,
    Ping,
    Pong,
    Produce,
    ProducePartition,
    ProducePartitionResponse,
    ProduceResponse,
    ProduceTopic,
    ProduceTopicResponse,
)

from .strategies import any_request, struct_strategy

RESPONSE_FOR = dict(API_PAIRS)


def msgpack_request(request, version: int) -> bytes:
    return codec.encode_request(request, version)
PING = codec.encode_request(Ping())


def _events(connection) -> list:
    events = []
    while (event := connection.next_event()) is not None:
        events.append(event)
    return events


def _produce(acks: int) -> Produce:
    return Produce(acks=acks, topics=(ProduceTopic("t", (ProducePartition(0, b"batch"),)),))


def test_pipelined_requests_pair_with_their_responses():
    client, server = ClientConnection(), ServerConnection()
    requests = [Ping(), DeleteTopic("a"), Metadata(), _produce(1)]
    wire = b"".join(client.send_request(r)[1] for r in requests)
    assert client.in_flight == 4
    server.receive_data(wire)
    received = _events(server)
    assert [e.request for e in received] == requests
    assert all(isinstance(e, RequestReceived) for e in received)
    assert [e.api_version for e in received] == [type(r).VERSIONS[1] for r in requests]
    assert server.pending_responses == 4
    answers = [Pong(), DeleteTopicResponse("a"), MetadataResponse(), ProduceResponse()]
    back = b"".join(server.send_response(e.correlation_id, a) for e, a in zip(received, answers))
    assert server.pending_responses == 0
    client.receive_data(back)
    events = _events(client)
    assert [(e.request, e.response) for e in events] == list(zip(requests, answers))
    assert [e.correlation_id for e in events] == [1, 2, 3, 4]
    assert client.in_flight == 0


def test_acks_zero_produce_gets_no_response_and_is_not_in_flight():
    client, server = ClientConnection(), ServerConnection()
    _, first = client.send_request(_produce(0))
    ping_id, second = client.send_request(Ping())
    assert client.in_flight == 1 and client.in_flight_requests == ((ping_id, Ping()),)
    server.receive_data(first + second)
    produce_event, ping_event = _events(server)
    assert produce_event.request == _produce(0)
    assert server.pending_responses == 1
    with pytest.raises(LocalProtocolError):  # nobody waits for it
        server.send_response(produce_event.correlation_id, ProduceResponse())
    client.receive_data(server.send_response(ping_event.correlation_id, Pong()))
    assert _events(client)[0].response == Pong()


def test_correlation_ids_wrap_and_skip_zero():
    client = ClientConnection(first_correlation_id=2**32 - 1)
    assert client.send_request(Ping())[0] == 2**32 - 1
    assert client.send_request(Ping())[0] == 1


def test_the_client_limits_requests_in_flight():
    client = ClientConnection(in_flight_max=2)
    client.send_request(Ping())
    client.send_request(_produce(0))  # never in flight, so never counted
    client.send_request(Ping())
    assert not client.can_send
    with pytest.raises(LocalProtocolError) as info:
        client.send_request(Ping())
    assert info.value.code == ErrorCode.THROTTLED


def test_a_failed_encoding_consumes_no_correlation_id():
    client = ClientConnection()
    with pytest.raises(LocalProtocolError):
        client.send_request(Ping(), api_version=5)
    assert client.send_request(Ping())[0] == 1
    assert client.in_flight == 1


@pytest.mark.parametrize("format,word", [(0, "known"), (1, "known"), (7, "unknown")])
def test_other_formats_are_answered_and_the_connection_kept(format, word):
    server = ServerConnection()
    server.receive_data(encode_frame(format, 42, b"\x01\x02") + encode_frame(2, 43, PING))
    bad, good = _events(server)
    assert bad == BadRequest(42, ErrorCode.UNSUPPORTED_FORMAT, bad.message, False)
    assert bad.message.startswith(word) or f" {word} " in bad.message
    assert isinstance(good, RequestReceived) and good.correlation_id == 43
    client = ClientConnection(first_correlation_id=42)
    client.send_request(Ping())
    client.receive_data(server.send_error(42, bad.error_code, bad.message))
    (event,) = _events(client)
    assert event.response == ErrorResponse(ErrorCode.UNSUPPORTED_FORMAT, bad.message)


@pytest.mark.parametrize(
    "payload,code",
    [
        (b"\xc1", ErrorCode.INVALID_REQUEST),
        (b"", ErrorCode.INVALID_REQUEST),
        (codec.encode_request(Ping())[:-1], ErrorCode.INVALID_REQUEST),
        (bytes.fromhex("93 63 00 80"), ErrorCode.UNSUPPORTED_VERSION),  # api 99
        (bytes.fromhex("93 01 05 80"), ErrorCode.UNSUPPORTED_VERSION),  # Ping v5
    ],
)
def test_bad_payloads_are_answered_and_the_connection_kept(payload, code):
    server = ServerConnection()
    server.receive_data(encode_frame(2, 5, payload) + encode_frame(2, 6, PING))
    bad, good = _events(server)
    assert (bad.correlation_id, bad.error_code, bad.fatal) == (5, code, False)
    assert good.request == Ping()
    with pytest.raises(LocalProtocolError):  # only an ErrorResponse answers a bad request
        server.send_response(5, Pong())
    error = codec.decode_response(server.send_error(5, code, bad.message)[9:])
    assert error == ErrorResponse(code, bad.message)
    assert server.send_response(6, Pong())


def test_an_oversized_frame_is_fatal_in_correlation_id_zero():
    server = ServerConnection(frame_bytes_max=1000)
    server.receive_data(encode_frame(2, 3, PING) + (10**6).to_bytes(4, "big") + b"x" * 100)
    ping, fatal = _events(server)
    assert ping.request == Ping()
    assert (fatal.correlation_id, fatal.fatal) == (0, True)
    assert fatal.error_code == ErrorCode.MESSAGE_TOO_LARGE
    assert server.failed and server.next_event() is None and server.buffered_bytes == 0
    answer = server.send_response(3, Pong())  # pending answers may still be flushed
    closing = server.send_error(0, fatal.error_code, fatal.message)
    client = ClientConnection(first_correlation_id=3)
    client.send_request(Ping())
    client.receive_data(answer + closing)
    assert client.next_event().response == Pong()
    for _ in range(2):
        with pytest.raises(RemoteProtocolError) as info:
            client.next_event()
        assert info.value.code == ErrorCode.MESSAGE_TOO_LARGE
    assert client.broken
    with pytest.raises(RemoteProtocolError):
        client.send_request(Ping())


def test_the_server_checks_response_order_and_type():
    client, server = ClientConnection(), ServerConnection()
    server.receive_data(client.send_request(Ping())[1] + client.send_request(DeleteTopic("t"))[1])
    first, second = _events(server)
    with pytest.raises(LocalProtocolError):
        server.send_response(second.correlation_id, DeleteTopicResponse("t"))
    with pytest.raises(LocalProtocolError):
        server.send_response(first.correlation_id, DeleteTopicResponse("t"))
    with pytest.raises(LocalProtocolError):
        server.send_response(999, Pong())
    with pytest.raises(LocalProtocolError):
        server.send_error(0, ErrorCode.INVALID_REQUEST)  # id 0 only after a fatal error
    server.send_response(first.correlation_id, Pong())
    server.send_error(second.correlation_id, ErrorCode.NOT_CONTROLLER, "x" * 10_000)  # clipped


def test_the_client_breaks_on_a_mismatched_correlation_id():
    client = ClientConnection()
    client.send_request(Ping())
    client.send_request(Ping())
    client.receive_data(encode_frame(2, 2, codec.encode_response(Pong())))
    with pytest.raises(RemoteProtocolError) as info:
        client.next_event()
    assert "expected 1" in str(info.value)
    with pytest.raises(RemoteProtocolError):
        client.next_event()
    assert client.broken and not client.can_send


@pytest.mark.parametrize(
    "frame",
    [
        encode_frame(2, 1, codec.encode_response(DeleteTopicResponse("t"))),  # wrong api
        encode_frame(0, 1, codec.encode_response(Pong())),  # not msgpack
        encode_frame(2, 1, b"\xc1"),  # undecodable
        encode_frame(2, 5, codec.encode_response(Pong())),  # nobody asked
        encode_frame(2, 0, codec.encode_response(Pong())),  # id 0 but not an error
    ],
)
def test_the_client_breaks_on_bad_responses(frame):
    client = ClientConnection()
    client.send_request(Ping())
    client.receive_data(frame)
    with pytest.raises(RemoteProtocolError):
        client.next_event()
    assert client.broken


def test_an_error_response_answers_any_request():
    client = ClientConnection()
    client.send_request(Metadata())
    throttled = ErrorResponse(ErrorCode.THROTTLED)
    client.receive_data(encode_frame(2, 1, codec.encode_response(throttled)))
    (event,) = _events(client)
    assert event == ResponseReceived(1, Metadata(), ErrorResponse(ErrorCode.THROTTLED))


class PipelineMachine(RuleBasedStateMachine):
    """Client and server back to back, bytes delivered in arbitrary pieces."""

    def __init__(self) -> None:
        super().__init__()
        self.client = ClientConnection(in_flight_max=8)
        self.server = ServerConnection()
        self.to_server = b""
        self.to_client = b""
        self.sent: deque = deque()  # model: requests awaiting a response, in order
        self.unanswered: deque = deque()  # server events awaiting an answer
        self.answers: deque = deque()  # model: what the server answered, in order

    @precondition(lambda self: self.client.can_send)
    @rule(request=any_request())
    def send(self, request):
        correlation_id, data = self.client.send_request(request)
        self.to_server += data
        if request.expects_response():
            self.sent.append((correlation_id, request))

    @rule(size=st.integers(1, 200))
    def deliver_to_server(self, size):
        piece, self.to_server = self.to_server[:size], self.to_server[size:]
        self.server.receive_data(piece)
        for event in _events(self.server):
            assert isinstance(event, RequestReceived)
            if event.request.expects_response():
                self.unanswered.append(event)

    @precondition(lambda self: self.unanswered)
    @rule(data=st.data(), as_error=st.booleans())
    def answer(self, data, as_error):
        event = self.unanswered.popleft()
        if as_error:
            response = ErrorResponse(ErrorCode.NOT_LEADER, "moved")
        else:
            response = data.draw(struct_strategy(RESPONSE_FOR[type(event.request)]))
        self.to_client += self.server.send_response(event.correlation_id, response)
        self.answers.append(response)

    @rule(size=st.integers(1, 200))
    def deliver_to_client(self, size):
        piece, self.to_client = self.to_client[:size], self.to_client[size:]
        self.client.receive_data(piece)
        for event in _events(self.client):
            correlation_id, request = self.sent.popleft()
            assert (event.correlation_id, event.request) == (correlation_id, request)
            assert event.response == self.answers.popleft()

    @invariant()
    def counts_agree(self):
        assert self.client.in_flight == len(self.sent)
        assert self.server.pending_responses == len(self.unanswered)
        assert not self.client.broken and not self.server.failed


PipelineMachine.TestCase.settings = settings(max_examples=30, stateful_step_count=25, deadline=None)
TestPipeline = PipelineMachine.TestCase


@settings(max_examples=100)
@given(version=st.sampled_from([0, 1]), base_offset=st.integers(0, 2**40),
       error=st.sampled_from([ErrorCode.NONE, ErrorCode.NOT_LEADER]),
       duplicate=st.booleans(), partitions=st.integers(1, 2))
def test_a_produce_answer_frame_from_its_template_is_the_generic_frame(
    version: int, base_offset: int, error: ErrorCode, duplicate: bool, partitions: int
) -> None:
    """``send_response`` takes a one-partition success answer from its template (no generic
    encoding); every answer's frame is byte for byte what the generic encoder makes."""
    request = Produce(topics=(ProduceTopic("t", tuple(
        ProducePartition(index, b"batch") for index in range(partitions))),))
    server = ServerConnection()
    server.receive_data(encode_frame(2, 77, msgpack_request(request, version)))
    (event,) = _events(server)
    assert event.api_version == version
    answers = tuple(
        ProducePartitionResponse(index, error, base_offset if not error else -1, -1,
                                 0 if not error else -1, duplicate=duplicate and version >= 1)
        for index in range(partitions))
    response = ProduceResponse((ProduceTopicResponse("t", answers),))
    frame = server.send_response(77, response)
    assert frame == encode_frame(2, 77, codec.encode_response(response, version))
    assert server.pending_responses == 0
