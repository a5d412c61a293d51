"""Begin..Commit assembly, the relation cache and the replay (LSN) filter."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rivven_connect.pg.pgoutput import (
    Begin, Column, ColumnValue, Commit, Delete, Insert, LogicalMessage, Origin, Relation,
    Truncate, Type, Update,
)
from rivven_connect.pg.transactions import (
    ReplicationStateError, Transaction, TransactionAssembler, TransactionTooLarge,
)

ORDERS = Relation(16384, "public", "orders", "d",
                  (Column("id", 23, -1, True), Column("note", 25, -1, False)))
ITEMS = Relation(16390, "public", "items", "f", (Column("id", 23, -1, True),))


def row(*texts: str | None) -> tuple[ColumnValue, ...]:
    return tuple(ColumnValue("n") if t is None else ColumnValue("t", t.encode()) for t in texts)


def transaction_messages(xid: int, commit_lsn: int, changes: list) -> list:
    return [Begin(commit_lsn, 5_000, xid), *changes,
            Commit(0, commit_lsn, commit_lsn + 40, 5_000)]


def feed_all(assembler: TransactionAssembler, messages: list) -> list:
    out = []
    for message in messages:
        result = assembler.feed(message)
        assembler.check_invariants()
        if result is not None:
            out.append(result)
    return out


def test_a_transaction_with_relations_and_changes():
    assembler = TransactionAssembler()
    messages = transaction_messages(771, 1000, [
        ORDERS, Insert(ORDERS.oid, row("1", "a")), Origin(900, "upstream"),
        Update(ORDERS.oid, row("1", "b")), Delete(ORDERS.oid, key=row("1", None)),
        ITEMS, Truncate(1, (ORDERS.oid, ITEMS.oid)),
        LogicalMessage(True, 990, "rivven.wm", b"{}")])
    [txn] = feed_all(assembler, messages)
    assert (txn.xid, txn.commit_lsn, txn.end_lsn, txn.origin) == (771, 1000, 1040, "upstream")
    assert [type(c.message).__name__ for c in txn.changes] == [
        "Insert", "Update", "Delete", "Truncate", "LogicalMessage"]
    assert txn.changes[0].relation is ORDERS and txn.changes[0].lsn == 1000
    assert txn.changes[3].relations == (ORDERS, ITEMS)
    assert txn.changes[4].relations == ()
    assert not assembler.in_transaction


def test_wal_lsn_is_kept_per_change():
    assembler = TransactionAssembler()
    assembler.feed(ORDERS)
    assembler.feed(Begin(1000, 0, 1))
    assembler.feed(Insert(ORDERS.oid, row("1", "a")), wal_lsn=950)
    assembler.feed(Insert(ORDERS.oid, row("2", "a")), wal_lsn=960)
    txn = assembler.feed(Commit(0, 1000, 1040, 0), wal_lsn=1040)
    assert [c.lsn for c in txn.changes] == [950, 960]


def test_a_relation_message_mid_stream_replaces_the_cached_one():
    assembler = TransactionAssembler()
    altered = Relation(ORDERS.oid, "public", "orders", "d",
                       (*ORDERS.columns, Column("qty", 23, -1, False)))
    [txn] = feed_all(assembler, transaction_messages(1, 100, [
        ORDERS, Insert(ORDERS.oid, row("1", "a")),
        altered, Insert(ORDERS.oid, row("2", "b", "3"))]))
    assert [c.relation for c in txn.changes] == [ORDERS, altered]
    assert assembler.relations[ORDERS.oid] is altered


def test_non_transactional_messages_come_out_at_once():
    assembler = TransactionAssembler()
    message = LogicalMessage(False, 77, "heartbeat", b"x")
    assert assembler.feed(message) is message


@pytest.mark.parametrize("messages,match", [
    ([Commit(0, 1, 2, 0)], "Commit outside a transaction"),
    ([Insert(ORDERS.oid, row("1", "a"))], "Insert outside a transaction"),
    ([Begin(1, 0, 1), Begin(2, 0, 2)], "Begin of xid 2 inside xid 1"),
    ([Begin(1, 0, 1), Insert(ORDERS.oid, row("1", "a"))], "before its Relation"),
    ([ORDERS, Begin(1, 0, 1), Truncate(0, (ORDERS.oid, 5))], "oid 5 before"),
    ([Begin(1, 0, 1), Commit(0, 2, 3, 0)], "does not match"),
])
def test_impossible_orders_are_typed_errors(messages, match):
    assembler = TransactionAssembler()
    with pytest.raises(ReplicationStateError, match=match):
        feed_all(assembler, messages)


def test_transactions_are_bounded():
    assembler = TransactionAssembler(changes_max=2)
    with pytest.raises(TransactionTooLarge, match="xid 9 has more than 2"):
        feed_all(assembler, [ORDERS, Begin(10, 0, 9)]
                 + [Insert(ORDERS.oid, row(str(i), "a")) for i in range(3)])


def test_reconnect_forgets_relations_and_the_open_transaction():
    assembler = TransactionAssembler()
    feed_all(assembler, [ORDERS, Begin(10, 0, 9)])
    assembler.on_reconnect()
    assert not assembler.in_transaction and assembler.relations == {}
    with pytest.raises(ReplicationStateError, match="before its Relation"):
        feed_all(assembler, transaction_messages(9, 10, [Insert(ORDERS.oid, row("1", "a"))]))


def test_a_resume_point_inside_a_commit_record_is_refused():
    assembler = TransactionAssembler(resume_end_lsn=1020)
    with pytest.raises(ReplicationStateError, match="inside the commit record"):
        feed_all(assembler, [ORDERS, *transaction_messages(
            1, 1000, [Insert(ORDERS.oid, row("1", "a"))])])


STREAMS = st.lists(st.lists(st.integers(0, 99), max_size=4), min_size=1, max_size=12)


@settings(max_examples=200)
@given(STREAMS, st.data())
def test_replay_after_a_crash_delivers_each_transaction_once(stream, data):
    """Model: the transactions are a list; a restart at any stored end_lsn, with Postgres
    resending from any earlier transaction, delivers exactly the later ones, in order."""
    messages, expected = [ORDERS], []
    for xid, ids in enumerate(stream, start=1):
        commit_lsn = 1000 * xid
        changes = [Insert(ORDERS.oid, row(str(i), None)) for i in ids]
        messages += transaction_messages(xid, commit_lsn, changes)
        expected.append((xid, commit_lsn + 40, [c.new for c in changes]))
    first = feed_all(TransactionAssembler(), messages)
    assert [(t.xid, t.end_lsn, [c.message.new for c in t.changes]) for t in first] == expected
    stored = data.draw(st.integers(0, len(expected)))          # transactions committed
    resend_from = data.draw(st.integers(0, stored))            # slot lags the stored offset
    resume_end_lsn = expected[stored - 1][1] if stored else 0
    resent = [ORDERS] + [m for m in messages[1:] if _xid_of(m, messages) > resend_from]
    assembler = TransactionAssembler(resume_end_lsn=resume_end_lsn)
    second = feed_all(assembler, resent)
    assert [t.xid for t in second] == [x for x, _, _ in expected[stored:]]
    assert assembler.statistics()["transactions_dropped_as_replayed"] == stored - resend_from


def _xid_of(message, messages) -> int:
    # The xid of the transaction a message belongs to (messages are unique objects by index).
    xid = 0
    for candidate in messages:
        if isinstance(candidate, Begin):
            xid = candidate.xid
        if candidate is message:
            return xid
    raise AssertionError(message)


def test_types_are_cached():
    assembler = TransactionAssembler()
    assembler.feed(Type(70000, "public", "mood"))
    assert assembler.types[70000].name == "mood"
    assert isinstance(feed_all(assembler, transaction_messages(1, 10, []))[0], Transaction)
