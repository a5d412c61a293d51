"""The incremental (DBLog) snapshot core: signals, state, and a model of Postgres in which
writers, the chunk reads and the stream interleave arbitrarily (Hypothesis): the output
materialised by key equals the table, and no chunk row is stale when emitted."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from rivven_connect.pg.incremental import (
    IncrementalSnapshot, IncrementalSnapshotError, IncrementalState, Signal, SignalError,
    key_id, parse_signal, race_keys_max,
)

TABLES = ("public.orders", "public.items")


def test_parse_signal():
    assert parse_signal("execute-snapshot", '{"data-collections": ["orders", "public.items"],'
                        ' "chunk-size": 7}', TABLES) == Signal(
        "execute-snapshot", TABLES, 7)
    assert parse_signal("pause-snapshot", None, TABLES) == Signal("pause-snapshot")
    assert parse_signal("stop-snapshot", "{}", TABLES) == Signal("stop-snapshot")
    for kind, data, words in [
            ("snapshot", None, "unknown signal type"),
            ("execute-snapshot", "{", "not JSON"),
            ("execute-snapshot", "[1]", "JSON object"),
            ("execute-snapshot", "{}", "at least one table"),
            ("execute-snapshot", '{"data-collections": ["public.nope"]}', "not one of"),
            ("execute-snapshot", '{"data-collections": "orders"}', "list of table"),
            ("execute-snapshot", '{"data-collections": ["orders"], "chunk-size": 0}', "chunk-size"),
            ("execute-snapshot", '{"data-collections": ["orders"], "chunk-size": true}',
             "chunk-size")]:
        with pytest.raises(SignalError, match=words):
            parse_signal(kind, data, TABLES)


def test_state_json_round_trip_and_errors():
    state = IncrementalState(TABLES, ("4", "x"), 50, True)
    assert IncrementalState.from_json(state.to_json()) == state
    for bad in [None, {}, {"tables": "t", "last_key": None, "chunk_rows": 5, "paused": False},
                {"tables": ["t"], "last_key": [1], "chunk_rows": 5, "paused": False},
                {"tables": [], "last_key": None, "chunk_rows": 5, "paused": False}]:
        with pytest.raises(ValueError):
            IncrementalState.from_json(bad)


def _run_chunk(core, rows, xids=(), *, changes=(), low_changes=()):
    """Read the requested chunk with ``rows`` (key -> payload), stream ``low_changes``
    before L and ``changes`` between L and H; the rows emitted at H."""
    request = core.next_chunk()
    assert request is not None
    assert core.chunk_read(request.chunk_id, [(key_id({"id": k}), v) for k, v in rows],
                           None if not rows else (str(rows[-1][0]),), xids)
    for xid, key in low_changes:
        core.on_change(xid, request.table, key_id({"id": key}))
    core.on_watermark("low", request.chunk_id)
    for xid, key in changes:
        core.on_change(xid, request.table, key_id({"id": key}))
    return request, core.on_watermark("high", request.chunk_id)


def test_window_drops_changed_keys_and_state_moves():
    core = IncrementalSnapshot(None, 3)
    core.on_signal(Signal("execute-snapshot", ("public.orders",)))
    request, emitted = _run_chunk(core, [(1, "a"), (2, "b"), (3, "c")],
                                  changes=[(9, 2)], low_changes=[(8, 1)])
    assert request.after is None and request.limit == 3
    assert emitted == ["a", "c"]  # 2 changed in the window; 1 before L by a visible xid
    assert core.state == IncrementalState(("public.orders",), ("3",), 3)
    _request, emitted = _run_chunk(core, [(4, "d")], xids=[8, 10], low_changes=[(10, 4)])
    assert emitted == [] and core.state is None  # 10 was running in S: a race, dropped
    assert core.next_chunk() is None
    core.check_invariants()


def _rows(*keys):
    return [(key_id({"id": k}), k) for k in keys]


def test_a_race_delivered_before_the_read_takes_its_keys_out_of_the_chunk():
    core = IncrementalSnapshot(IncrementalState(("public.orders",), None, 5), 5)
    core.on_transaction(77)
    core.on_change(77, "public.orders", key_id({"id": 2}))
    core.on_change(77, "public.items", key_id({"id": 3}))  # another table's key 3
    request = core.next_chunk()
    assert core.chunk_read(request.chunk_id, _rows(1, 2, 3), ("3",), [77 + (1 << 32)])
    core.on_watermark("low", request.chunk_id)
    assert core.on_watermark("high", request.chunk_id) == [1, 3]  # 2: the stream had it
    assert core.chunks_retried == 0 and core.rows_dropped == 1
    assert core.state is None  # three rows read of five asked: the table is done
    core.check_invariants()


@pytest.mark.parametrize("how", ["before the snapshot", "too many keys", "a truncate"])
def test_a_race_whose_keys_are_unknown_drops_the_chunk(how):
    state = IncrementalState(("public.orders",), None, 5)
    core = IncrementalSnapshot(None if how == "before the snapshot" else state, 5)
    core.on_transaction(77)
    if how == "too many keys":
        for k in range(race_keys_max + 1):
            core.on_change(77, "public.orders", key_id({"id": k}))
    elif how == "a truncate":
        core.on_truncate(77, "public.orders")
    else:
        core.on_signal(Signal("execute-snapshot", ("public.orders",), 5))
    core.check_invariants()
    request = core.next_chunk()
    assert not core.chunk_read(request.chunk_id, _rows(1), ("1",), [77 + (1 << 32)])
    assert core.chunks_retried == 1 and core.next_chunk().chunk_id == request.chunk_id + 1


def test_pause_resume_stop_and_old_watermarks():
    core = IncrementalSnapshot(None, 2)
    core.on_signal(Signal("pause-snapshot"))  # nothing running: ignored
    assert core.state is None
    core.on_signal(Signal("execute-snapshot", ("public.orders",), 4))
    core.on_signal(Signal("execute-snapshot", TABLES))
    assert core.state == IncrementalState(TABLES, None, 4)
    request = core.next_chunk()
    core.on_signal(Signal("pause-snapshot"))
    assert core.chunk_read(request.chunk_id, [(key_id({"id": k}), k) for k in range(4)],
                           ("3",), [])
    core.on_watermark("low", request.chunk_id)
    assert core.on_watermark("high", request.chunk_id) == [0, 1, 2, 3]  # in flight: ends
    assert core.next_chunk() is None and core.state.paused
    core.on_signal(Signal("resume-snapshot"))
    request = core.next_chunk()
    assert request.table == "public.orders" and request.after == ("3",)
    core.on_signal(Signal("stop-snapshot", ("public.orders",)))
    assert core.on_watermark("high", request.chunk_id) is None  # stopped: ignored
    assert core.state == IncrementalState(("public.items",), None, 4)
    assert core.next_chunk().table == "public.items"
    core.on_signal(Signal("stop-snapshot"))
    assert core.state is None and core.chunk is None


def test_watermarks_out_of_order_are_errors():
    core = IncrementalSnapshot(IncrementalState(("public.orders",), None, 5), 5)
    request = core.next_chunk()
    with pytest.raises(IncrementalSnapshotError):
        core.on_watermark("low", request.chunk_id)  # before the read
    core.chunk_read(request.chunk_id, [], None, [])
    with pytest.raises(IncrementalSnapshotError):
        core.on_watermark("high", request.chunk_id)


def test_a_truncate_in_the_window_empties_the_chunk():
    core = IncrementalSnapshot(IncrementalState(("public.orders",), None, 5), 5)
    request = core.next_chunk()
    core.chunk_read(request.chunk_id, [(key_id({"id": 1}), "a")], ("1",), [])
    core.on_watermark("low", request.chunk_id)
    core.on_truncate(5, "public.other")
    core.on_truncate(5, "public.orders")
    assert core.on_watermark("high", request.chunk_id) == []


# --- the model ------------------------------------------------------------------------------
KEYS = range(8)


class Model:
    """Postgres as the core sees it: a transaction begins (xid, locks its keys), writes its
    commit record to the WAL, then becomes visible; the chunk read commits L, takes a
    snapshot (visible rows, running xids), reads, commits H; the stream reads the WAL."""

    def __init__(self, table: dict[int, int], chunk_rows: int) -> None:
        self.visible = dict(table)
        self.wal: list[tuple] = []
        self.read_at = 0                  # stream position in the WAL
        self.next_xid = 100
        self.running: dict[int, list] = {}   # xid -> ops; began, not visible
        self.recorded: list[int] = []        # commit record written, not visible yet
        self.locked: set[int] = set()
        self.core: IncrementalSnapshot = IncrementalSnapshot(None, chunk_rows)
        self.core.on_signal(Signal("execute-snapshot", ("public.t",)))
        self.reading: tuple | None = None    # (request, phase, snapshot rows, running xids)
        self.output: list[tuple] = []
        self.state_at_wal: dict[int, int | None] = dict(table)  # table after the stream read

    def begin(self, ops: list[tuple[int, int | None]]) -> None:
        ops = [(k, v) for k, v in ops if k not in self.locked]
        self.locked |= {k for k, _v in ops}
        self.running[self.next_xid] = ops
        self.next_xid += 1

    def record(self) -> None:
        waiting = [xid for xid in self.running if xid not in self.recorded]
        if waiting:
            xid = waiting[0]
            self.recorded.append(xid)
            self.wal.append(("txn", xid, self.running[xid]))

    def make_visible(self) -> None:
        if self.recorded:
            xid = self.recorded.pop(0)
            for k, v in self.running.pop(xid):
                self.locked.discard(k)
                if v is None:
                    self.visible.pop(k, None)
                else:
                    self.visible[k] = v

    def chunk_step(self) -> None:
        if self.reading is None:
            request = self.core.next_chunk()
            if request is not None:
                self.wal.append(("wm", "low", request.chunk_id))
                self.reading = (request, "low")
            return
        request, phase = self.reading[:2]
        if phase == "low":
            after = -1 if request.after is None else int(request.after[0])
            keys = sorted(k for k in self.visible if k > after)[:request.limit]
            self.reading = (request, "read", [(k, self.visible[k]) for k in keys],
                            list(self.running))
            return
        self.wal.append(("wm", "high", request.chunk_id))
        rows = self.reading[2]
        self.core.chunk_read(request.chunk_id, [(key_id({"id": k}), (k, v)) for k, v in rows],
                             (str(rows[-1][0]),) if rows else None, self.reading[3])
        self.reading = None

    def consume(self) -> None:
        if self.reading is not None or self.read_at == len(self.wal):
            return  # the source reads the chunk in its poll loop: no stream meanwhile
        entry = self.wal[self.read_at]
        self.read_at += 1
        if entry[0] == "txn":
            _kind, xid, ops = entry
            self.core.on_transaction(xid)
            for k, v in ops:
                self.core.on_change(xid, "public.t", key_id({"id": k}))
                self.output.append(("stream", k, v))
                self.state_at_wal[k] = v
        else:
            rows = self.core.on_watermark(entry[1], entry[2])
            for k, v in rows or ():
                assert self.state_at_wal.get(k) == v, ("stale r", k, v, self.state_at_wal)
                self.output.append(("r", k, v))
        self.core.check_invariants()


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), st.integers(0, 9)), st.integers(1, 4),
       st.lists(st.one_of(
           st.tuples(st.just("begin"), st.lists(st.tuples(st.sampled_from(KEYS), st.one_of(
               st.none(), st.integers(10, 99))), min_size=1, max_size=3)),
           st.tuples(st.sampled_from(["record", "visible", "chunk", "consume"]))),
           max_size=120))
def test_any_interleaving_materialises_to_the_table(table, chunk_rows, steps):
    model = Model(table, chunk_rows)
    for step in steps:
        if step[0] == "begin":
            model.begin(step[1])
        elif step[0] == "record":
            model.record()
        elif step[0] == "visible":
            model.make_visible()
        elif step[0] == "chunk":
            model.chunk_step()
        else:
            model.consume()
    while model.running:  # the writers finish
        model.record()
        model.make_visible()
    for _ in range(1000):  # then the snapshot and the stream run to the end
        if model.core.state is None and model.reading is None and model.read_at == len(
                model.wal):
            break
        model.chunk_step()
        while model.read_at < len(model.wal) and model.reading is None:
            model.consume()
    else:
        raise AssertionError("the snapshot did not finish")
    materialised: dict[int, int] = {}  # a consumer of the topic: last event per key wins
    for _kind, k, v in model.output:
        if v is None:
            materialised.pop(k, None)
        else:
            materialised[k] = v
    assert materialised == model.visible
    emitted = [k for kind, k, _v in model.output if kind == "r"]
    assert len(emitted) == len(set(emitted))  # one snapshot: each row at most once


@pytest.mark.parametrize("consumed_before_the_read", [True, False])
def test_a_commit_record_before_l_still_running_in_s_is_no_stale_row(consumed_before_the_read):
    """The race of the module docstring, both ways: the stream delivered the transaction
    before the chunk was read or after; either way its key leaves the buffer (before: when
    the chunk is read, the transaction's keys being known; after: when it streams)."""
    model = Model({1: 1, 2: 2}, 4)
    model.begin([(1, 5)])
    model.record()             # commit record in the WAL; not visible yet
    if consumed_before_the_read:
        model.consume()
    for _ in range(3):
        model.chunk_step()     # L, the snapshot (1 still 1, xid running), H
    model.make_visible()
    while model.read_at < len(model.wal):
        model.consume()
    assert model.output == [("stream", 1, 5), ("r", 2, 2)]
    assert model.core.chunks_retried == 0 and model.core.state is None
