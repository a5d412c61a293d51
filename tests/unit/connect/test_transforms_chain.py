"""build_chain's config errors, Chain.apply's order, gating and error wrapping."""

from __future__ import annotations

import re

import attrs
import pytest

from rivven_connect.core.records import Destination, Record
from rivven_connect.core.transforms import (
    TRANSFORM_TYPES,
    Chain,
    TransformConfigError,
    TransformError,
    build_chain,
)
from rivven_connect.core.transforms.chain import TRANSFORMS_MAX, Step

from .helpers import PATH, cdc_record

T = PATH  # "sources.shop.transforms"

# (specs, the error's start: "path: reason")
CONFIG_ERRORS = [
    ("Cast", f"{T}: must be a list of transforms"),
    (["Cast"], f"{T}[0]: must be an object"),
    ([{"fields": ["a"]}], f"{T}[0].type: is required"),
    ([{"type": "Cats"}], f"{T}[0].type: unknown transform 'Cats' (did you mean 'Cast'?)"),
    ([{"type": "maskfield"}], f"{T}[0].type: unknown transform 'maskfield' (did you mean "
                              f"'MaskField'?)"),
    ([{"type": "Flatten"}, {"type": "Zzz"}], f"{T}[1].type: unknown transform 'Zzz'; known:"),
    ([{"type": 3}], f"{T}[0].type: unknown transform 3"),
    ([{"type": "Flatten", "delimeter": "_"}],
     f"{T}[0].delimeter: unknown option (did you mean 'delimiter'?)"),
    ([{"type": "Flatten", "colour": "red"}], f"{T}[0].colour: unknown option"),
    ([{"type": "Cast", "feilds": {"a": "int"}}],
     f"{T}[0].fields: is required (is 'feilds' a misspelling of it?)"),
    ([{"type": "Route", "key_field": "k", "mapping": {"x": "t"}}],
     f"{T}[0].field: is required"),                 # key_field is an option, not a typo
    ([{"type": "Route", "field": "k", "mapping": {"x": "t"}, "key_fields": "k"}],
     f"{T}[0].key_fields: unknown option (did you mean 'key_field'?)"),
    ([{"type": "Cast"}], f"{T}[0].fields: is required"),
    ([{"type": "Cast", "fields": {"a": "integer"}}],
     f"{T}[0].fields.a: must be one of int, float, str, bool, bytes, not 'integer' (did you "
     f"mean 'int'?)"),
    ([{"type": "Cast", "fields": {}}], f"{T}[0].fields: must be a non-empty object"),
    ([{"type": "MaskField", "fields": []}], f"{T}[0].fields: must be a string or a non-empty"),
    ([{"type": "MaskField", "fields": ["a", "a"]}], f"{T}[0].fields: lists a field twice"),
    ([{"type": "MaskField", "fields": ["a", "b..c"]}], f"{T}[0].fields[1]: 'b..c' is not"),
    ([{"type": "MaskField", "fields": ["a"], "replacement": 0}],
     f"{T}[0].replacement: must be a string"),
    ([{"type": "ReplaceField"}], f"{T}[0]: needs include, exclude or rename"),
    ([{"type": "ReplaceField", "include": ["a"], "exclude": ["b"]}],
     f"{T}[0]: give include or exclude, not both"),
    ([{"type": "ReplaceField", "rename": {"a": "c", "b": "c"}}],
     f"{T}[0].rename: renames two fields to the same name"),
    ([{"type": "InsertField"}], f"{T}[0]: needs static or one of table, schema, op"),
    ([{"type": "InsertField", "static": {"a": {1, 2}}}], f"{T}[0].static.a: must be a JSON"),
    ([{"type": "InsertField", "topic": ""}], f"{T}[0].topic: '' is not a dotted path"),
    ([{"type": "TimestampConverter", "fields": ["a"], "to": "string"}],
     f"{T}[0].output_format: is required with to: string, and only then"),
    ([{"type": "TimestampConverter", "fields": ["a"], "to": "iso8601", "output_format": "%Y"}],
     f"{T}[0].output_format: is required with to: string, and only then"),
    ([{"type": "TimestampConverter", "fields": ["a"], "to": "iso"}],
     f"{T}[0].to: must be one of epoch_ms, iso8601, date, string, not 'iso'"),
    ([{"type": "TimestampConverter", "fields": ["a"], "to": "date", "epoch_unit": "ns"}],
     f"{T}[0].epoch_unit: must be one of s, ms, us"),
    ([{"type": "ExtractNewRecordState", "delete_handling": "none"}],
     f"{T}[0].delete_handling: must be one of drop, tombstone, rewrite"),
    ([{"type": "ExtractNewRecordState", "add_fields": ["op", "lsm"]}],
     f"{T}[0].add_fields[1]: unknown field 'lsm'"),
    ([{"type": "ExtractNewRecordState", "drop_tombstones": "false"}],
     f"{T}[0].drop_tombstones: must be true or false"),
    ([{"type": "RegexRouter", "regex": "(a"}], f"{T}[0].regex: bad regular expression"),
    ([{"type": "RegexRouter", "regex": "(a)", "replacement": "$1"}],
     f"{T}[0].replacement: uses $-references"),
    ([{"type": "RegexRouter", "regex": "(a)", "replacement": r"\2"}],
     f"{T}[0].replacement: refers to group '2'"),
    ([{"type": "RegexRouter", "regex": "(a)", "replacement": r"\g<name>"}],
     f"{T}[0].replacement: refers to group 'name'"),
    ([{"type": "ContentRouter", "field": "a"}], f"{T}[0]: needs mapping or patterns"),
    ([{"type": "ContentRouter", "field": "a", "patterns": [{"matches": "x"}]}],
     f"{T}[0].patterns[0].topic: is required"),
    ([{"type": "ContentRouter", "field": "a", "mapping": {"x": "bad topic"}}],
     f"{T}[0].mapping.x: 'bad topic' is not a topic name"),
    ([{"type": "ContentRouter", "field": "a", "mapping": {"x": "t"}, "default": ".."}],
     f"{T}[0].default: '..' is not a topic name"),
    ([{"type": "Route", "field": "a", "mapping": {}}],
     f"{T}[0].mapping: is empty (an empty mapping is never a fallback)"),
    ([{"type": "Route", "field": "a"}], f"{T}[0].mapping: is required"),
    ([{"type": "Route", "field": "a", "mapping": "http://x/map"}],
     f"{T}[0].mapping: must be an object"),
    ([{"type": "Route", "field": "a", "mapping": {1.5: "t"}}],
     f"{T}[0].mapping: key 1.5 is not a string or an integer"),
    ([{"type": "Route", "field": "a", "mapping": {"x": "t"}, "key_field": "k",
       "partition_field": "p"}], f"{T}[0]: give key_field or partition_field, not both"),
    ([{"type": "EventRouter", "topic_template": "outbox.{type!r}"}],
     f"{T}[0].topic_template: placeholder {{type}} must be a bare column name"),
    ([{"type": "EventRouter", "topic_template": "outbox.{a.b}"}],
     f"{T}[0].topic_template: placeholder {{a.b}} must be a bare column name"),
    ([{"type": "EventRouter", "topic_template": "outbox.{"}],
     f"{T}[0].topic_template: bad template"),
    ([{"type": "EventRouter", "on_update": "warn"}], f"{T}[0].on_update: must be one of drop"),
    ([{"type": "Filter"}], f"{T}[0]: a Filter without keep, drop or predicate drops every"),
    ([{"type": "Filter", "keep": {"table": "a"}, "drop": {"table": "b"}}],
     f"{T}[0]: give keep or drop, not both"),
    ([{"type": "Filter", "keep": {"tabel": "a"}}],
     f"{T}[0].keep.tabel: unknown option (did you mean 'table'?)"),
    ([{"type": "Flatten", "predicate": {"operation": "x"}}],
     f"{T}[0].predicate.operation[0]: must be one of c, u, d, r"),
    ([{"type": "Flatten"}] * (TRANSFORMS_MAX + 1), f"{T}: has {TRANSFORMS_MAX + 1} transforms"),
]


