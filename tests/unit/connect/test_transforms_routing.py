"""RegexRouter, ContentRouter and Route: which destination each computes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rivven_connect.core.records import Destination, Record
from rivven_connect.core.transforms import TransformError

from .helpers import run

SET = Destination("cdc.public.orders", key=b"k", partition=2)

# (spec, record, expected destination)
REGEX_CASES = [
    (r"cdc\.(\w+)\.(\w+)", r"\2.\1", Record({}, destination=SET),
     Destination("orders.public", key=b"k", partition=2)),
    (r"cdc\.(?P<schema>\w+)\.(?P<table>\w+)", r"db-\g<table>", Record({}, destination=SET),
     Destination("db-orders", key=b"k", partition=2)),
    (r"cdc\.public", "x", Record({}, destination=SET), SET),        # full match only
    (r"audit\..*", "x", Record({}, destination=SET), SET),
    (r".*", "x", Record({}), None),                                 # no destination: as is
]


@pytest.mark.parametrize("regex,replacement,record,expected", REGEX_CASES)
def test_regex_router(regex, replacement, record, expected):
    spec = {"type": "RegexRouter", "regex": regex, "replacement": replacement}
    assert run(spec, record).destination == expected


def test_regex_router_refuses_an_illegal_result():
    spec = {"type": "RegexRouter", "regex": r"cdc\.(.*)", "replacement": r"bad topic \1"}
    with pytest.raises(TransformError, match="illegal topic"):
        run(spec, Record({}, destination=SET))


CONTENT = {"type": "ContentRouter", "field": "after.region",
           "mapping": {"eu": "orders.eu", "7": "orders.seven", "true": "orders.yes"},
           "patterns": [{"matches": "us-.*", "topic": "orders.us"},
                        {"matches": ".*", "topic": "orders.any"}]}

# (spec, field value, expected destination (a record starting with SET))
CONTENT_CASES = [
    (CONTENT, "eu", Destination("orders.eu", key=b"k", partition=2)),
    (CONTENT, 7, Destination("orders.seven", key=b"k", partition=2)),
    (CONTENT, True, Destination("orders.yes", key=b"k", partition=2)),
    (CONTENT, "us-east", Destination("orders.us", key=b"k", partition=2)),   # patterns in order
    (CONTENT, "ap", Destination("orders.any", key=b"k", partition=2)),
    (CONTENT, None, SET),                                   # null never matches
    (CONTENT, 7.5, SET),                                    # floats never match
    ({**CONTENT, "default": "orders.other"}, {"x": 1}, Destination("orders.other", key=b"k",
                                                                   partition=2)),
    ({"type": "ContentRouter", "field": "after.region", "mapping": {"eu": "orders.eu"}},
     "us", SET),
]


@pytest.mark.parametrize("spec,field_value,expected", CONTENT_CASES)
def test_content_router(spec, field_value, expected):
    record = Record({"after": {"region": field_value}}, destination=SET)
    assert run(spec, record).destination == expected


def test_content_router_sets_a_destination_on_a_record_without_one():
    record = Record({"after": {"region": "eu"}})
    assert run(CONTENT, record).destination == Destination("orders.eu")
    assert run({**CONTENT, "default": "d"}, Record(None)).destination == Destination("d")


ROUTE = {"type": "Route", "field": "after.meta.kind",
         "mapping": {"order": "t.orders", "refund": "t.refunds", 3: "t.three"}}


def routed(spec, value, destination=SET):
    return run(spec, Record(value, destination=destination)).destination


# (spec, value, expected destination)
ROUTE_CASES = [
    (ROUTE, {"after": {"meta": {"kind": "order"}}}, Destination("t.orders")),   # replaced whole
    (ROUTE, {"after": {"meta": {"kind": 3}}}, Destination("t.three")),
    (ROUTE, {"after": {"meta": {"kind": "other"}}}, SET),                      # no match: as is
    (ROUTE, {"after": {"meta": None}}, SET),
    (ROUTE, {"after": {}}, SET),
    (ROUTE, None, SET),
    ({**ROUTE, "key_field": "after.id"}, {"after": {"id": "c-9", "meta": {"kind": "refund"}}},
     Destination("t.refunds", key=b"c-9")),
    ({**ROUTE, "key_field": "after.id"}, {"after": {"id": 12, "meta": {"kind": "refund"}}},
     Destination("t.refunds", key=b"12")),
    ({**ROUTE, "key_field": "after.id"}, {"after": {"id": None, "meta": {"kind": "refund"}}},
     Destination("t.refunds")),                                                 # balanced
    ({**ROUTE, "key_field": "after.id"}, {"after": {"meta": {"kind": "refund"}}},
     Destination("t.refunds")),
    ({**ROUTE, "partition_field": "after.p"}, {"after": {"p": 4, "meta": {"kind": "order"}}},
     Destination("t.orders", partition=4)),
]


@pytest.mark.parametrize("spec,value,expected", ROUTE_CASES)
def test_route(spec, value, expected):
    assert routed(spec, value) == expected


def test_route_without_a_previous_destination():
    assert routed(ROUTE, {"after": {"meta": {"kind": "order"}}}, None) == Destination("t.orders")
    assert routed(ROUTE, {"after": {"meta": {"kind": "nope"}}}, None) is None


@pytest.mark.parametrize("spec,value,message", [
    ({**ROUTE, "key_field": "id"}, {"id": {"a": 1}, "after": {"meta": {"kind": "order"}}},
     "a dict cannot be a destination key"),
    ({**ROUTE, "partition_field": "p"}, {"p": -1, "after": {"meta": {"kind": "order"}}},
     "-1 is not a partition number"),
    ({**ROUTE, "partition_field": "p"}, {"p": True, "after": {"meta": {"kind": "order"}}},
     "True is not a partition number"),
])
def test_route_refuses_bad_key_or_partition(spec, value, message):
    with pytest.raises(TransformError, match=message):
        routed(spec, value)


MAPPINGS = st.dictionaries(st.text(alphabet="abc", min_size=1, max_size=3),
                           st.text(alphabet="xyz.", min_size=1, max_size=5)
                           .filter(lambda t: t not in (".", "..")), min_size=1, max_size=5)
FIELD_VALUES = st.none() | st.booleans() | st.integers(-3, 3) | st.text(alphabet="abc",
                                                                        max_size=3)


@given(MAPPINGS, FIELD_VALUES, st.booleans())
def test_route_never_invents_a_topic(mapping, field_value, had_destination):
    before = Destination("t.before", key=b"k") if had_destination else None
    spec = {"type": "Route", "field": "kind", "mapping": mapping}
    after = routed(spec, {"kind": field_value}, before)
    assert after == before or after.topic in mapping.values()
    if isinstance(field_value, str) and field_value in mapping:
        assert after == Destination(mapping[field_value])
