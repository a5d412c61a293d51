"""pgoutput from a real Postgres 15 through decoder, assembler and envelope, checked record by
record and against a ``test_decoding`` slot over the same WAL (a differential oracle)."""

from __future__ import annotations

import json
import re
import select
import time

import psycopg2
import psycopg2.extras

from rivven_connect.pg.envelope import (
    HEADER_PK_CHANGE_NEW_KEY, HEADER_PK_CHANGE_OLD_KEY, HEADER_UNAVAILABLE_COLUMNS,
    UNAVAILABLE_VALUE, EnvelopeBuilder,
)
from rivven_connect.pg.pgoutput import LogicalMessage, Truncate, decode_message
from rivven_connect.pg.transactions import TransactionAssembler

READ_TIMEOUT_S = 20
BIG = "".join(f"{i:05d}" for i in range(1000))  # 5 KB, stored out of line (STORAGE EXTERNAL)
END_PREFIX = "test.end"

SETUP = """
CREATE TABLE orders (id int PRIMARY KEY, status text, amount numeric(10,2), paid bool,
    placed timestamptz, tags text[], doc jsonb, ref uuid, raw bytea, qty int8, ratio float8,
    day date, note text);
ALTER TABLE orders REPLICA IDENTITY FULL;
ALTER TABLE orders ALTER COLUMN note SET STORAGE EXTERNAL;
CREATE TABLE notes (id int PRIMARY KEY, title varchar(20), body text);
ALTER TABLE notes ALTER COLUMN body SET STORAGE EXTERNAL;
CREATE PUBLICATION pub FOR TABLE orders, notes;
"""
SLOTS = ["SELECT pg_create_logical_replication_slot('s_pgoutput', 'pgoutput')",
         "SELECT pg_create_logical_replication_slot('s_oracle', 'test_decoding')"]

# One list item = one transaction.
WORKLOAD = [
    ["""INSERT INTO orders VALUES (1, 'new', 12.50, false, '2024-01-02 03:04:05.5+01',
        '{a,"b c",NULL}', '{"x": [1, 2]}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '\\x00ff',
        9007199254740993, 0.5, '2024-01-02', NULL)"""],
    ["UPDATE orders SET status = 'paid', paid = true WHERE id = 1"],
    ["INSERT INTO orders (id, status) VALUES (2, 'a')",
     "UPDATE orders SET status = 'b' WHERE id = 2",
     "INSERT INTO orders (id, status, note) VALUES (3, 'big', %(big)s)"],
    ["DELETE FROM orders WHERE id = 1"],
    ["UPDATE orders SET id = 20 WHERE id = 2"],
    ["UPDATE orders SET status = 'bigger' WHERE id = 3"],               # FULL: TOAST unchanged
    ["INSERT INTO notes VALUES (1, 't', %(big)s)"],
    ["UPDATE notes SET title = 't2' WHERE id = 1"],                     # DEFAULT: TOAST unchanged
    ["UPDATE notes SET id = 2 WHERE id = 1"],                           # DEFAULT: PK change
    ["DELETE FROM notes WHERE id = 2"],
    ["SELECT pg_logical_emit_message(true, 'app.event', 'hello')"],
    ["INSERT INTO notes VALUES (7, 'x', 'y')", "TRUNCATE notes"],
]


def _run_workload(dsn: str) -> None:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cursor:
        cursor.execute(SETUP)
        conn.commit()
        for statement in SLOTS:             # each in a transaction of its own, before any DML
            cursor.execute(statement)
            conn.commit()
        for statements in WORKLOAD:
            for statement in statements:
                cursor.execute(statement, {"big": BIG})
            conn.commit()
        conn.autocommit = True
        cursor.execute("SELECT pg_logical_emit_message(false, %s, '')", (END_PREFIX,))
    conn.close()


