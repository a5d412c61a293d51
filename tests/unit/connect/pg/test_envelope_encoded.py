"""The encoded path's envelopes (``EnvelopeBuilder.encoded``) are the per-record path's
(``records`` then ``encode_payload``, as the driver sends them), byte for byte: keys, values,
headers, timestamps and order; blocks split where the table changes and carry the positions
of their first and last record."""

from __future__ import annotations

import collections
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from rivven_broker.records.batch import encode_headers
from rivven_connect.core.records import EncodedRecords, encode_json, encode_payload
from rivven_connect.pg.envelope import EnvelopeBuilder
from rivven_connect.pg.pgoutput import (
    Column, ColumnValue, Delete, Insert, LogicalMessage, Relation, Truncate, Update,
)
from rivven_connect.pg.transactions import Change, Transaction
from rivven_connect.sources.postgres_cdc_incremental import position_json
from rivven_connect.sources.postgres_cdc_metrics import count_encoded_events, count_events

COLUMNS = (Column("id", 23, -1, True), Column("body", 25, -1, False),
           Column("amount", 1700, -1, False), Column("at", 1184, -1, False),
           Column("doc", 3802, -1, False))
DEFAULT = Relation(1, "public", "notes", "d", COLUMNS)
FULL = Relation(2, "shop", "docs", "f", tuple(Column(c.name, c.type_oid, -1, True)
                                               for c in COLUMNS))
RELATIONS = {1: DEFAULT, 2: FULL}
BUILDER = EnvelopeBuilder(db="shöp \"db\"", key_columns={("shop", "docs"): ("id",)})
NOW_MS = 1_700_000_000_123

texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                max_size=12)
bodies = st.one_of(st.none(), st.just(...), texts)
amounts = st.one_of(st.none(), st.sampled_from(["1.50", "-0.000001", "NaN",
                                                "12345678901234567890.1"]))
stamps = st.one_of(st.none(), st.sampled_from(["2024-01-02 03:04:05.5+02", "infinity",
                                               "0044-03-15 12:00:00+00 BC"]))
docs = st.one_of(st.none(), st.just(...), st.dictionaries(texts, st.integers(), max_size=2)
                 .map(json.dumps))


def _tuple(key: int, body, amount, at, doc) -> tuple[ColumnValue, ...]:
    return tuple(ColumnValue("n") if v is None else ColumnValue("u") if v is ... else
                 ColumnValue("t", v.encode()) for v in (str(key), body, amount, at, doc))


rows = st.builds(_tuple, st.integers(0, 5), bodies, amounts, stamps, docs)
full_rows = st.builds(_tuple, st.integers(0, 5), texts, amounts, stamps, docs.filter(
    lambda doc: doc is not ...))


@st.composite
def changes(draw):
    oid = draw(st.sampled_from([1, 2]))
    kind = draw(st.sampled_from(["insert", "update", "delete", "truncate", "message"]))
    if kind == "truncate":
        return Truncate(0, tuple(draw(st.permutations([1, 2]))[:draw(st.integers(1, 2))]))
    if kind == "message":
        return LogicalMessage(True, 7, draw(texts), draw(st.binary(max_size=4)))
    new = draw(rows)
    if oid == 2:  # FULL: whole old rows, and no unchanged TOAST without one
        old = draw(full_rows)
        if kind == "insert":
            return Insert(2, draw(full_rows))
        if kind == "delete":
            return Delete(2, old=old)
        return Update(2, new, old=old)
    key_only = _tuple(draw(st.integers(0, 5)), None, None, None, None)
    if kind == "insert":
        return Insert(1, draw(rows.filter(lambda r: all(v.kind != "u" for v in r))))
    if kind == "delete":
        return Delete(1, key=key_only)
    return Update(1, new, key=draw(st.one_of(st.none(), st.just(key_only))))


@st.composite
def transactions(draw):
    made = draw(st.lists(changes(), min_size=1, max_size=8))
    out = []
    for index, message in enumerate(made):
        if isinstance(message, Truncate):
            relations = tuple(RELATIONS[oid] for oid in message.relation_oids)
        elif isinstance(message, LogicalMessage):
            relations = ()
        else:
            relations = (RELATIONS[message.relation_oid],)
        out.append(Change(message, relations, 0x900 + 0x10 * index))
    return Transaction(draw(st.integers(1, 2**32 - 1)), 0x1_0000_1000, 0x1_0000_1040,
                       draw(st.integers(0, 2**50)), tuple(out))


def _wire(record) -> tuple:
    """What the driver hands the producer for a record (``driver._send``)."""
    return (encode_payload(record.key), encode_payload(record.value),
            encode_headers(tuple(record.headers)), record.timestamp_ms)  # (the wire's bytes)


def _flat(blocks: list[EncodedRecords]) -> list[tuple]:
    return [(key, value, encode_headers(headers), timestamp_ms) for block in blocks
            for key, value, headers, timestamp_ms in
            zip(block.keys, block.values, block.headers, block.timestamps_ms)]


@settings(max_examples=300, deadline=None)
@given(transactions(), st.booleans())
def test_encoded_blocks_are_the_records_byte_for_byte(transaction, quiet):
    builder = EnvelopeBuilder(db=BUILDER.db, key_columns=BUILDER.key_columns,
                              emit_truncates=not quiet, emit_messages=not quiet)
    records = builder.records(transaction, NOW_MS, position_json)
    blocks = builder.encoded(transaction, NOW_MS, position_json)
    assert _flat(blocks) == [_wire(record) for record in records]
    # one block per run of one table's records, positioned by its first and last record
    at = 0
    for block in blocks:
        run = records[at:at + block.record_count]
        assert {(r.schema, r.table) for r in run} == {(block.schema, block.table)}
        assert (block.first_position, block.position) == (run[0].position, run[-1].position)
        at += block.record_count
        if at < len(records):
            assert (records[at].schema, records[at].table) != (block.schema, block.table)
    assert at == len(records)
    assert not blocks or blocks[-1].position["last"] is True
    expected, counted = collections.Counter(), collections.Counter()
    count_events(expected, records)
    count_encoded_events(counted, blocks)
    assert counted == expected


def test_a_typical_transaction_is_one_block_of_plain_json():
    transaction = Transaction(771, 0x1000, 0x1040, 1_000_000, tuple(
        Change(Insert(1, _tuple(key, "é\n\"", "1.50", None, None)), (DEFAULT,), 0x900 + key)
        for key in range(3)))
    [block] = BUILDER.encoded(transaction, NOW_MS, position_json)
    assert block.record_count == 3 and block.op_counts == (("c", 3),)
    assert block.position == {"end_lsn": "0/1040", "commit_lsn": "0/1000", "seq": 2,
                              "last": True}
    assert block.first_position["seq"] == 0
    value = json.loads(block.values[1])
    assert value["after"] == {"id": 1, "body": "é\n\"", "amount": "1.50", "at": None,
                              "doc": None}
    assert value["source"]["lsn"] == "0/901" and value["source"]["db"] == 'shöp "db"'
    assert block.keys[1] == b'{"id":1}' and "é".encode() in block.values[1]


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), texts,
                              st.floats(allow_nan=False, allow_infinity=False)),
                    lambda inner: st.one_of(st.lists(inner, max_size=3),
                                            st.dictionaries(texts, inner, max_size=3)),
                    max_leaves=10))
def test_encode_json_is_compact_json_dumps(value):
    assert encode_json(value) == json.dumps(value, separators=(",", ":"), ensure_ascii=False)
