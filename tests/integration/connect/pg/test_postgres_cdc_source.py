"""The ``postgres-cdc`` source end to end: a real Postgres 15, a real broker process and
``rivven-connect`` as a process; topics read ``read_committed``.

After every phase the slot's ``confirmed_flush_lsn`` is checked against the stored offset
(never ahead)."""

from __future__ import annotations

import json
import os
import pathlib
import random
import re
import signal
import subprocess
import sys
import threading
import time

import psycopg2
import trio

from rivven_broker.client.errors import RivvenError, UnknownTopicOrPartitionError
from rivven_connect.driver import find_error, read_position
from rivven_connect.pg.pgoutput import parse_lsn
from tests.integration.connect.helpers import read_committed

ROOT = pathlib.Path(__file__).resolve().parents[4]
TOPIC = "cdc.public.orders"
SOURCE = "orders_db"
SETUP = """
CREATE TABLE orders (id int PRIMARY KEY, status text, amount numeric(10,2));
ALTER TABLE orders REPLICA IDENTITY FULL;
CREATE TABLE noise (id serial PRIMARY KEY, v text);
"""


def _sql(dsn: str, *statements: str) -> list:
    """Run ``statements`` in one transaction; the last one's rows (if any)."""
    rows: list = []
    with psycopg2.connect(dsn) as conn, conn.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)
            rows = cursor.fetchall() if cursor.description else []
    conn.close()
    return rows


def _write_config(path: pathlib.Path, server, database: str, bootstrap: str) -> None:
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
              status_interval_ms: 1000, batch_size: 50 }}
    routing: {{ topic_defaults: {{ partitions: 1 }} }}
