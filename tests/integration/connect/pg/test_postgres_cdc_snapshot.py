"""Snapshots of the ``postgres-cdc`` source end to end (docs/connect-postgres.md
"Snapshots"): a real Postgres 15, a broker process and ``rivven-connect`` processes;
topics read ``read_committed``.

The handover is checked row by row: every pre-existing row exactly once as ``r``, every
row written while the snapshot runs exactly once (in the snapshot or in the stream, never
both, never neither), the materialized topic equal to the table."""

from __future__ import annotations

import json
import threading
import time

import psycopg2
import trio

from rivven_connect.driver import read_position
from rivven_connect.pg.pgoutput import parse_lsn

from tests.integration.connect.pg.test_postgres_cdc_source import (
    SOURCE, Runtime, _assert_slot_not_ahead, _records, _slot, _sql, _wait,
)

ROWS = 5000
SETUP = f"""
CREATE TABLE orders (id int PRIMARY KEY, status text, amount numeric(10,2));
ALTER TABLE orders REPLICA IDENTITY FULL;
INSERT INTO orders SELECT n, 'old', n FROM generate_series(1, {ROWS}) n;
"""


def _config(path, database: str, bootstrap: str, mode: str, chunk_size: int = 50,
            on_interrupted: str = "fail") -> None:
    # Heartbeats every minute: these tests read the snapshot's and the stream's positions,
    # which a heartbeat (the default 1 s while the WAL moves) would replace.
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
              tables: [public.orders], snapshot: {{ mode: {mode}, chunk_size: {chunk_size},
                          on_interrupted: {on_interrupted} }},
              status_interval_ms: 1000, batch_size: 50, heartbeat_interval_ms: 60000 }}
    routing: {{ topic_defaults: {{ partitions: 1 }} }}
