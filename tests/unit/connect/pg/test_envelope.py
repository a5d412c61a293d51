"""Transactions -> CDC envelope records (rivven_connect.pg.envelope)."""

from __future__ import annotations

import json

import pytest

from rivven_connect.pg.envelope import (
    HEADER_ID, HEADER_PK_CHANGE_NEW_KEY, HEADER_PK_CHANGE_OLD_KEY, HEADER_SCHEMA_VERSION,
    HEADER_UNAVAILABLE_COLUMNS, UNAVAILABLE_VALUE, CdcPosition, EnvelopeBuilder, EnvelopeError,
    schema_version,
)
from rivven_connect.pg.pgoutput import (
    Column, ColumnValue, Delete, Insert, LogicalMessage, Relation, Truncate, Update,
)
from rivven_connect.pg.transactions import Change, Transaction

COLUMNS = (Column("id", 23, -1, True), Column("body", 25, -1, False),
           Column("doc", 3802, -1, False))
DEFAULT = Relation(1, "public", "notes", "d", COLUMNS)
FULL = Relation(2, "public", "docs", "f",
                tuple(Column(c.name, c.type_oid, -1, True) for c in COLUMNS))
BUILDER = EnvelopeBuilder(db="shop", key_columns={("public", "docs"): ("id",)})
NOW_MS = 1_700_000_000_123
COMMIT_TS_US = 1_000_000  # 2000-01-01T00:00:01Z


def row(*texts):
    return tuple(ColumnValue("n") if t is None else ColumnValue("u") if t is ... else
                 ColumnValue("t", t.encode()) for t in texts)


def txn(*changes, relation=DEFAULT):
    return Transaction(771, 0x1000, 0x1040, COMMIT_TS_US, tuple(
        Change(c, (relation,) if not isinstance(c, (Truncate, LogicalMessage)) else
               (() if isinstance(c, LogicalMessage) else (DEFAULT, FULL)), 0x900 + i)
        for i, c in enumerate(changes)))


def summary(records):
    return [(r.op, r.key, None if r.value is None else (r.value["before"], r.value["after"]))
            for r in records]


def headers(record):
    return {name: value.decode() for name, value in record.headers}


def test_insert_update_delete_under_default_identity():
    records = BUILDER.records(txn(
        Insert(1, row("1", "a", '{"x": 1}')), Update(1, row("1", "b", None)),
        Delete(1, key=row("1", None, None))), NOW_MS)
    assert summary(records) == [
        ("c", {"id": 1}, (None, {"id": 1, "body": "a", "doc": {"x": 1}})),
        ("u", {"id": 1}, (None, {"id": 1, "body": "b", "doc": None})),
        ("d", {"id": 1}, ({"id": 1}, None)),
        ("d", {"id": 1}, None)]                                      # the tombstone
    first = records[0]
    assert first.value["source"] == {
        "connector": "postgres-cdc", "db": "shop", "schema": "public", "table": "notes",
        "lsn": "0/900", "txId": 771, "ts_ms": 946_684_801_000, "snapshot": "false"}
    assert first.value["ts_ms"] == NOW_MS and first.value["op"] == "c"
    assert (first.table, first.schema, first.timestamp_ms) == ("notes", "public", 946_684_801_000)
    assert [headers(r)[HEADER_ID] for r in records] == ["0/1000:0", "0/1000:1", "0/1000:2",
                                                        "0/1000:3"]
    assert [r.position for r in records] == [CdcPosition(0x1040, 0x1000, s, s == 3)
                                             for s in range(4)]
    assert records[3].table == "notes" and records[3].op == "d"


def test_full_identity_has_whole_before_images_and_copies_unchanged_toast():
    records = BUILDER.records(txn(
        Update(2, row("1", ..., "2"), old=row("1", "big text", "1")),
        Delete(2, old=row("1", "big text", "2")), relation=FULL), NOW_MS)
    assert summary(records) == [
        ("u", {"id": 1}, ({"id": 1, "body": "big text", "doc": 1},
                          {"id": 1, "body": "big text", "doc": 2})),
        ("d", {"id": 1}, ({"id": 1, "body": "big text", "doc": 2}, None)),
        ("d", {"id": 1}, None)]
    assert HEADER_UNAVAILABLE_COLUMNS not in headers(records[0])


def test_unchanged_toast_without_a_before_image_is_the_marker_and_a_header():
    [record] = BUILDER.records(txn(Update(1, row("1", ..., ...))), NOW_MS)
    assert record.value["after"] == {"id": 1, "body": UNAVAILABLE_VALUE,
                                     "doc": UNAVAILABLE_VALUE}
    assert json.loads(headers(record)[HEADER_UNAVAILABLE_COLUMNS]) == ["body", "doc"]


