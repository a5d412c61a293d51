"""Column values: Postgres' text output of a type (pgoutput kind ``t``) -> a JSON-able value.

Theory of operation: the Relation message gives each column's type oid; ``decode_value``
maps the built-in oids to Python values that survive JSON unchanged, and everything else
(enums, domains, ranges, geometry, intervals, money, user types) stays the text Postgres
sent. The choices, as Debezium's "handling modes" would call them:

- int2/int4/int8/oid -> int; bool -> bool; float4/float8 -> float, but NaN and infinities
  stay the strings Postgres writes ("NaN", "Infinity", "-Infinity": JSON has no such numbers);
- numeric -> the exact decimal *string* as Postgres wrote it (never a float);
- json/jsonb -> the parsed value;
- timestamp -> ISO-8601 without offset ("2024-01-02T03:04:05.123456"); timestamptz -> ISO-8601
  in UTC with "Z"; date and time as Postgres writes them in ISO DateStyle; timetz with a
  "+HH:MM" offset; infinity, BC dates and years past 9999 stay Postgres' text — for a
  timestamptz the text Postgres writes under ``TimeZone = UTC`` ("0044-03-15 12:00:00+00
  BC"), whatever the session's zone: the offset is applied here (in the proleptic Gregorian
  calendar, shifted by whole 400-year cycles into Python's range), so one instant is one
  value whichever zone the server or connection uses, and an instant that only leaves
  years 1..9999 in UTC (9999-12-31 23:00-05) becomes that text instead of an error;
- uuid, text, varchar, char, name -> str; bytea -> base64 (standard alphabet, padded);
- one-dimensional or nested arrays -> lists, elements typed as above, NULL -> None;
- binary values (kind ``b``, only with the ``binary`` option, which we do not ask for)
  -> base64 of the raw bytes.

Text decoding assumes the database and the replication connection use UTF-8 and the
``ISO`` DateStyle (Postgres' defaults); the driver must check both.
"""

from __future__ import annotations

import base64
import datetime
import functools
import json
import math
import re
from typing import Any, Callable

__all__ = ["decode_text", "decode_value", "parse_array", "text_decoder"]

BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 18, 19, 20, 21, 23, 25, 26
JSON, FLOAT4, FLOAT8, BPCHAR, VARCHAR, DATE, TIME = 114, 700, 701, 1042, 1043, 1082, 1083
TIMESTAMP, TIMESTAMPTZ, TIMETZ, NUMERIC, UUID, JSONB = 1114, 1184, 1266, 1700, 2950, 3802

_INTS = frozenset({INT2, INT4, INT8, OID})
_FLOATS = frozenset({FLOAT4, FLOAT8})
_JSONS = frozenset({JSON, JSONB})
_TIMESTAMPTZ = re.compile(r"(\d{4,})-(\d\d)-(\d\d) (\d\d:\d\d:\d\d)(?:\.(\d{1,6}))?"
                          r"([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?( BC)?")
_TIMESTAMP_NO_ZONE = re.compile(r"\d{4,}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?( BC)?")
_TIMETZ = re.compile(r"(\d\d:\d\d:\d\d(?:\.\d+)?)([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?")

#: Types ``decode_text`` returns as the text itself (no mapping): numeric, the strings,
#: uuid, date, time (checked against ``decode_text`` by the unit tests).
_TEXT_AS_IS = frozenset({TEXT, VARCHAR, BPCHAR, NAME, CHAR, NUMERIC, UUID, DATE, TIME})

#: Postgres arrays have at most 6 dimensions (MAXDIM).
ARRAY_DIMENSIONS_MAX = 6
#: Array type oid -> element type oid (the built-in ones; others decode as text lists).
ARRAY_ELEMENT_OIDS = {
    1000: BOOL, 1001: BYTEA, 1002: CHAR, 1003: NAME, 1005: INT2, 1007: INT4, 1016: INT8,
    1009: TEXT, 1028: OID, 199: JSON, 3807: JSONB, 1021: FLOAT4, 1022: FLOAT8, 1014: BPCHAR,
    1015: VARCHAR, 1182: DATE, 1183: TIME, 1115: TIMESTAMP, 1185: TIMESTAMPTZ, 1270: TIMETZ,
    1231: NUMERIC, 2951: UUID,
}


def decode_value(type_oid: int, kind: str, data: bytes) -> Any:
    """A column value of kind ``t`` (text) or ``b`` (binary) as a JSON-able value.
    Raises ``ValueError`` when text that should be the type's output is not (bad UTF-8,
    not an integer, broken JSON or array literal)."""
    if kind == "b":
        return base64.b64encode(data).decode("ascii")
    assert kind == "t", kind
    return decode_text(type_oid, data.decode("utf-8"))


def decode_text(type_oid: int, text: str) -> Any:
    """Postgres' text output of a value of type ``type_oid`` (see the module docstring)."""
    if type_oid in _INTS:
        return int(text)
    if type_oid == BOOL:
        if text not in ("t", "f"):
            raise ValueError(f"not a bool: {text!r}")
        return text == "t"
    if type_oid in _FLOATS:
        number = float(text)
        return number if math.isfinite(number) else text
    if type_oid in _JSONS:
        return json.loads(text)
    if type_oid == TIMESTAMP:
        return _timestamp(text, with_zone=False)
    if type_oid == TIMESTAMPTZ:
        return _timestamp(text, with_zone=True)
    if type_oid == TIMETZ:
        return _timetz(text)
    if type_oid == BYTEA:
        return base64.b64encode(_bytea(text)).decode("ascii")
    element = ARRAY_ELEMENT_OIDS.get(type_oid)
    if element is not None:
        return _map_array(parse_array(text), element)
    return text  # numeric, text, varchar, uuid, date, time and every other type


