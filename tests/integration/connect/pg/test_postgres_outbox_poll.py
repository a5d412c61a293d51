"""The polling outbox (``postgres-outbox-poll``) end to end: a real Postgres 15, a broker
process and ``rivven-connect`` processes; topics read ``read_committed``.

Rows of an outbox table (uuid ids, ordered by a ``bigserial``) become events through the
``EventRouter`` transform and admission (allowlist, DLQ), exactly once; delivered rows are
deleted (or marked) only after the broker commit; ``kill -9`` at each crash point — between
the broker commit and the DELETE above all — and a restart still deliver every event exactly
once and leave nothing pending."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

import pytest
import trio

from rivven_connect.core.config import OFFSETS_TOPIC
from rivven_connect.crash_points import CRASH_AT_ENV, POINTS
from tests.integration.connect.helpers import read_committed
from tests.integration.connect.pg.test_postgres_cdc_outbox import _records
from tests.integration.connect.pg.test_postgres_cdc_source import ROOT, Runtime, _sql, _wait

SOURCE = "outbox_poll"
ORDER, CUSTOMER, DLQ = "outbox.event.Order", "outbox.event.Customer", "connect.dlq"
SETUP = """
CREATE TABLE outbox (id uuid PRIMARY KEY, seq bigserial UNIQUE, aggregatetype text NOT NULL,
                     aggregateid text NOT NULL, type text NOT NULL, payload jsonb,
                     published bool NOT NULL DEFAULT false);
"""
BATCH = 20
RUN_TIMEOUT_S = 60


def _write_config(path, database: str, bootstrap: str, mode: str) -> None:
    marking = "processed_column: published" if mode == "mark" else "delete_after_read: true"
    path.write_text(f"""
version: "1.0"
broker: {{ bootstrap: "{bootstrap}" }}
http: off
sources:
  {SOURCE}:
    connector: postgres-outbox-poll
    topic: outbox.unrouted
    config: {{ host: 127.0.0.1, port: "${{PGPORT_TEST}}", database: {database},
              user: postgres, table: public.outbox, id_column: id, order_column: seq,
              {marking}, batch_size: {BATCH}, poll_interval_ms: 100 }}
    transforms:
      - {{ type: EventRouter }}
    routing:
      admission: {{ mode: allowlist, topics: [{ORDER}, {CUSTOMER}], max_destinations: 2 }}
      on_admission_failure: dlq
      dlq_topic: {DLQ}
      topic_defaults: {{ partitions: 1 }}