@pytest.mark.parametrize("specs,message", CONFIG_ERRORS, ids=[m for _, m in CONFIG_ERRORS])
def test_config_errors_name_the_path_and_option(specs, message):
    with pytest.raises(TransformConfigError, match="^" + re.escape(message)) as caught:
        build_chain(specs, path=PATH)
    assert str(caught.value) == f"{caught.value.path}: {caught.value.reason}"


#: The smallest valid spec of every transform.
MINIMAL = {
    "Filter": {"drop": {"operation": "d"}},
    "MaskField": {"fields": ["a"]},
    "ReplaceField": {"exclude": ["a"]},
    "InsertField": {"op": "__op"},
    "Cast": {"fields": {"a": "int"}},
    "Flatten": {},
    "TimestampConverter": {"fields": ["a"], "to": "epoch_ms"},
    "ValueToKey": {"fields": ["a"]},
    "ExtractNewRecordState": {},
    "RegexRouter": {"regex": "a", "replacement": "b"},
    "ContentRouter": {"field": "a", "mapping": {"x": "t"}},
    "Route": {"field": "a", "mapping": {"x": "t"}},
    "EventRouter": {},
}


def test_every_transform_has_a_minimal_spec_here():
    assert set(MINIMAL) == set(TRANSFORM_TYPES)


