"""The msgpack codec: messages to payload bytes and back, versioned and total.

Theory of operation
-------------------
A payload (the bytes of a format-0x02 frame after the correlation id) is one msgpack array
``[api_key, api_version, body]``. ``body`` is a map from field name to value; nested parts are
maps too, lists are arrays, record bytes are bin, strings are UTF-8 str, absent optionals nil.

Versions. Each message class declares the (min, max) versions it speaks, and each field the
version that added it (``since``). Encoding at version v writes exactly the fields with
``since <= v`` (a newer field holding a non-default value cannot be sent at an older version:
LocalProtocolError UNSUPPORTED_VERSION). Decoding at version v requires those fields, takes
the default for newer ones, and ignores keys it does not know, so a newer peer's extra fields
do no harm.

Decoding is total: every malformed payload raises ``RemoteProtocolError`` and nothing else.

- not msgpack, truncated, trailing bytes, over a size bound, not ``[int, int, map]``, missing
  or ill-typed field, int out of range, bad UTF-8, ext types: INVALID_REQUEST;
- an api key this side does not know, or a version outside the class's range:
  UNSUPPORTED_VERSION (Kafka answers unknown apis the same way; one code means "this broker
  cannot speak that", whatever the reason);
- a request that names one partition twice (Produce, Fetch, ListOffsets, DeleteRecords,
  OffsetCommit, OffsetFetch, AddPartitionsToTxn, TxnOffsetCommit: every request whose
  ``topics`` are ``name`` + ``partitions``): INVALID_REQUEST for the whole request, so the
  broker acts on none of it (its answer could not say which entry an outcome belongs to).

Unpacking is bounded by ``limits`` (string, bin, array and map sizes; ext types refused), so
a hostile payload cannot make the unpacker allocate more than its own size suggests.

Speed. ``fast_codec`` decodes ``Produce`` and ``ProduceResponse`` and encodes
``ProduceResponse`` without the field walk, ``fast_txn_codec`` decodes ``AddPartitionsToTxn``
and its answer, each falling back to the walk for anything not plainly valid (so errors are
the generic ones).
Produce requests and Fetch responses carry MiBs of record bytes. Decoding uses
msgpack's C unpacker, which copies each bin once into its ``bytes`` object and touches nothing
per record. Encoding messages that carry records (``CARRIES_RECORDS``) returns *parts*: the
msgpack bytes around each large bin, and the bin itself by reference; ``framing
.encode_frame_parts`` then joins them with the frame header in a single copy. A bin may also
be a ``FileRegion`` (the broker's fetch answers: record bytes left in the segment file); it
stays a part of its own, and the frame comes out in pieces for the writer to ``sendfile``.
"""

from __future__ import annotations

import functools
import struct
from typing import Any, Callable, Mapping

import attrs
import msgpack

from rivven_broker.file_region import FileRegion
from rivven_broker.protocol import fast_codec, fast_txn_codec, limits
from rivven_broker.protocol.errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from rivven_broker.protocol.message_base import Message, Request, Response, Struct, field_kind
from rivven_broker.protocol.messages import (
    REQUEST_TYPES,
    RESPONSE_TYPES,
    Produce,
    ProduceResponse,
)
from rivven_broker.protocol.txn_messages import AddPartitionsToTxn, AddPartitionsToTxnResponse

__all__ = [
    "encode_request",
    "encode_response",
    "encode_parts",
    "decode_request",
    "decode_response",
    "decode_request_and_version",
    "decode_response_and_version",
    "struct_to_wire",
    "struct_from_wire",
    "PARTITIONED_REQUESTS",
    "repeated_partition",
]

