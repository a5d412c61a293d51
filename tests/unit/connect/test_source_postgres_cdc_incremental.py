"""``IncrementalRunner.process``: signals from the signal table and from messages, watermarks
of this run only, chunk rows at the high watermark, positions carrying the state."""

from __future__ import annotations

import json

from rivven_connect.pg.envelope import EnvelopeBuilder
from rivven_connect.pg.incremental import key_id
from rivven_connect.pg.pgoutput import Column, ColumnValue, Insert, LogicalMessage, Relation, Update
from rivven_connect.pg.slot import SIGNAL_MESSAGE_PREFIX
from rivven_connect.pg.snapshot_reader import WATERMARK_MESSAGE_PREFIX
from rivven_connect.pg.transactions import Change, Transaction
from rivven_connect.sources.postgres_cdc_incremental import (
    IncrementalRunner, position_json, signal_message,
)

ORDERS = Relation(1, "public", "orders", "d", (Column("id", 23, -1, True),
                                                Column("status", 25, -1, False)))
SIGNALS = Relation(2, "public", "rivven_signal", "d", (
    Column("id", 25, -1, True), Column("type", 25, -1, False), Column("data", 25, -1, False)))


class Slot:
    slot_name = "rivven_slot"
    config = None
    tables = (("public", "orders"),)
    signal_table = ("public", "rivven_signal")


def _text(*values):
    return tuple(ColumnValue("n") if v is None else ColumnValue("t", str(v).encode())
                 for v in values)


def _txn(xid, lsn, *changes):
    return Transaction(xid, lsn, lsn + 8, 0, tuple(
        Change(message, (relation,) if relation else (), lsn) for message, relation in changes))


def _message(prefix, content):
    return LogicalMessage(True, 0, prefix, content.encode()), None


def _runner():
    builder = EnvelopeBuilder(db="shop", key_columns={("public", "orders"): ("id",),
                                                      ("public", "rivven_signal"): ("id",)},
                              emit_messages=False)
    runner = IncrementalRunner(Slot(), builder, {("public", "orders"): ("id",)}, None, 1024,
                               lambda: 1000)
    return runner, builder


def _process(runner, builder, txn):
    return runner.process(txn, builder.records(txn, 0, position_json))


def test_signals_watermarks_and_positions():
    runner, builder = _runner()
    signal = _txn(700, 0x100, (Insert(2, _text("s1", "execute-snapshot",
                                                '{"data-collections": ["orders"], "chunk-size": 2}')), SIGNALS))
    [record] = _process(runner, builder, signal)
    assert record.position_only  # the signal row is consumed; the state change committed
    state = {"tables": ["public.orders"], "last_key": None, "chunk_rows": 2,
             "paused": False}
    assert record.position == {"end_lsn": "0/108", "commit_lsn": "0/100", "seq": 0,
                               "last": True, "incremental": state}
    request = runner.core.next_chunk()
    rows = [builder.snapshot_record(ORDERS, _text(k, "old"), 0x200, k, "incremental", None, 0)
            for k in (1, 2)]
    runner.core.chunk_read(request.chunk_id, [(key_id(r.key), r) for r in rows], ("2",), [])

    def mark(kind, run=runner.run_id, slot="rivven_slot"):
        return _message(WATERMARK_MESSAGE_PREFIX, json.dumps(
            {"slot": slot, "run": run, "chunk": request.chunk_id, "kind": kind}))

    assert _process(runner, builder, _txn(701, 0x300, mark("low", run="older"))) == []
    assert _process(runner, builder, _txn(702, 0x310, mark("low", slot="other"))) == []
    assert _process(runner, builder, _txn(703, 0x320, mark("low"))) == []
    update = _txn(704, 0x400, (Update(1, _text(1, "new")), ORDERS))
    [changed] = _process(runner, builder, update)
    assert changed.op == "u" and changed.position["incremental"] == state
    emitted = _process(runner, builder, _txn(705, 0x500, mark("high")))
    assert [(r.op, r.key) for r in emitted] == [("r", {"id": 2})]  # 1 changed in the window
    assert emitted[0].position == {"end_lsn": "0/508", "commit_lsn": "0/500", "seq": 0,
                                   "last": True, "incremental": {**state, "last_key": ["2"]}}
    assert emitted[0].value["source"]["snapshot"] == "incremental"


def test_signal_messages_bad_signals_and_other_slots():
    runner, builder = _runner()
    bad = _txn(1, 0x100, _message(SIGNAL_MESSAGE_PREFIX, "{"),
               (Insert(2, _text("s2", "explode", None)), SIGNALS))
    assert _process(runner, builder, bad) == [] and runner.signals["refused"] == 2
    other = signal_message("someone_else", "execute-snapshot", {"data-collections": ["orders"]})
    assert _process(runner, builder, _txn(2, 0x200, _message(SIGNAL_MESSAGE_PREFIX, other))) == []
    ours = signal_message("rivven_slot", "execute-snapshot", {"data-collections": ["orders"],
                                                               "chunk-size": 5})
    [record] = _process(runner, builder, _txn(3, 0x300, _message(SIGNAL_MESSAGE_PREFIX, ours)))
    assert record.position["incremental"]["chunk_rows"] == 5
    assert runner.signals == {"refused": 2, "accepted": 1}
    [record] = _process(runner, builder, _txn(4, 0x400, _message(
        SIGNAL_MESSAGE_PREFIX, '{"type": "stop-snapshot"}')))  # no slot named: for every one
    assert record.position_only and "incremental" not in record.position


def test_positions_without_a_snapshot_running():
    runner, builder = _runner()
    two = _txn(10, 0x100, (Insert(1, _text(1, "a")), ORDERS), (Insert(1, _text(2, "b")), ORDERS))
    given = builder.records(two, 0, position_json)
    out = runner.process(two, given)
    assert out == given  # the builder's positions stand
    assert [r.position for r in out] == [
        {"end_lsn": "0/108", "commit_lsn": "0/100", "seq": 0, "last": False},
        {"end_lsn": "0/108", "commit_lsn": "0/100", "seq": 1, "last": True}]
    # A signal row consumed: the rest renumbered, the last one last.
    mixed = _txn(11, 0x200, (Insert(1, _text(3, "c")), ORDERS),
                 (Insert(2, _text("s9", "stop-snapshot", None)), SIGNALS))
    [record] = _process(runner, builder, mixed)
    assert record.key == {"id": 3} and record.position == {
        "end_lsn": "0/208", "commit_lsn": "0/200", "seq": 0, "last": True}
    # A snapshot started and stopped: a record in the stopping transaction carries no state.
    start = signal_message("rivven_slot", "execute-snapshot", {"data-collections": ["orders"]})
    [started] = _process(runner, builder, _txn(12, 0x300, _message(SIGNAL_MESSAGE_PREFIX, start)))
    assert "incremental" in started.position
    stop = _txn(13, 0x400, (Insert(1, _text(4, "d")), ORDERS),
                _message(SIGNAL_MESSAGE_PREFIX, '{"type": "stop-snapshot"}'))
    [stopped] = _process(runner, builder, stop)
    assert stopped.position == {"end_lsn": "0/408", "commit_lsn": "0/400", "seq": 0,
                                "last": True}
