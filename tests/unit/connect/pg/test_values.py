"""Text output of Postgres types -> JSON-able values (rivven_connect.pg.values)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rivven_connect.pg.values import (
    _TEXT_AS_IS, decode_text, decode_value, parse_array, text_decoder,
)

CASES = [
    (21, "-7", -7), (23, "42", 42), (20, "9007199254740993", 9007199254740993), (26, "1", 1),
    (16, "t", True), (16, "f", False),
    (700, "1.5", 1.5), (701, "-2e+300", -2e300), (701, "NaN", "NaN"),
    (701, "Infinity", "Infinity"), (701, "-Infinity", "-Infinity"),
    (1700, "12345678901234567890.000000000001", "12345678901234567890.000000000001"),
    (1700, "NaN", "NaN"),
    (25, "héllo", "héllo"), (1043, "v", "v"), (1042, "ab  ", "ab  "),
    (114, '{"a": [1, 2.5, null]}', {"a": [1, 2.5, None]}), (3802, '"s"', "s"),
    (1114, "2024-01-02 03:04:05.123456", "2024-01-02T03:04:05.123456"),
    (1114, "infinity", "infinity"), (1114, "0044-03-15 12:00:00 BC", "0044-03-15 12:00:00 BC"),
    (1184, "2024-01-02 03:04:05.5+01", "2024-01-02T02:04:05.500000Z"),
    (1184, "2024-01-02 03:04:05+05:30", "2024-01-01T21:34:05Z"),
    (1184, "1900-01-01 00:00:00.5-03:30:52", "1900-01-01T03:30:52.500000Z"),  # LMT offsets
    # Outside years 1..9999 in UTC: Postgres' text under TimeZone=UTC, whatever the zone.
    (1184, "0044-03-15 08:29:08-03:30:52 BC", "0044-03-15 12:00:00+00 BC"),
    (1184, "0044-03-15 12:00:00+00 BC", "0044-03-15 12:00:00+00 BC"),
    (1184, "9999-12-31 23:30:00.25-05", "10000-01-01 04:30:00.25+00"),
    (1184, "0001-01-01 00:30:00+01", "0001-12-31 23:30:00+00 BC"),
    (1184, "0001-03-01 00:30:00+01 BC", "0001-02-29 23:30:00+00 BC"),  # 1 BC was a leap year
    (1184, "10000-01-01 04:30:00+05", "9999-12-31T23:30:00Z"),
    (1184, "infinity", "infinity"), (1184, "-infinity", "-infinity"),
    (1082, "2024-01-02", "2024-01-02"), (1083, "03:04:05.25", "03:04:05.25"),
    (1266, "03:04:05+01", "03:04:05+01:00"), (1266, "03:04:05.5-05:30", "03:04:05.5-05:30"),
    (2950, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    (17, "\\x00ff10", "AP8Q"), (17, "a\\\\b\\001", "YVxiAQ=="),
    (1007, "{1,NULL,3}", [1, None, 3]), (1009, '{"a b","x\\"y",NULL,"NULL",z}',
                                         ["a b", 'x"y', None, "NULL", "z"]),
    (1007, "[0:1]={{1,2},{3,4}}", [[1, 2], [3, 4]]), (1009, "{}", []),
    (1185, '{"2024-01-02 03:04:05+00"}', ["2024-01-02T03:04:05Z"]),
    (3807, '{"{\\"a\\": 1}"}', [{"a": 1}]),
    (1231, "{1.10,NaN}", ["1.10", "NaN"]),
    (99999, "(1,2)", "(1,2)"),  # unknown oid: text
    (1186, "1 day 02:00:00", "1 day 02:00:00"),
]


@pytest.mark.parametrize("oid,text,expected", CASES)
def test_decode_text(oid, text, expected):
    value = decode_text(oid, text)
    assert value == expected and type(value) is type(expected)
    assert json.loads(json.dumps(value)) == value  # survives JSON unchanged


@pytest.mark.parametrize("oid,text,expected", CASES + [
    (18, "c", "c"), (19, "pg_class", "pg_class"), (25, "", ""), (1700, "-0.5", "-0.5")])
def test_the_decoder_chosen_per_column_is_decode_value(oid, text, expected):
    value = text_decoder(oid)(text.encode())
    assert value == expected == decode_value(oid, "t", text.encode())
    assert type(value) is type(expected)


def test_the_types_decoded_as_their_text_are_the_ones_decode_text_leaves_alone():
    for oid in _TEXT_AS_IS:  # (a sentinel that no mapping would return unchanged)
        assert decode_text(oid, "\x7b1\x7d") == "\x7b1\x7d"
        assert text_decoder(oid) is bytes.decode


@pytest.mark.parametrize("oid,data", [(23, b"x"), (20, b"1.5"), (25, b"\xff\xfe"),
                                      (16, b"true"), (1184, b"2024-01-02 03:04:05")])
def test_the_per_column_decoder_raises_value_error_as_decode_value_does(oid, data):
    with pytest.raises(ValueError):
        decode_value(oid, "t", data)
    with pytest.raises(ValueError):
        text_decoder(oid)(data)


@pytest.mark.parametrize("oid,text", [
    (23, "x"), (16, "true"), (114, "{"), (1007, "{1,2"), (1007, "1,2}"), (1007, "{1,,2}"),
    (1009, '{"a}'), (1007, "{1}x"), (1184, "2024-01-02 03:04:05"), (17, "\\xzz"),
    (1007, "{" * 7 + "}" * 7),
])
def test_text_that_is_not_the_types_output_is_a_value_error(oid, text):
    with pytest.raises(ValueError):
        decode_text(oid, text)


def test_binary_values_are_base64_and_bad_utf8_is_a_value_error():
    assert decode_value(23, "b", b"\x00\x00\x00\x01") == "AAAAAQ=="
    with pytest.raises(ValueError):
        decode_value(25, "t", b"\xff")


def _literal(items: list) -> str:
    return "{" + ",".join(
        _literal(i) if isinstance(i, list) else "NULL" if i is None
        else '"' + i.replace("\\", "\\\\").replace('"', '\\"') + '"' for i in items) + "}"


@given(st.lists(st.one_of(st.none(), st.text(max_size=8)), max_size=6))
def test_array_literals_round_trip(items):
    assert parse_array(_literal(items)) == items
