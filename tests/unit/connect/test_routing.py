"""Source-side routing and dispatch: by_table, topic_column, key_column, stripping, and the
on_missing_destination actions."""

from __future__ import annotations

import pytest

from rivven_connect.core.admission import Admission, RejectReason
from rivven_connect.core.config import load_config
from rivven_connect.core.records import Destination, Record
from rivven_connect.core.routing import Action, Router


def _router(topic="cdc.{schema}.{table}", **routing):
    source = {"connector": "postgres-cdc", "topic": topic, "routing": routing}
    config = load_config({"sources": {"db": source}}, {}).sources["db"]
    return Router(config, Admission(config.routing.admission))


def _cdc(after, before=None, table="orders", op="c"):
    return Record(value={"before": before, "after": after, "op": op}, table=table,
                  schema="public", op=op, position=1)


def test_by_table_template():
    record = _router(by_table="shop.{table}").route_at_source(_cdc({"id": 1}))
    assert record.destination == Destination("shop.orders")


def test_by_table_mapping_prefers_schema_dot_table_and_leaves_others_unrouted():
    router = _router(by_table={"public.orders": "o.{schema}", "items": "i"})
    assert router.route_at_source(_cdc({"id": 1})).destination == Destination("o.public")
    assert router.route_at_source(_cdc({"id": 1}, table="items")).destination == Destination("i")
    assert router.route_at_source(_cdc({"id": 1}, table="users")).destination is None


def test_topic_column_key_column_and_stripping_on_a_cdc_delete():
    router = _router(topic_column="kind", default_topic="misc", key_column="tenant",
                     strip_columns=True)
    deleted = _cdc(None, before={"id": 1, "kind": "invoices", "tenant": "acme"}, op="d")
    record = router.route_at_source(deleted)
    assert record.destination == Destination("invoices", key=b"acme")
    assert record.value["before"] == {"id": 1} and record.value["after"] is None
    missing = router.route_at_source(_cdc({"id": 2, "tenant": 7}))
    assert missing.destination == Destination("misc", key=b"7")
    assert missing.value["after"] == {"id": 2}


def test_without_stripping_the_columns_stay():
    router = _router(topic_column="kind", default_topic="misc")
    record = router.route_at_source(Record(value={"kind": "a", "x": 1}, position=1))
    assert record.value == {"kind": "a", "x": 1} and record.destination == Destination("a")


@pytest.mark.parametrize("action,expected", [
    ("default", Action.SEND), ("drop", Action.DROP), ("error", Action.ERROR)])
def test_on_missing_destination(action, expected):
    router = _router(on_missing_destination=action)
    verdict = router.dispatch(_cdc({"id": 1}), 1, 0)
    assert verdict.action is expected
    assert router.admission.counters.unmatched[action] == 1
    if expected is Action.SEND:
        assert verdict.record.destination == Destination("cdc.public.orders")


def test_the_default_topic_is_admitted_like_any_other():
    router = _router(admission={"max_destinations": 1}, on_admission_failure="drop")
    assert router.dispatch(_cdc({"id": 1}), 1, 0).action is Action.SEND
    verdict = router.dispatch(_cdc({"id": 1}, table="items"), 1, 0)
    assert (verdict.action, verdict.reason) == (Action.DROP, "max_destinations")


def test_a_template_without_a_table_is_an_invalid_topic():
    router = _router(on_admission_failure="drop")
    verdict = router.dispatch(Record(value={}, position=1), 1, 0)
    assert verdict.reason == "invalid_topic"
    assert router.admission.counters.rejected[RejectReason.INVALID_TOPIC] == 1


def test_an_illegal_column_value_is_rejected_not_created():
    router = _router(topic_column="t", default_topic="d", on_admission_failure="error")
    record = router.route_at_source(Record(value={"t": "no/slashes"}, position=1))
    verdict = router.dispatch(record, 1, 0)
    assert (verdict.action, verdict.reason, verdict.retriable) == (
        Action.ERROR, "invalid_topic", False)


def test_with_destination_keeps_every_other_field():
    import attrs as _attrs

    from rivven_connect.core.records import Destination as _Destination, Record as _Record

    record = _Record({"v": 1}, key={"id": 1}, headers=(("h", b"x"),), timestamp_ms=5,
                     table="t", schema="s", op="c", position={"p": 1})
    moved = record.with_destination(_Destination("topic", key=b"k", partition=2))
    assert moved == _attrs.evolve(record, destination=_Destination("topic", key=b"k",
                                                                   partition=2))
    assert [f.name for f in _attrs.fields(_Record)] == [
        "value", "key", "headers", "timestamp_ms", "destination", "table", "schema", "op",
        "position", "position_only"]  # a new field must be added to with_destination
