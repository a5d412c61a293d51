"""Incremental (DBLog) snapshots of the ``postgres-cdc`` source end to end
(docs/connect-postgres.md "Incremental snapshots"): a real Postgres 15, a broker process,
``rivven-connect`` processes, topics read ``read_committed``.

Under concurrent inserts, updates and deletes the topic materialised by key (last value
wins, a delete removes) equals ``SELECT *``; each row is at most once an ``r`` (a chunk's
rows and the progress commit together, also across ``kill -9``); pause, resume and stop are
checked by their position in the topic (each signal is committed together with a marker
row change), not by timing. Every connection of the connector terminated mid snapshot: the
same process reconnects and goes on (docs/connect-postgres.md "Reconnects", point 6)."""

from __future__ import annotations

import json
import random
import threading
import time

import psycopg2
import trio

from rivven_broker.client.errors import RivvenError, UnknownTopicOrPartitionError
from rivven_connect.driver import find_error, read_position
from tests.integration.connect.helpers import read_committed
from tests.integration.connect.pg.test_postgres_cdc_source import (
    SOURCE, Runtime, _assert_slot_not_ahead, _sql, _wait,
)

ROWS = 3000
SETUP = f"""
CREATE TABLE orders (id int PRIMARY KEY, status text, amount numeric(10,2));
INSERT INTO orders SELECT n, 'old', n FROM generate_series(1, {ROWS}) n;
CREATE TABLE rivven_signal (id text PRIMARY KEY, type text NOT NULL, data text);
"""


def _config(path, database: str, bootstrap: str, mode: str = "never",
            tables: str = "[public.orders]", chunk_size: int = 100,
            on_interrupted: str = "resume") -> None:
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
              tables: {tables}, signal_table: public.rivven_signal,
              snapshot: {{ mode: {mode}, chunk_size: {chunk_size},
                          on_interrupted: {on_interrupted} }},
              status_interval_ms: 1000, batch_size: 200, heartbeat_interval_ms: 1000 }}
    routing: {{ topic_defaults: {{ partitions: 1 }} }}