_STRING_BYTES_MAX = max(
    limits.wire_name_bytes_max,
    limits.error_message_bytes_max,
    limits.client_id_bytes_max,
    limits.config_key_bytes_max,
    limits.config_value_bytes_max,
    limits.host_bytes_max,
)
_UNPACK_OPTIONS: dict[str, Any] = {
    "raw": False,
    "use_list": False,
    "strict_map_key": False,
    "max_str_len": _STRING_BYTES_MAX,
    "max_bin_len": limits.frame_bytes_max,
    "max_array_len": limits.list_length_max,
    "max_map_len": limits.list_length_max,
    "max_ext_len": 0,
}
#: Bins at least this long are passed by reference when packing in parts.
_INLINE_BIN_BYTES_MAX = 2048
_BIN8 = struct.Struct(">BB")
_BIN16 = struct.Struct(">BH")
_BIN32 = struct.Struct(">BI")
_MISSING = object()
Buffer = bytes | bytearray | memoryview
Part = Buffer | FileRegion  # a piece of an encoded payload (see ``encode_parts``)
_DECODE_ERRORS = (ValueError, TypeError, OverflowError, RecursionError, msgpack.UnpackException)


# --- the field walk, driven by the declared field kinds --------------------------------------


@functools.cache
def _plan(cls: type, version: int) -> tuple[tuple[str, bool, type | None, Any], ...]:
    """For each field: (name, carried at this version, element class if nested, default)."""
    plan = []
    for attribute in attrs.fields(cls):
        kind = attribute.metadata["kind"]
        default = attribute.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = default.factory()
        carried = attribute.metadata["since"] <= version
        plan.append((attribute.name, carried, kind.cls, default))
    return tuple(plan)


def struct_to_wire(message: Struct, version: int) -> dict[str, Any]:
    """The msgpack-ready map of ``message`` at ``version`` (nested parts as maps).

    Raises:
        LocalProtocolError: a field newer than ``version`` holds a non-default value
            (UNSUPPORTED_VERSION).
    """
    body: dict[str, Any] = {}
    for name, carried, nested, default in _plan(type(message), version):
        value = getattr(message, name)
        if not carried:
            if value != default:
                raise LocalProtocolError(
                    f"{type(message).__name__}.{name} cannot be sent at version {version}",
                    ErrorCode.UNSUPPORTED_VERSION,
                )
            continue
        if nested is not None:
            value = [struct_to_wire(item, version) for item in value]
        body[name] = value
    return body


def struct_from_wire(cls: type, body: object, version: int) -> Any:
    """Build a ``cls`` from its decoded map at ``version``.

    Raises:
        RemoteProtocolError: not a map, a field missing, or a value the class refuses
            (INVALID_REQUEST).
    """
    if type(body) is not dict:
        raise RemoteProtocolError(f"{cls.__name__}: expected a map, got {type(body).__name__}")
    values: dict[str, Any] = {}
    for name, carried, nested, _default in _plan(cls, version):
        if not carried:
            continue
        value = body.get(name, _MISSING)
        if value is _MISSING:
            raise RemoteProtocolError(f"{cls.__name__}: missing field {name!r}")
        if nested is not None:
            if type(value) is not tuple:
                raise RemoteProtocolError(f"{cls.__name__}.{name}: expected an array")
            value = tuple([struct_from_wire(nested, item, version) for item in value])
        values[name] = value
    try:
        return cls(**values)
    except LocalProtocolError as exc:
        raise RemoteProtocolError(str(exc), exc.code) from None


# --- encoding --------------------------------------------------------------------------------


def _version_for(cls: type[Message], version: int | None) -> int:
    low, high = cls.VERSIONS
    if version is None:
        return high
    if type(version) is not int or not low <= version <= high:
        raise LocalProtocolError(
            f"{cls.__name__} supports versions {low}..{high}, not {version!r}",
            ErrorCode.UNSUPPORTED_VERSION,
        )
    return version


