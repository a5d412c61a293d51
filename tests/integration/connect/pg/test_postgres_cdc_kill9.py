"""``kill -9`` of ``rivven-connect`` while four writers commit 10,000 changes (issue 23's
test): a real Postgres 15, a broker process, the connector as a process killed with SIGKILL
five times at random moments and once at each named crash point
(``rivven_connect.crash_points``), in a seeded random order, then a last run that drains.
A ``read_committed`` reader then sees every change exactly once, in commit order per key.

Each writer owns the keys ``k % 4 == w`` of a 400-key space, so the commit order of a key's
changes is its writer's order; it commits 1–5 inserts, updates or deletes per transaction,
every insert or update writing the next value of the writer's own sequence. A change is
identified by its op and a sequence number: an insert's or update's new ``seq`` (``after``),
a delete's deleted ``seq`` (``before``: the table is REPLICA IDENTITY FULL; a row version is
deleted at most once). The slot is checked never to be ahead of the stored offset after
every kill. The configuration has no transforms and no routing at the source, so the changes
take the encoded path (``EncodedRecords``): the last run's ``/metrics`` must say so. Every
other run, and the last, gathers polls into transactions (``transaction: {boundary:
interval}``), so the crashes also fall inside gathered transactions and on changes of the
boundary between runs."""

from __future__ import annotations

import collections
import json
import os
import random
import subprocess
import sys
import threading
import time

import psycopg2
import trio

from rivven_connect.crash_points import CRASH_AT_ENV, POINTS
from tests.integration.connect.pg.test_postgres_cdc_guards import _free_port, _metrics
from rivven_connect.driver import read_position
from tests.integration.connect.helpers import read_committed
from tests.integration.connect.pg.test_postgres_cdc_source import (
    ROOT, SOURCE, _assert_slot_not_ahead, _slot, _sql, _wait,
)

WRITERS, CHANGES, KEYS_PER_WRITER = 4, 10_000, 100
TOPIC, PULSE_TOPIC = "cdc.public.items", "cdc.public.pulse"
RANDOM_KILLS = 5
SETUP = """
CREATE TABLE items (id int PRIMARY KEY, writer int NOT NULL, seq bigint NOT NULL);
ALTER TABLE items REPLICA IDENTITY FULL;
CREATE TABLE pulse (id serial PRIMARY KEY);
"""


class Writer(threading.Thread):
    """One writer's share of the changes; ``expected``: (key, op, seq) in commit order."""

    def __init__(self, dsn: str, index: int, changes: int, pause_s: float) -> None:
        super().__init__(name=f"writer-{index}")
        self.dsn, self.index, self.changes, self.pause_s = dsn, index, changes, pause_s
        self.expected: list[tuple[int, str, int]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(100 + self.index)
        rows: dict[int, int] = {}  # key -> the seq of its current version
        seq = self.index * 1_000_000
        try:
            conn = psycopg2.connect(self.dsn)
            try:
                while len(self.expected) < self.changes:
                    made = []
                    with conn.cursor() as cursor:
                        for _ in range(min(rng.randint(1, 5),
                                           self.changes - len(self.expected))):
                            key = self.index + WRITERS * rng.randrange(KEYS_PER_WRITER)
                            if key not in rows:
                                cursor.execute("INSERT INTO items VALUES (%s, %s, %s)",
                                               (key, self.index, seq))
                                made.append((key, "c", seq))
                            elif rng.random() < 0.25:
                                cursor.execute("DELETE FROM items WHERE id = %s", (key,))
                                made.append((key, "d", rows.pop(key)))
                                continue
                            else:
                                cursor.execute("UPDATE items SET seq = %s WHERE id = %s",
                                               (seq, key))
                                made.append((key, "u", seq))
                            rows[key] = seq
                            seq += 1
                    conn.commit()
                    self.expected.extend(made)
                    time.sleep(rng.uniform(0, 2 * self.pause_s))
            finally:
                conn.close()
        except BaseException as error:  # the test reports it
            self.error = error


class Connector:
    """``rivven-connect`` as a process, stderr to a log file (appended to)."""

    def __init__(self, config, port: int, log, crash_at: str | None = None) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PGPORT_TEST": str(port)}
        env.pop(CRASH_AT_ENV, None)
        if crash_at is not None:
            env[CRASH_AT_ENV] = crash_at
        self.log, self.handle = log, log.open("ab")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "rivven_connect", "--config", str(config)], env=env,
            stderr=self.handle)

    def wait(self, timeout_s: float) -> int:
        try:
            return self.popen.wait(timeout=timeout_s)
        finally:
            self.handle.close()

    def kill(self) -> int:
        self.popen.kill()
        return self.wait(30)


def _config(path, database: str, bootstrap: str, http: str = "off",
            boundary: str = "poll") -> None:
    transaction = ("{ boundary: poll }" if boundary == "poll"
                   else "{ boundary: interval, interval_ms: 200, records_max: 2000 }")
    path.write_text(f"""
version: "1.0"
broker: {{ bootstrap: "{bootstrap}" }}
http: {http}
sources:
  {SOURCE}:
    connector: postgres-cdc
    topic: "cdc.{{schema}}.{{table}}"
    config: {{ host: 127.0.0.1, port: "${{PGPORT_TEST}}", database: {database},
              user: postgres, slot_name: rivven_slot, publication_name: rivven_pub,
              tables: [public.items, public.pulse], snapshot: {{ mode: never }},
              status_interval_ms: 1000, batch_size: 500 }}
    routing: {{ topic_defaults: {{ partitions: 4 }} }}
    transaction: {transaction}
""")


