"""ExtractNewRecordState (Debezium unwrap) and EventRouter (the outbox)."""

from __future__ import annotations

import json

import pytest

from rivven_connect.core.records import Destination, Record
from rivven_connect.core.transforms import TransformError

from .helpers import cdc_record, run

BEFORE = {"id": 1, "status": "new"}
AFTER = {"id": 1, "status": "paid"}
UNWRAP = {"type": "ExtractNewRecordState"}
TOMBSTONE = Record(None, key={"id": 1}, table="orders", op="d")

# (options, record, expected value or "dropped")
UNWRAP_CASES = [
    ({}, cdc_record("c", after=AFTER), AFTER),
    ({}, cdc_record("u", before=BEFORE, after=AFTER), AFTER),
    ({}, cdc_record("r", after=AFTER), AFTER),
    ({}, cdc_record("d", before=BEFORE), None),                      # default: tombstone
    ({}, TOMBSTONE, "dropped"),                                      # ... and only one
    ({"drop_tombstones": False}, TOMBSTONE, None),
    ({"delete_handling": "drop"}, cdc_record("d", before=BEFORE), "dropped"),
    ({"delete_handling": "rewrite"}, cdc_record("d", before=BEFORE),
     {**BEFORE, "__deleted": True}),
    ({"delete_handling": "rewrite"}, cdc_record("d", before=None), {"__deleted": True}),
    ({"delete_handling": "rewrite"}, cdc_record("u", before=BEFORE, after=AFTER),
     {**AFTER, "__deleted": False}),
    ({"add_fields": ["op", "table", "lsn", "source.ts_ms", "ts_ms", "txId"]},
     cdc_record("u", before=BEFORE, after=AFTER),
     {**AFTER, "__op": "u", "__table": "orders", "__lsn": "0/16B3748",
      "__source_ts_ms": 1_700_000_000_000, "__ts_ms": 1_700_000_000_123, "__txId": 771}),
    ({"add_fields": "op", "add_fields_prefix": "meta_"}, cdc_record("c", after=AFTER),
     {**AFTER, "meta_op": "c"}),
    ({"add_fields": ["snapshot"]}, Record({"op": "c", "after": AFTER}),  # no source: null
     {**AFTER, "__snapshot": None}),
    ({"delete_handling": "rewrite", "add_fields": ["op"]}, cdc_record("d", before=BEFORE),
     {**BEFORE, "__op": "d", "__deleted": True}),
    ({}, Record({"heartbeat": 1}), {"heartbeat": 1}),                # not an envelope
]


@pytest.mark.parametrize("options,record,expected", UNWRAP_CASES)
def test_extract_new_record_state(options, record, expected):
    result = run({**UNWRAP, **options}, record)
    if expected == "dropped":
        assert result is None
        return
    assert result is not None and result.value == expected
    assert (result.key, result.table, result.op) == (record.key, record.table, record.op)


def test_unwrap_keeps_the_envelope_untouched():
    record = cdc_record("c", after=AFTER)
    run({**UNWRAP, "add_fields": ["op"]}, record)
    assert record.value["after"] == {"id": 1, "status": "paid"}


@pytest.mark.parametrize("value,message", [
    ({"op": "c", "after": None}, "op 'c' has no after row"),
    ({"op": "u", "after": [1]}, "after is a list"),
])
def test_unwrap_refuses_broken_envelopes(value, message):
    with pytest.raises(TransformError, match=message):
        run(UNWRAP, Record(value))


OUTBOX_ROW = {"id": "e-1", "aggregatetype": "Order", "aggregateid": "o-42",
              "type": "OrderPaid", "payload": json.dumps({"total": 10}), "tenant": "acme"}


def outbox(op: str, row=OUTBOX_ROW, before=None) -> Record:
    return cdc_record(op, before=before, after=row, table="outbox",
                      headers=(("traceparent", b"t"),))


def test_event_router_routes_an_insert():
    result = run({"type": "EventRouter"}, outbox("c"))
    assert result.destination == Destination("outbox.event.Order")
    assert result.key == "o-42" and result.value == {"total": 10}
    assert result.headers == (("traceparent", b"t"), ("id", b"e-1"), ("type", b"OrderPaid"))
    assert (result.table, result.op) == ("outbox", "c")


# (options, record, expected (topic, key, value, extra headers) or "dropped")
OUTBOX_CASES = [
    ({}, outbox("r"), ("outbox.event.Order", "o-42", {"total": 10}, ())),
    ({}, outbox("d", row=None, before=OUTBOX_ROW), "dropped"),
    ({}, Record(None, table="outbox"), "dropped"),
    ({}, outbox("u", before=OUTBOX_ROW), "dropped"),
    ({"topic_template": "{tenant}.{aggregatetype}.events", "additional_headers": ["tenant"]},
     outbox("c"), ("acme.Order.events", "o-42", {"total": 10}, (("tenant", b"acme"),))),
    ({"expand_json_payload": False}, outbox("c"),
     ("outbox.event.Order", "o-42", '{"total": 10}', ())),
    ({}, outbox("c", row={**OUTBOX_ROW, "payload": "not json"}),
     ("outbox.event.Order", "o-42", "not json", ())),
    ({}, outbox("c", row={**OUTBOX_ROW, "payload": None}),
     ("outbox.event.Order", "o-42", None, ())),
    ({}, outbox("c", row={**OUTBOX_ROW, "payload": {"already": "decoded"}}),
     ("outbox.event.Order", "o-42", {"already": "decoded"}, ())),
    ({"field_event_key": "tenant", "field_event_type": "aggregatetype",
      "additional_headers": ["missing_col"]}, outbox("c"),
     ("outbox.event.Order", "acme", {"total": 10}, ())),
    ({}, Record(OUTBOX_ROW), ("outbox.event.Order", "o-42", {"total": 10}, ())),  # polled row
    ({}, Record(OUTBOX_ROW, op="u"), "dropped"),
]


@pytest.mark.parametrize("options,record,expected", OUTBOX_CASES)
def test_event_router(options, record, expected):
    result = run({"type": "EventRouter", **options}, record)
    if expected == "dropped":
        assert result is None
        return
    topic, key, value, extra = expected
    assert (result.destination, result.key, result.value) == (Destination(topic), key, value)
    assert result.headers[len(record.headers) + 2:] == extra
    if options.get("field_event_type") == "aggregatetype":
        assert ("type", b"Order") in result.headers


@pytest.mark.parametrize("options,row,message", [
    ({"on_update": "error"}, OUTBOX_ROW, "outbox rows are insert-only"),
    ({}, {k: v for k, v in OUTBOX_ROW.items() if k != "aggregatetype"},
     "no column 'aggregatetype'"),
    ({}, {k: v for k, v in OUTBOX_ROW.items() if k != "id"}, "no column 'id'"),
    ({}, {**OUTBOX_ROW, "aggregatetype": None}, "'aggregatetype' is null"),
    ({}, {**OUTBOX_ROW, "aggregatetype": "Or der"}, "illegal topic"),
])
def test_event_router_errors(options, row, message):
    op = "u" if options else "c"
    with pytest.raises(TransformError, match=message):
        run({"type": "EventRouter", **options}, outbox(op, row=row, before=row))
