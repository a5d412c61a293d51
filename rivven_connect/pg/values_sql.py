"""Column values typed by Postgres itself: per type, the SQL whose JSON is ``values.py``'s.

Theory of operation: the snapshot's encoded path (docs/connect-postgres.md "Snapshots")
has Postgres write each row's ``after`` image and key as JSON (``row_to_json`` of a row of
these expressions: compact, columns in order, strings escaped as Python's ``json`` escapes
them), so Python does not touch a value. That is only right where the JSON Postgres writes
is, byte for byte, ``encode_json(decode_text(type, text))``; ``column_json_sql`` gives the
expression for a type, or None where there is none and the table is read row by row:

- int2/int4/int8 as they are (JSON numbers), oid as ``int8`` (Postgres writes an oid as a
  string); bool as it is;
- numeric, and every type ``values.py`` keeps as Postgres' text (text, varchar, uuid,
  date, time, interval, enums, domains — a domain over an integer included: its oid is
  not int's), as the type's output text: ``format('%s', c)`` (NULL kept), the text the
  per-row path receives — not ``::text``, which for char(n) drops the padding and for
  inet adds the netmask (their casts to text are functions, not the output);
- timestamp: ``YYYY-MM-DDTHH:MI:SS`` and ``.US`` when the microseconds are not 0 (Python's
  ``isoformat``) for years 1..9999, else the text (infinity, BC, years past 9999);
  timestamptz: the same of the instant in UTC with ``Z``, else the text under
  ``TimeZone = UTC`` (the reader's session is set so);
- bytea: base64 without the line breaks Postgres' ``encode`` puts in;
- none for float4/float8 (Python writes ``1.0`` and switches to exponents at 1e16,
  Postgres writes ``1`` and switches at 1e15), json/jsonb (re-encoded by Python), timetz
  (its offset is rewritten) and arrays.

Pure: SQL text only (``psycopg2.sql`` composition, no connection; a ``%`` is doubled:
the chunk query takes parameters).
"""

from __future__ import annotations

from psycopg2 import sql

from .values import (
    ARRAY_ELEMENT_OIDS, BOOL, BYTEA, FLOAT4, FLOAT8, INT2, INT4, INT8, JSON, JSONB, OID,
    TIMESTAMP, TIMESTAMPTZ, TIMETZ,
)

__all__ = ["column_json_sql", "table_json_supported"]

_AS_IS = frozenset({INT2, INT4, INT8, BOOL})
_NONE = frozenset({FLOAT4, FLOAT8, JSON, JSONB, TIMETZ, *ARRAY_ELEMENT_OIDS})
_ISO = "'YYYY-MM-DD\"T\"HH24:MI:SS'"
#: ``{c}``: the column; a finite value in years 1..9999 as ``isoformat`` writes it.
_TIMESTAMP = (f"CASE WHEN isfinite({{c}}) AND {{c}} >= '0001-01-01' AND {{c}} < '10000-01-01' "
              f"THEN to_char({{c}}, {_ISO}) || CASE WHEN mod(extract(microseconds FROM {{c}})"
              f"::bigint, 1000000) <> 0 THEN to_char({{c}}, '.US') ELSE '' END "
              f"ELSE {{c}}::text END")
_TIMESTAMPTZ = (f"CASE WHEN isfinite({{c}}) AND {{c}} >= '0001-01-01 00:00:00+00' AND "
                f"{{c}} < '10000-01-01 00:00:00+00' THEN to_char({{c}} AT TIME ZONE 'UTC', "
                f"{_ISO}) || CASE WHEN mod(extract(microseconds FROM {{c}})::bigint, 1000000) "
                f"<> 0 THEN to_char({{c}} AT TIME ZONE 'UTC', '.US') ELSE '' END || 'Z' "
                f"ELSE {{c}}::text END")


def column_json_sql(type_oid: int, column: sql.Composable) -> sql.Composable | None:
    """The expression of ``column`` (of type ``type_oid``) whose JSON is ``values.py``'s
    value; None when there is none (module docstring)."""
    if type_oid in _AS_IS:
        return column
    if type_oid == OID:
        return sql.SQL("{}::int8").format(column)
    if type_oid in _NONE:
        return None
    if type_oid == TIMESTAMP:
        return sql.SQL(_TIMESTAMP).format(c=column)
    if type_oid == TIMESTAMPTZ:
        return sql.SQL(_TIMESTAMPTZ).format(c=column)
    if type_oid == BYTEA:
        return sql.SQL("translate(encode({}, 'base64'), E'\\n', '')").format(column)
    return sql.SQL("CASE WHEN {c} IS NULL THEN NULL ELSE format('%%s', {c}) END").format(
        c=column)


def table_json_supported(type_oids: list[int]) -> bool:
    """Whether every column has an expression (the table can take the encoded path)."""
    return not any(type_oid in _NONE for type_oid in type_oids)