""")


def _setup(tmp_path, postgres_server, pg_database, broker_process, mode: str):
    dsn = postgres_server.dsn(pg_database)
    _sql(dsn, SETUP)
    bootstrap = broker_process().address
    config = tmp_path / "connect.yaml"
    _config(config, pg_database, bootstrap, mode)
    return dsn, bootstrap, config


def _events(bootstrap: str) -> list[tuple]:
    """(op, id, after) per record; tombstones as ("tombstone", id, None)."""
    out = []
    for record in _records(bootstrap):
        key = json.loads(record.key)["id"]
        if record.value is None:
            out.append(("tombstone", key, None))
        else:
            value = json.loads(record.value)
            out.append((value["op"], key, value["after"]))
    return out


def _materialized(events: list[tuple]) -> dict:
    state: dict = {}
    for op, key, after in events:
        if op in ("r", "c", "u"):
            state[key] = after
        elif op == "d":
            state.pop(key, None)
    return state


def _table(dsn: str) -> dict:
    return {row[0]: {"id": row[0], "status": row[1], "amount": row[2]} for row in
            _sql(dsn, "SELECT id, status, amount::text FROM orders")}


class Writer(threading.Thread):
    """Inserts ids 100001.., updates and deletes pre-existing rows, one row per
    transaction, until stopped (or 450 rounds)."""

    def __init__(self, dsn: str) -> None:
        super().__init__()
        self.dsn, self.stop, self.inserted = dsn, threading.Event(), []

    def run(self) -> None:
        conn = psycopg2.connect(self.dsn)
        try:
            with conn.cursor() as cursor:
                n = 0
                while not self.stop.is_set() and n < 450:  # n * 11 stays a pre-existing id
                    n += 1
                    cursor.execute("INSERT INTO orders VALUES (%s, 'w', %s)", (100000 + n, n))
                    self.inserted.append(100000 + n)
                    conn.commit()
                    cursor.execute("UPDATE orders SET status = 'u' WHERE id = %s", (n * 7,))
                    conn.commit()
                    if n % 5 == 0:
                        cursor.execute("DELETE FROM orders WHERE id = %s", (n * 11,))
                        conn.commit()
                    time.sleep(0.005)
        finally:
            conn.close()


def test_initial_snapshot_then_stream_with_writes_during_the_snapshot(
        postgres_server, pg_database, broker_process, tmp_path):
    dsn, bootstrap, config = _setup(tmp_path, postgres_server, pg_database, broker_process,
                                    "initial")
    log = tmp_path / "connect.log"
    writer = Writer(dsn)
    writer.start()  # before the slot exists: some writes land in the snapshot, some after
    runtime = Runtime(config, postgres_server.port, log)
    try:
        _wait(lambda: len(_records(bootstrap)) >= 100, "the snapshot to start", runtime=runtime)
        assert len(_records(bootstrap)) < ROWS, "the snapshot was too fast to overlap writes"
        writer.stop.set()  # it wrote before the slot existed and after (records are out)
        writer.join(timeout=120)
        final = _table(dsn)
        _wait(lambda: _materialized(_events(bootstrap)) == final, "the topic to match the table",
              runtime=runtime, timeout_s=180)
        events = _events(bootstrap)
        snapshot = [e for e in events if e[0] == "r"]
        r_ids = [e[1] for e in snapshot]
        assert len(r_ids) == len(set(r_ids))  # every row at most once in the snapshot
        streamed_c = [e[1] for e in events if e[0] == "c"]
        for key in writer.inserted:  # in the snapshot or in the stream: exactly once
            assert (r_ids.count(key) + streamed_c.count(key)) == 1, key
        in_snapshot = [key for key in writer.inserted if key in r_ids]
        assert 0 < len(in_snapshot) < len(writer.inserted)  # both sides of the handover
        assert events.index(snapshot[-1]) == len(snapshot) - 1  # r first, then the stream
        values = [json.loads(r.value) for r in _records(bootstrap) if r.value is not None]
        flags = [v["source"]["snapshot"] for v in values if v["op"] == "r"]
        assert flags == ["true"] * (len(flags) - 1) + ["last"]
        assert all(v["source"]["snapshot"] == "false" for v in values if v["op"] != "r")
        # every pre-existing row exactly once as r, unless deleted before the slot existed
        deleted_early = {i for i in range(1, ROWS + 1)} - set(r_ids)
        assert all(i % 11 == 0 for i in deleted_early), sorted(deleted_early)[:5]
        for i in deleted_early:  # deleted before the snapshot: no trace at all
            assert not [e for e in events if e[1] == i]
        # live changes after the snapshot: c, u, d exactly once
        seen = len(events)
        _sql(dsn, "INSERT INTO orders VALUES (900001, 'live', 1)")
        _sql(dsn, "UPDATE orders SET status = 'live2' WHERE id = 900001")
        _sql(dsn, "DELETE FROM orders WHERE id = 900001")
        _wait(lambda: len(_records(bootstrap)) >= seen + 4, "the live changes", runtime=runtime)
        time.sleep(1)
        assert [e[:2] for e in _events(bootstrap)[seen:]] == [
            ("c", 900001), ("u", 900001), ("d", 900001), ("tombstone", 900001)]
        _assert_slot_not_ahead(dsn, bootstrap)
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        writer.stop.set()
        writer.join()
        if runtime.popen.poll() is None:
            runtime.kill()
    # A restart after the snapshot completed does not snapshot again; it streams.
    total = len(_records(bootstrap))
    runtime = Runtime(config, postgres_server.port, log)
    try:
        _wait(lambda: _slot(dsn)[1], "the slot to be active again", runtime=runtime)
        _sql(dsn, "UPDATE orders SET status = 'after-restart' WHERE id = 1")
        _wait(lambda: len(_records(bootstrap)) > total, "the change after restart",
              runtime=runtime)
        time.sleep(1)
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        if runtime.popen.poll() is None:
            runtime.kill()
    tail = _events(bootstrap)[total:]
    assert [e[:2] for e in tail] == [("u", 1)], tail
    assert _materialized(_events(bootstrap)) == _table(dsn)
    _assert_slot_not_ahead(dsn, bootstrap)


def test_initial_only_stops_after_the_snapshot_and_keeps_no_slot(
        postgres_server, pg_database, broker_process, tmp_path):
    dsn, bootstrap, config = _setup(tmp_path, postgres_server, pg_database, broker_process,
                                    "initial_only")
    _sql(dsn, "CREATE TABLE other (id int PRIMARY KEY)")
    log = tmp_path / "connect.log"
    runtime = Runtime(config, postgres_server.port, log)
    assert runtime.wait(timeout_s=120) == 0, runtime.stderr()
    events = _events(bootstrap)
    assert [e[1] for e in events] == list(range(1, ROWS + 1))
    assert {e[0] for e in events} == {"r"}
    assert _slot(dsn) == (None, False)  # the exporting slot was temporary
    # Started again: the stored offset says done; it stops at once, sending nothing.
    _sql(dsn, f"INSERT INTO orders VALUES ({ROWS + 1}, 'x', 1)")
    runtime = Runtime(config, postgres_server.port, log)
    assert runtime.wait(timeout_s=60) == 0, runtime.stderr()
    assert len(_records(bootstrap)) == ROWS


def test_never_without_a_slot_streams_from_now(postgres_server, pg_database, broker_process,
                                               tmp_path):
    dsn, bootstrap, config = _setup(tmp_path, postgres_server, pg_database, broker_process,
                                    "never")
    runtime = Runtime(config, postgres_server.port, tmp_path / "connect.log")
    try:
        _wait(lambda: _slot(dsn)[1], "the slot to be active", runtime=runtime)
        _sql(dsn, "UPDATE orders SET status = 'now' WHERE id = 3")
        _wait(lambda: _records(bootstrap), "the change", runtime=runtime)
        time.sleep(1)
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        if runtime.popen.poll() is None:
            runtime.kill()
    assert [e[:2] for e in _events(bootstrap)] == [("u", 3)]


def test_kill_9_mid_snapshot_is_refused_at_restart_then_restarted_on_request(
        postgres_server, pg_database, broker_process, tmp_path):
    dsn, bootstrap, config = _setup(tmp_path, postgres_server, pg_database, broker_process,
                                    "initial")
    log = tmp_path / "connect.log"
    runtime = Runtime(config, postgres_server.port, log)
    try:
        _wait(lambda: len(_records(bootstrap)) >= 500, "part of the snapshot", runtime=runtime)
        runtime.kill()
    finally:
        if runtime.popen.poll() is None:
            runtime.kill()
    partial = _events(bootstrap)
    assert 500 <= len(partial) < ROWS
    assert [e[1] for e in partial] == list(range(1, len(partial) + 1))
    runtime = Runtime(config, postgres_server.port, log)
    assert runtime.wait(timeout_s=60) == 3
    assert "a snapshot was interrupted" in runtime.stderr(), runtime.stderr()
    assert _events(bootstrap) == partial  # nothing sent twice; the slot is kept
    assert _slot(dsn)[0] is not None
    # on_interrupted: restart — a new slot and snapshot; the rows sent before are sent again
    _config(config, pg_database, bootstrap, "initial", on_interrupted="restart")
    _sql(dsn, "UPDATE orders SET status = 'changed' WHERE id = 1",
         f"DELETE FROM orders WHERE id = {ROWS}")
    runtime = Runtime(config, postgres_server.port, log)
    try:
        _wait(lambda: len(_records(bootstrap)) >= len(partial) + ROWS - 1, "the new snapshot",
              runtime=runtime, timeout_s=120)
        _sql(dsn, "INSERT INTO orders VALUES (0, 'streamed', 0)")
        _wait(lambda: _materialized(_events(bootstrap)) == _table(dsn), "the topic = the table",
              runtime=runtime)
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        if runtime.popen.poll() is None:
            runtime.kill()
    events = _events(bootstrap)
    again = events[len(partial):]
    assert [e[1] for e in again if e[0] == "r"] == list(range(1, ROWS))
    assert again[0][2]["status"] == "changed" and [e[:2] for e in again[ROWS - 1:]] == [
        ("c", 0)]
    _assert_slot_not_ahead(dsn, bootstrap)


def test_a_snapshot_of_a_table_without_primary_key_is_refused_before_the_slot(
        postgres_server, pg_database, broker_process, tmp_path):
    dsn, bootstrap, config = _setup(tmp_path, postgres_server, pg_database, broker_process,
                                    "initial")
    _sql(dsn, "ALTER TABLE orders DROP CONSTRAINT orders_pkey")  # FULL: streamable, no key
    runtime = Runtime(config, postgres_server.port, tmp_path / "connect.log")
    assert runtime.wait(timeout_s=60) == 3
    assert "has no primary key: a snapshot reads by primary key" in runtime.stderr()
    assert _slot(dsn) == (None, False)


def _run_until(config, postgres_server, log, bootstrap, count: int) -> None:
    runtime = Runtime(config, postgres_server.port, log)
    try:
        _wait(lambda: len(_records(bootstrap)) >= count, f"{count} records", runtime=runtime,
              timeout_s=120)
        time.sleep(1)
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        if runtime.popen.poll() is None:
            runtime.kill()


def test_always_snapshots_at_every_start_and_when_needed_when_the_slot_is_gone(
        postgres_server, pg_database, broker_process, tmp_path):
    dsn, bootstrap, config = _setup(tmp_path, postgres_server, pg_database, broker_process,
                                    "always")
    _sql(dsn, "DELETE FROM orders WHERE id > 100")
    log = tmp_path / "connect.log"
    _run_until(config, postgres_server, log, bootstrap, 100)
    _sql(dsn, "UPDATE orders SET status = 'between' WHERE id = 5")  # while stopped
    _run_until(config, postgres_server, log, bootstrap, 200)
    events = _events(bootstrap)
    assert [e[:2] for e in events] == [("r", i) for i in range(1, 101)] * 2  # no u for id 5
    assert events[104][2]["status"] == "between"
    # when_needed: an offset is stored and the slot is there -> stream only
    _config(config, pg_database, bootstrap, "when_needed")
    runtime = Runtime(config, postgres_server.port, log)
    try:
        _wait(lambda: _slot(dsn)[1], "the slot to be active", runtime=runtime)
        _sql(dsn, "UPDATE orders SET status = 'live' WHERE id = 6")
        _wait(lambda: len(_records(bootstrap)) > 200, "the update", runtime=runtime)
        time.sleep(1)
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        if runtime.popen.poll() is None:
            runtime.kill()
    assert [e[:2] for e in _events(bootstrap)[200:]] == [("u", 6)]
    # ... and when the slot is gone, a new snapshot (initial would stop: WAL lost)
    _sql(dsn, "SELECT pg_drop_replication_slot('rivven_slot')")
    _sql(dsn, "UPDATE orders SET status = 'unseen' WHERE id = 7")
    _run_until(config, postgres_server, log, bootstrap, 301)
    tail = _events(bootstrap)[201:]
    assert [e[:2] for e in tail] == [("r", i) for i in range(1, 101)]
    assert tail[6][2]["status"] == "unseen"
    assert _materialized(_events(bootstrap)) == _table(dsn)
    stored = trio.run(read_position, bootstrap, SOURCE)  # the snapshot's last row
    assert stored["phase"] == "snapshot" and stored["done"]
    assert _slot(dsn)[0] == parse_lsn(stored["consistent_lsn"])  # a new slot, not confirmed