def encode_parts(message: Message, version: int | None = None) -> list[Part]:
    """The payload of ``message`` at ``version`` (default: the newest) as pieces to join.

    Messages carrying records keep their large bins by reference (a ``FileRegion`` bin is a
    piece of its own, never read here); others are one piece.
    Does not block.

    Raises:
        LocalProtocolError: not a message, or ``version`` not supported (UNSUPPORTED_VERSION).
    """
    cls = type(message)
    if not isinstance(message, Message):
        raise LocalProtocolError(f"{cls.__name__} is not a message")
    version = _version_for(cls, version)
    body = None
    if cls is ProduceResponse:  # the hot path; None where the generic walk must decide
        payload = fast_codec.produce_answer_payload(message, version)  # type: ignore[arg-type]
        if payload is not None:
            return [payload]
        body = fast_codec.produce_response_to_wire(message, version)  # type: ignore[arg-type]
    if body is None:
        body = struct_to_wire(message, version)
    envelope = (int(cls.API_KEY), version, body)
    if cls.CARRIES_RECORDS:
        return _pack_parts(envelope)
    return [msgpack.packb(envelope)]


def encode_request(request: Request, version: int | None = None) -> bytes:
    """The payload bytes of ``request``. Raises as ``encode_parts`` (also for non-requests)."""
    if not isinstance(request, Request):
        raise LocalProtocolError(f"{type(request).__name__} is not a request")
    return b"".join(encode_parts(request, version))


def encode_response(response: Response, version: int | None = None) -> bytes:
    """The payload bytes of ``response`` (a ``FileRegion``'s bytes read in). Raises as
    ``encode_parts`` (also for non-responses), and ``OSError`` if a region cannot be read."""
    if not isinstance(response, Response):
        raise LocalProtocolError(f"{type(response).__name__} is not a response")
    return b"".join([part.read() if type(part) is FileRegion else part  # type: ignore[misc]
                     for part in encode_parts(response, version)])


def _bin_header(size: int) -> bytes:
    if size < 0x100:
        return _BIN8.pack(0xC4, size)
    if size < 0x1_0000:
        return _BIN16.pack(0xC5, size)
    return _BIN32.pack(0xC6, size)


def _pack_parts(tree: object) -> list[Part]:
    """msgpack of ``tree`` in pieces: large bins by reference, everything else packed.

    The walk is a module function, not a closure: a recursive closure is a reference cycle
    (the function holds the cell that holds it), and one holding ``parts`` would keep every
    answer's record bytes (MiB per fetch) alive until the cyclic collector ran.
    """
    packer = msgpack.Packer(autoreset=False)
    parts: list[Part] = []
    _walk(tree, packer, parts)
    parts.append(packer.bytes())
    return parts


def _walk(value: object, packer: msgpack.Packer, parts: list[Part]) -> None:
    kind = type(value)
    if kind is dict:
        assert isinstance(value, dict)
        packer.pack_map_header(len(value))
        for key, item in value.items():
            packer.pack(key)
            _walk(item, packer, parts)
    elif kind is list or kind is tuple:
        assert isinstance(value, (list, tuple))
        packer.pack_array_header(len(value))
        for item in value:
            _walk(item, packer, parts)
    elif kind is FileRegion or (
        (kind is bytes or kind is bytearray or kind is memoryview)
        and len(value) >= _INLINE_BIN_BYTES_MAX  # type: ignore[arg-type]
    ):  # by reference (a FileRegion whatever its size: its bytes are not in memory)
        assert isinstance(value, (bytes, bytearray, memoryview, FileRegion))
        parts.append(packer.bytes())
        packer.reset()
        parts.append(_bin_header(len(value)))
        parts.append(value)
    else:
        packer.pack(value)


# --- decoding --------------------------------------------------------------------------------

_FAST_DECODERS: dict[type, Callable[[object, int], Any]] = {
    Produce: fast_codec.decode_produce,
    ProduceResponse: fast_codec.decode_produce_response,
    AddPartitionsToTxn: fast_txn_codec.decode_add_partitions,
    AddPartitionsToTxnResponse: fast_txn_codec.decode_add_partitions_response,
}


