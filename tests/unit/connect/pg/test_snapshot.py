"""``plan_start``: the start each snapshot mode makes for each stored offset and slot state
(docs/connect-postgres.md "Snapshots"), and the snapshot ``r`` record."""

from __future__ import annotations

import pytest

from rivven_connect.pg.envelope import EnvelopeBuilder, schema_version
from rivven_connect.pg.pgoutput import Column, ColumnValue, Relation
from rivven_connect.pg.snapshot import SnapshotPosition, StartPlan, plan_start

STREAMED = {"end_lsn": "0/500", "commit_lsn": "0/4F0", "seq": 3, "last": True}
MID = SnapshotPosition(0x300, 0, "public.orders", ("7",), 7, False).to_json()
DONE = SnapshotPosition(0x300, 1, "public.items", ("9",), 20, True).to_json()
SNAPSHOT = StartPlan("snapshot", drop_slot=True)
FRESH_SNAPSHOT = StartPlan("snapshot")


@pytest.mark.parametrize("mode,stored,slot,action,extra", [
    ("never", None, "missing", "stream", {"create_slot": True}),
    ("never", None, "ok", "stream", {}),
    ("never", None, "lost", "refuse", {}),
    ("never", STREAMED, "ok", "stream", {"stream_from": 0x500}),
    ("never", STREAMED, "missing", "refuse", {}),
    ("never", DONE, "ok", "stream", {"stream_from": 0x300}),
    ("initial", None, "missing", "snapshot", {}),
    ("initial", None, "ok", "snapshot", {"drop_slot": True}),  # no offset: nothing was sent
    ("initial", None, "lost", "snapshot", {"drop_slot": True}),
    ("initial", STREAMED, "ok", "stream", {"stream_from": 0x500}),
    ("initial", STREAMED, "lost", "refuse", {}),
    ("initial", STREAMED, "missing", "refuse", {}),
    ("initial", DONE, "ok", "stream", {"stream_from": 0x300}),
    ("initial", MID, "ok", "refuse", {}),
    ("when_needed", None, "missing", "snapshot", {}),
    ("when_needed", STREAMED, "ok", "stream", {"stream_from": 0x500}),
    ("when_needed", STREAMED, "lost", "snapshot", {"drop_slot": True}),
    ("when_needed", STREAMED, "missing", "snapshot", {}),
    ("when_needed", MID, "ok", "refuse", {}),
    ("always", STREAMED, "ok", "snapshot", {"drop_slot": True}),
    ("always", None, "missing", "snapshot", {}),
    ("always", MID, "ok", "snapshot", {"drop_slot": True}),
    ("initial_only", None, "missing", "snapshot", {"temporary": True, "stop_after": True}),
    ("initial_only", None, "ok", "snapshot", {"temporary": True, "stop_after": True}),
    ("initial_only", DONE, "missing", "stop", {}),
    ("initial_only", MID, "missing", "refuse", {}),
    ("initial_only", STREAMED, "ok", "refuse", {}),
])
def test_plan_start(mode, stored, slot, action, extra):
    plan = plan_start(mode, stored, slot)
    if action == "refuse":
        assert plan.action == "refuse" and plan.reason
        return
    assert plan == StartPlan(action, **extra)


def test_an_interrupted_snapshot_is_refused_with_the_reason():
    reason = plan_start("initial", MID, "ok").reason
    assert "interrupted" in reason and "on_interrupted: resume" in reason
    assert "restart to snapshot again" in reason


@pytest.mark.parametrize("mode,slot,expected", [
    ("initial", "ok", StartPlan("resume", stream_from=0x300)),
    ("when_needed", "ok", StartPlan("resume", stream_from=0x300)),
    ("when_needed", "lost", SNAPSHOT),       # the WAL since is gone: a new snapshot
    ("when_needed", "missing", FRESH_SNAPSHOT),
    ("initial", "lost", "refuse"),
    ("initial", "missing", "refuse"),
    ("initial_only", "missing", "refuse"),   # its temporary slot is gone: nothing to stream
    ("never", "ok", "refuse"),
    ("always", "ok", SNAPSHOT),              # snapshots at every start anyway
])
def test_on_interrupted_resume_streams_from_the_consistent_lsn(mode, slot, expected):
    plan = plan_start(mode, MID, slot, "resume")
    if expected == "refuse":
        assert plan.action == "refuse" and plan.reason
    else:
        assert plan == expected
    assert plan_start(mode, DONE, "ok", "resume").action in ("stream", "stop", "snapshot")


@pytest.mark.parametrize("mode,slot,expected", [
    ("initial", "ok", SNAPSHOT),
    ("when_needed", "ok", SNAPSHOT),
    ("when_needed", "lost", SNAPSHOT),
    ("initial", "missing", FRESH_SNAPSHOT),
    ("initial_only", "missing", StartPlan("snapshot", temporary=True, stop_after=True)),
])
def test_on_interrupted_restart_snapshots_again(mode, slot, expected):
    assert plan_start(mode, MID, slot, "restart") == expected
    assert plan_start(mode, DONE, "ok", "restart").action in ("stream", "stop")
    assert plan_start("never", MID, "ok", "restart").action == "refuse"


def test_a_snapshot_row_is_an_r_record_typed_as_streamed_rows():
    relation = Relation(1, "public", "orders", "f", (
        Column("id", 23, -1, True), Column("amount", 1700, -1, False),
        Column("tags", 1009, -1, False), Column("note", 25, -1, False)))
    builder = EnvelopeBuilder(db="shop", key_columns={("public", "orders"): ("id",)})
    row = (ColumnValue("t", b"7"), ColumnValue("t", b"10.50"), ColumnValue("t", b"{a,b}"),
           ColumnValue("n"))
    record = builder.snapshot_record(relation, row, 0x300, 6, "last", MID, 1234)
    assert record.key == {"id": 7} and record.op == "r" and record.position == MID
    assert record.value == {
        "before": None, "after": {"id": 7, "amount": "10.50", "tags": ["a", "b"], "note": None},
        "op": "r", "ts_ms": 1234,
        "source": {"connector": "postgres-cdc", "db": "shop", "schema": "public",
                   "table": "orders", "lsn": "0/300", "txId": None, "ts_ms": 1234,
                   "snapshot": "last"}}
    assert dict(record.headers) == {"rivven.cdc.id": b"0/300:r:6",
                                    "rivven.cdc.schema_version":
                                        schema_version(relation).encode()}
