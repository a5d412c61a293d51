"""Building blocks of the wire messages: api keys, field kinds and validating field constructors.

Theory of operation
-------------------
Every message is a frozen, slotted attrs class whose fields are declared with the constructors
below (``i32()``, ``text(...)``, ``structs(ProducePartition)`` ...). Each constructor does two
things. It attaches one validator that rejects, at construction time, anything the wire cannot
carry (a wrong type, an int outside its width or range, a string or list that is too long, a
string that is not UTF-8) with ``LocalProtocolError(INVALID_REQUEST)``. And it records the
field's ``FieldKind`` and the version that added it (``since``) in the attrs metadata.

Three consumers read those kinds, so they cannot drift apart: the codec (to walk nested
structures and to know which fields a version carries), the tests (to generate every valid
message with Hypothesis) and the docs test (``docs/protocol.md`` must list every field with
the type ``FieldKind.describe`` gives).

Validation is structural only. Semantic rules (is this topic name legal, is this partition
count allowed) are the broker's, answered per item with a specific error code.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, ClassVar, NamedTuple, NoReturn

import attrs

from rivven_broker.file_region import FileRegion
from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode, LocalProtocolError

__all__ = [
    "ApiKey",
    "FieldKind",
    "Struct",
    "Message",
    "Request",
    "Response",
    "I32_MIN",
    "I32_MAX",
    "I64_MIN",
    "I64_MAX",
    "i32",
    "i64",
    "choice",
    "boolean",
    "text",
    "blob",
    "error_code",
    "structs",
    "ints",
    "texts",
    "str_map",
    "version_map",
    "field_kind",
    "field_since",
]

I16_MAX = 2**15 - 1
I32_MIN, I32_MAX = -(2**31), 2**31 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1


class ApiKey(enum.IntEnum):
    """Which request a payload carries. Ranges are reserved for the milestones to come:
    0-19 core, admin and data; 20-39 consumer groups; 40-59 producer ids and transactions;
    60-79 cluster and replication. Numbers never change once released."""

    HANDSHAKE = 0
    PING = 1
    METADATA = 2
    CREATE_TOPIC = 3
    DELETE_TOPIC = 4
    LIST_TOPICS = 5
    DESCRIBE_TOPIC = 6
    ALTER_TOPIC_CONFIG = 7
    PRODUCE = 8
    FETCH = 9
    LIST_OFFSETS = 10
    DELETE_RECORDS = 11
    CREATE_PARTITIONS = 12
    OFFSETS_FOR_LEADER_EPOCH = 13
    DESCRIBE_LOG_DIRS = 14
    ERROR = 19  # responses only: the generic frame-level error answer
    # 20-39: consumer groups (group_messages.py)
    JOIN_GROUP = 20
    SYNC_GROUP = 21
    HEARTBEAT = 22
    LEAVE_GROUP = 23
    OFFSET_COMMIT = 24
    OFFSET_FETCH = 25
    LIST_GROUPS = 26
    DESCRIBE_GROUP = 27
    DELETE_GROUP = 28
    FIND_COORDINATOR = 29
    # 40-59: producer ids and transactions (txn_messages.py)
    INIT_PRODUCER_ID = 40
    ADD_PARTITIONS_TO_TXN = 41
    ADD_OFFSETS_TO_TXN = 42
    TXN_OFFSET_COMMIT = 43
    END_TXN = 44
    # 60-79: cluster and replication (cluster_messages.py)
    DESCRIBE_CLUSTER = 60


class FieldKind(NamedTuple):
    """What a field holds on the wire. ``tag`` is one of: int, bool, str, bin, error_code,
    structs, ints, strs, str_map, version_map."""

    tag: str
    width: str = ""  # int, ints: "i32" or "i64"
    lo: int = 0
    hi: int = 0
    choices: tuple[int, ...] = ()
    bytes_max: int = 0  # str, strs, str_map (keys)
    value_bytes_max: int = 0  # str_map values
    nullable: bool = False  # str, strs: the field may be None; str_map: values may be None
    cls: type | None = None  # structs: the element class
    length_max: int = limits.list_length_max

    def describe(self) -> str:
        """The type as docs/protocol.md writes it."""
        tag = self.tag
        if tag == "int":
            return _describe_int(self)
        if tag == "str":
            return f"str <= {self.bytes_max} B" + (" or nil" if self.nullable else "")
        if tag == "structs":
            assert self.cls is not None
            return f"array of {self.cls.__name__}"
        if tag == "ints":
            return f"array of {self.width}"
        if tag == "strs":
            text = f"array of str <= {self.bytes_max} B"
            return text + (", or nil" if self.nullable else "")
        if tag == "str_map":
            value = f"str <= {self.value_bytes_max} B" + (" or nil" if self.nullable else "")
            return f"map of str <= {self.bytes_max} B to {value}"
        return {
            "bool": "bool",
            "bin": "bin",
            "error_code": "i32 error code",
            "version_map": "map of api key to [min, max]",
        }[tag]


def _describe_int(kind: FieldKind) -> str:
    if kind.choices:
        return f"{kind.width}, one of " + ", ".join(str(c) for c in kind.choices)
    full = (I32_MIN, I32_MAX) if kind.width == "i32" else (I64_MIN, I64_MAX)
    if (kind.lo, kind.hi) == full:
        return kind.width
    if kind.hi == full[1]:
        return f"{kind.width} >= {kind.lo}"
    return f"{kind.width} in [{kind.lo}, {kind.hi}]"


class Struct:
    """Base of every message and nested message part: frozen, slotted, validated attrs."""

    __slots__ = ()


class Message(Struct):
    """A top-level message: one per payload. Subclasses set ``API_KEY`` and ``VERSIONS``."""

    __slots__ = ()
    API_KEY: ClassVar[ApiKey]
    #: The (min, max) versions this code can encode and decode.
    VERSIONS: ClassVar[tuple[int, int]] = (0, 0)
    #: True when the message carries record bytes: the codec then packs it without copying
    #: those bytes (see codec.py).
    CARRIES_RECORDS: ClassVar[bool] = False


class Request(Message):
    """A message a client sends."""

    __slots__ = ()

    def expects_response(self) -> bool:
        """False only for requests the broker never answers (Produce with acks=0)."""
        return True


class Response(Message):
    """A message the broker sends back, in the request's correlation id."""

    __slots__ = ()