""")


class Runtime:
    """``rivven-connect`` as a process (stderr to a file)."""

    def __init__(self, config: pathlib.Path, port: int, log: pathlib.Path) -> None:
        self.log = log
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PGPORT_TEST": str(port)}
        self.handle = log.open("ab")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "rivven_connect", "--config", str(config)], env=env,
            stderr=self.handle)

    def stop(self) -> int:
        self.popen.send_signal(signal.SIGTERM)
        return self.wait()

    def wait(self, timeout_s: float = 60) -> int:
        try:
            return self.popen.wait(timeout=timeout_s)
        finally:
            self.handle.close()

    def kill(self) -> None:
        self.popen.kill()
        self.wait()

    def stderr(self) -> str:
        return self.log.read_text()


def _records(bootstrap: str) -> list:
    try:
        return trio.run(read_committed, bootstrap, TOPIC)
    except (RivvenError, BaseExceptionGroup) as caught:  # the topic does not exist yet
        if find_error(caught, (UnknownTopicOrPartitionError,)) is None:
            raise
        return []


def _stored_end_lsn(bootstrap: str) -> int | None:
    position = trio.run(read_position, bootstrap, SOURCE)
    return None if position is None else parse_lsn(position["end_lsn"])


def _slot(dsn: str) -> tuple[int | None, bool]:
    rows = _sql(dsn, "SELECT confirmed_flush_lsn::text, active FROM pg_replication_slots "
                     "WHERE slot_name = 'rivven_slot'")
    if not rows:
        return None, False
    lsn, active = rows[0]
    return (None if lsn is None else parse_lsn(lsn)), active


def _wait(predicate, what: str, timeout_s: float = 60, runtime: Runtime | None = None):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if runtime is not None:
            assert runtime.popen.poll() is None, f"{what}: runtime exited\n{runtime.stderr()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _assert_slot_not_ahead(dsn: str, bootstrap: str) -> int:
    confirmed, _ = _slot(dsn)
    stored = _stored_end_lsn(bootstrap)
    assert stored is not None and confirmed is not None
    assert confirmed <= stored, (hex(confirmed), hex(stored))
    return stored


def _summary(record) -> tuple:
    key = json.loads(record.key)
    if record.value is None:
        return ("tombstone", key)
    value = json.loads(record.value)
    return (value["op"], key, value["before"], value["after"])


def _start(tmp_path, postgres_server, pg_database, broker_process):
    dsn = postgres_server.dsn(pg_database)
    _sql(dsn, SETUP)
    broker = broker_process()
    config = tmp_path / "connect.yaml"
    _write_config(config, postgres_server, pg_database, broker.address)
    return dsn, broker.address, config


def test_changes_arrive_once_in_order_across_restarts(postgres_server, pg_database,
                                                      broker_process, tmp_path):
    dsn, bootstrap, config = _start(tmp_path, postgres_server, pg_database, broker_process)
    log = tmp_path / "connect.log"
    runtime = Runtime(config, postgres_server.port, log)
    try:  # the connector creates the publication and the slot, then streams
        _wait(lambda: _slot(dsn)[1], "the slot to be active", runtime=runtime)
        _sql(dsn, "INSERT INTO orders VALUES (1, 'new', 10.50)")
        _sql(dsn, "UPDATE orders SET status = 'paid' WHERE id = 1")
        _sql(dsn, "DELETE FROM orders WHERE id = 1")
        _sql(dsn, "INSERT INTO orders VALUES (2, 'a', 1)", "INSERT INTO orders VALUES (3, 'b', 2)",
             "UPDATE orders SET status = 'a2' WHERE id = 2")
        records = _wait(lambda: len(_records(bootstrap)) >= 7 and _records(bootstrap),
                        "7 records", runtime=runtime)
        row1 = {"id": 1, "status": "new", "amount": "10.50"}
        row1_paid = {**row1, "status": "paid"}
        row2 = {"id": 2, "status": "a", "amount": "1.00"}
        assert [_summary(r) for r in records] == [
            ("c", {"id": 1}, None, row1),
            ("u", {"id": 1}, row1, row1_paid),
            ("d", {"id": 1}, row1_paid, None),
            ("tombstone", {"id": 1}),
            ("c", {"id": 2}, None, row2),
            ("c", {"id": 3}, None, {"id": 3, "status": "b", "amount": "2.00"}),
            ("u", {"id": 2}, row2, {**row2, "status": "a2"}),
        ]
        values = [json.loads(r.value) for r in records if r.value is not None]
        lsns = [parse_lsn(v["source"]["lsn"]) for v in values]
        assert lsns == sorted(lsns) and len(set(lsns)) == len(lsns)
        assert len({v["source"]["txId"] for v in values[3:]}) == 1  # one PG transaction
        assert len({v["source"]["txId"] for v in values[:4]}) == 4
        assert all(v["source"]["table"] == "orders" and v["source"]["db"] == pg_database
                   for v in values)
        # The side effect confirms end_lsn - 1 after the commit; unpublished writes while
        # idle (status updates every second) never push the slot past the stored offset.
        stored = _assert_slot_not_ahead(dsn, bootstrap)
        _wait(lambda: _slot(dsn)[0] == stored - 1, "the slot confirmed at the stored offset")
        for n in range(5):
            _sql(dsn, f"INSERT INTO noise (v) VALUES ('{n}')")
            time.sleep(0.5)
        _assert_slot_not_ahead(dsn, bootstrap)
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        if runtime.popen.poll() is None:
            runtime.kill()
    _assert_slot_not_ahead(dsn, bootstrap)

    # A restart with nothing new sends nothing twice.
    runtime = Runtime(config, postgres_server.port, log)
    _wait(lambda: _slot(dsn)[1], "the slot to be active again", runtime=runtime)
    _sql(dsn, "INSERT INTO noise (v) VALUES ('idle')")
    time.sleep(2)
    assert runtime.stop() == 0, runtime.stderr()
    assert len(_records(bootstrap)) == 7
    _assert_slot_not_ahead(dsn, bootstrap)

    # Changes made while the runtime is down arrive, exactly those.
    _sql(dsn, "INSERT INTO orders VALUES (4, 'late', 4)")
    _sql(dsn, "INSERT INTO noise (v) VALUES ('x')", "UPDATE orders SET amount = 5 WHERE id = 4")
    runtime = Runtime(config, postgres_server.port, log)
    try:
        records = _wait(lambda: len(_records(bootstrap)) >= 9 and _records(bootstrap),
                        "9 records", runtime=runtime)
        time.sleep(1)
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        if runtime.popen.poll() is None:
            runtime.kill()
    records = _records(bootstrap)
    assert [_summary(r)[:2] for r in records[7:]] == [("c", {"id": 4}), ("u", {"id": 4})]
    assert len(records) == 9
    _assert_slot_not_ahead(dsn, bootstrap)


ROWS, TRANSACTIONS = 2000, 100
_CHANGE = re.compile(r"^table public\.orders: INSERT: id\[integer\]:(\d+) ")


def _writer(dsn: str, done: threading.Event) -> None:
    conn = psycopg2.connect(dsn)
    rng = random.Random(5)
    try:
        with conn.cursor() as cursor:
            per = ROWS // TRANSACTIONS
            for txn in range(TRANSACTIONS):
                for row in range(txn * per, (txn + 1) * per):
                    cursor.execute("INSERT INTO orders VALUES (%s, 'w', %s)", (row, row))
                conn.commit()
                time.sleep(rng.uniform(0.01, 0.05))
    finally:
        conn.close()
        done.set()


def test_kill_9_mid_stream_delivers_every_row_exactly_once(postgres_server, pg_database,
                                                            broker_process, tmp_path):
    dsn, bootstrap, config = _start(tmp_path, postgres_server, pg_database, broker_process)
    _sql(dsn, "CREATE PUBLICATION rivven_pub FOR TABLE orders")
    _sql(dsn, "SELECT pg_create_logical_replication_slot('oracle', 'test_decoding')")
    log = tmp_path / "connect.log"
    runtime = Runtime(config, postgres_server.port, log)
    done = threading.Event()
    writer = threading.Thread(target=_writer, args=(dsn, done))
    kills = 0
    try:
        _wait(lambda: _slot(dsn)[1], "the slot to be active", runtime=runtime)
        writer.start()
        while not done.is_set() or kills < 2:
            seen = len(_records(bootstrap))
            _wait(lambda: len(_records(bootstrap)) > seen, "progress", runtime=runtime)
            time.sleep(random.Random(kills).uniform(0.1, 0.6))
            runtime.kill()  # SIGKILL: mid-batch, mid-transaction, before or after feedback
            kills += 1
            assert len(_records(bootstrap)) < ROWS or done.is_set()
            _assert_slot_not_ahead(dsn, bootstrap)
            runtime = Runtime(config, postgres_server.port, log)
        writer.join()
        _wait(lambda: len(_records(bootstrap)) >= ROWS, f"{ROWS} records", runtime=runtime,
              timeout_s=120)
        # The last runtime may have started a moment ago: SIGTERM before its handler is
        # installed kills it (-15). Once its slot is active it is streaming.
        _wait(lambda: _slot(dsn)[1], "the slot to be active", runtime=runtime)
        time.sleep(1)
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        if runtime.popen.poll() is None:
            runtime.kill()
        writer.join()
    assert kills >= 2
    ours = sorted((json.loads(r.value)["after"]["id"], json.loads(r.value)["source"]["lsn"])
                  for r in _records(bootstrap))
    oracle = []
    for lsn, data in _sql(dsn, "SELECT lsn::text, data FROM "
                               "pg_logical_slot_get_changes('oracle', NULL, NULL)"):
        match = _CHANGE.match(data)
        if match:
            oracle.append((int(match.group(1)), lsn))
    assert len(oracle) == ROWS
    assert ours == sorted(oracle)  # multiset equality on (pk, lsn): every row exactly once
    _assert_slot_not_ahead(dsn, bootstrap)


def test_a_slot_ahead_of_the_stored_offset_stops_the_connector(postgres_server, pg_database,
                                                                broker_process, tmp_path):
    dsn, bootstrap, config = _start(tmp_path, postgres_server, pg_database, broker_process)
    log = tmp_path / "connect.log"
    runtime = Runtime(config, postgres_server.port, log)
    try:
        _wait(lambda: _slot(dsn)[1], "the slot to be active", runtime=runtime)
        _sql(dsn, "INSERT INTO orders VALUES (1, 'a', 1)")
        _wait(lambda: _records(bootstrap), "the first record", runtime=runtime)
        _wait(lambda: _slot(dsn)[0] == _stored_end_lsn(bootstrap) - 1, "the confirmation")
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        if runtime.popen.poll() is None:
            runtime.kill()
    # Undelivered, then skipped by hand (flushed: a slot advances only over flushed WAL).
    _sql(dsn, "SET synchronous_commit = on", "INSERT INTO orders VALUES (2, 'lost', 2)")
    _sql(dsn, "SELECT pg_replication_slot_advance('rivven_slot', pg_current_wal_lsn())")
    assert _slot(dsn)[0] > _stored_end_lsn(bootstrap)
    runtime = Runtime(config, postgres_server.port, log)
    assert runtime.wait() == 3
    stderr = runtime.stderr()
    assert "the slot ran ahead" in stderr and "stored offset" in stderr, stderr
    assert len(_records(bootstrap)) == 1


def test_a_table_without_primary_key_is_refused_at_start(postgres_server, pg_database,
                                                          broker_process, tmp_path):
    dsn, bootstrap, config = _start(tmp_path, postgres_server, pg_database, broker_process)
    _sql(dsn, "ALTER TABLE orders REPLICA IDENTITY DEFAULT",
         "ALTER TABLE orders DROP CONSTRAINT orders_pkey")
    runtime = Runtime(config, postgres_server.port, tmp_path / "connect.log")
    assert runtime.wait() == 3
    stderr = runtime.stderr()
    assert "public.orders has no primary key" in stderr, stderr
    assert _slot(dsn) == (None, False)  # nothing created