""")


def _events(bootstrap: str, table: str = "orders") -> list[tuple]:
    """(op, id, after) per record; tombstones as ("tombstone", id, None)."""
    try:
        records = trio.run(read_committed, bootstrap, f"cdc.public.{table}")
    except (RivvenError, BaseExceptionGroup) as caught:  # the topic does not exist yet
        if find_error(caught, (UnknownTopicOrPartitionError,)) is None:
            raise
        return []
    out = []
    for record in records:
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


def _table(dsn: str, table: str = "orders") -> dict:
    return {row[0]: {"id": row[0], "status": row[1], "amount": row[2]} for row in
            _sql(dsn, f"SELECT id, status, amount::text FROM {table}")}


def _signal(dsn: str, signal_id: str, kind: str, data: dict | None = None,
            marker: int | None = None) -> None:
    """Insert a signal row; with ``marker``, in one transaction with an update of that
    row (status = the signal id), whose ``u`` shows where the signal sits in the topic."""
    statements = [f"INSERT INTO rivven_signal VALUES ('{signal_id}', '{kind}', "
                  f"'{json.dumps(data or {})}')"]
    if marker is not None:
        statements.append(f"UPDATE orders SET status = '{signal_id}' WHERE id = {marker}")
    _sql(dsn, *statements)


def _marker_index(events: list[tuple], signal_id: str) -> int:
    [index] = [i for i, e in enumerate(events)
               if e[0] == "u" and e[2]["status"] == signal_id]
    return index


def _snapshot_done(bootstrap: str) -> bool:
    stored = trio.run(read_position, bootstrap, SOURCE)
    return stored is not None and stored.get("phase") != "snapshot" and (
        "incremental" not in stored)


class Writer(threading.Thread):
    """Random inserts (ids > ROWS), updates and deletes, one row per transaction, until
    stopped; never touches ids 1..10 (the signal markers) or the untouched set."""

    def __init__(self, dsn: str, seed: int) -> None:
        super().__init__()
        self.dsn, self.stop, self.rng = dsn, threading.Event(), random.Random(seed)
        self.touched: set[int] = set()

    def run(self) -> None:
        conn = psycopg2.connect(self.dsn)
        try:
            with conn.cursor() as cursor:
                n = 0
                while not self.stop.is_set() and n < 3000:
                    n += 1
                    key = self.rng.randrange(11, ROWS * 2) | 1  # odd ids only
                    self.touched.add(key)
                    action = self.rng.random()
                    if action < 0.4:
                        cursor.execute("INSERT INTO orders VALUES (%s, 'w', %s) ON CONFLICT "
                                       "(id) DO UPDATE SET status = 'w2'", (key, n))
                    elif action < 0.8:
                        cursor.execute("UPDATE orders SET status = %s, amount = %s WHERE "
                                       "id = %s", (f"u{n}", n, key))
                    else:
                        cursor.execute("DELETE FROM orders WHERE id = %s", (key,))
                    conn.commit()
                    time.sleep(0.002)
        finally:
            conn.close()


def _setup(tmp_path, postgres_server, pg_database, broker_process, **config):
    dsn = postgres_server.dsn(pg_database)
    _sql(dsn, SETUP)
    bootstrap = broker_process().address
    path = tmp_path / "connect.yaml"
    _config(path, pg_database, bootstrap, **config)
    return dsn, bootstrap, path


def _check_final(dsn: str, bootstrap: str, writer: Writer | None = None) -> list[tuple]:
    events = _events(bootstrap)
    assert _materialized(events) == _table(dsn)
    r_ids = [e[1] for e in events if e[0] == "r"]
    assert len(r_ids) == len(set(r_ids))  # at most once each (one snapshot)
    untouched = {i for i in range(1, ROWS + 1) if i % 2 == 0 and i > 10}  # writer: odd ids
    assert untouched <= set(r_ids)  # every row nobody changed came from the snapshot
    return events


def test_incremental_snapshot_under_writes_with_pause_resume_and_stop(
        postgres_server, pg_database, broker_process, tmp_path):
    dsn, bootstrap, config = _setup(tmp_path, postgres_server, pg_database, broker_process)
    runtime = Runtime(config, postgres_server.port, tmp_path / "connect.log")
    writer = Writer(dsn, seed=1)
    try:
        _wait(lambda: _sql(dsn, "SELECT bool_or(active) FROM pg_replication_slots WHERE "
                                 "database = current_database()")[0][0],
              "the slot to be active", runtime=runtime)
        writer.start()
        _wait(lambda: len(_events(bootstrap)) > 20, "streamed writes", runtime=runtime)
        _signal(dsn, "go", "execute-snapshot", {"data-collections": ["public.orders"],
                                                 "chunk-size": 40})
        _wait(lambda: sum(e[0] == "r" for e in _events(bootstrap)) >= 200, "r records",
              runtime=runtime)
        _signal(dsn, "pause", "pause-snapshot", marker=1)
        _wait(lambda: any(e[0] == "u" and e[2]["status"] == "pause"
                          for e in _events(bootstrap)), "the pause marker", runtime=runtime)
        seen = len(_events(bootstrap))
        _wait(lambda: len(_events(bootstrap)) > seen + 50, "streaming while paused",
              runtime=runtime)
        _signal(dsn, "resume", "resume-snapshot", marker=2)
        _wait(lambda: _snapshot_done(bootstrap), "the snapshot to finish", runtime=runtime,
              timeout_s=180)
        writer.stop.set()
        writer.join(timeout=60)
        _wait(lambda: _materialized(_events(bootstrap)) == _table(dsn),
              "the topic to match the table", runtime=runtime, timeout_s=120)
        events = _check_final(dsn, bootstrap, writer)
        paused = events[_marker_index(events, "pause"):_marker_index(events, "resume")]
        assert sum(e[0] == "r" for e in paused) <= 40  # at most the chunk in flight
        assert len(paused) > 50  # streaming went on
        # stop: a second, slow snapshot stopped at once; no r after the stop marker
        _signal(dsn, "again", "execute-snapshot", {"data-collections": ["orders"],
                                                    "chunk-size": 5})
        _wait(lambda: sum(e[0] == "r" for e in _events(bootstrap)) >= len(
            [e for e in events if e[0] == "r"]) + 20, "the second snapshot", runtime=runtime)
        _signal(dsn, "stop", "stop-snapshot", marker=3)
        _wait(lambda: _snapshot_done(bootstrap), "the stop", runtime=runtime)
        _sql(dsn, "UPDATE orders SET status = 'after-stop' WHERE id = 4")
        _wait(lambda: any(e[2] and e[2]["status"] == "after-stop" for e in _events(bootstrap)),
              "a change after the stop", runtime=runtime)
        events = _events(bootstrap)
        assert [e for e in events[_marker_index(events, "stop"):] if e[0] == "r"] == []
        assert _materialized(events) == _table(dsn)
        _assert_slot_not_ahead(dsn, bootstrap)
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        writer.stop.set()
        if writer.is_alive():
            writer.join()
        if runtime.popen.poll() is None:
            runtime.kill()


def _terminate_ours(dsn: str) -> list[tuple[int, str]]:
    """Terminate every backend of ``rivven-connect`` in this database: the walsender, the
    chunk reader's connection, any short one; their (pid, backend_type)."""
    return _sql(dsn, "WITH ours AS MATERIALIZED (SELECT pid, backend_type FROM "
                     "pg_stat_activity WHERE application_name = 'rivven-connect' AND "
                     "datname = current_database()) SELECT pid, backend_type FROM ours "
                     "WHERE pg_terminate_backend(pid)")