# --- validators ------------------------------------------------------------------------------

Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


def _fail(instance: object, attribute: attrs.Attribute[Any], problem: str) -> NoReturn:
    raise LocalProtocolError(f"{type(instance).__name__}.{attribute.name}: {problem}")


def _type_name(value: object) -> str:
    return type(value).__name__


def _is_int(value: object) -> bool:
    return type(value) is int or (isinstance(value, int) and not isinstance(value, bool))


def _int_problem(value: object, lo: int, hi: int, choices: tuple[int, ...]) -> str | None:
    if not _is_int(value):
        return f"expected int, got {_type_name(value)}"
    assert isinstance(value, int)
    if choices:
        return None if value in choices else f"must be one of {choices}"
    if not lo <= value <= hi:
        shown = value if value.bit_length() <= 64 else "a huge int"
        return f"{shown} is outside [{lo}, {hi}]"
    return None


def _str_problem(value: object, bytes_max: int) -> str | None:
    if type(value) is not str:
        return f"expected str, got {_type_name(value)}"
    if len(value) > bytes_max:
        return f"longer than {bytes_max} bytes"
    if value.isascii():
        return None
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return "not encodable as UTF-8"
    return None if size <= bytes_max else f"longer than {bytes_max} bytes"


def _tuple_problem(value: object, length_max: int) -> str | None:
    if type(value) is not tuple:
        return f"expected a tuple, got {_type_name(value)}"
    if len(value) > length_max:
        return f"{len(value)} items exceed the maximum of {length_max}"
    return None


