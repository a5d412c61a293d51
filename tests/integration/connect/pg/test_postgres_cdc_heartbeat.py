"""Heartbeats end to end: while only an unpublished table changes, the slot follows the WAL
(confirmed_flush_lsn advances, and with restart points restart_lsn too, so retained WAL stays
small) and the stored offset moves first, never behind the slot. A real Postgres 15, a broker
process, ``rivven-connect`` processes."""

from __future__ import annotations

import json
import threading
import time

import psycopg2
import pytest
import trio

from rivven_connect.driver import read_position
from rivven_connect.pg.pgoutput import parse_lsn
from rivven_connect.pg.slot import PgConnectConfig, ReplicationSlot
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
        # The heartbeats' restart points, not Postgres (at most one every 15 s from the
        # background writer; no checkpoint here), log the running transactions that let
        # restart_lsn follow.
        assert _running_xacts(dsn, start_lsn, written_to) >= 3

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


def _running_xacts(dsn: str, start: int, end: int) -> int:
    """Running-transactions records in the WAL from ``start`` to ``end`` (pg_walinspect)."""
    _sql(dsn, "CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    [(count,)] = _sql(
        dsn, f"SELECT count(*) FROM pg_get_wal_records_info('{start >> 32:X}/{start & 0xFFFFFFFF:X}', "
             f"'{end >> 32:X}/{end & 0xFFFFFFFF:X}') "
             "WHERE resource_manager = 'Standby' AND record_type = 'RUNNING_XACTS'")
    return count


def _restart_slot(postgres_server, database: str) -> ReplicationSlot:
    config = PgConnectConfig("127.0.0.1", postgres_server.port, database, "postgres", None)
    return ReplicationSlot(config, "rivven_slot", "rivven_pub", [("public", "orders")])


def _lsn(dsn: str) -> int:
    return parse_lsn(_sql(dsn, "SELECT pg_current_wal_insert_lsn()::text")[0][0])


def test_a_restart_point_logs_running_transactions_even_with_one_left_open(
        postgres_server, pg_database):
    """The temporary slot's creation logs the record first; with a transaction open (so the
    creation would wait for it to end) the statement timeout ends the wait and the record
    stays. No temporary slot is left behind."""
    dsn = postgres_server.dsn(pg_database)
    slot = _restart_slot(postgres_server, pg_database)
    before = _lsn(dsn)
    assert slot.log_restart_point()
    assert _running_xacts(dsn, before, _lsn(dsn)) >= 1
    holder = psycopg2.connect(dsn)
    try:
        with holder.cursor() as cursor:
            cursor.execute("CREATE TABLE IF NOT EXISTS held (v int)")
            holder.commit()
            cursor.execute("INSERT INTO held VALUES (1)")  # an xid, left open
        before = _lsn(dsn)
        assert slot.log_restart_point()
        assert _running_xacts(dsn, before, _lsn(dsn)) >= 1
    finally:
        holder.rollback()
        holder.close()
    assert slot.restart_points_logged == 2
    assert _sql(dsn, "SELECT count(*) FROM pg_replication_slots "
                     "WHERE slot_name LIKE 'rivven_rp_%'") == [(0,)]


def test_a_refused_restart_point_is_reported_and_the_next_one_works(postgres_server,
                                                                    pg_database, caplog):
    """Every slot of max_replication_slots taken: the restart point is refused (False, one
    warning for any number of refusals), nothing raised; with a slot free it works again."""
    dsn = postgres_server.dsn(pg_database)
    slot = _restart_slot(postgres_server, pg_database)
    taken = []
    try:
        [(limit,)] = _sql(dsn, "SELECT setting::int FROM pg_settings "
                               "WHERE name = 'max_replication_slots'")
        [(used,)] = _sql(dsn, "SELECT count(*) FROM pg_replication_slots")
        for index in range(limit - used):
            name = f"filler_{index}"
            _sql(dsn, f"SELECT pg_create_physical_replication_slot('{name}')")
            taken.append(name)
        with caplog.at_level("WARNING", logger="rivven_connect.pg.slot"):
            assert not slot.log_restart_point()
            assert not slot.log_restart_point()
        assert len([r for r in caplog.records if "no restart point" in r.getMessage()]) == 1
        _sql(dsn, f"SELECT pg_drop_replication_slot('{taken.pop()}')")
        assert slot.log_restart_point()
    finally:
        for name in taken:
            _sql(dsn, f"SELECT pg_drop_replication_slot('{name}')")


def test_restart_points_hold_retained_wal_near_one_interval_under_steady_writes(
        postgres_server, pg_database, broker_process, tmp_path):
    """A writer fills an unpublished table steadily for ~12 s (most of a background
    writer's 15 s interval): with heartbeats every 500 ms and their restart points, the
    slot's retained WAL, sampled in the last 6 s, stays a small fraction of what was
    written (without restart points it grows with every write until Postgres logs running
    transactions on its own)."""
    dsn = postgres_server.dsn(pg_database)
    _sql(dsn, SETUP)
    bootstrap = broker_process().address
    config = tmp_path / "connect.yaml"
    _write_config(config, pg_database, bootstrap)
    runtime = Runtime(config, postgres_server.port, tmp_path / "connect.log")
    stop = threading.Event()

    def write() -> None:
        while not stop.is_set():
            _sql(dsn, "INSERT INTO noise (v) SELECT repeat(md5(g::text), 24) "
                      "FROM generate_series(1, 500) g")
            time.sleep(0.05)

    writer = threading.Thread(target=write)
    try:
        _wait(lambda: _slot(dsn)[1], "the slot to be active", runtime=runtime)
        start_lsn = _wal(dsn)[0]
        writer.start()
        time.sleep(6)
        retained = []
        for _ in range(12):
            current, restart, _ = _wal(dsn)
            retained.append(current - restart)
            time.sleep(0.5)
        written = _wal(dsn)[0] - start_lsn
        assert written > 16 * MB, written
        assert max(retained) < written / 3, (retained, written)
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        stop.set()
        if writer.is_alive():
            writer.join()
        if runtime.popen.poll() is None:
            runtime.kill()