def _read_pgoutput(dsn: str) -> list[tuple[int, bytes]]:
    """(XLogData start LSN, payload) frames up to the non-transactional end message."""
    conn = psycopg2.connect(dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection)
    frames = []
    try:
        cursor = conn.cursor()
        cursor.start_replication(slot_name="s_pgoutput", decode=False, options={
            "proto_version": "1", "publication_names": "pub", "messages": "true"})
        deadline = time.monotonic() + READ_TIMEOUT_S
        while True:
            message = cursor.read_message()
            if message is None:
                assert time.monotonic() < deadline, f"no end message after {len(frames)} frames"
                select.select([cursor], [], [], 0.2)
                continue
            payload = bytes(message.payload)
            frames.append((message.data_start, payload))
            decoded = decode_message(payload)
            if isinstance(decoded, LogicalMessage) and decoded.prefix == END_PREFIX:
                return frames
    finally:
        conn.close()


def _records(frames):
    assembler = TransactionAssembler()
    builder = EnvelopeBuilder(db="shop", key_columns={("public", "orders"): ("id",)})
    transactions, records, others = [], [], []
    for lsn, payload in frames:
        result = assembler.feed(decode_message(payload), lsn)
        if isinstance(result, LogicalMessage):
            others.append(result)
        elif result is not None:
            transactions.append(result)
            records += builder.records(result, now_ms=1)
    assembler.check_invariants()
    return transactions, records, others


def _summary(record):
    value = record.value
    if value is None:
        return ("tombstone", record.table, record.key)
    return (value["op"], record.table, record.key, value["before"], value["after"])


ORDER_1 = {"id": 1, "status": "new", "amount": "12.50", "paid": False,
           "placed": "2024-01-02T02:04:05.500000Z", "tags": ["a", "b c", None],
           "doc": {"x": [1, 2]}, "ref": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "raw": "AP8=",
           "qty": 9007199254740993, "ratio": 0.5, "day": "2024-01-02", "note": None}
ORDER_1_PAID = {**ORDER_1, "status": "paid", "paid": True}
EMPTY = dict.fromkeys(ORDER_1, None)
ORDER_2A, ORDER_2B = {**EMPTY, "id": 2, "status": "a"}, {**EMPTY, "id": 2, "status": "b"}
ORDER_3 = {**EMPTY, "id": 3, "status": "big", "note": BIG}


def test_pgoutput_from_postgres_becomes_the_expected_records(postgres_server, pg_database):
    dsn = postgres_server.dsn(pg_database)
    _run_workload(dsn)
    transactions, records, others = _records(_read_pgoutput(dsn))
    assert [_summary(r) for r in records] == [
        ("c", "orders", {"id": 1}, None, ORDER_1),
        ("u", "orders", {"id": 1}, ORDER_1, ORDER_1_PAID),
        ("c", "orders", {"id": 2}, None, ORDER_2A),
        ("u", "orders", {"id": 2}, ORDER_2A, ORDER_2B),
        ("c", "orders", {"id": 3}, None, ORDER_3),
        ("d", "orders", {"id": 1}, ORDER_1_PAID, None),
        ("tombstone", "orders", {"id": 1}),
        ("d", "orders", {"id": 2}, ORDER_2B, None),                     # PK change 2 -> 20
        ("tombstone", "orders", {"id": 2}),
        ("c", "orders", {"id": 20}, None, {**ORDER_2B, "id": 20}),
        ("u", "orders", {"id": 3}, ORDER_3, {**ORDER_3, "status": "bigger"}),  # TOAST copied
        ("c", "notes", {"id": 1}, None, {"id": 1, "title": "t", "body": BIG}),
        ("u", "notes", {"id": 1}, None, {"id": 1, "title": "t2", "body": UNAVAILABLE_VALUE}),
        ("d", "notes", {"id": 1}, {"id": 1}, None),                     # PK change 1 -> 2
        ("tombstone", "notes", {"id": 1}),
        ("c", "notes", {"id": 2}, None, {"id": 2, "title": "t2", "body": UNAVAILABLE_VALUE}),
        ("d", "notes", {"id": 2}, {"id": 2}, None),
        ("tombstone", "notes", {"id": 2}),
        ("m", None, {"prefix": "app.event"}, None, None),
        ("c", "notes", {"id": 7}, None, {"id": 7, "title": "x", "body": "y"}),
        ("t", "notes", None, None, None),
    ]
    headers = [dict((n, v.decode()) for n, v in r.headers) for r in records]
    assert json.loads(headers[12][HEADER_UNAVAILABLE_COLUMNS]) == ["body"]
    assert HEADER_UNAVAILABLE_COLUMNS not in headers[10]
    assert json.loads(headers[7][HEADER_PK_CHANGE_NEW_KEY]) == {"id": 20}
    assert json.loads(headers[8][HEADER_PK_CHANGE_NEW_KEY]) == {"id": 20}
    assert json.loads(headers[9][HEADER_PK_CHANGE_OLD_KEY]) == {"id": 2}
    assert records[18].value["message"]["content"] == "aGVsbG8="
    assert [m.prefix for m in others] == [END_PREFIX]

    # One record list per PG transaction; txId equal inside, different across; positions.
    assert len(transactions) == len(WORKLOAD)
    by_txn = {}
    for record in records:
        by_txn.setdefault(record.position.end_lsn, []).append(record)
    assert [len(group) for group in by_txn.values()] == [1, 1, 3, 2, 3, 1, 1, 1, 3, 2, 1, 2]
    for group in by_txn.values():
        assert len({r.value["source"]["txId"] for r in group if r.value}) == 1
        assert [r.position.seq for r in group] == list(range(len(group)))
        assert [r.position.last for r in group] == [False] * (len(group) - 1) + [True]
    assert len({g[0].value["source"]["txId"] for g in by_txn.values()}) == len(by_txn)
    assert list(by_txn) == sorted(by_txn)
    assert [r.position for r in records] == sorted(r.position for r in records)
    # source.lsn: strictly increasing change by change (the parts of a PK change share one).
    change_lsns = [int(r.value["source"]["lsn"].replace("/", ""), 16) for r in records
                   if r.value and HEADER_PK_CHANGE_OLD_KEY not in dict(r.headers)]
    assert all(a < b for a, b in zip(change_lsns, change_lsns[1:])), change_lsns
    for record in records:
        if record.value:
            assert record.value["source"]["db"] == "shop"
            assert record.value["source"]["snapshot"] == "false"