def _check(kind: FieldKind) -> Validator:
    """The one validator of a field of ``kind``."""
    tag = kind.tag

    def check(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        problem = _problem(kind, tag, value)
        if problem is not None:
            _fail(instance, attribute, problem)

    return check


def _problem(kind: FieldKind, tag: str, value: Any) -> str | None:
    """What is wrong with ``value`` for a field of ``kind``, or None."""
    if tag == "int":
        return _int_problem(value, kind.lo, kind.hi, kind.choices)
    if tag == "str":
        return None if value is None and kind.nullable else _str_problem(value, kind.bytes_max)
    if tag == "bool":
        return None if type(value) is bool else f"expected bool, got {_type_name(value)}"
    if tag == "bin":
        return _bin_problem(value)
    if tag == "error_code":
        return None if type(value) is ErrorCode else f"expected an error code, got {value!r:.40}"
    if tag == "structs":
        return _items_problem(value, kind, lambda item: _struct_item_problem(item, kind.cls))
    if tag == "ints":
        return _items_problem(value, kind, lambda item: _int_problem(item, kind.lo, kind.hi, ()))
    if tag == "strs":
        if value is None and kind.nullable:
            return None
        return _items_problem(value, kind, lambda item: _str_problem(item, kind.bytes_max))
    if tag == "str_map":
        return _str_map_problem(value, kind)
    assert tag == "version_map", tag
    return _version_map_problem(value, kind)


def _bin_problem(value: object) -> str | None:
    if type(value) is bytes or type(value) is bytearray or type(value) is FileRegion:
        return None
    if type(value) is memoryview:
        if value.ndim == 1 and value.itemsize == 1 and value.c_contiguous:
            return None
        return "a memoryview must be one-dimensional, contiguous, of bytes"
    return f"expected bytes, got {_type_name(value)}"


def _struct_item_problem(item: object, cls: type | None) -> str | None:
    if type(item) is cls:
        return None
    assert cls is not None
    return f"expected {cls.__name__}, got {_type_name(item)}"


def _items_problem(
    value: object, kind: FieldKind, item_problem: Callable[[Any], str | None]
) -> str | None:
    problem = _tuple_problem(value, kind.length_max)
    if problem is not None:
        return problem
    assert isinstance(value, tuple)
    for index, item in enumerate(value):
        problem = item_problem(item)
        if problem is not None:
            return f"item {index}: {problem}"
    return None


def _str_map_problem(value: object, kind: FieldKind) -> str | None:
    if type(value) is not dict:
        return f"expected a dict, got {_type_name(value)}"
    if len(value) > kind.length_max:
        return f"{len(value)} entries exceed the maximum of {kind.length_max}"
    for key, item in value.items():
        problem = _str_problem(key, kind.bytes_max)
        if problem is not None:
            return f"key: {problem}"
        if item is None and kind.nullable:
            continue
        problem = _str_problem(item, kind.value_bytes_max)
        if problem is not None:
            return f"value of {key!r:.60}: {problem}"
    return None


def _version_map_problem(value: object, kind: FieldKind) -> str | None:
    if type(value) is not dict:
        return f"expected a dict, got {_type_name(value)}"
    if len(value) > kind.length_max:
        return f"{len(value)} entries exceed the maximum of {kind.length_max}"
    for key, item in value.items():
        problem = _int_problem(key, 0, I16_MAX, ())
        if problem is not None:
            return f"api key: {problem}"
        if type(item) is not tuple or len(item) != 2:
            return f"versions of api {key} must be a (min, max) tuple"
        for version in item:
            problem = _int_problem(version, 0, I16_MAX, ())
            if problem is not None:
                return f"versions of api {key}: {problem}"
        if item[0] > item[1]:
            return f"versions of api {key}: min {item[0]} > max {item[1]}"
    return None


# --- converters: lists are accepted where tuples are meant -----------------------------------


def _tuple_of_list(value: Any) -> Any:
    return tuple(value) if type(value) is list else value


def _error_code_of_int(value: Any) -> Any:
    if type(value) is ErrorCode:
        return value
    if _is_int(value) and I32_MIN <= value <= I32_MAX:
        return ErrorCode.from_wire(value)
    return value  # the validator names the problem


# --- field constructors ----------------------------------------------------------------------


def _field(kind: FieldKind, default: Any, since: int, **extra: Any) -> Any:
    assert since >= 0
    assert since == 0 or default is not attrs.NOTHING, "fields added later need a default"
    return attrs.field(
        default=default,
        validator=_check(kind),
        metadata={"kind": kind, "since": since},
        **extra,
    )


def i32(
    default: Any = attrs.NOTHING, *, lo: int = I32_MIN, hi: int = I32_MAX, since: int = 0
) -> Any:
    """A 32-bit signed int, optionally narrowed to [lo, hi]."""
    assert I32_MIN <= lo <= hi <= I32_MAX
    return _field(FieldKind("int", "i32", lo, hi), default, since)


def i64(
    default: Any = attrs.NOTHING, *, lo: int = I64_MIN, hi: int = I64_MAX, since: int = 0
) -> Any:
    """A 64-bit signed int, optionally narrowed to [lo, hi]."""
    assert I64_MIN <= lo <= hi <= I64_MAX
    return _field(FieldKind("int", "i64", lo, hi), default, since)


def choice(choices: tuple[int, ...], default: Any = attrs.NOTHING, *, since: int = 0) -> Any:
    """A 32-bit int that must be one of ``choices``."""
    assert choices
    return _field(FieldKind("int", "i32", min(choices), max(choices), choices), default, since)


def boolean(default: Any = attrs.NOTHING, *, since: int = 0) -> Any:
    """A bool (msgpack true/false; ints are refused)."""
    return _field(FieldKind("bool"), default, since)


def text(
    bytes_max: int, default: Any = attrs.NOTHING, *, nullable: bool = False, since: int = 0
) -> Any:
    """A UTF-8 string of at most ``bytes_max`` encoded bytes (or None when ``nullable``)."""
    return _field(FieldKind("str", bytes_max=bytes_max, nullable=nullable), default, since)


def _bin_repr(value: Any) -> str:
    return f"<{len(value)} bytes>"


def blob(default: Any = attrs.NOTHING, *, since: int = 0) -> Any:
    """Raw bytes (msgpack bin), never inspected. bytes, bytearray or a byte memoryview."""
    return _field(FieldKind("bin"), default, since, repr=_bin_repr)


def error_code(default: Any = ErrorCode.NONE, *, since: int = 0) -> Any:
    """An ``ErrorCode``; ints are converted (unknown numbers become UNKNOWN_SERVER_ERROR)."""
    return _field(FieldKind("error_code"), default, since, converter=_error_code_of_int)


def structs(cls: type, default: Any = (), *, since: int = 0) -> Any:
    """A tuple of ``cls`` instances (lists are converted), at most ``list_length_max``."""
    assert issubclass(cls, Struct) and attrs.has(cls)
    return _field(FieldKind("structs", cls=cls), default, since, converter=_tuple_of_list)


def ints(width: str = "i32", default: Any = (), *, since: int = 0) -> Any:
    """A tuple of ints of ``width`` ("i32" or "i64"), at most ``list_length_max``."""
    lo, hi = {"i32": (I32_MIN, I32_MAX), "i64": (I64_MIN, I64_MAX)}[width]
    return _field(FieldKind("ints", width, lo, hi), default, since, converter=_tuple_of_list)


def texts(bytes_max: int, default: Any = (), *, nullable: bool = False, since: int = 0) -> Any:
    """A tuple of strings (or None when ``nullable``), at most ``list_length_max``."""
    kind = FieldKind("strs", bytes_max=bytes_max, nullable=nullable)
    return _field(kind, default, since, converter=_tuple_of_list)


def str_map(
    key_bytes_max: int, value_bytes_max: int, *, nullable_values: bool = False, since: int = 0
) -> Any:
    """A dict of str to str (values may be None when ``nullable_values``); default empty."""
    kind = FieldKind(
        "str_map",
        bytes_max=key_bytes_max,
        value_bytes_max=value_bytes_max,
        nullable=nullable_values,
    )
    return _field(kind, attrs.Factory(dict), since)


def version_map(*, since: int = 0) -> Any:
    """A dict of api key to a (min, max) version tuple; default empty."""
    return _field(FieldKind("version_map"), attrs.Factory(dict), since)


def field_kind(attribute: attrs.Attribute[Any]) -> FieldKind:
    """The ``FieldKind`` a field was declared with."""
    kind = attribute.metadata["kind"]
    assert isinstance(kind, FieldKind)
    return kind


def field_since(attribute: attrs.Attribute[Any]) -> int:
    """The first version that carries the field."""
    since = attribute.metadata["since"]
    assert isinstance(since, int)
    return since
