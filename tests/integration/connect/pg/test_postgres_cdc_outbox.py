"""The transactional outbox end to end: CDC of an outbox table through the ``EventRouter``
transform and admission (allowlist, ``max_destinations``, DLQ), a real Postgres 15, a broker
process and ``rivven-connect`` processes; topics read ``read_committed``.

The application inserts an outbox row and deletes it in the same transaction (the table
stays empty); each insert becomes one event on ``outbox.event.{aggregatetype}``, keyed by
``aggregateid``, the payload as value, ``id``/``type`` headers; the deletes make nothing; an
aggregate type outside the allowlist goes to the DLQ in the batch's own transaction."""

from __future__ import annotations

import json

import trio

from rivven_broker.client.errors import RivvenError, UnknownTopicOrPartitionError
from rivven_connect.driver import find_error
from rivven_connect.pg.pgoutput import parse_lsn
from tests.integration.connect.helpers import read_committed
from tests.integration.connect.pg.test_postgres_cdc_source import Runtime, _sql, _wait

SOURCE = "outbox_db"
SETUP = """
CREATE TABLE orders (id int PRIMARY KEY, status text);
CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype text NOT NULL,
                     aggregateid text NOT NULL, type text NOT NULL, payload jsonb);
"""


def _records(bootstrap: str, topic: str) -> list:
    try:
        return trio.run(read_committed, bootstrap, topic)
    except (RivvenError, BaseExceptionGroup) as caught:  # the topic does not exist (yet)
        if find_error(caught, (UnknownTopicOrPartitionError,)) is None:
            raise
        return []


def _slot_active(dsn: str) -> bool:
    return bool(_sql(dsn, "SELECT 1 FROM pg_replication_slots WHERE slot_name = "
                          "'outbox_slot' AND active"))


def _write_config(path, database: str, bootstrap: str) -> None:
    path.write_text(f"""
version: "1.0"
broker: {{ bootstrap: "{bootstrap}" }}
http: off
sources:
  {SOURCE}:
    connector: postgres-cdc
    topic: "cdc.{{schema}}.{{table}}"
    config: {{ host: 127.0.0.1, port: "${{PGPORT_TEST}}", database: {database},
              user: postgres, slot_name: outbox_slot, publication_name: outbox_pub,
              tables: [public.outbox], snapshot: {{ mode: never }},
              status_interval_ms: 1000 }}
    transforms:
      - {{ type: EventRouter }}
    routing:
      admission:
        mode: allowlist
        topics: [outbox.event.Order, outbox.event.Customer]
        max_destinations: 2
      on_admission_failure: dlq
      dlq_topic: connect.dlq
      topic_defaults: {{ partitions: 1 }}
""")


def _event(dsn: str, n: int, aggregate: str, key: str, kind: str, payload: dict,
           *extra: str) -> str:
    """One application transaction: a business change, the outbox row, its delete."""
    event_id = f"00000000-0000-0000-0000-{n:012d}"
    _sql(dsn, f"INSERT INTO orders VALUES ({n}, '{kind}')",
         f"INSERT INTO outbox VALUES ('{event_id}', '{aggregate}', '{key}', '{kind}', "
         f"'{json.dumps(payload)}')", *extra, f"DELETE FROM outbox WHERE id = '{event_id}'")
    return event_id


def _summary(record) -> tuple:
    headers = dict(record.headers)
    return (record.key.decode(), json.loads(record.value), headers["id"].decode(),
            headers["type"].decode())


def test_outbox_rows_become_routed_events_exactly_once(postgres_server, pg_database,
                                                        broker_process, tmp_path):
    dsn = postgres_server.dsn(pg_database)
    _sql(dsn, SETUP)
    bootstrap = broker_process().address
    config = tmp_path / "connect.yaml"
    _write_config(config, pg_database, bootstrap)
    log = tmp_path / "connect.log"
    order, customer = "outbox.event.Order", "outbox.event.Customer"
    runtime = Runtime(config, postgres_server.port, log)
    try:
        _wait(lambda: _slot_active(dsn), "the slot to be active", runtime=runtime)
        e1 = _event(dsn, 1, "Order", "o-1", "OrderCreated", {"total": "10.50", "lines": [1, 2]})
        e2 = _event(dsn, 2, "Customer", "c-7", "CustomerRenamed", {"name": "Ada"})
        # An unknown aggregate type in the same PG transaction as a known one.
        spam_id = "00000000-0000-0000-0000-000000000099"
        e3 = _event(dsn, 3, "Order", "o-1", "OrderPaid", {"paid": True},
                    f"INSERT INTO outbox VALUES ('{spam_id}', 'Spam', 's-1', 'Junk', "
                    f"'{{\"x\": 1}}')", f"DELETE FROM outbox WHERE id = '{spam_id}'")
        _wait(lambda: len(_records(bootstrap, order)) >= 2
              and _records(bootstrap, "connect.dlq"), "the events", runtime=runtime)
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        if runtime.popen.poll() is None:
            runtime.kill()
    # A restart with nothing new, then one more event: nothing is sent twice.
    runtime = Runtime(config, postgres_server.port, log)
    try:
        _wait(lambda: _slot_active(dsn), "the slot to be active", runtime=runtime)
        e4 = _event(dsn, 4, "Customer", "c-7", "CustomerDeleted", {})
        _wait(lambda: len(_records(bootstrap, customer)) >= 2, "the 4th event", runtime=runtime)
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        if runtime.popen.poll() is None:
            runtime.kill()

    orders, customers = _records(bootstrap, order), _records(bootstrap, customer)
    assert [_summary(r) for r in orders] == [
        ("o-1", {"total": "10.50", "lines": [1, 2]}, e1, "OrderCreated"),
        ("o-1", {"paid": True}, e3, "OrderPaid"),
    ]
    assert [_summary(r) for r in customers] == [
        ("c-7", {"name": "Ada"}, e2, "CustomerRenamed"),
        ("c-7", {}, e4, "CustomerDeleted"),
    ]
    # Deletes (and their tombstones) make nothing: no CDC topic, nothing else in the DLQ.
    assert _records(bootstrap, "cdc.public.outbox") == []
    [dead] = _records(bootstrap, "connect.dlq")
    headers = dict(dead.headers)
    assert headers["rivven.dlq.reason"] == b"not_allowed", headers
    assert headers["rivven.dlq.original_topic"] == b"outbox.event.Spam"
    assert (dead.key, json.loads(dead.value)) == (b"s-1", {"x": 1})
    assert (headers["id"], headers["type"]) == (spam_id.encode(), b"Junk")
    # Same PG transaction as e3, so the same batch: the same commit LSN in the stable ids and
    # the same source position (the batch's broker transaction holds both).
    paid_headers = dict(orders[1].headers)
    assert (headers["rivven.cdc.id"].split(b":")[0]
            == paid_headers["rivven.cdc.id"].split(b":")[0])
    position = json.loads(headers["rivven.dlq.source_position"])  # JSON, sorted keys
    assert parse_lsn(position["commit_lsn"]) == parse_lsn(
        paid_headers["rivven.cdc.id"].decode().split(":")[0])