def test_connections_lost_mid_incremental_snapshot_the_same_process_goes_on(
        postgres_server, pg_database, broker_process, tmp_path):
    """The reconnect path and the chunk windows together: every connection of the
    connector terminated three times while chunks are read under writes (a chunk read or
    an open window may be hit) → one process throughout, table = topic, each row at most
    once an ``r``."""
    dsn, bootstrap, config = _setup(tmp_path, postgres_server, pg_database, broker_process)
    log = tmp_path / "connect.log"
    runtime = Runtime(config, postgres_server.port, log)
    writer = Writer(dsn, seed=4)
    rng = random.Random(4)
    try:
        pid = _wait(lambda: _sql(dsn, "SELECT active_pid FROM pg_replication_slots WHERE "
                                      "database = current_database() AND active")[0:1],
                    "the slot to be active", runtime=runtime)[0][0]
        writer.start()
        _signal(dsn, "go", "execute-snapshot", {"data-collections": ["orders"],
                                                 "chunk-size": 10})
        # Chunks of 10 rows (300 chunk windows): with 30 the snapshot was once over before the
        # first kill on a fast run, and the test exercised nothing it says.
        mid_snapshot = 0
        for threshold in (60, 600, 1200):  # r records seen before each round of kills
            _wait(lambda: _snapshot_done(bootstrap) or sum(
                e[0] == "r" for e in _events(bootstrap)) >= threshold, "more chunks",
                runtime=runtime)
            time.sleep(rng.uniform(0, 0.3))
            mid_snapshot += not _snapshot_done(bootstrap)
            killed = _terminate_ours(dsn)
            assert (pid, "walsender") in killed, killed
            pid = _wait(lambda: (rows := _sql(
                dsn, "SELECT active_pid FROM pg_replication_slots WHERE database = "
                     "current_database() AND active")) and rows[0][0] != pid and rows[0][0],
                "a new walsender", runtime=runtime)
        assert mid_snapshot, "the snapshot was over before the first kill"
        _wait(lambda: _snapshot_done(bootstrap), "the snapshot to finish", runtime=runtime,
              timeout_s=180)
        writer.stop.set()
        writer.join(timeout=60)
        _wait(lambda: _materialized(_events(bootstrap)) == _table(dsn),
              "the topic to match the table", runtime=runtime, timeout_s=120)
        _check_final(dsn, bootstrap, writer)
        _assert_slot_not_ahead(dsn, bootstrap)
        assert runtime.popen.poll() is None  # the same process throughout
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        writer.stop.set()
        if writer.is_alive():
            writer.join()
        if runtime.popen.poll() is None:
            runtime.kill()
    assert runtime.stderr().count("the replication connection was lost") >= 3


def test_kill_9_mid_incremental_snapshot_resumes_at_the_last_committed_chunk(
        postgres_server, pg_database, broker_process, tmp_path):
    dsn, bootstrap, config = _setup(tmp_path, postgres_server, pg_database, broker_process)
    log = tmp_path / "connect.log"
    runtime = Runtime(config, postgres_server.port, log)
    writer = Writer(dsn, seed=2)
    try:
        _wait(lambda: _sql(dsn, "SELECT bool_or(active) FROM pg_replication_slots WHERE "
                                 "database = current_database()")[0][0],
              "the slot to be active", runtime=runtime)
        writer.start()
        # Chunks of 10 and a kill after 150 rows: the kill must land inside the snapshot, and
        # the encoded path made chunks of 30 fast enough to finish 3,000 rows between two
        # looks at the topic.
        _signal(dsn, "go", "execute-snapshot", {"data-collections": ["orders"],
                                                 "chunk-size": 10})
        _wait(lambda: sum(e[0] == "r" for e in _events(bootstrap)) >= 150, "part of it",
              runtime=runtime)
        runtime.kill()
        stored = trio.run(read_position, bootstrap, SOURCE)
        assert stored["incremental"]["tables"] == ["public.orders"], stored
        runtime = Runtime(config, postgres_server.port, log)
        _wait(lambda: _snapshot_done(bootstrap), "the snapshot to finish", runtime=runtime,
              timeout_s=180)
        writer.stop.set()
        writer.join(timeout=60)
        _wait(lambda: _materialized(_events(bootstrap)) == _table(dsn),
              "the topic to match the table", runtime=runtime, timeout_s=120)
        _check_final(dsn, bootstrap, writer)
        _assert_slot_not_ahead(dsn, bootstrap)
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        writer.stop.set()
        if writer.is_alive():
            writer.join()
        if runtime.popen.poll() is None:
            runtime.kill()