@pytest.mark.parametrize("name", sorted(MINIMAL))
def test_every_transform_builds_and_refuses_unknown_options(name):
    chain = build_chain([{"type": name, **MINIMAL[name]}], path=PATH)
    assert type(chain.steps[0].transform) is TRANSFORM_TYPES[name]
    with pytest.raises(TransformConfigError, match=re.escape(f"{PATH}[0].bogus_option: "
                                                             f"unknown option")):
        build_chain([{"type": name, **MINIMAL[name], "bogus_option": 1}], path=PATH)


def test_no_specs_is_the_identity_chain():
    record = Record({"a": 1})
    assert build_chain(None, path=PATH).apply(record) is record
    assert build_chain([], path=PATH).apply(record) is record


def test_transforms_run_in_order_and_a_predicate_gates_one_step():
    chain = build_chain([
        {"type": "ExtractNewRecordState"},
        {"type": "MaskField", "fields": ["email"], "predicate": {"table": "customers"}},
        {"type": "InsertField", "static": {"seen": True}},
        {"type": "Route", "field": "kind", "mapping": {"vip": "t.vip"}},
    ], path=PATH)
    row = {"email": "a@b.c", "kind": "vip"}
    customers = chain.apply(cdc_record("c", after=row, table="customers"))
    orders = chain.apply(cdc_record("c", after=row, table="orders"))
    assert customers.value == {"email": "", "kind": "vip", "seen": True}
    assert orders.value == {"email": "a@b.c", "kind": "vip", "seen": True}
    assert customers.destination == orders.destination == Destination("t.vip")
    # order matters: Route before the unwrap sees the envelope and finds no "kind"
    reversed_chain = build_chain([
        {"type": "Route", "field": "kind", "mapping": {"vip": "t.vip"}},
        {"type": "ExtractNewRecordState"},
    ], path=PATH)
    assert reversed_chain.apply(cdc_record("c", after=row)).destination is None


def test_a_filtered_record_stops_the_chain():
    chain = build_chain([{"type": "Filter", "drop": {"operation": "d"}},
                         {"type": "ValueToKey", "fields": ["missing"]}], path=PATH)
    assert chain.apply(cdc_record("d", before={"id": 1})) is None  # the raising step never ran
    with pytest.raises(TransformError):
        chain.apply(cdc_record("c", after={"id": 1}))


def test_a_failing_transform_is_wrapped_with_index_type_record_and_cause():
    chain = build_chain([
        {"type": "InsertField", "static": {"step": 0}},
        {"type": "Flatten"},
        {"type": "Cast", "fields": {"n": "int"}},
    ], path=PATH)
    record = Record({"n": "twelve"}, key="k")
    with pytest.raises(TransformError) as caught:
        chain.apply(record)
    error = caught.value
    assert (error.transform_index, error.transform_type) == (2, "Cast")
    assert error.record == attrs.evolve(record, value={"n": "twelve", "step": 0})
    assert isinstance(error.cause, ValueError) and error.__cause__ is error.cause
    assert str(error).startswith("transforms[2] (Cast) failed: ValueError: invalid literal")


class _Broken:
    TYPE = "Broken"

    def __init__(self, exception: BaseException) -> None:
        self.exception = exception

    def apply(self, record: Record) -> Record:
        raise self.exception


def test_programmer_errors_are_not_wrapped():
    with pytest.raises(AssertionError):
        Chain((Step(0, _Broken(AssertionError("bug"))),)).apply(Record({}))
    with pytest.raises(TransformError) as caught:
        Chain((Step(0, _Broken(KeyError("x"))),)).apply(Record({}))
    assert caught.value.transform_type == "Broken"


def test_a_later_option_is_not_taken_for_a_typo_of_a_required_one():
    with pytest.raises(TransformConfigError) as caught:
        build_chain([{"type": "Route", "key_field": "k", "mapping": {"x": "t"}}], path=PATH)
    assert str(caught.value) == f"{PATH}[0].field: is required"
