"""pgoutput protocol version 1: one replication message's bytes -> one typed message.

Theory of operation: Postgres' built-in logical decoding plugin ``pgoutput`` sends each
decoded event as the payload of a CopyData ``XLogData`` frame; psycopg2 hands us that payload
(``msg.payload`` with ``decode=False``). The first byte names the message, the rest is
big-endian fixed-width integers, NUL-terminated strings and "tuple data" (see
docs/connect-postgres.md, byte by byte). ``decode_message`` is a pure function: no state, no
I/O. The relation cache and Begin..Commit assembly live in ``transactions.py``.

Every malformed input — truncated, trailing bytes, unknown message or column kind, a
negative length, a non-UTF-8 name, a count over its limit — raises ``PgOutputError`` naming
the byte offset; nothing else escapes (a Hypothesis test feeds it garbage).

Only protocol version 1 is decoded (no streamed in-progress transactions, no two-phase
messages); binary column values (kind ``b``) are kept as bytes, undecoded.
"""

from __future__ import annotations

import struct

import attrs

__all__ = [
    "COLUMNS_MAX",
    "PG_EPOCH_UNIX_MS",
    "RELATIONS_PER_TRUNCATE_MAX",
    "Begin",
    "Column",
    "ColumnValue",
    "Commit",
    "Delete",
    "Insert",
    "LogicalMessage",
    "Message",
    "Origin",
    "PgOutputError",
    "Relation",
    "Truncate",
    "Type",
    "Update",
    "decode_message",
    "format_lsn",
    "parse_lsn",
    "pg_timestamp_to_unix_ms",
]

#: Postgres allows at most 1664 columns in a tuple (MaxTupleAttributeNumber).
COLUMNS_MAX = 1664
#: One TRUNCATE names at most this many relations (a sanity bound, not a Postgres limit).
RELATIONS_PER_TRUNCATE_MAX = 65_536
#: 2000-01-01T00:00:00Z, Postgres' timestamp epoch, in Unix milliseconds.
PG_EPOCH_UNIX_MS = 946_684_800_000

# Replica identity settings as Relation.replica_identity carries them.
REPLICA_IDENTITY_DEFAULT = "d"
REPLICA_IDENTITY_NOTHING = "n"
REPLICA_IDENTITY_FULL = "f"
REPLICA_IDENTITY_INDEX = "i"
_REPLICA_IDENTITIES = frozenset("dnfi")

# Tuple column kinds.
KIND_NULL = "n"
KIND_UNCHANGED_TOAST = "u"
KIND_TEXT = "t"
KIND_BINARY = "b"

_U8 = struct.Struct(">B")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")