def test_a_crash_mid_initial_snapshot_resumes_by_chunks(
        postgres_server, pg_database, broker_process, tmp_path, monkeypatch):
    dsn, bootstrap, config = _setup(tmp_path, postgres_server, pg_database, broker_process,
                                    mode="initial", chunk_size=50)
    log = tmp_path / "connect.log"
    monkeypatch.setenv("RIVVEN_CONNECT_CRASH_AT", "before_commit:5")  # batch 5 of 200 rows
    runtime = Runtime(config, postgres_server.port, log)
    monkeypatch.delenv("RIVVEN_CONNECT_CRASH_AT")
    writer = Writer(dsn, seed=3)
    try:
        assert runtime.wait() == -9, runtime.stderr()
        assert "crash point before_commit:5 reached" in runtime.stderr()
        stored = trio.run(read_position, bootstrap, SOURCE)
        assert stored["phase"] == "snapshot" and not stored["done"], stored
        partial = _events(bootstrap)
        assert [e[:2] for e in partial] == [("r", i) for i in range(1, 801)]
        writer.start()  # changes after the consistent point, before and during the resume
        _wait(lambda: len(writer.touched) > 100, "writes while stopped")
        runtime = Runtime(config, postgres_server.port, log)
        _wait(lambda: _snapshot_done(bootstrap), "the resumed snapshot to finish",
              runtime=runtime, timeout_s=180)
        writer.stop.set()
        writer.join(timeout=60)
        _wait(lambda: _materialized(_events(bootstrap)) == _table(dsn),
              "the topic to match the table", runtime=runtime, timeout_s=120)
        events = _check_final(dsn, bootstrap, writer)
        assert events[:len(partial)] == partial  # nothing sent again, nothing restarted
        assert any(e[0] == "r" and e[1] > partial[-1][1] for e in events)  # the rest by chunks
        _assert_slot_not_ahead(dsn, bootstrap)
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        writer.stop.set()
        if writer.is_alive():
            writer.join()
        if runtime.popen.poll() is None:
            runtime.kill()


def test_a_table_added_to_the_include_list_is_snapshotted_while_streaming(
        postgres_server, pg_database, broker_process, tmp_path):
    dsn, bootstrap, config = _setup(tmp_path, postgres_server, pg_database, broker_process,
                                    mode="initial")
    _sql(dsn, "DELETE FROM orders WHERE id > 100",
         "CREATE TABLE items (id int PRIMARY KEY, status text, amount numeric(10,2))",
         "INSERT INTO items SELECT n, 'item', n FROM generate_series(1, 500) n")
    log = tmp_path / "connect.log"
    runtime = Runtime(config, postgres_server.port, log)
    try:
        _wait(lambda: len(_events(bootstrap)) == 100, "the initial snapshot", runtime=runtime)
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        if runtime.popen.poll() is None:
            runtime.kill()
    _sql(dsn, "UPDATE items SET status = 'while-stopped' WHERE id = 7")
    _config(config, pg_database, bootstrap, mode="initial",
            tables="[public.orders, public.items]")
    runtime = Runtime(config, postgres_server.port, log)
    try:
        _wait(lambda: len(_events(bootstrap, "items")) >= 500, "the new table's rows",
              runtime=runtime)
        _sql(dsn, "UPDATE items SET status = 'streamed' WHERE id = 8",
             "UPDATE orders SET status = 'streamed' WHERE id = 9")
        _wait(lambda: _materialized(_events(bootstrap, "items")) == _table(dsn, "items"),
              "items to match", runtime=runtime)
        _wait(lambda: _materialized(_events(bootstrap)) == _table(dsn), "orders to match",
              runtime=runtime)
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        if runtime.popen.poll() is None:
            runtime.kill()
    items = _events(bootstrap, "items")
    assert [e[:2] for e in items] == [("r", i) for i in range(1, 501)] + [("u", 8)], [
        e[:2] for e in items if e[0] != "r"]
    assert items[6][2]["status"] == "while-stopped"
    assert [e[:2] for e in _events(bootstrap)[100:]] == [("u", 9)]  # no second orders snapshot
    assert _sql(dsn, "SELECT tablename FROM pg_publication_tables WHERE pubname = "
                     "'rivven_pub' ORDER BY 1") == [("items",), ("orders",), ("rivven_signal",)]