_TABLE_LINE = re.compile(r"^table (\w+)\.(\w+): (INSERT|UPDATE|DELETE|TRUNCATE):(.*)$")
_COLUMN = re.compile(r"(\w+)\[(.+?)\]:('(?:[^']|'')*'|null|unchanged-toast-datum|[^ ]+)")


def _oracle_columns(text: str) -> dict[str, str | None]:
    """The new tuple of a test_decoding line: column -> the type's text output as pgoutput
    sends it (None for null, ... for unchanged TOAST)."""
    text = text.split("new-tuple:")[-1]
    out = {}
    for name, _type, value in _COLUMN.findall(text):
        if value == "null":
            out[name] = None
        elif value == "unchanged-toast-datum":
            out[name] = ...
        elif _type == "boolean":                    # test_decoding spells bools out
            out[name] = {"true": "t", "false": "f"}[value]
        else:
            out[name] = value[1:-1].replace("''", "'") if value.startswith("'") else value
    return out


def test_pgoutput_agrees_with_test_decoding(postgres_server, pg_database):
    dsn = postgres_server.dsn(pg_database)
    _run_workload(dsn)
    transactions, _, _ = _records(_read_pgoutput(dsn))
    ours = []
    for transaction in transactions:
        for change in transaction.changes:
            message = change.message
            kind = type(message).__name__.upper()
            if isinstance(message, LogicalMessage):
                continue
            if isinstance(message, Truncate):
                ours += [(r.schema, r.name, kind, {}) for r in change.relations]
                continue
            tuple_ = message.new if kind != "DELETE" else None
            columns = {} if tuple_ is None else {
                column.name: None if value.kind == "n" else ... if value.kind == "u"
                else value.data.decode()
                for column, value in zip(change.relation.columns, tuple_)}
            ours.append((change.relation.schema, change.relation.name, kind, columns))
    with psycopg2.connect(dsn) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT data FROM pg_logical_slot_get_changes('s_oracle', NULL, NULL)")
        lines = [row[0] for row in cursor.fetchall()]
    conn.close()
    oracle = []
    for line in lines:
        match = _TABLE_LINE.match(line)
        if match:
            schema, table, kind, rest = match.groups()
            oracle.append((schema, table, kind,
                           _oracle_columns(rest) if kind in ("INSERT", "UPDATE") else {}))
    assert len(ours) == len(oracle) == 14
    assert ours == oracle