class PgOutputError(ValueError):
    """A pgoutput message that cannot be decoded. ``offset`` is the byte where it went
    wrong (within the one message)."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"pgoutput: {reason} at byte {offset}")
        self.offset = offset
        self.reason = reason


def format_lsn(lsn: int) -> str:
    """An LSN as Postgres writes it: ``"16/B374D848"`` (upper-case hex halves)."""
    assert 0 <= lsn < 1 << 64, lsn
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    """``"16/B374D848"`` -> int. Raises ``ValueError`` on anything else."""
    high, sep, low = text.partition("/")
    if not sep or not 1 <= len(high) <= 8 or not 1 <= len(low) <= 8:
        raise ValueError(f"not an LSN: {text!r}")
    return (int(high, 16) << 32) | int(low, 16)


def pg_timestamp_to_unix_ms(microseconds: int) -> int:
    """A pgoutput timestamp (microseconds since 2000-01-01 UTC) in Unix milliseconds."""
    return PG_EPOCH_UNIX_MS + microseconds // 1000


@attrs.frozen
class ColumnValue:
    """One column of a tuple: ``kind`` is ``n`` (null), ``u`` (unchanged TOAST: the value is
    not sent), ``t`` (text output of the type) or ``b`` (binary send format); ``data`` is
    the bytes for ``t``/``b``, else ``None``."""

    kind: str
    data: bytes | None = None

    def __attrs_post_init__(self) -> None:
        assert self.kind in "nutb" and len(self.kind) == 1, self.kind
        assert (self.data is not None) == (self.kind in "tb"), self


_NULL = ColumnValue("n")
_UNCHANGED = ColumnValue("u")


@attrs.frozen
class Column:
    """A Relation's column. ``key`` is the replica-identity flag: the identity index's
    columns under DEFAULT/INDEX, every column under FULL (so not necessarily the PK)."""

    name: str
    type_oid: int
    type_modifier: int
    key: bool


@attrs.frozen
class Begin:
    final_lsn: int            # the LSN of the commit record (= Commit.commit_lsn)
    commit_ts_us: int         # microseconds since 2000-01-01 UTC
    xid: int


@attrs.frozen
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int              # the end of the commit record: where a restart resumes
    commit_ts_us: int


@attrs.frozen
class Origin:
    commit_lsn: int
    name: str


@attrs.frozen
class Relation:
    oid: int
    schema: str               # "" means pg_catalog
    name: str
    replica_identity: str     # d (default), n (nothing), f (full), i (index)
    columns: tuple[Column, ...]


@attrs.frozen
class Type:
    oid: int
    schema: str
    name: str


@attrs.frozen
class Insert:
    relation_oid: int
    new: tuple[ColumnValue, ...]


@attrs.frozen
class Update:
    relation_oid: int
    new: tuple[ColumnValue, ...]
    key: tuple[ColumnValue, ...] | None = None     # 'K': the old identity, when it changed
    old: tuple[ColumnValue, ...] | None = None     # 'O': the whole old row (FULL)


@attrs.frozen
class Delete:
    relation_oid: int
    key: tuple[ColumnValue, ...] | None = None
    old: tuple[ColumnValue, ...] | None = None


@attrs.frozen
class Truncate:
    options: int              # bit 1: CASCADE, bit 2: RESTART IDENTITY
    relation_oids: tuple[int, ...]

    @property
    def cascade(self) -> bool:
        return bool(self.options & 1)

    @property
    def restart_identity(self) -> bool:
        return bool(self.options & 2)


@attrs.frozen
class LogicalMessage:
    """``pg_logical_emit_message(transactional, prefix, content)``; only sent with the
    ``messages 'true'`` option. A non-transactional one arrives outside Begin..Commit."""

    transactional: bool
    lsn: int
    prefix: str
    content: bytes


Message = (Begin | Commit | Origin | Relation | Type | Insert | Update | Delete | Truncate
           | LogicalMessage)


class _Reader:
    """A cursor over one message; every read checks the bytes are there."""

    __slots__ = ("data", "offset")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.offset = 0

    def _need(self, size: int, what: str) -> int:
        start = self.offset
        if start + size > len(self.data):
            raise PgOutputError(start, f"truncated {what}: need {size} bytes, "
                                       f"have {len(self.data) - start}")
        self.offset = start + size
        return start

    def u8(self, what: str) -> int:
        return _U8.unpack_from(self.data, self._need(1, what))[0]

    def char(self, what: str) -> str:
        return chr(self.u8(what))

    def i16(self, what: str) -> int:
        return _I16.unpack_from(self.data, self._need(2, what))[0]

    def i32(self, what: str) -> int:
        return _I32.unpack_from(self.data, self._need(4, what))[0]

    def u32(self, what: str) -> int:
        return _U32.unpack_from(self.data, self._need(4, what))[0]

    def u64(self, what: str) -> int:
        return _U64.unpack_from(self.data, self._need(8, what))[0]

    def i64(self, what: str) -> int:
        return _I64.unpack_from(self.data, self._need(8, what))[0]

    def raw(self, size: int, what: str) -> bytes:
        start = self._need(size, what)
        return bytes(self.data[start:start + size])

    def string(self, what: str) -> str:
        start = self.offset
        end = self.data.find(b"\0", start)
        if end < 0:
            raise PgOutputError(start, f"{what}: no NUL terminator")
        self.offset = end + 1
        try:
            return bytes(self.data[start:end]).decode("utf-8")
        except UnicodeDecodeError as error:
            raise PgOutputError(start + error.start, f"{what}: not UTF-8") from None

    def count(self, what: str, limit: int, *, wide: bool = False) -> int:
        start = self.offset
        value = self.i32(what) if wide else self.i16(what)
        if not 0 <= value <= limit:
            raise PgOutputError(start, f"{what} {value} outside 0..{limit}")
        return value

    def tuple_data(self) -> tuple[ColumnValue, ...]:
        """The columns of a tuple. The common case (every bound fits) is read in one loop
        of local operations; anything else is read again by ``_tuple_data_checked``, which
        says what is wrong and where."""
        data, start = self.data, self.offset
        end = len(data)
        if start + 2 > end or type(data) is not bytes:  # (slices of bytes are bytes)
            return self._tuple_data_checked()
        count = _I16.unpack_from(data, start)[0]
        if not 0 <= count <= COLUMNS_MAX:
            return self._tuple_data_checked()
        offset = start + 2
        columns = []
        append = columns.append
        unpack_length = _I32.unpack_from
        for _ in range(count):
            if offset >= end:
                return self._tuple_data_checked()
            kind = data[offset]
            if kind == 0x74 or kind == 0x62:  # t, b
                if offset + 5 > end:
                    return self._tuple_data_checked()
                length = unpack_length(data, offset + 1)[0]
                value_at = offset + 5
                offset = value_at + length
                if length < 0 or offset > end:
                    return self._tuple_data_checked()
                append(ColumnValue("t" if kind == 0x74 else "b", data[value_at:offset]))
            elif kind == 0x6E:  # n
                append(_NULL)
                offset += 1
            elif kind == 0x75:  # u
                append(_UNCHANGED)
                offset += 1
            else:
                return self._tuple_data_checked()
        self.offset = offset
        return tuple(columns)

    def _tuple_data_checked(self) -> tuple[ColumnValue, ...]:
        columns = []
        for _ in range(self.count("tuple column count", COLUMNS_MAX)):
            start = self.offset
            kind = self.char("column kind")
            if kind in "nu":
                columns.append(ColumnValue(kind))
            elif kind in "tb":
                length_at = self.offset
                length = self.i32("column length")
                if length < 0:
                    raise PgOutputError(length_at, f"negative column length {length}")
                columns.append(ColumnValue(kind, self.raw(length, "column value")))
            else:
                raise PgOutputError(start, f"unknown column kind {kind!r}")
        return tuple(columns)

    def old_or_key(self, marker: str, start: int) -> tuple[str, tuple[ColumnValue, ...]]:
        if marker not in "KO":
            raise PgOutputError(start, f"expected 'K' or 'O' tuple, got {marker!r}")
        return marker, self.tuple_data()

    def expect_new(self) -> tuple[ColumnValue, ...]:
        start = self.offset
        marker = self.char("tuple marker")
        if marker != "N":
            raise PgOutputError(start, f"expected 'N' tuple, got {marker!r}")
        return self.tuple_data()


def _relation(reader: _Reader) -> Relation:
    oid = reader.u32("relation oid")
    schema = reader.string("namespace")
    name = reader.string("relation name")
    identity_at = reader.offset
    identity = reader.char("replica identity")
    if identity not in _REPLICA_IDENTITIES:
        raise PgOutputError(identity_at, f"unknown replica identity {identity!r}")
    columns = []
    for _ in range(reader.count("relation column count", COLUMNS_MAX)):
        flags = reader.u8("column flags")
        column_name = reader.string("column name")
        type_oid = reader.u32("column type oid")
        type_modifier = reader.i32("column type modifier")
        columns.append(Column(column_name, type_oid, type_modifier, bool(flags & 1)))
    return Relation(oid, schema, name, identity, tuple(columns))


def _update(reader: _Reader) -> Update:
    oid = reader.u32("relation oid")
    start = reader.offset
    marker = reader.char("tuple marker")
    if marker == "N":
        return Update(oid, reader.tuple_data())
    which, tuple_ = reader.old_or_key(marker, start)
    new = reader.expect_new()
    return Update(oid, new, key=tuple_ if which == "K" else None,
                  old=tuple_ if which == "O" else None)


def _delete(reader: _Reader) -> Delete:
    oid = reader.u32("relation oid")
    start = reader.offset
    which, tuple_ = reader.old_or_key(reader.char("tuple marker"), start)
    return Delete(oid, key=tuple_ if which == "K" else None,
                  old=tuple_ if which == "O" else None)


def _truncate(reader: _Reader) -> Truncate:
    count = reader.count("truncate relation count", RELATIONS_PER_TRUNCATE_MAX, wide=True)
    options = reader.u8("truncate options")
    return Truncate(options, tuple(reader.u32("relation oid") for _ in range(count)))


def _logical_message(reader: _Reader) -> LogicalMessage:
    flags = reader.u8("message flags")
    lsn = reader.u64("message lsn")
    prefix = reader.string("message prefix")
    length_at = reader.offset
    length = reader.i32("message length")
    if length < 0:
        raise PgOutputError(length_at, f"negative message length {length}")
    return LogicalMessage(bool(flags & 1), lsn, prefix, reader.raw(length, "message content"))


def _decode(reader: _Reader, kind: str) -> Message:
    if kind == "B":
        return Begin(reader.u64("final lsn"), reader.i64("commit timestamp"),
                     reader.u32("xid"))
    if kind == "C":
        return Commit(reader.u8("commit flags"), reader.u64("commit lsn"),
                      reader.u64("end lsn"), reader.i64("commit timestamp"))
    if kind == "O":
        return Origin(reader.u64("origin lsn"), reader.string("origin name"))
    if kind == "R":
        return _relation(reader)
    if kind == "Y":
        return Type(reader.u32("type oid"), reader.string("type namespace"),
                    reader.string("type name"))
    if kind == "I":
        oid = reader.u32("relation oid")
        return Insert(oid, reader.expect_new())
    if kind == "U":
        return _update(reader)
    if kind == "D":
        return _delete(reader)
    if kind == "T":
        return _truncate(reader)
    if kind == "M":
        return _logical_message(reader)
    raise PgOutputError(0, f"unknown message type {kind!r}")


def decode_message(data: bytes) -> Message:
    """One pgoutput (protocol version 1) message. Raises ``PgOutputError`` (with the
    offset) on any malformed input, including trailing bytes."""
    reader = _Reader(data)
    message = _decode(reader, reader.char("message type"))
    if reader.offset != len(data):
        raise PgOutputError(reader.offset, f"{len(data) - reader.offset} trailing bytes "
                                           f"after {type(message).__name__}")
    return message
