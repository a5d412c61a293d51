"""``postgres-cdc`` configuration: every problem names its option; positions order as the
stream does. (The source itself runs against a real Postgres in
tests/integration/connect/pg/test_postgres_cdc_source.py.)"""

from __future__ import annotations

import json

import pytest

from rivven_connect.core.config import ConnectConfigError, load_config
from rivven_connect.sources import build_source
from rivven_connect.pg.snapshot import SnapshotPosition
from rivven_connect.sources.postgres_cdc import PostgresCdcSource

GOOD = {"host": "127.0.0.1", "port": 5432, "database": "shop", "user": "rivven",
        "password": "pw", "slot_name": "rivven_slot", "publication_name": "rivven_pub",
        "tables": ["public.orders", "items"], "snapshot": {"mode": "never"}}


def _build(**changes):
    config = {**GOOD, **changes}
    for key in [key for key, value in changes.items() if value is ...]:
        del config[key]
    loaded = load_config({"sources": {"db": {"connector": "postgres-cdc",
                                              "topic": "cdc.{schema}.{table}",
                                              "config": config}}}, {})
    return build_source(loaded.sources["db"])


def test_a_good_config_builds_the_source():
    source = _build()
    assert isinstance(source, PostgresCdcSource)
    assert source.slot.tables == (("public", "orders"), ("public", "items"))
    assert source.slot.config.port == 5432 and source.slot.config.password == "pw"
    assert "pw" not in repr(source.slot.config)
    assert _build(port="6543", password=...).slot.config.port == 6543  # ${ENV} text


@pytest.mark.parametrize("changes,path,words", [
    ({"host": ...}, "config.host", "required"),
    ({"database": ""}, "config.database", "required"),
    ({"user": 3}, "config.user", "required"),
    ({"password": 3}, "config.password", "string"),
    ({"port": 0}, "config.port", "[1, 65535]"),
    ({"port": "x"}, "config.port", "integer"),
    ({"slot_name": ...}, "config.slot_name", "required"),
    ({"slot_name": "Bad-Name"}, "config.slot_name", "identifier"),
    ({"publication_name": "a.b"}, "config.publication_name", "identifier"),
    ({"tables": []}, "config.tables", "non-empty"),
    ({"tables": ["public.orders", "a.b.c"]}, "config.tables[1]", "schema.table"),
    ({"tables": ["orders", "public.orders"]}, "config.tables[1]", "twice"),
    ({"snapshot": ...}, "config.snapshot", "is required"),
    ({"snapshot": {"mode": "sometimes"}}, "config.snapshot.mode", "when_needed"),
    ({"snapshot": {"mode": "initial", "chunk_size": 0}}, "config.snapshot.chunk_size",
     "[1, 10000]"),
    ({"snapshot": {"mode": "never", "chunk": 3}}, "config.snapshot.chunk", "unknown"),
    ({"snapshot": {"mode": "initial", "on_interrupted": "resume"}},
     "config.snapshot.on_interrupted", "fail, restart"),
    ({"slot": "x"}, "config.slot", "unknown option"),
])
def test_config_errors_name_the_option(changes, path, words):
    with pytest.raises(ConnectConfigError) as caught:
        _build(**changes)
    message = str(caught.value)
    assert message.startswith(f"sources.db.{path}"), message
    assert words in message, message


def test_positions_order_by_end_lsn_then_seq():
    source = _build()
    positions = [{"end_lsn": "0/FF", "commit_lsn": "0/F0", "seq": 2, "last": True},
                 {"end_lsn": "1/0", "commit_lsn": "0/100", "seq": 0, "last": False},
                 {"end_lsn": "1/0", "commit_lsn": "0/100", "seq": 1, "last": True}]
    keys = [source.position_key(p) for p in positions]
    assert keys == sorted(keys) and keys[0] == (0xFF, 1, 2) and keys[1] == (1 << 32, 1, 0)


def test_snapshot_options_and_positions():
    source = _build(snapshot={"mode": "initial", "chunk_size": "64"})
    assert (source.snapshot_mode, source.snapshot_chunk_rows) == ("initial", 64)
    assert _build(snapshot={"mode": "when_needed"}).snapshot_chunk_rows == 1024
    assert _build(snapshot={"mode": "initial"}).snapshot_on_interrupted == "fail"
    assert _build(snapshot={"mode": "initial", "on_interrupted": "restart"}
                  ).snapshot_on_interrupted == "restart"
    rows = [SnapshotPosition(0x100, 0, "public.orders", ("1",), 1, False),
            SnapshotPosition(0x100, 1, "public.items", ("a", "2"), 2, True)]
    stored = [json.loads(json.dumps(p.to_json())) for p in rows]  # as the offsets topic keeps it
    assert [SnapshotPosition.from_json(p) for p in stored] == rows
    streamed = {"end_lsn": "0/101", "commit_lsn": "0/100", "seq": 0, "last": True}
    later = SnapshotPosition(0x200, 0, "public.orders", None, 1, False).to_json()
    keys = [source.position_key(p) for p in [*stored, streamed, later]]
    assert keys == sorted(keys) and len(set(keys)) == 4
    with pytest.raises(ValueError):
        source.position_key({"phase": "snapshot", "consistent_lsn": "0/1"})


def test_metrics_are_the_lag_the_retained_wal_once_read_and_the_changes_per_table():
    source = _build()
    assert [(m.name, m.value) for m in source.metrics()] == [("cdc_replication_lag_bytes", 0)]
    source.stream_from = 0x1000  # resumed at a stored end LSN: that much is confirmed
    source.received_end_lsn = 0x1800
    source.events.update({("public.orders", "c"): 2, ("public.items", "d"): 1})
    source.retained_wal_bytes = 4096
    assert [(m.name, m.value, m.labels) for m in source.metrics()] == [
        ("cdc_retained_wal_bytes", 4096, ()),
        ("cdc_replication_lag_bytes", 0x800, ()),
        ("cdc_events", 1, (("table", "public.items"), ("op", "d"))),
        ("cdc_events", 2, (("table", "public.orders"), ("op", "c")))]
    source.confirmed_lsn = 0x17ff  # confirmed at end_lsn - 1: caught up
    assert source.metrics()[1].value == 0
