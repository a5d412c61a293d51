"""The polling outbox's pure core (rivven_connect.pg.outbox_poll): positions, typing, and a
model run with crashes at every step against the batch cycle's order (commit, then side
effect; after a restart the stored position's side effect first)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rivven_connect.pg.outbox_poll import (
    POLL_ROWS_MAX, OutboxPoller, OutboxPosition, OutboxTableShape,
)

SHAPE = OutboxTableShape("public", "outbox", (
    ("id", 20), ("aggregatetype", 25), ("aggregateid", 25), ("type", 25), ("payload", 3802),
    ("created", 1184)), "id")


def _row(n: int) -> tuple:
    return (str(n), "Order", f"o-{n % 3}", "Created", '{"n": %d, "x": 1.50}' % n,
            "2024-01-02 03:04:05+01")


def test_records_are_typed_like_cdc_and_the_last_one_carries_the_batch_ids():
    poller = OutboxPoller()
    records = poller.records(SHAPE, [_row(7), _row(3)])
    assert [r.value for r in records] == [
        {"id": 7, "aggregatetype": "Order", "aggregateid": "o-1", "type": "Created",
         "payload": {"n": 7, "x": 1.5}, "created": "2024-01-02T02:04:05Z"},
        {"id": 3, "aggregatetype": "Order", "aggregateid": "o-0", "type": "Created",
         "payload": {"n": 3, "x": 1.5}, "created": "2024-01-02T02:04:05Z"}]
    assert [(r.key, r.op, r.table, r.schema) for r in records] == [
        (7, "c", "outbox", "public"), (3, "c", "outbox", "public")]
    assert [r.position for r in records] == [
        {"poll": 0, "n": 0, "last": False},
        {"poll": 0, "n": 1, "last": True, "ids": ["7", "3"]}]
    assert poller.exclude_ids() == ("7", "3")
    assert OutboxPoller.side_effect_ids(records[-1].position) == ("7", "3")
    poller.side_effect_done(records[-1].position)
    assert poller.exclude_ids() == ()
    assert poller.records(SHAPE, [_row(1)])[0].position["poll"] == 1


def test_resume_continues_numbering_and_excludes_the_stored_batch_until_its_side_effect():
    poller = OutboxPoller()
    stored = {"poll": 41, "n": 2, "last": True, "ids": ["5", "6", "9"]}
    poller.resume(stored)
    assert poller.exclude_ids() == ("5", "6", "9")
    poller.side_effect_done(stored)
    assert poller.exclude_ids() == ()
    [record] = poller.records(SHAPE, [_row(10)])
    assert OutboxPosition.from_json(record.position).key() > OutboxPosition.from_json(
        stored).key()


@pytest.mark.parametrize("raw", [
    None, [], {"poll": -1, "n": 0, "last": False}, {"poll": 0, "n": True, "last": False},
    {"poll": 0, "n": 0, "last": True}, {"poll": 0, "n": 0, "last": False, "ids": ["1"]},
    {"poll": 0, "n": 0, "last": True, "ids": []}, {"poll": 0, "n": 0, "last": True, "ids": [1]},
    {"poll": 0, "n": 0, "last": True, "ids": ["1"] * (POLL_ROWS_MAX + 1)},
    {"end_lsn": "0/1", "seq": 0, "last": True},
])
def test_what_is_not_a_position_is_a_value_error(raw):
    with pytest.raises(ValueError):
        OutboxPosition.from_json(raw)


def test_resume_inside_a_batch_or_a_side_effect_of_one_is_refused():
    with pytest.raises(ValueError, match="not the end of a batch"):
        OutboxPoller().resume({"poll": 3, "n": 0, "last": False})
    with pytest.raises(ValueError):
        OutboxPoller.side_effect_ids({"poll": 3, "n": 0, "last": False})


def test_a_null_or_repeated_id_and_bad_text_are_value_errors():
    poller = OutboxPoller()
    with pytest.raises(ValueError, match="null id"):
        poller.records(SHAPE, [(None, *_row(1)[1:])])
    with pytest.raises(ValueError, match="not unique"):
        poller.records(SHAPE, [_row(1), _row(1)])
    with pytest.raises(ValueError):
        poller.records(SHAPE, [("x", *_row(1)[1:])])
    assert poller.next_poll == 0 and poller.exclude_ids() == ()


STEPS = st.lists(st.one_of(
    st.tuples(st.just("insert"), st.integers(0, 60)),   # a row commits (any id: late ones too)
    st.tuples(st.just("run"), st.integers(1, 5)),       # poll + commit + side effect, n rows
    st.tuples(st.just("crash"), st.sampled_from(["before_commit", "after_commit"])),
), max_size=40)


@settings(max_examples=300)
@given(STEPS)
def test_every_row_is_delivered_exactly_once_across_crashes(steps):
    """The table, the broker's committed records and offset, and a poller that a crash
    replaces (resuming from the stored offset, running its side effect first)."""
    table: dict[str, tuple] = {}
    inserted: set[str] = set()
    delivered: list[str] = []
    stored = None
    poller = OutboxPoller()

    def poll(limit: int) -> list:
        excluded = set(poller.exclude_ids())
        pending = sorted((int(i) for i in table if i not in excluded))[:limit]
        return poller.records(SHAPE, [table[str(i)] for i in pending]) if pending else []

    def restart() -> OutboxPoller:
        fresh = OutboxPoller()
        fresh.resume(stored)
        if stored is not None:  # the cycle's first step: the stored position's side effect
            for identifier in OutboxPoller.side_effect_ids(stored):
                table.pop(identifier, None)
            fresh.side_effect_done(stored)
        return fresh

    for kind, arg in steps:
        if kind == "insert":
            if str(arg) not in inserted:
                inserted.add(str(arg))
                table[str(arg)] = _row(arg)
        elif kind == "run":
            records = poll(arg)
            if records:
                delivered.extend(str(r.key) for r in records)
                stored = records[-1].position
                for identifier in OutboxPoller.side_effect_ids(stored):
                    table.pop(identifier, None)
                poller.side_effect_done(stored)
        elif arg == "before_commit":
            poll(3)  # polled, never committed: the locks and the batch are gone
            poller = restart()
        else:
            records = poll(3)
            if records:  # committed, side effect cut off by the crash
                delivered.extend(str(r.key) for r in records)
                stored = records[-1].position
            poller = restart()
        poller.check_invariants()
        assert len(delivered) == len(set(delivered)), delivered  # never twice
    while records := poll(POLL_ROWS_MAX):  # drain
        delivered.extend(str(r.key) for r in records)
        for identifier in OutboxPoller.side_effect_ids(records[-1].position):
            table.pop(identifier, None)
        poller.side_effect_done(records[-1].position)
    assert sorted(delivered) == sorted(inserted) and not table