@pytest.mark.parametrize("relation,update", [
    (DEFAULT, Update(1, row("2", "a", None), key=row("1", None, None))),
    (FULL, Update(2, row("2", "a", None), old=row("1", "a", None))),
])
def test_a_primary_key_change_is_a_delete_a_tombstone_and_a_create(relation, update):
    records = BUILDER.records(txn(update, relation=relation), NOW_MS)
    assert [(r.op, r.key, r.value is None) for r in records] == [
        ("d", {"id": 1}, False), ("d", {"id": 1}, True), ("c", {"id": 2}, False)]
    assert records[2].value["after"] == {"id": 2, "body": "a", "doc": None}
    assert records[2].value["before"] is None
    for record in records[:2]:
        assert json.loads(headers(record)[HEADER_PK_CHANGE_NEW_KEY]) == {"id": 2}
    assert json.loads(headers(records[2])[HEADER_PK_CHANGE_OLD_KEY]) == {"id": 1}
    assert [r.position.seq for r in records] == [0, 1, 2] and records[2].position.last


def test_truncates_and_messages():
    records = BUILDER.records(txn(Truncate(0, (1, 2)),
                                  LogicalMessage(True, 5, "rivven.wm", b"\x01")), NOW_MS)
    assert [(r.op, r.table, r.key) for r in records] == [
        ("t", "notes", None), ("t", "docs", None), ("m", None, {"prefix": "rivven.wm"})]
    assert records[2].value["message"] == {"prefix": "rivven.wm", "content": "AQ=="}
    quiet = EnvelopeBuilder(db="shop", emit_truncates=False, emit_messages=False)
    assert quiet.records(txn(Truncate(0, (1,)), LogicalMessage(True, 5, "p", b"")), 0) == []


def test_a_table_without_a_key_has_no_key_and_no_tombstone():
    builder = EnvelopeBuilder(db="shop", key_columns={("public", "docs"): ()})
    records = builder.records(txn(Delete(2, old=row("1", "a", None)), relation=FULL), NOW_MS)
    assert [(r.op, r.key) for r in records] == [("d", None)]


@pytest.mark.parametrize("builder,change,relation,match", [
    (EnvelopeBuilder(db="x"), Insert(2, row("1", "a", None)), FULL, "REPLICA IDENTITY FULL"),
    (EnvelopeBuilder(db="x", key_columns={("public", "docs"): ("nope",)}),
     Insert(2, row("1", "a", None)), FULL, "no key column 'nope'"),
    (BUILDER, Insert(1, row("1", "a")), DEFAULT, "tuple has 2 columns"),
    (BUILDER, Insert(1, row("x", "a", None)), DEFAULT, r"public.notes.id \(type oid 23\)"),
])
def test_changes_that_cannot_be_records_are_typed_errors(builder, change, relation, match):
    with pytest.raises(EnvelopeError, match=match):
        builder.records(txn(change, relation=relation), NOW_MS)


def test_every_record_of_a_table_carries_its_schema_version_which_follows_ddl():
    added = Relation(1, "public", "notes", "d", (*COLUMNS, Column("tag", 25, -1, False)))
    retyped = Relation(1, "public", "notes", "d",
                       (COLUMNS[0], Column("body", 1043, 104, False), COLUMNS[2]))
    versions = {schema_version(r) for r in (DEFAULT, added, retyped)}
    assert len(versions) == 3 and all(len(v) == 16 for v in versions)
    # the replica-identity flags do not count: a snapshot's Relation (key flags = the PK)
    # and pgoutput's under FULL (every column flagged) describe the same columns
    assert schema_version(FULL) == schema_version(
        Relation(2, "public", "docs", "d", COLUMNS))
    before = BUILDER.records(txn(Insert(1, row("1", "a", None)),
                                 Delete(1, key=row("1", None, None))), NOW_MS)
    after = BUILDER.records(txn(Insert(1, row("2", "a", None, "t")), relation=added), NOW_MS)
    assert [headers(r)[HEADER_SCHEMA_VERSION] for r in before] == [schema_version(DEFAULT)] * 3
    assert headers(after[0])[HEADER_SCHEMA_VERSION] == schema_version(added)
    assert after[0].value["after"] == {"id": 2, "body": "a", "doc": None, "tag": "t"}
    truncated = BUILDER.records(txn(Truncate(0, (1, 2))), NOW_MS)
    assert [headers(r)[HEADER_SCHEMA_VERSION] for r in truncated] == [
        schema_version(DEFAULT), schema_version(FULL)]
    snapshot = BUILDER.snapshot_record(DEFAULT, row("3", "x", None), 0x500, 0, "true", {}, NOW_MS)
    assert headers(snapshot)[HEADER_SCHEMA_VERSION] == schema_version(DEFAULT)
