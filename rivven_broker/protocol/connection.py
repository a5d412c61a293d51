"""Sans-I/O connection cores: the server's and the client's side of one connection.

Theory of operation
-------------------
As in h11, a connection core is a state machine fed bytes and asked for events; it owns no
socket, no clock and no task. The trio broker, the blocking client, the trio client and the
simulator all drive these same two classes, so the rules below hold everywhere:

- Requests are pipelined; responses come back in request order, each in its request's
  correlation id and at its request's version. Produce with acks=0 gets no response at all.
- ``ServerConnection`` turns frames into ``RequestReceived`` or ``BadRequest`` events and
  remembers which requests await an answer (in order). ``send_response`` / ``send_error``
  must answer the oldest one; that is checked (LocalProtocolError), not hoped.
- Bad input is answered, not fatal, whenever framing survives: an undecodable payload
  (INVALID_REQUEST), an unknown api or version (UNSUPPORTED_VERSION), a format other than
  msgpack (UNSUPPORTED_FORMAT) each give a non-fatal ``BadRequest`` the server answers with an
  ``ErrorResponse`` in that correlation id. A frame whose length prefix is too large (or too
  small) destroys framing: a fatal ``BadRequest`` in correlation id 0, which the server sends
  as an ``ErrorResponse`` before closing the connection.
- ``next_plain_produce`` takes a produce whose payload has the shape of one this connection
  sent before (``produce_shape.py``: same topic, partition, acks, time-out and version; only
  the records differ) without decoding it: the produce lane's commonest request. Anything
  else is left for ``next_event``, which learns the shape from a produce it decodes after a
  match was asked for and failed (a connection never asked pays nothing for it).
- ``ClientConnection`` numbers requests (u32, wrapping, never 0: correlation id 0 is the
  server's connection-level error channel), remembers the in-flight order and pairs each
  response with its request. A response out of order, of the wrong api, undecodable, or in a
  format other than msgpack breaks the connection: ``RemoteProtocolError``, raised again on
  every later call; the driver closes, fails what was in flight and reconnects.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, NamedTuple

import attrs

from rivven_broker.protocol import codec, fast_codec, limits
from rivven_broker.protocol.errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from rivven_broker.protocol.framing import (
    FORMAT_MSGPACK,
    FrameDecoder,
    FramePieces,
    describe_format,
    encode_frame_parts,
    encode_small_msgpack_frame,
)
from rivven_broker.protocol.message_base import Request, Response
from rivven_broker.protocol.messages import ErrorResponse, Produce, ProduceResponse
from rivven_broker.protocol.produce_shape import Learner, ProduceShape

__all__ = [
    "RequestReceived",
    "BadRequest",
    "ResponseReceived",
    "ServerConnection",
    "ClientConnection",
    "CONNECTION_ERROR_CORRELATION_ID",
]

#: The correlation id of a connection-level error the server sends before closing.
CONNECTION_ERROR_CORRELATION_ID = 0
_U32_MAX = 0xFFFF_FFFF


def _clip(text: str, bytes_max: int = limits.error_message_bytes_max) -> str:
    """``text`` as valid UTF-8 of at most ``bytes_max`` bytes, cut on a character boundary."""
    data = text.encode("utf-8", "replace")
    return data[:bytes_max].decode("utf-8", "ignore")


class RequestReceived(NamedTuple):
    """A decoded request. Answer it with ``send_response`` unless it expects no response.
    (Frozen as the other events are; a tuple because one is made per request: a frozen
    attrs class costs ~2.5x as much to build.)"""

    correlation_id: int
    request: Request
    api_version: int


@attrs.frozen
class BadRequest:
    """A request that cannot be handled. Answer it with ``send_error(correlation_id,
    error_code, message)``; when ``fatal``, close the connection after sending that."""

    correlation_id: int
    error_code: ErrorCode
    message: str
    fatal: bool


@attrs.frozen
class ResponseReceived:
    """A response (or an ``ErrorResponse``) paired with the request it answers."""

    correlation_id: int
    request: Request
    response: Response


class _Pending(NamedTuple):
    correlation_id: int
    api_key: int | None  # None: a BadRequest, answerable only with an ErrorResponse
    api_version: int


#: ``RequestReceived(...)`` and ``_Pending(...)`` without their Python frames (one each per
#: request).
_new_tuple = tuple.__new__
_PRODUCE_KEY = ProduceResponse.API_KEY


class ServerConnection:
    """The broker's side of one client connection. Pure: never blocks, never does I/O.

    With ``reference_bytes_min``, answers keep payload pieces of that many bytes or more (a
    fetch answer's record bytes) by reference, as ``memoryview``s among ``FramePieces``,
    instead of copying them into the frame (``framing.encode_frame_parts``); the writer then
    sends them from their own buffers. Without it an answer is bytes unless it holds a
    ``FileRegion``.
    """

    __slots__ = ("_decoder", "_pending", "_failed", "_reference_bytes_min", "_shapes")

    def __init__(
        self, *, frame_bytes_max: int = limits.frame_bytes_max,
        reference_bytes_min: int | None = None,
    ) -> None:
        self._reference_bytes_min = reference_bytes_min
        self._decoder = FrameDecoder(frame_bytes_max)
        self._pending: deque[_Pending] = deque()
        self._failed = False
        self._shapes = Learner()  # the shape of this client's produces (``produce_shape.py``)

    @property
    def pending_responses(self) -> int:
        """Requests received and not yet answered (acks=0 produce requests not counted)."""
        return len(self._pending)

    @property
    def failed(self) -> bool:
        """True after a fatal ``BadRequest``: send the error, then close."""
        return self._failed

    @property
    def buffered_bytes(self) -> int:
        """Bytes received and not yet turned into events."""
        return self._decoder.buffered_bytes

    @property
    def partial_frame_bytes(self) -> int:
        """Size (header + body) of the frame being received, once its header is in and until
        it is complete; 0 otherwise (between frames, or with only part of a header)."""
        return self._decoder.frame_bytes

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Take bytes from the socket. Does not block or raise; ignored after a fatal error."""
        self._decoder.feed(data)

    def next_event(self) -> RequestReceived | BadRequest | None:
        """The next event, or None when more data is needed (or after a fatal error).

        Never raises for bad input: every problem becomes a ``BadRequest``.
        """
        if self._failed:
            return None
        try:
            frame = self._decoder.next_frame()
        except RemoteProtocolError as exc:
            self._failed = True
            return BadRequest(CONNECTION_ERROR_CORRELATION_ID, exc.code, _clip(str(exc)), True)
        if frame is None:
            return None
        correlation_id = frame.correlation_id
        if frame.format != FORMAT_MSGPACK:
            self._pending.append(_Pending(correlation_id, None, 0))
            message = describe_format(frame.format)
            return BadRequest(correlation_id, ErrorCode.UNSUPPORTED_FORMAT, message, False)
        try:
            request, version = codec.decode_request_and_version(frame.payload)
        except RemoteProtocolError as exc:
            self._pending.append(_Pending(correlation_id, None, 0))
            return BadRequest(correlation_id, exc.code, _clip(str(exc)), False)
        if request.expects_response():
            self._pending.append(_new_tuple(_Pending, (correlation_id, request.API_KEY, version)))
        if type(request) is Produce and self._shapes.wanted:
            self._shapes.missed(frame.payload, request, version)
        return _new_tuple(RequestReceived, (correlation_id, request, version))

    def next_plain_produce(self) -> tuple[int, ProduceShape, bytes] | None:
        """The next request, if it is a produce of the shape this connection's produces had
        (``produce_shape.py``): its correlation id, the shape (what it decodes to but for the
        records) and its records, awaiting an answer as ``next_event`` would leave it. None,
        taking nothing, for anything else: ``next_event`` then decodes it. Never raises."""
        shapes = self._shapes
        shape = shapes.shape
        frame = self._decoder.peek_frame()
        if frame is None or self._failed:
            return None
        records = None if shape is None or frame.format != FORMAT_MSGPACK \
            else shape.match(frame.payload)
        if records is None:
            shapes.wanted = True  # (``next_event`` learns from it, if it is a produce)
            return None
        self._decoder.next_frame()
        correlation_id = frame.correlation_id
        self._pending.append(_new_tuple(_Pending, (correlation_id, _PRODUCE_KEY, shape.version)))
        return correlation_id, shape, records

    def send_response(self, correlation_id: int, response: Response) -> bytes | FramePieces:
        """The frame answering the oldest pending request, which must be ``correlation_id``:
        bytes, or ``FramePieces`` when the response holds a ``FileRegion`` (a fetch answer
        naming record bytes in a segment file) or, with ``reference_bytes_min``, a piece
        kept by reference (see the class docstring and ``framing.encode_frame_parts``).

        ``response`` must be of the request's api (encoded at the request's version) or an
        ``ErrorResponse``. After a fatal error, an ``ErrorResponse`` in correlation id 0 is
        also accepted. Does not block.

        Raises:
            LocalProtocolError: out of order, unknown correlation id, wrong response type
                (INVALID_REQUEST), or a response too large for a frame (MESSAGE_TOO_LARGE).
        """
        is_error = type(response) is ErrorResponse
        if (
            self._failed
            and is_error
            and correlation_id == CONNECTION_ERROR_CORRELATION_ID
            and not (self._pending and self._pending[0].correlation_id == correlation_id)
        ):
            return self._frame(correlation_id, response, None)
        if not self._pending or self._pending[0].correlation_id != correlation_id:
            oldest = self._pending[0].correlation_id if self._pending else None
            raise LocalProtocolError(
                f"response to correlation id {correlation_id} but the oldest pending is {oldest}"
            )
        pending = self._pending[0]
        if not is_error and int(response.API_KEY) != pending.api_key:
            raise LocalProtocolError(
                f"{type(response).__name__} does not answer api {pending.api_key}"
            )
        if type(response) is ProduceResponse:  # the hot path: a template's answer, if it fits
            payload = fast_codec.produce_answer_payload(response, pending.api_version)
            if payload is not None:
                self._pending.popleft()
                return encode_small_msgpack_frame(correlation_id, payload)
        data = self._frame(correlation_id, response, None if is_error else pending.api_version)
        self._pending.popleft()
        return data

    def send_payload(self, correlation_id: int,
                     payload_of: Callable[[int], bytes | None]) -> bytes | None:
        """The frame answering the oldest pending request, ``correlation_id``, with the
        payload ``payload_of(version)`` gives at the request's version (a produce answer from
        its template, ``fast_codec.produce_appended_payload``); None, and nothing answered,
        when it gives None. Does not block.

        Raises:
            LocalProtocolError: out of order or unknown correlation id, or not a produce.
        """
        pending = self._pending[0] if self._pending else None
        if pending is None or pending.correlation_id != correlation_id \
                or pending.api_key != _PRODUCE_KEY:
            raise LocalProtocolError(
                f"a produce answer to correlation id {correlation_id} but the oldest pending "
                f"is {pending}")
        payload = payload_of(pending.api_version)
        if payload is None:
            return None
        self._pending.popleft()
        return encode_small_msgpack_frame(correlation_id, payload)

    def send_error(
        self, correlation_id: int, error_code: ErrorCode, message: str = ""
    ) -> bytes | FramePieces:
        """An ``ErrorResponse`` frame (``message`` clipped to fit). Raises as ``send_response``."""
        return self.send_response(correlation_id, ErrorResponse(error_code, _clip(message)))

    def _frame(
        self, correlation_id: int, response: Response, version: int | None
    ) -> bytes | FramePieces:
        if not isinstance(response, Response):
            raise LocalProtocolError(f"{type(response).__name__} is not a response")
        parts = codec.encode_parts(response, version)
        return encode_frame_parts(
            FORMAT_MSGPACK, correlation_id, parts, frame_bytes_max=limits.response_bytes_max,
            reference_bytes_min=self._reference_bytes_min,
        )


@attrs.frozen
class _InFlight:
    correlation_id: int
    request: Request
    api_version: int


class ClientConnection:
    """The client's side of one connection. Pure: never blocks, never does I/O."""

    __slots__ = ("_decoder", "_in_flight", "_next_id", "_in_flight_max", "_error")

    def __init__(
        self,
        *,
        first_correlation_id: int = 1,
        in_flight_max: int = limits.in_flight_requests_per_connection_max,
        frame_bytes_max: int = limits.frame_bytes_max,
    ) -> None:
        assert 1 <= first_correlation_id <= _U32_MAX
        assert in_flight_max >= 1
        self._decoder = FrameDecoder(frame_bytes_max)
        self._in_flight: deque[_InFlight] = deque()
        self._next_id = first_correlation_id
        self._in_flight_max = in_flight_max
        self._error: RemoteProtocolError | None = None

    @property
    def in_flight(self) -> int:
        """Requests sent and awaiting a response (acks=0 produce requests not counted)."""
        return len(self._in_flight)

    @property
    def can_send(self) -> bool:
        """True when ``send_request`` would not refuse for too many requests in flight."""
        return self._error is None and len(self._in_flight) < self._in_flight_max

    @property
    def in_flight_requests(self) -> tuple[tuple[int, Request], ...]:
        """(correlation id, request) of every request in flight, oldest first."""
        return tuple((item.correlation_id, item.request) for item in self._in_flight)

    @property
    def broken(self) -> bool:
        """True once the server broke the protocol; the connection must be closed."""
        return self._error is not None

    def send_request(self, request: Request, api_version: int | None = None) -> tuple[int, bytes]:
        """Encode ``request`` (at ``api_version``, default the newest); return its correlation
        id and frame bytes. Does not block.

        Raises:
            LocalProtocolError: not a request, version not supported (UNSUPPORTED_VERSION),
                too large (MESSAGE_TOO_LARGE), or ``in_flight_max`` requests already in
                flight (THROTTLED).
            RemoteProtocolError: the connection is broken (the error that broke it).
        """
        if self._error is not None:
            raise self._error
        if len(self._in_flight) >= self._in_flight_max:
            raise LocalProtocolError(
                f"{self._in_flight_max} requests already in flight", ErrorCode.THROTTLED
            )
        if not isinstance(request, Request):
            raise LocalProtocolError(f"{type(request).__name__} is not a request")
        version = type(request).VERSIONS[1] if api_version is None else api_version
        parts = codec.encode_parts(request, version)
        correlation_id = self._next_id
        data = encode_frame_parts(FORMAT_MSGPACK, correlation_id, parts)
        assert type(data) is bytes  # requests never carry a FileRegion
        self._next_id = correlation_id + 1 if correlation_id < _U32_MAX else 1
        if request.expects_response():
            self._in_flight.append(_InFlight(correlation_id, request, version))
        return correlation_id, data

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Take bytes from the socket. Does not block or raise."""
        self._decoder.feed(data)

    def receive_buffer(self) -> memoryview | None:
        """Where to ``recv_into`` the rest of a large response body, or None (then
        ``receive_data``); see ``FrameDecoder.receive_buffer``. Does not block."""
        return self._decoder.receive_buffer()

    def received(self, count: int) -> None:
        """``count`` bytes were received into the last ``receive_buffer``. Does not block."""
        self._decoder.received(count)

    @property
    def body_missing(self) -> int:
        """Bytes of the response being received still to come (0 between responses)."""
        return self._decoder.body_missing

    def next_event(self) -> ResponseReceived | None:
        """The next response paired with its request, or None when more data is needed.

        Raises:
            RemoteProtocolError: the server broke the protocol (see the module docstring), or
                sent a connection-level error (its code). Raised again on every later call.
        """
        if self._error is not None:
            raise self._error
        try:
            return self._next_event()
        except RemoteProtocolError as exc:
            self._error = exc
            raise

    def _next_event(self) -> ResponseReceived | None:
        frame = self._decoder.next_frame()
        if frame is None:
            return None
        if frame.format != FORMAT_MSGPACK:
            raise RemoteProtocolError(
                f"response in {describe_format(frame.format)}", ErrorCode.UNSUPPORTED_FORMAT
            )
        correlation_id = frame.correlation_id
        if correlation_id == CONNECTION_ERROR_CORRELATION_ID:
            response = codec.decode_response(frame.payload)
            if type(response) is ErrorResponse and response.error_code != ErrorCode.NONE:
                raise RemoteProtocolError(
                    f"the server closed the connection: {response.message}", response.error_code
                )
            raise RemoteProtocolError("unexpected response in correlation id 0")
        if not self._in_flight or self._in_flight[0].correlation_id != correlation_id:
            expected = self._in_flight[0].correlation_id if self._in_flight else None
            raise RemoteProtocolError(
                f"response in correlation id {correlation_id}, expected {expected}"
            )
        pending = self._in_flight[0]
        response, version = codec.decode_response_and_version(frame.payload)
        if type(response) is not ErrorResponse:
            if response.API_KEY != pending.request.API_KEY or version != pending.api_version:
                raise RemoteProtocolError(
                    f"{type(response).__name__} v{version} does not answer "
                    f"{type(pending.request).__name__} v{pending.api_version}"
                )
        self._in_flight.popleft()
        return ResponseReceived(correlation_id, pending.request, response)