def text_decoder(type_oid: int) -> Callable[[bytes], Any]:
    """``decode_value(type_oid, "t", data)`` as one function of ``data``, chosen once per
    column (the envelope keeps one per Relation): the types whose value is the text itself
    (text, varchar, numeric, uuid, date and every type without a mapping) decode the UTF-8
    and nothing more, integers parse the bytes at once; the rest go through
    ``decode_text``. Raises what ``decode_value`` raises (``ValueError``)."""
    if type_oid in _INTS:
        return int  # (int() takes the ASCII digits as bytes; a non-digit raises ValueError)
    if type_oid in _TEXT_AS_IS:
        return bytes.decode  # UTF-8 (a bad byte raises UnicodeDecodeError, a ValueError)
    return functools.partial(_decode_utf8_text, type_oid)


def _decode_utf8_text(type_oid: int, data: bytes) -> Any:
    return decode_text(type_oid, data.decode("utf-8"))


def _timestamp(text: str, *, with_zone: bool) -> str:
    if with_zone:
        return _timestamptz(text)
    try:
        return datetime.datetime.fromisoformat(text).isoformat()
    except ValueError:
        return text  # infinity, -infinity, BC, years past 9999: Postgres' own text


def _timestamptz(text: str) -> str:
    """ISO-8601 in UTC; outside years 1..9999 (in UTC) Postgres' text under TimeZone=UTC."""
    match = _TIMESTAMPTZ.fullmatch(text)
    if match is None:
        if _TIMESTAMP_NO_ZONE.fullmatch(text):
            raise ValueError(f"timestamptz without an offset: {text!r}")
        return text  # infinity, -infinity
    year, month, day, clock, fraction, sign, hours, minutes, seconds, bc = match.groups()
    astronomical = 1 - int(year) if bc else int(year)  # 1 BC is year 0
    shift = (astronomical - 2000) // 400 * 400  # the calendar repeats every 400 years
    hour, minute, second = map(int, clock.split(":"))
    local = datetime.datetime(astronomical - shift, int(month), int(day), hour, minute, second)
    offset = datetime.timedelta(hours=int(hours), minutes=int(minutes or 0),
                                seconds=int(seconds or 0))
    utc = local - offset if sign == "+" else local + offset
    utc_year = utc.year + shift
    if 1 <= utc_year <= 9999:
        micros = (fraction or "").ljust(6, "0")
        return utc.replace(year=utc_year).isoformat() + (f".{micros}" if int(micros) else "") \
            + "Z"
    shown, era = (1 - utc_year, " BC") if utc_year < 1 else (utc_year, "")
    return (f"{shown:04d}-{utc:%m-%d %H:%M:%S}{'.' + fraction if fraction else ''}+00{era}")


def _timetz(text: str) -> str:
    match = _TIMETZ.fullmatch(text)
    if match is None:
        return text
    clock, sign, hours, minutes, seconds = match.groups()
    offset = f"{sign}{hours}:{minutes or '00'}" + (f":{seconds}" if seconds else "")
    return clock + offset


def _bytea(text: str) -> bytes:
    if text.startswith("\\x"):
        return bytes.fromhex(text[2:])
    out, at = bytearray(), 0               # the "escape" bytea_output format
    while at < len(text):
        char = text[at]
        if char != "\\":
            out += char.encode("utf-8")
            at += 1
        elif text[at + 1:at + 2] == "\\":
            out.append(0x5C)
            at += 2
        else:
            out.append(int(text[at + 1:at + 4], 8))
            at += 4
    return bytes(out)


def parse_array(text: str) -> list:
    """A Postgres array literal (``{1,2,NULL,"a b"}``, nested, with an optional
    ``[lo:hi]=`` bounds prefix) -> nested lists of str / None. Raises ``ValueError``."""
    if text.startswith("["):
        text = text[text.index("=") + 1:]
    value, at = _array_at(text, 0, 1)
    if at != len(text):
        raise ValueError(f"trailing text in array literal at {at}: {text!r}")
    return value


def _array_at(text: str, at: int, depth: int) -> tuple[list, int]:
    if depth > ARRAY_DIMENSIONS_MAX:
        raise ValueError(f"array literal: more than {ARRAY_DIMENSIONS_MAX} dimensions")
    if text[at:at + 1] != "{":
        raise ValueError(f"array literal: expected '{{' at {at}: {text!r}")
    at += 1
    items: list = []
    if text[at:at + 1] == "}":
        return items, at + 1
    while True:
        if text[at:at + 1] == "{":
            item, at = _array_at(text, at, depth + 1)
            items.append(item)
        elif text[at:at + 1] == '"':
            chars, at = [], at + 1
            while at < len(text) and text[at] != '"':
                if text[at] == "\\":
                    at += 1
                chars.append(text[at:at + 1])
                at += 1
            if at >= len(text):
                raise ValueError(f"array literal: unterminated quote: {text!r}")
            items.append("".join(chars))
            at += 1
        else:
            end = at
            while end < len(text) and text[end] not in ",}":
                end += 1
            word = text[at:end]
            if not word:
                raise ValueError(f"array literal: empty element at {at}: {text!r}")
            items.append(None if word == "NULL" else word)
            at = end
        separator = text[at:at + 1]
        at += 1
        if separator == "}":
            return items, at
        if separator != ",":
            raise ValueError(f"array literal: expected ',' or '}}' at {at - 1}: {text!r}")


def _map_array(items: list, element_oid: int) -> list:
    return [_map_array(item, element_oid) if isinstance(item, list)
            else None if item is None else decode_text(element_oid, item) for item in items]
