"""Heartbeats end to end: while only an unpublished table changes, the slot follows the WAL
(confirmed_flush_lsn advances, retained WAL stays small) and the stored offset moves first,
never behind the slot. A real Postgres 15, a broker process, ``rivven-connect`` processes."""

from __future__ import annotations

import json
import time

import trio

from rivven_connect.driver import read_position
from rivven_connect.pg.pgoutput import parse_lsn
from tests.integration.connect.pg.test_postgres_cdc_source import (
    SETUP, SOURCE, Runtime, _assert_slot_not_ahead, _records, _slot, _sql, _wait,
)

MB = 1 << 20


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
              user: postgres, slot_name: rivven_slot, publication_name: rivven_pub,
              tables: [public.orders], snapshot: {{ mode: never }},
              status_interval_ms: 1000, heartbeat_interval_ms: 500 }}
    routing: {{ topic_defaults: {{ partitions: 1 }} }}
""")


def _wal(dsn: str) -> tuple[int, int, int]:
    """(pg_current_wal_lsn, the slot's restart_lsn, its confirmed_flush_lsn)."""
    [(current, restart, confirmed)] = _sql(
        dsn, "SELECT pg_current_wal_lsn()::text, restart_lsn::text, confirmed_flush_lsn::text "
             "FROM pg_replication_slots WHERE slot_name = 'rivven_slot'")
    return parse_lsn(current), parse_lsn(restart), parse_lsn(confirmed)


def test_heartbeats_let_the_slot_follow_unpublished_wal(postgres_server, pg_database,
                                                        broker_process, tmp_path):
    dsn = postgres_server.dsn(pg_database)
    _sql(dsn, SETUP)
    bootstrap = broker_process().address
    config = tmp_path / "connect.yaml"
    _write_config(config, pg_database, bootstrap)
    log = tmp_path / "connect.log"
    runtime = Runtime(config, postgres_server.port, log)
    try:
        _wait(lambda: _slot(dsn)[1], "the slot to be active", runtime=runtime)
        _sql(dsn, "INSERT INTO orders VALUES (1, 'a', 1)")
        _wait(lambda: _records(bootstrap), "the first record", runtime=runtime)
        start_lsn = _wal(dsn)[0]
        # ~16 MB of WAL on the unpublished table, in 16 transactions, checking as we go that
        # the stored offset is never behind the slot.
        for _ in range(16):
            _sql(dsn, "INSERT INTO noise (v) SELECT repeat(md5(g::text), 24) "
                      "FROM generate_series(1, 1000) g")
            _assert_slot_not_ahead(dsn, bootstrap)
            time.sleep(0.2)
        written_to = _wal(dsn)[0]
        assert written_to - start_lsn > 8 * MB
        _sql(dsn, "CHECKPOINT")  # logs running transactions: a restart_lsn candidate

        def followed() -> bool:
            current, restart, confirmed = _wal(dsn)
            _assert_slot_not_ahead(dsn, bootstrap)
            return confirmed >= written_to and current - restart < 1 * MB

        _wait(followed, "the slot to follow the unpublished WAL", runtime=runtime)
        position = trio.run(read_position, bootstrap, SOURCE)
        assert position["heartbeat"] is True and parse_lsn(position["end_lsn"]) >= written_to
        assert len(_records(bootstrap)) == 1  # heartbeats send nothing
        _sql(dsn, "INSERT INTO orders VALUES (2, 'b', 2)")
        _wait(lambda: len(_records(bootstrap)) >= 2, "the second record", runtime=runtime)
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        if runtime.popen.poll() is None:
            runtime.kill()
    _assert_slot_not_ahead(dsn, bootstrap)
    # A restart after heartbeats: nothing twice, and later changes arrive.
    runtime = Runtime(config, postgres_server.port, log)
    try:
        _wait(lambda: _slot(dsn)[1], "the slot to be active again", runtime=runtime)
        _sql(dsn, "INSERT INTO noise (v) VALUES ('x')")
        time.sleep(2)  # a few heartbeats
        _assert_slot_not_ahead(dsn, bootstrap)
        _sql(dsn, "INSERT INTO orders VALUES (3, 'c', 3)")
        _wait(lambda: len(_records(bootstrap)) >= 3, "the third record", runtime=runtime)
        time.sleep(1)
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        if runtime.popen.poll() is None:
            runtime.kill()
    records = _records(bootstrap)
    assert [json.loads(r.key)["id"] for r in records] == [1, 2, 3]
    _assert_slot_not_ahead(dsn, bootstrap)
