"""``postgres-cdc`` reconnects, end to end (real Postgres 15, a broker process and one
``rivven-connect`` process that must survive): the walsender terminated several times and
Postgres restarted once while a writer commits → every change exactly once, in commit
order, to a ``read_committed`` reader, the reconnects in ``/metrics``, the slot never ahead
of the stored offset; Postgres down for longer than the reconnect budget → the connector
stops with exit code 3 and says why."""

from __future__ import annotations

import json
import random
import re
import socket
import threading
import time
import urllib.request

import psycopg2

from tests.integration.connect.pg.test_postgres_cdc_source import (
    SOURCE, Runtime, _assert_slot_not_ahead, _records, _slot, _sql, _wait,
)

SETUP = "CREATE TABLE orders (id int PRIMARY KEY, seq bigint NOT NULL);"
CHANGES, KEYS = 1200, 40
TERMINATIONS = 4


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _config(tmp_path, database: str, bootstrap: str, http_port: int, extra: str = ""):
    config = tmp_path / "connect.yaml"
    config.write_text(f"""
version: "1.0"
broker: {{ bootstrap: "{bootstrap}" }}
http: "127.0.0.1:{http_port}"
sources:
  {SOURCE}:
    connector: postgres-cdc
    topic: "cdc.{{schema}}.{{table}}"
    config: {{ host: 127.0.0.1, port: "${{PGPORT_TEST}}", database: {database},
              user: postgres, slot_name: rivven_slot, publication_name: rivven_pub,
              tables: [public.orders], snapshot: {{ mode: never }},
              status_interval_ms: 1000, batch_size: 50{extra} }}
    routing: {{ topic_defaults: {{ partitions: 1 }} }}
""")
    return config


class Writer(threading.Thread):
    """Commits ``CHANGES`` inserts/updates over ``KEYS`` keys, 1–4 per transaction, each
    row version carrying the next ``seq``; holds ``lock`` during each transaction (so the
    test can restart Postgres between two). ``committed``: the seqs in commit order."""

    def __init__(self, dsn: str) -> None:
        super().__init__()
        self.dsn, self.lock = dsn, threading.Lock()
        self.committed: list[int] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        rng, exists, seq = random.Random(23), set(), 0
        try:
            while seq < CHANGES:
                with self.lock:  # one connection per transaction: Postgres may restart
                    conn = psycopg2.connect(self.dsn)
                    try:
                        with conn.cursor() as cursor:
                            pending = []
                            for _ in range(min(rng.randint(1, 4), CHANGES - seq)):
                                key = rng.randrange(KEYS)
                                if key in exists or key in {k for k, _ in pending}:
                                    cursor.execute("UPDATE orders SET seq = %s WHERE id = %s",
                                                   (seq, key))
                                else:
                                    cursor.execute("INSERT INTO orders VALUES (%s, %s)",
                                                   (key, seq))
                                pending.append((key, seq))
                                seq += 1
                        conn.commit()
                    finally:
                        conn.close()
                exists.update(key for key, _ in pending)
                self.committed.extend(s for _, s in pending)
                time.sleep(rng.uniform(0.002, 0.01))
        except BaseException as error:  # the test reports it
            self.error = error


def _metric(http_port: int, name: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    match = re.search(rf'^{name}{{connector="{SOURCE}"}} (\d+)$', text, re.MULTILINE)
    assert match, text
    return int(match.group(1))


def _walsender_pid(dsn: str) -> int | None:
    rows = _sql(dsn, "SELECT active_pid FROM pg_replication_slots WHERE "
                     "slot_name = 'rivven_slot' AND active")
    return rows[0][0] if rows else None


def test_walsender_terminated_and_postgres_restarted_every_change_once_in_order(
        postgres_server, pg_database, broker_process, tmp_path):
    dsn = postgres_server.dsn(pg_database)
    _sql(dsn, SETUP)
    bootstrap, http_port = broker_process().address, _free_port()
    config = _config(tmp_path, pg_database, bootstrap, http_port)
    runtime = Runtime(config, postgres_server.port, tmp_path / "connect.log")
    writer = Writer(dsn)
    rng = random.Random(7)
    try:
        pid = _wait(lambda: _walsender_pid(dsn), "the slot to be active", runtime=runtime)
        writer.start()
        for outage in range(TERMINATIONS + 1):
            seen = len(_records(bootstrap))
            _wait(lambda: writer.error or len(_records(bootstrap)) > seen, "progress",
                  runtime=runtime)
            assert writer.error is None, writer.error
            time.sleep(rng.uniform(0.1, 0.6))
            if outage < TERMINATIONS:
                _sql(dsn, f"SELECT pg_terminate_backend({pid})")
            else:  # a restart of Postgres between two of the writer's transactions
                with writer.lock:
                    postgres_server.stop()
                    time.sleep(1.0)  # the runtime's attempts fail meanwhile
                    postgres_server.start()
            pid = _wait(lambda: (p := _walsender_pid(dsn)) != pid and p, "a new walsender",
                        runtime=runtime)
            _assert_slot_not_ahead(dsn, bootstrap)
        writer.join()
        assert writer.error is None, writer.error
        assert writer.committed[-1] == CHANGES - 1 and outage == TERMINATIONS
        _wait(lambda: len(_records(bootstrap)) >= CHANGES, f"{CHANGES} records",
              runtime=runtime)
        # The walsender shows as active when START_REPLICATION runs, before the runtime
        # counts its reconnect; every record may be in already: wait for the count.
        _wait(lambda: _metric(http_port, "rivven_connect_cdc_reconnects_total")
              >= TERMINATIONS + 1, "every reconnect counted", runtime=runtime)
        assert _metric(http_port, "rivven_connect_cdc_reconnects_total") == TERMINATIONS + 1
        assert _metric(http_port, "rivven_connect_cdc_reconnect_failures_total") >= 1
        time.sleep(1)  # nothing more arrives
        assert runtime.popen.poll() is None  # the same process throughout
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        if runtime.popen.poll() is None:
            runtime.kill()
        if writer.is_alive():
            writer.join()
    seqs = [json.loads(r.value)["after"]["seq"] for r in _records(bootstrap)]
    assert seqs == writer.committed == list(range(CHANGES))  # each once, in commit order
    _assert_slot_not_ahead(dsn, bootstrap)
    assert runtime.stderr().count("the replication connection was lost") == TERMINATIONS + 1


def test_postgres_down_longer_than_the_budget_stops_the_connector(
        postgres_server, pg_database, broker_process, tmp_path):
    dsn = postgres_server.dsn(pg_database)
    _sql(dsn, SETUP)
    bootstrap = broker_process().address
    config = _config(tmp_path, pg_database, bootstrap, _free_port(),
                     ", reconnect_timeout_ms: 2000, reconnect_attempts_max: 100")
    runtime = Runtime(config, postgres_server.port, tmp_path / "connect.log")
    try:
        _wait(lambda: _slot(dsn)[1], "the slot to be active", runtime=runtime)
        _sql(dsn, "INSERT INTO orders VALUES (1, 0)")
        _wait(lambda: _records(bootstrap), "the first record", runtime=runtime)
        postgres_server.stop()
        try:
            code = runtime.wait(timeout_s=30)
        finally:
            postgres_server.start()
    finally:
        if runtime.popen.poll() is None:
            runtime.kill()
    assert code == 3, runtime.stderr()
    stderr = runtime.stderr()
    assert "the replication connection was lost" in stderr, stderr
    assert "could not be re-established" in stderr and "in 2.0 s" in stderr, stderr
    assert len(_records(bootstrap)) == 1
    _assert_slot_not_ahead(dsn, bootstrap)