def _slot_not_ahead(dsn: str, bootstrap: str) -> None:
    """The slot at or below the stored offset (once there is one)."""
    if trio.run(read_position, bootstrap, SOURCE) is not None:
        _assert_slot_not_ahead(dsn, bootstrap)


def _items(bootstrap: str) -> list:
    return trio.run(read_committed, bootstrap, TOPIC)


def _check(records: list, writers: list[Writer]) -> None:
    """Every change once, per key in its writer's commit order; a tombstone after each
    delete and nowhere else."""
    expected: dict[int, list[tuple[str, int]]] = collections.defaultdict(list)
    for writer in writers:
        for key, op, seq in writer.expected:
            expected[key].append((op, seq))
    seen: dict[int, list[tuple[str, int]]] = collections.defaultdict(list)
    for record in records:  # partition by partition, each in offset order
        key = json.loads(record.key)["id"]
        if record.value is None:
            assert seen[key] and seen[key][-1][0] == "d", (key, seen[key][-3:])
            seen[key].append(("tombstone", seen[key][-1][1]))
            continue
        value = json.loads(record.value)
        image = value["before"] if value["op"] == "d" else value["after"]
        seen[key].append((value["op"], image["seq"]))
    seen = {key: [change for change in changes if change[0] != "tombstone"]
            for key, changes in seen.items()}
    assert sum(map(len, seen.values())) == CHANGES == sum(map(len, expected.values()))
    for key in expected:
        assert seen[key] == expected[key], (key, seen[key][:5], expected[key][:5])


def test_kill_9_at_random_and_at_each_crash_point_while_four_writers_commit(
        postgres_server, pg_database, broker_process, tmp_path):
    dsn = postgres_server.dsn(pg_database)
    _sql(dsn, SETUP)
    bootstrap = broker_process().address
    config, log = tmp_path / "connect.yaml", tmp_path / "connect.log"
    _config(config, pg_database, bootstrap)
    rng = random.Random(23)
    lives: list[str | None] = [None] * RANDOM_KILLS + [f"{point}:{rng.randint(2, 6)}"
                                                       for point in POINTS]
    rng.shuffle(lives)
    writers = [Writer(dsn, index, CHANGES // WRITERS, pause_s=0.02) for index in range(WRITERS)]
    kills, connector = [], None
    try:
        for life, crash_at in enumerate(lives):
            _config(config, pg_database, bootstrap,
                    boundary="interval" if life % 2 else "poll")
            connector = Connector(config, postgres_server.port, log, crash_at)
            if not kills:  # the first run creates the slot: the writers start after it
                _wait(lambda: _slot(dsn)[1], "the slot to be active", timeout_s=30)
                for writer in writers:
                    writer.start()
            if crash_at is None:  # SIGKILL at a random moment of this run
                time.sleep(rng.uniform(0.2, 3.0))
                assert connector.popen.poll() is None, log.read_text()
                kills.append(connector.kill())
            else:  # it kills itself at the crash point; keep changes coming meanwhile
                while connector.popen.poll() is None:
                    if not any(writer.is_alive() for writer in writers):
                        _sql(dsn, "INSERT INTO pulse DEFAULT VALUES")
                    time.sleep(0.1)
                kills.append(connector.wait(30))
                assert f"crash point {crash_at} reached" in log.read_text(), log.read_text()
            _slot_not_ahead(dsn, bootstrap)
            assert all(writer.error is None for writer in writers)
        http_port = _free_port()  # the last run drains, and says which path the records took
        _config(config, pg_database, bootstrap, http=f'"127.0.0.1:{http_port}"',
                boundary="interval")
        connector = Connector(config, postgres_server.port, log)
        for writer in writers:
            writer.join()
        assert all(writer.error is None for writer in writers), [w.error for w in writers]
        _wait(lambda: len(_items(bootstrap)) >= CHANGES, f"{CHANGES} changes", timeout_s=120)
        time.sleep(1)  # nothing more arrives
        _sql(dsn, "INSERT INTO pulse DEFAULT VALUES")  # at least one change in this run
        label = f'connector="{SOURCE}",path='
        _wait(lambda: _metrics(http_port).get(
            f'rivven_connect_cdc_records_queued_total{{{label}"encoded"}}', 0) > 0,
            "an encoded record", timeout_s=30)
        assert _metrics(http_port)[f'rivven_connect_cdc_records_queued_total{{{label}"record"}}'] == 0
        connector.popen.terminate()
        assert connector.wait(60) == 0, log.read_text()
    finally:
        if connector is not None and connector.popen.poll() is None:
            connector.kill()
        for writer in writers:
            if writer.is_alive():
                writer.join()
    assert kills == [-9] * len(lives)
    _check(_items(bootstrap), writers)
    _assert_slot_not_ahead(dsn, bootstrap)