def _decode(payload: bytes, types: Mapping[int, type[Message]], what: str) -> tuple[Any, int]:
    try:
        envelope = msgpack.unpackb(payload, **_UNPACK_OPTIONS)
    except _DECODE_ERRORS as exc:
        raise RemoteProtocolError(f"undecodable {what} payload: {exc}"[:200]) from None
    if type(envelope) is not tuple or len(envelope) != 3:
        raise RemoteProtocolError(f"a {what} payload must be [api_key, api_version, body]")
    api_key, version, body = envelope
    if type(api_key) is not int or type(version) is not int:
        raise RemoteProtocolError(f"{what} api key and version must be ints")
    cls = types.get(api_key)
    if cls is None:
        message = f"unknown {what} api key {api_key}"
        raise RemoteProtocolError(message, ErrorCode.UNSUPPORTED_VERSION)
    low, high = cls.VERSIONS
    if not low <= version <= high:
        raise RemoteProtocolError(
            f"{cls.__name__} version {version} is not supported (supported: {low}..{high})",
            ErrorCode.UNSUPPORTED_VERSION,
        )
    message: Any = None
    fast = _FAST_DECODERS.get(cls)
    if fast is not None:  # a hot path; None sends anything not plainly valid the generic way
        message = fast(body, version)
    if message is None:
        try:
            message = struct_from_wire(cls, body, version)
        except RecursionError:  # pragma: no cover - nesting is bounded by the classes
            raise RemoteProtocolError(f"{what} nested too deeply") from None
    if cls in PARTITIONED_REQUESTS:
        repeated = repeated_partition(message)
        if repeated is not None:
            raise RemoteProtocolError(
                f"{cls.__name__} names partition {repeated[1]} of topic {repeated[0]!r} more "
                "than once"
            )
    return message, version


def _names_partitions(cls: type[Message]) -> bool:
    """Whether ``cls`` has ``topics``: structs of ``name`` + ``partitions`` (ints or structs
    with a ``partition`` field)."""
    fields = {field.name: field for field in attrs.fields(cls)}
    topics = fields.get("topics")
    if topics is None or field_kind(topics).tag != "structs":
        return False
    topic_cls = field_kind(topics).cls
    topic_fields = {field.name: field for field in attrs.fields(topic_cls)}
    partitions = topic_fields.get("partitions")
    if "name" not in topic_fields or partitions is None:
        return False
    kind = field_kind(partitions)
    if kind.tag == "ints":
        return True
    return kind.tag == "structs" and "partition" in attrs.fields_dict(kind.cls)


#: The request classes whose ``topics`` name partitions: each partition at most once.
PARTITIONED_REQUESTS = frozenset(
    cls for cls in REQUEST_TYPES.values() if _names_partitions(cls)
)


def repeated_partition(request: Request) -> tuple[str, int] | None:
    """The first (topic, partition) ``request`` names twice, or None. Pure.

    ``request`` must be of a class whose ``topics`` are ``name`` + ``partitions``. A request of
    one topic and one partition (the common produce) costs two length checks.
    """
    topics = request.topics  # type: ignore[attr-defined]
    if len(topics) == 1 and len(topics[0].partitions) < 2:
        return None
    seen: set[tuple[str, int]] = set()
    for topic in topics:
        for item in topic.partitions:
            key = (topic.name, item if type(item) is int else item.partition)
            if key in seen:
                return key
            seen.add(key)
    return None


def decode_request_and_version(payload: bytes | bytearray | memoryview) -> tuple[Request, int]:
    """Decode a request payload; return it with the version it was sent at. Pure.

    Raises:
        RemoteProtocolError: INVALID_REQUEST for any malformed payload, UNSUPPORTED_VERSION
            for an unknown api key or an unsupported version. Never any other exception.
    """
    return _decode(payload, REQUEST_TYPES, "request")


def decode_response_and_version(payload: bytes | bytearray | memoryview) -> tuple[Response, int]:
    """Decode a response payload (``ErrorResponse`` included); raises as the request side."""
    return _decode(payload, RESPONSE_TYPES, "response")


def decode_request(payload: bytes | bytearray | memoryview) -> Request:
    """Decode a request payload. Raises as ``decode_request_and_version``."""
    return _decode(payload, REQUEST_TYPES, "request")[0]


def decode_response(payload: bytes | bytearray | memoryview) -> Response:
    """Decode a response payload. Raises as ``decode_request_and_version``."""
    return _decode(payload, RESPONSE_TYPES, "response")[0]