""")


def _event_id(n: int) -> str:
    return f"00000000-0000-0000-0000-{n:012d}"


def _insert(dsn: str, numbers: range, spam: int | None = None) -> None:
    """One application transaction per ten events (Order and Customer alternating; ``spam``
    gets an aggregate type outside the allowlist)."""
    for start in range(numbers.start, numbers.stop, 10):
        statements = []
        for n in range(start, min(start + 10, numbers.stop)):
            aggregate = "Spam" if n == spam else ("Order", "Customer")[n % 2]
            statements.append(
                f"INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES "
                f"('{_event_id(n)}', '{aggregate}', '{aggregate[0].lower()}-{n % 7}', "
                f"'Happened', '{json.dumps({'n': n, 'amount': '1.50'})}')")
        _sql(dsn, *statements)


def _pending(dsn: str, mode: str) -> int:
    where = " WHERE NOT published" if mode == "mark" else ""
    return _sql(dsn, f"SELECT count(*) FROM outbox{where}")[0][0]


def _delivered(bootstrap: str) -> dict[str, list]:
    return {topic: _records(bootstrap, topic) for topic in (ORDER, CUSTOMER, DLQ)}


def _check_exactly_once(bootstrap: str, total: int, spam: int | None) -> None:
    seen = _delivered(bootstrap)
    numbers = []
    for topic, records in seen.items():
        for record in records:
            headers = dict(record.headers)
            value = json.loads(record.value)
            n = value["n"]
            numbers.append(n)
            assert value == {"n": n, "amount": "1.50"}
            assert headers["id"] == _event_id(n).encode() and headers["type"] == b"Happened"
            aggregate = "Spam" if n == spam else ("Order", "Customer")[n % 2]
            assert record.key == f"{aggregate[0].lower()}-{n % 7}".encode()
            if topic == DLQ:
                assert headers["rivven.dlq.reason"] == b"not_allowed"
                assert headers["rivven.dlq.original_topic"] == b"outbox.event.Spam"
            else:
                assert topic == f"outbox.event.{aggregate}"
    assert sorted(numbers) == list(range(total)), (len(numbers), len(set(numbers)))
    for topic in (ORDER, CUSTOMER):  # per aggregate, in seq (= insert) order
        ns = [json.loads(r.value)["n"] for r in seen[topic]]
        assert ns == sorted(ns)


def _stored(bootstrap: str) -> dict:
    records = [r for r in trio.run(read_committed, bootstrap, OFFSETS_TOPIC)
               if r.key == SOURCE.encode()]
    return json.loads(records[-1].value)["position"]


@pytest.mark.parametrize("mode", ["delete", "mark"])
def test_outbox_rows_become_routed_events_exactly_once_and_leave_after_the_commit(
        postgres_server, pg_database, broker_process, tmp_path, mode):
    dsn = postgres_server.dsn(pg_database)
    _sql(dsn, SETUP)
    _insert(dsn, range(0, 50), spam=17)
    bootstrap = broker_process().address
    config = tmp_path / "connect.yaml"
    _write_config(config, pg_database, bootstrap, mode)
    log = tmp_path / "connect.log"
    runtime = Runtime(config, postgres_server.port, log)
    try:
        _wait(lambda: _pending(dsn, mode) == 0, "the first 50 events", runtime=runtime)
        _insert(dsn, range(50, 80))  # while it runs
        _wait(lambda: _pending(dsn, mode) == 0, "30 more", runtime=runtime)
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        if runtime.popen.poll() is None:
            runtime.kill()
    _check_exactly_once(bootstrap, 80, spam=17)
    rows = _sql(dsn, "SELECT count(*), count(*) FILTER (WHERE published) FROM outbox")[0]
    assert rows == ((80, 80) if mode == "mark" else (0, 0))
    # A restart with nothing pending sends nothing; one more event, once.
    runtime = Runtime(config, postgres_server.port, log)
    try:
        _insert(dsn, range(80, 81))
        _wait(lambda: _pending(dsn, mode) == 0, "the 81st event", runtime=runtime)
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        if runtime.popen.poll() is None:
            runtime.kill()
    _check_exactly_once(bootstrap, 81, spam=17)
    position = _stored(bootstrap)
    assert position["last"] and position["ids"] == [_event_id(80)]


def _crash_run(config, port: int, crash_at: str) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PGPORT_TEST": str(port),
           CRASH_AT_ENV: crash_at}
    run = subprocess.Popen([sys.executable, "-m", "rivven_connect", "--config", str(config)],
                           env=env, stderr=subprocess.PIPE)
    try:
        _, stderr = run.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    return run.returncode, stderr.decode()


@pytest.mark.parametrize("point", POINTS)
def test_kill_9_at_a_crash_point_then_a_restart_delivers_exactly_once(
        postgres_server, pg_database, broker_process, tmp_path, point):
    dsn = postgres_server.dsn(pg_database)
    _sql(dsn, SETUP)
    total = 100  # five batches of 20
    _insert(dsn, range(total))
    bootstrap = broker_process().address
    config = tmp_path / "connect.yaml"
    _write_config(config, pg_database, bootstrap, "delete")
    crash_at = f"{point}:3"
    code, stderr = _crash_run(config, postgres_server.port, crash_at)
    assert code == -9 and f"crash point {crash_at} reached" in stderr, (code, stderr)
    committed = sum(map(len, _delivered(bootstrap).values()))
    if point == "after_commit_before_side_effect":
        # The third batch is committed to the broker but still in the table; the stored
        # position names exactly its rows.
        assert committed == 3 * BATCH
        assert _pending(dsn, "delete") == total - 2 * BATCH
        assert _stored(bootstrap)["ids"] == [_event_id(n) for n in range(40, 60)]
    else:
        assert committed == 2 * BATCH and _pending(dsn, "delete") == total - 2 * BATCH
    runtime = Runtime(config, postgres_server.port, tmp_path / "connect.log")
    try:
        _wait(lambda: _pending(dsn, "delete") == 0, "the rest", runtime=runtime)
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        if runtime.popen.poll() is None:
            runtime.kill()
    _check_exactly_once(bootstrap, total, spam=None)
    if point == "before_commit":  # the killed batch was in the log, aborted by the restart
        raw = sum(len(trio.run(read_committed, bootstrap, t, "read_uncommitted"))
                  for t in (ORDER, CUSTOMER))
        assert raw > total


def _poller_backends(dsn: str, database: str) -> list[int]:
    return [row[0] for row in _sql(dsn, "SELECT pid FROM pg_stat_activity WHERE application_name "
                                        f"= 'rivven-connect' AND datname = '{database}'")]


def test_terminated_backends_and_a_postgres_restart_do_not_stop_it_nor_lose_an_event(
        postgres_server, pg_database, broker_process, tmp_path):
    """The same process throughout: its connection terminated three times while events
    arrive, then Postgres restarted; every event once, in order per aggregate."""
    dsn = postgres_server.dsn(pg_database)
    _sql(dsn, SETUP)
    bootstrap = broker_process().address
    config = tmp_path / "connect.yaml"
    _write_config(config, pg_database, bootstrap, "delete")
    runtime = Runtime(config, postgres_server.port, tmp_path / "connect.log")
    rng = random.Random(3)
    total, outages = 0, 4
    try:
        pids = _wait(lambda: _poller_backends(dsn, pg_database), "the poller's connection",
                     runtime=runtime)
        for outage in range(outages + 1):
            _insert(dsn, range(total, total + 60))
            total += 60
            if outage == outages:  # after the last outage: these need the new connection
                _wait(lambda: _pending(dsn, "delete") == 0, f"events up to {total}",
                      runtime=runtime)
                break
            time.sleep(rng.uniform(0.0, 0.3))  # while it polls and deletes
            if outage < outages - 1:
                for pid in pids:
                    _sql(dsn, f"SELECT pg_terminate_backend({pid})")
            else:
                postgres_server.stop()
                time.sleep(1.0)  # its attempts fail meanwhile
                postgres_server.start()
            # The next outage only once this one was noticed: a new connection.
            pids = _wait(lambda: [p for p in _poller_backends(dsn, pg_database)
                                  if p not in pids], "a new connection", runtime=runtime)
        assert runtime.popen.poll() is None  # never stopped
        assert runtime.stop() == 0, runtime.stderr()
    finally:
        if runtime.popen.poll() is None:
            runtime.kill()
    _check_exactly_once(bootstrap, total, spam=None)
    stderr = runtime.stderr()
    assert stderr.count("the connection was lost") == outages, stderr
    assert stderr.count("reconnected after") == outages, stderr
