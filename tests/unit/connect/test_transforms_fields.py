"""MaskField, ReplaceField, InsertField, ValueToKey, Flatten, Cast, TimestampConverter."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rivven_connect.core.records import Destination, Record
from rivven_connect.core.transforms import TransformError
from rivven_connect.core.transforms.fields import flatten

from .helpers import run

ROW = {"id": 7, "email": "a@b.c", "age": 41, "score": 2.5, "vip": True, "tags": ["x"],
       "addr": {"city": "Oslo", "zip": "0150"}, "note": None}


def value_after(spec: dict, value=ROW, **record_fields):
    result = run(spec, Record(value, **record_fields))
    assert result is not None
    return result.value


# (spec, expected value)
FIELD_CASES = [
    ({"type": "MaskField", "fields": ["email", "age", "score", "vip", "tags", "addr"]},
     {**ROW, "email": "", "age": 0, "score": 0.0, "vip": False, "tags": [], "addr": {}}),
    ({"type": "MaskField", "fields": ["addr.city", "note", "missing"]},
     {**ROW, "addr": {"city": "", "zip": "0150"}}),             # null stays, missing skipped
    ({"type": "MaskField", "fields": ["email", "age"], "replacement": "***"},
     {**ROW, "email": "***", "age": "***"}),
    ({"type": "ReplaceField", "include": ["id", "addr.city", "missing"]},
     {"id": 7, "addr": {"city": "Oslo"}}),
    ({"type": "ReplaceField", "exclude": ["email", "addr.zip", "missing"]},
     {k: v for k, v in ROW.items() if k != "email"} | {"addr": {"city": "Oslo"}}),
    ({"type": "ReplaceField", "rename": {"email": "mail", "addr.city": "city", "gone": "x"}},
     {k: v for k, v in ROW.items() if k != "email"} | {"mail": "a@b.c", "city": "Oslo",
                                                       "addr": {"zip": "0150"}}),
    ({"type": "ReplaceField", "include": ["id", "email"], "rename": {"email": "contact.mail"}},
     {"id": 7, "contact": {"mail": "a@b.c"}}),
    ({"type": "InsertField", "static": {"origin": "shop", "meta.v": 2}},
     {**ROW, "origin": "shop", "meta": {"v": 2}}),
    ({"type": "InsertField", "static": {"id": None}}, {**ROW, "id": None}),  # overwrites
    ({"type": "Flatten"},
     {k: v for k, v in ROW.items() if k != "addr"} | {"addr.city": "Oslo", "addr.zip": "0150"}),
    ({"type": "Flatten", "delimiter": "__"},
     {k: v for k, v in ROW.items() if k != "addr"} | {"addr__city": "Oslo", "addr__zip": "0150"}),
    ({"type": "Cast", "fields": {"id": "str", "age": "float", "vip": "int", "score": "str",
                                 "note": "int", "missing": "int", "addr.zip": "int"}},
     {**ROW, "id": "7", "age": 41.0, "vip": 1, "score": "2.5", "addr": {"city": "Oslo",
                                                                       "zip": 150}}),
    ({"type": "Cast", "fields": {"tags": "str", "vip": "str", "email": "bytes", "age": "bool"}},
     {**ROW, "tags": '["x"]', "vip": "true", "email": b"a@b.c", "age": True}),
]


@pytest.mark.parametrize("spec,expected", FIELD_CASES, ids=[c[0]["type"] for c in FIELD_CASES])
def test_field_transform(spec, expected):
    before = repr(ROW)
    assert value_after(spec) == expected
    assert repr(ROW) == before  # the input value is never mutated


def test_insert_field_metadata():
    record = Record({"id": 1}, timestamp_ms=1234, table="orders", schema="public", op="c",
                    destination=Destination("t.orders", partition=3))
    spec = {"type": "InsertField", "table": "__table", "schema": "m.schema", "op": "__op",
            "timestamp": "__ts", "topic": "__topic", "partition": "__partition"}
    assert run(spec, record).value == {"id": 1, "__table": "orders", "m": {"schema": "public"},
                                       "__op": "c", "__ts": 1234, "__topic": "t.orders",
                                       "__partition": 3}
    bare = run(spec, Record({"id": 1}))
    assert bare.value == {"id": 1, "__table": None, "m": {"schema": None}, "__op": None,
                          "__ts": None, "__topic": None, "__partition": None}


def test_value_to_key():
    record = Record({"id": 7, "after": {"org": "acme"}}, key="old")
    result = run({"type": "ValueToKey", "fields": ["id", "after.org"]}, record)
    assert result.key == {"id": 7, "after.org": "acme"} and result.value == record.value
    with pytest.raises(TransformError, match="field 'missing' is missing"):
        run({"type": "ValueToKey", "fields": ["id", "missing"]}, record)


@pytest.mark.parametrize("spec", [
    {"type": "MaskField", "fields": ["a"]},
    {"type": "ReplaceField", "exclude": ["a"]},
    {"type": "InsertField", "static": {"a": 1}},
    {"type": "ValueToKey", "fields": ["a"]},
    {"type": "Flatten"},
    {"type": "Cast", "fields": {"a": "int"}},
    {"type": "TimestampConverter", "fields": ["a"], "to": "epoch_ms"},
])
def test_value_transforms_pass_tombstones_and_refuse_scalars(spec):
    tombstone = Record(None, key={"id": 1})
    assert run(spec, tombstone) is tombstone
    with pytest.raises(TransformError, match="needs an object value, not list") as caught:
        run(spec, Record([1, 2]))
    assert isinstance(caught.value.cause, TypeError)


@pytest.mark.parametrize("spec,value,message", [
    ({"type": "ReplaceField", "rename": {"a": "b"}}, {"a": 1, "b": 2}, "that field exists"),
    ({"type": "Flatten"}, {"a.b": 1, "a": {"b": 2}}, "two fields flatten to 'a.b'"),
    ({"type": "Cast", "fields": {"a": "int"}}, {"a": 2.5}, "without losing its fraction"),
    ({"type": "Cast", "fields": {"a": "int"}}, {"a": "x1"}, "invalid literal"),
    ({"type": "Cast", "fields": {"a": "float"}}, {"a": "nan"}, "finite"),
    ({"type": "Cast", "fields": {"a": "bool"}}, {"a": "maybe"}, "cannot cast 'maybe' to bool"),
    ({"type": "Cast", "fields": {"a": "bytes"}}, {"a": 1}, "cannot cast a int to bytes"),
    ({"type": "Cast", "fields": {"a": "int"}}, {"a": {}}, "cannot cast a dict to int"),
    ({"type": "MaskField", "fields": ["a"]}, {"a": object()}, "cannot mask a object"),
])
def test_field_transform_errors(spec, value, message):
    with pytest.raises(TransformError, match=message):
        run(spec, Record(value))


@pytest.mark.parametrize("raw,expected", [
    ("false", False), ("TRUE", True), (" 1 ", True), ("0", False), (0.0, False), (3, True),
])
def test_cast_to_bool(raw, expected):
    assert value_after({"type": "Cast", "fields": {"a": "bool"}}, {"a": raw}) == {"a": expected}


MS = 1_714_564_800_123  # 2024-05-01T12:00:00.123Z

# (options, input value, output value)
TIMESTAMP_CASES = [
    ({"to": "iso8601"}, MS, "2024-05-01T12:00:00.123Z"),
    ({"to": "date"}, MS, "2024-05-01"),
    ({"to": "epoch_ms"}, "2024-05-01T12:00:00.123Z", MS),
    ({"to": "epoch_ms"}, "2024-05-01T14:00:00.123+02:00", MS),
    ({"to": "epoch_ms"}, "2024-05-01T12:00:00.123", MS),               # naive = UTC
    ({"to": "epoch_ms"}, "2024-05-01", MS - 43_200_123),                # a date: midnight
    ({"to": "epoch_ms", "epoch_unit": "s"}, 1_714_564_800, MS - 123),
    ({"to": "epoch_ms", "epoch_unit": "us"}, MS * 1000 + 999, MS),      # floored
    ({"to": "iso8601", "epoch_unit": "s"}, 1_714_564_800.5, "2024-05-01T12:00:00.500Z"),
    ({"to": "epoch_ms"}, -1, -1),                                        # before 1970
    ({"to": "string", "output_format": "%d/%m/%Y %H:%M"}, MS, "01/05/2024 12:00"),
    ({"to": "iso8601", "input_format": "%d/%m/%Y"}, "01/05/2024", "2024-05-01T00:00:00.000Z"),
    ({"to": "date", "input_format": "%Y%m%d%z"}, "20240501+0300", "2024-04-30"),
    ({"to": "iso8601"}, None, None),
]


@pytest.mark.parametrize("options,raw,expected", TIMESTAMP_CASES)
def test_timestamp_converter(options, raw, expected):
    spec = {"type": "TimestampConverter", "fields": ["at", "missing"], **options}
    assert value_after(spec, {"at": raw, "other": raw}) == {"at": expected, "other": raw}


@pytest.mark.parametrize("raw,error", [
    ("yesterday", "Invalid isoformat"), (True, "a bool is not a timestamp"),
    ([1], "a list is not a timestamp"),
])
def test_timestamp_converter_refuses(raw, error):
    with pytest.raises(TransformError, match=error):
        run({"type": "TimestampConverter", "fields": ["at"], "to": "iso8601"}, Record({"at": raw}))


def _leaves(value: dict, prefix: tuple = ()) -> list[tuple[tuple, object]]:
    found = []
    for key, inner in value.items():
        if isinstance(inner, dict) and inner:
            found += _leaves(inner, (*prefix, key))
        else:
            found.append(((*prefix, key), inner))
    return found


KEYS = st.text(alphabet="abcxyz", min_size=1, max_size=3)
JSON_LEAF = st.none() | st.booleans() | st.integers() | st.text(max_size=3) | st.just({})
NESTED = st.recursive(JSON_LEAF, lambda inner: st.dictionaries(KEYS, inner, max_size=4),
                      max_leaves=12)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(KEYS, NESTED, max_size=4))
def test_flatten_keeps_every_leaf(value):
    flat = flatten(value, "/")
    leaves = _leaves(value)
    assert len(flat) == len(leaves)  # keys have no "/", so no two leaves collide
    for path, leaf in leaves:
        assert flat["/".join(path)] == leaf
