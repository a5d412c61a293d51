"""A pgoutput (protocol 1) encoder for tests: the inverse of ``decode_message``, written
independently from the Postgres documentation (docs/connect-postgres.md)."""

from __future__ import annotations

import struct

from rivven_connect.pg.pgoutput import (
    Begin, ColumnValue, Commit, Delete, Insert, LogicalMessage, Message, Origin, Relation,
    Truncate, Type, Update,
)


def _string(text: str) -> bytes:
    return text.encode() + b"\0"


def _tuple(columns: tuple[ColumnValue, ...]) -> bytes:
    out = [struct.pack(">h", len(columns))]
    for column in columns:
        out.append(column.kind.encode())
        if column.data is not None:
            out.append(struct.pack(">i", len(column.data)) + column.data)
    return b"".join(out)


def encode(message: Message) -> bytes:
    match message:
        case Begin(final_lsn, ts, xid):
            return b"B" + struct.pack(">QqI", final_lsn, ts, xid)
        case Commit(flags, commit_lsn, end_lsn, ts):
            return b"C" + struct.pack(">BQQq", flags, commit_lsn, end_lsn, ts)
        case Origin(lsn, name):
            return b"O" + struct.pack(">Q", lsn) + _string(name)
        case Relation(oid, schema, name, identity, columns):
            out = [b"R", struct.pack(">I", oid), _string(schema), _string(name),
                   identity.encode(), struct.pack(">h", len(columns))]
            for column in columns:
                out += [struct.pack(">B", int(column.key)), _string(column.name),
                        struct.pack(">Ii", column.type_oid, column.type_modifier)]
            return b"".join(out)
        case Type(oid, schema, name):
            return b"Y" + struct.pack(">I", oid) + _string(schema) + _string(name)
        case Insert(oid, new):
            return b"I" + struct.pack(">I", oid) + b"N" + _tuple(new)
        case Update(oid, new, key, old):
            head = b"U" + struct.pack(">I", oid)
            if key is not None:
                head += b"K" + _tuple(key)
            elif old is not None:
                head += b"O" + _tuple(old)
            return head + b"N" + _tuple(new)
        case Delete(oid, key, old):
            body = b"K" + _tuple(key) if key is not None else b"O" + _tuple(old)
            return b"D" + struct.pack(">I", oid) + body
        case Truncate(options, oids):
            return (b"T" + struct.pack(">iB", len(oids), options)
                    + b"".join(struct.pack(">I", oid) for oid in oids))
        case LogicalMessage(transactional, lsn, prefix, content):
            return (b"M" + struct.pack(">BQ", int(transactional), lsn) + _string(prefix)
                    + struct.pack(">i", len(content)) + content)
    raise AssertionError(message)
