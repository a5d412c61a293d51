"""The ``postgres-cdc`` guard rails end to end (real Postgres 15, broker and
``rivven-connect`` processes): schema changes mid-stream, the CDC gauges in ``/metrics``."""

from __future__ import annotations

import json
import socket
import urllib.request

from rivven_connect.pg.envelope import HEADER_SCHEMA_VERSION
from tests.integration.connect.pg.test_postgres_cdc_source import (
    SETUP, SOURCE, Runtime, _assert_slot_not_ahead, _records, _slot, _sql, _summary, _wait,
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start(tmp_path, postgres_server, pg_database, broker_process):
    dsn = postgres_server.dsn(pg_database)
    _sql(dsn, SETUP)
    broker = broker_process()
    http_port = _free_port()
    config = tmp_path / "connect.yaml"
    config.write_text(f"""
version: "1.0"
broker: {{ bootstrap: "{broker.address}" }}
http: "127.0.0.1:{http_port}"
sources:
  {SOURCE}:
    connector: postgres-cdc
    topic: "cdc.{{schema}}.{{table}}"
    config: {{ host: 127.0.0.1, port: "${{PGPORT_TEST}}", database: {pg_database},
              user: postgres, slot_name: rivven_slot, publication_name: rivven_pub,
              tables: [public.orders], snapshot: {{ mode: never }},
              status_interval_ms: 1000, batch_size: 50 }}
    routing: {{ topic_defaults: {{ partitions: 1 }} }}
""")
    return dsn, broker.address, config, http_port


def _metrics(http_port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def _version(record) -> str:
    return dict(record.headers)[HEADER_SCHEMA_VERSION].decode()


def test_schema_changes_mid_stream_arrive_once_with_their_columns_and_a_new_version(
        postgres_server, pg_database, broker_process, tmp_path):
    dsn, bootstrap, config, http_port = _start(tmp_path, postgres_server, pg_database, broker_process)
    runtime = Runtime(config, postgres_server.port, tmp_path / "connect.log")
    try:
        _wait(lambda: _slot(dsn)[1], "the slot to be active", runtime=runtime)
        _sql(dsn, "INSERT INTO orders VALUES (1, 'new', 1)")
        # rows before and after the DDL, in one transaction and in the next ones
        _sql(dsn, "INSERT INTO orders VALUES (2, 'a', 2)",
             "ALTER TABLE orders ADD COLUMN tag text",
             "INSERT INTO orders VALUES (3, 'b', 3, 't3')")
        _sql(dsn, "UPDATE orders SET tag = 't1' WHERE id = 1")
        _sql(dsn, "ALTER TABLE orders DROP COLUMN status")
        _sql(dsn, "INSERT INTO orders VALUES (4, 4, 't4')")
        _sql(dsn, "ALTER TABLE orders ALTER COLUMN amount TYPE numeric(12,3)")
        _sql(dsn, "INSERT INTO orders VALUES (5, 5, 't5')", "DELETE FROM orders WHERE id = 2")
        records = _wait(lambda: len(_records(bootstrap)) >= 8 and _records(bootstrap),
                        "8 records", runtime=runtime)
        assert runtime.popen.poll() is None, runtime.stderr()
        # the CDC gauges: labelled by connector (and table, one of the configured ones)
        label = f'connector="{SOURCE}"'
        _wait(lambda: _metrics(http_port).get(
            f'rivven_connect_cdc_replication_lag_bytes{{{label}}}') == 0, "lag 0 once caught up")
        metrics = _metrics(http_port)
        retained = metrics[f"rivven_connect_cdc_retained_wal_bytes{{{label}}}"]
        assert 0 < retained < 64 << 20
        events = {key: value for key, value in metrics.items()
                  if key.startswith("rivven_connect_cdc_events_total")}
        assert events == {
            f'rivven_connect_cdc_events_total{{{label},table="public.orders",op="{op}"}}': n
            for op, n in (("c", 5), ("u", 1), ("d", 1))}
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        if runtime.popen.poll() is None:
            runtime.kill()
    records = _records(bootstrap)  # nothing more after the stop: each change once
    assert [_summary(r) for r in records] == [
        ("c", {"id": 1}, None, {"id": 1, "status": "new", "amount": "1.00"}),
        ("c", {"id": 2}, None, {"id": 2, "status": "a", "amount": "2.00"}),
        ("c", {"id": 3}, None, {"id": 3, "status": "b", "amount": "3.00", "tag": "t3"}),
        ("u", {"id": 1}, {"id": 1, "status": "new", "amount": "1.00", "tag": None},
         {"id": 1, "status": "new", "amount": "1.00", "tag": "t1"}),
        ("c", {"id": 4}, None, {"id": 4, "amount": "4.00", "tag": "t4"}),
        ("c", {"id": 5}, None, {"id": 5, "amount": "5.000", "tag": "t5"}),
        ("d", {"id": 2}, {"id": 2, "amount": "2.000", "tag": None}, None),
        ("tombstone", {"id": 2}),
    ]
    versions = [_version(r) for r in records]
    # one version per column set: original, + tag, - status, amount retyped
    assert versions[0] == versions[1] != versions[2] == versions[3] != versions[4]
    assert versions[4] != versions[5] == versions[6] == versions[7]
    assert len(set(versions)) == 4
    _assert_slot_not_ahead(dsn, bootstrap)
