"""pgoutput decoding: known bytes, Hypothesis round trips through the test encoder, and
garbage/truncated input that must raise only ``PgOutputError``."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rivven_connect.pg.pgoutput import (
    Begin, Column, ColumnValue, Commit, Delete, Insert, LogicalMessage, Origin, PgOutputError,
    Relation, Truncate, Type, Update, decode_message, format_lsn, parse_lsn,
    pg_timestamp_to_unix_ms,
)

from .encoder import encode

U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, 2**64 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
NAMES = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)),
                max_size=20)
VALUES = st.one_of(
    st.just(ColumnValue("n")), st.just(ColumnValue("u")),
    st.builds(ColumnValue, st.just("t"), st.binary(max_size=40)),
    st.builds(ColumnValue, st.just("b"), st.binary(max_size=40)))
TUPLES = st.lists(VALUES, max_size=8).map(tuple)
COLUMNS = st.builds(Column, NAMES, U32, st.integers(-(2**31), 2**31 - 1), st.booleans())

MESSAGES = st.one_of(
    st.builds(Begin, U64, I64, U32),
    st.builds(Commit, st.integers(0, 255), U64, U64, I64),
    st.builds(Origin, U64, NAMES),
    st.builds(Relation, U32, NAMES, NAMES, st.sampled_from("dnfi"),
              st.lists(COLUMNS, max_size=6).map(tuple)),
    st.builds(Type, U32, NAMES, NAMES),
    st.builds(Insert, U32, TUPLES),
    st.builds(Update, U32, TUPLES),
    st.builds(lambda oid, new, key: Update(oid, new, key=key), U32, TUPLES, TUPLES),
    st.builds(lambda oid, new, old: Update(oid, new, old=old), U32, TUPLES, TUPLES),
    st.builds(lambda oid, key: Delete(oid, key=key), U32, TUPLES),
    st.builds(lambda oid, old: Delete(oid, old=old), U32, TUPLES),
    st.builds(Truncate, st.integers(0, 3), st.lists(U32, max_size=5).map(tuple)),
    st.builds(LogicalMessage, st.booleans(), U64, NAMES, st.binary(max_size=60)),
)


@settings(max_examples=400)
@given(MESSAGES)
def test_round_trip(message):
    assert decode_message(encode(message)) == message


@settings(max_examples=400)
@given(MESSAGES, st.data())
def test_every_truncation_raises_the_typed_error_naming_its_offset(message, data):
    raw = encode(message)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(PgOutputError) as error:
        decode_message(raw[:cut])
    assert 0 <= error.value.offset <= cut


@settings(max_examples=300)
@given(MESSAGES, st.binary(min_size=1, max_size=8))
def test_trailing_bytes_are_refused(message, tail):
    raw = encode(message)
    with pytest.raises(PgOutputError, match="trailing") as error:
        decode_message(raw + tail)
    assert error.value.offset == len(raw)


@settings(max_examples=1000)
@given(st.one_of(st.binary(max_size=80),
                 st.tuples(st.sampled_from(b"BCORYIUDTM"), st.binary(max_size=80))
                 .map(lambda t: bytes([t[0]]) + t[1])))
def test_garbage_raises_only_the_typed_error(raw):
    try:
        decode_message(raw)
    except PgOutputError as error:
        assert 0 <= error.offset <= len(raw)


@settings(max_examples=300)
@given(MESSAGES, st.data())
def test_flipped_bytes_raise_only_the_typed_error(message, data):
    raw = bytearray(encode(message))
    at = data.draw(st.integers(0, len(raw) - 1))
    raw[at] = data.draw(st.integers(0, 255))
    try:
        decode_message(bytes(raw))
    except PgOutputError:
        pass


def test_known_bytes():
    # Begin: final LSN 0/16B3748, ts 1 s after 2000-01-01, xid 771.
    raw = b"B" + struct.pack(">QqI", 0x16B3748, 1_000_000, 771)
    begin = decode_message(raw)
    assert begin == Begin(0x16B3748, 1_000_000, 771)
    assert pg_timestamp_to_unix_ms(begin.commit_ts_us) == 946_684_801_000
    insert = b"I" + struct.pack(">I", 16384) + b"N" + struct.pack(">h", 3) + b"t" \
        + struct.pack(">i", 2) + b"42" + b"n" + b"u"
    assert decode_message(insert) == Insert(
        16384, (ColumnValue("t", b"42"), ColumnValue("n"), ColumnValue("u")))


@pytest.mark.parametrize("raw,offset,reason", [
    (b"", 0, "truncated message type"),
    (b"Z", 0, "unknown message type 'Z'"),
    (b"I" + struct.pack(">I", 1) + b"X", 5, "expected 'N' tuple"),
    (b"D" + struct.pack(">I", 1) + b"N", 5, "expected 'K' or 'O'"),
    (b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">h", 1) + b"q", 8, "column kind 'q'"),
    (b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">h", 1) + b"t" + struct.pack(">i", -1),
     9, "negative column length"),
    (b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">h", -1), 6, "outside 0..1664"),
    (b"Y" + struct.pack(">I", 1) + b"pub\xff\0x\0", 8, "not UTF-8"),
    (b"Y" + struct.pack(">I", 1) + b"public", 5, "no NUL"),
    (b"R" + struct.pack(">I", 1) + b"s\0t\0x", 9, "replica identity 'x'"),
])
def test_malformed_messages_name_the_offset(raw, offset, reason):
    with pytest.raises(PgOutputError, match=reason) as error:
        decode_message(raw)
    assert error.value.offset == offset
    assert f"at byte {offset}" in str(error.value)


@given(U64)
def test_lsn_text_round_trip(lsn):
    assert parse_lsn(format_lsn(lsn)) == lsn


def test_lsn_text():
    assert format_lsn(0x16_B374D848) == "16/B374D848"
    assert format_lsn(0) == "0/0"
    for bad in ["", "1", "1/", "/1", "g/1", "123456789/0"]:
        with pytest.raises(ValueError):
            parse_lsn(bad)
