"""The wire protocol, sans-I/O: framing, messages, the msgpack codec, connection cores.

Theory of operation
-------------------
Bytes in, events out; messages in, bytes out. Nothing here touches a socket, a clock or a
task, so the trio broker, the blocking and trio clients, the simulator and Hypothesis all
drive the same code. Layers, bottom up: ``framing`` cuts the stream into frames (size limit
checked on the prefix); ``codec`` turns msgpack payloads into validated message objects
(``messages``) and back, versioned and total (every bad input is a ``RemoteProtocolError``
with a documented code); ``connection`` pairs requests with responses and decides what bad
input costs (an error answer, or the connection). ``errors`` and ``limits`` are shared by the
whole broker. The byte-level description is docs/protocol.md.

The package exports each layer's entry points and every message: ``messages.__all__``, itself
built from the lists the message modules keep of their own names.
"""

from rivven_broker.protocol import messages
from rivven_broker.protocol.codec import (
    decode_request,
    decode_request_and_version,
    decode_response,
    decode_response_and_version,
    encode_parts,
    encode_request,
    encode_response,
)
from rivven_broker.protocol.connection import (
    CONNECTION_ERROR_CORRELATION_ID,
    BadRequest,
    ClientConnection,
    RequestReceived,
    ResponseReceived,
    ServerConnection,
)
from rivven_broker.protocol.errors import (
    ErrorCode,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
)
from rivven_broker.protocol.framing import (
    FORMAT_MSGPACK,
    FORMAT_POSTCARD,
    FORMAT_PROTOBUF,
    Frame,
    FrameDecoder,
    encode_frame,
    encode_frame_parts,
)
from rivven_broker.protocol.messages import *  # noqa: F403 (``messages.__all__``)
from rivven_broker.protocol.names import group_id_error, topic_name_error

__all__ = [
    # errors
    "ErrorCode",
    "ProtocolError",
    "LocalProtocolError",
    "RemoteProtocolError",
    # framing
    "FORMAT_POSTCARD",
    "FORMAT_PROTOBUF",
    "FORMAT_MSGPACK",
    "Frame",
    "FrameDecoder",
    "encode_frame",
    "encode_frame_parts",
    # codec
    "encode_request",
    "encode_response",
    "encode_parts",
    "decode_request",
    "decode_response",
    "decode_request_and_version",
    "decode_response_and_version",
    # connection cores
    "ServerConnection",
    "ClientConnection",
    "RequestReceived",
    "BadRequest",
    "ResponseReceived",
    "CONNECTION_ERROR_CORRELATION_ID",
    # names
    "topic_name_error",
    "group_id_error",
    # every message, the registries and the versions a broker speaks
    *messages.__all__,
]
