"""Dotted paths, predicates (every condition, negate) and Filter."""

from __future__ import annotations

import re

import pytest

from rivven_connect.core.records import Record
from rivven_connect.core.transforms import TransformConfigError, parse_predicate
from rivven_connect.core.transforms.paths import (
    MISSING,
    delete_path,
    get_path,
    parse_path,
    set_path,
)

from .helpers import cdc_record, run

VALUE = {"a": {"b": {"c": 1}, "n": None, "l": [1, 2]}, "top": "x"}


@pytest.mark.parametrize("path,expected", [
    ("top", "x"),
    ("a.b.c", 1),
    ("a.n", None),
    ("a.l", [1, 2]),
    ("a.missing", MISSING),
    ("a.n.deeper", MISSING),   # through a null
    ("a.l.0", MISSING),        # no array indexing
    ("top.x", MISSING),        # through a string
])
def test_get_path(path, expected):
    found = get_path(VALUE, parse_path(path))
    if expected is MISSING:
        assert found is MISSING
    else:
        assert found is not MISSING and found == expected


@pytest.mark.parametrize("text", ["", "a..b", ".a", "a."])
def test_parse_path_refuses_empty_segments(text):
    with pytest.raises(ValueError):
        parse_path(text)


def test_set_and_delete_copy_and_never_mutate():
    original = {"a": {"b": 1}, "k": 2}
    changed = set_path(original, ("a", "c", "d"), 3)
    assert changed == {"a": {"b": 1, "c": {"d": 3}}, "k": 2}
    assert original == {"a": {"b": 1}, "k": 2}
    removed = delete_path(changed, ("a", "b"))
    assert removed == {"a": {"c": {"d": 3}}, "k": 2} and changed["a"]["b"] == 1
    assert delete_path(original, ("nope", "x")) is original
    with pytest.raises(TypeError):
        set_path(original, ("k", "x"), 1)


ORDER = cdc_record("u", before={"status": "new"}, after={"status": "paid", "total": 10,
                                                         "vip": True, "note": None})

# (predicate spec, record, matches?)
PREDICATE_CASES = [
    ({"table": "orders"}, ORDER, True),
    ({"table": "order"}, ORDER, False),                        # full match, not search
    ({"table": "ord.*"}, ORDER, True),
    ({"table": ["customers", "orders"]}, ORDER, True),
    ({"table": ["customers", "items"]}, ORDER, False),
    ({"table": "orders"}, Record({"x": 1}), False),            # no table: never matches
    ({"schema": "public"}, ORDER, True),
    ({"schema": ["audit"]}, ORDER, False),
    ({"operation": "u"}, ORDER, True),
    ({"operation": ["c", "d"]}, ORDER, False),
    ({"operation": ["c", "u"]}, ORDER, True),
    ({"operation": "c"}, Record({"x": 1}), False),             # no op
    ({"field_exists": "after.status"}, ORDER, True),
    ({"field_exists": "after.note"}, ORDER, True),             # null is present
    ({"field_exists": "after.missing"}, ORDER, False),
    ({"field_exists": "before.total"}, ORDER, False),
    ({"field_exists": "x"}, Record(None), False),              # a tombstone has no fields
    ({"field_value": {"path": "after.status", "equals": "paid"}}, ORDER, True),
    ({"field_value": {"path": "after.status", "equals": "new"}}, ORDER, False),
    ({"field_value": {"path": "after.total", "equals": 10}}, ORDER, True),
    ({"field_value": {"path": "after.total", "equals": 10.0}}, ORDER, True),
    ({"field_value": {"path": "after.total", "equals": "10"}}, ORDER, False),
    ({"field_value": {"path": "after.vip", "equals": True}}, ORDER, True),
    ({"field_value": {"path": "after.vip", "equals": 1}}, ORDER, False),  # true is not 1
    ({"field_value": {"path": "after.note", "equals": None}}, ORDER, True),
    ({"field_value": {"path": "after.gone", "equals": None}}, ORDER, False),
    ({"field_value": {"path": "after.status", "matches": "pa.*"}}, ORDER, True),
    ({"field_value": {"path": "after.status", "matches": "a"}}, ORDER, False),  # full match
    ({"field_value": {"path": "after.total", "matches": "10"}}, ORDER, False),  # not a string
    ({"table": "orders", "operation": "u"}, ORDER, True),      # all must hold
    ({"table": "orders", "operation": "d"}, ORDER, False),
    ({"table": "orders", "negate": True}, ORDER, False),
    ({"table": "items", "negate": True}, ORDER, True),
    ({"table": "orders", "operation": "d", "negate": True}, ORDER, True),
    ({"field_exists": "after.missing", "negate": True}, ORDER, True),
]


@pytest.mark.parametrize("spec,record,expected", PREDICATE_CASES)
def test_predicate(spec, record, expected):
    assert parse_predicate(spec, "p").matches(record) is expected


@pytest.mark.parametrize("spec,where", [
    ({}, "p: tests nothing"),
    ({"negate": True}, "p: tests nothing"),
    ({"tables": "orders"}, "p.tables: unknown option (did you mean 'table'?)"),
    ({"operation": ["c", "x"]}, "p.operation[1]: must be one of c, u, d, r"),
    ({"operation": []}, "p.operation: must be a string or a non-empty list"),
    ({"table": "("}, "p.table[0]: bad regular expression"),
    ({"negate": "yes", "table": "t"}, "p.negate: must be true or false"),
    ({"field_exists": "a..b"}, "p.field_exists: 'a..b' is not a dotted path"),
    ({"field_value": {"path": "a"}}, "p.field_value: needs exactly one of equals, matches"),
    ({"field_value": {"path": "a", "equals": 1, "matches": "1"}}, "p.field_value: needs"),
    ({"field_value": {"equals": 1}}, "p.field_value.path: is required"),
    ({"field_value": {"path": "a", "equals": 1, "x": 2}}, "p.field_value.x: unknown option"),
    ({"field_value": "a=1"}, "p.field_value: must be an object"),
    ("orders", "p: must be an object of conditions"),
])
def test_predicate_config_errors(spec, where):
    with pytest.raises(TransformConfigError, match="^" + re.escape(where)):
        parse_predicate(spec, "p")


DELETE = cdc_record("d", before={"id": 1})
INSERT = cdc_record("c", after={"id": 2})

# (filter spec, record, kept?)
FILTER_CASES = [
    ({"type": "Filter", "drop": {"operation": "d"}}, DELETE, False),
    ({"type": "Filter", "drop": {"operation": "d"}}, INSERT, True),
    ({"type": "Filter", "keep": {"operation": "d"}}, DELETE, True),
    ({"type": "Filter", "keep": {"operation": "d"}}, INSERT, False),
    ({"type": "Filter", "keep": {"operation": "d", "negate": True}}, INSERT, True),
    # Kafka Connect's form: drop what the predicate selects
    ({"type": "Filter", "predicate": {"table": "orders"}}, INSERT, False),
    ({"type": "Filter", "predicate": {"table": "items"}}, INSERT, True),
    # a predicate limits which records a keep-filter even looks at
    ({"type": "Filter", "predicate": {"table": "items"}, "keep": {"operation": "d"}}, INSERT,
     True),
    ({"type": "Filter", "predicate": {"table": "orders"}, "keep": {"operation": "d"}}, INSERT,
     False),
]


@pytest.mark.parametrize("spec,record,kept", FILTER_CASES)
def test_filter(spec, record, kept):
    result = run(spec, record)
    assert (result is record) if kept else (result is None)
