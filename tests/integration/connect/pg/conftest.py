"""A real Postgres 15 for the CDC tests: one server per session, a fresh database per test.

- ``postgres_server`` (session): a throw-away cluster from ``rivven_broker.bench.postgres``
  (``initdb`` as the ``postgres`` user when the tests run as root, ``wal_level = logical``,
  loopback on a free port; the bench ``rivven bench cdc`` starts the same one); at the end
  ``remove()`` (``pg_ctl -m immediate stop``, the directory deleted). Missing binaries FAIL
  the run (never skip): CI must have ``postgresql-15``. Returns a ``PostgresServer``
  (``.port``, ``.dsn(database)``, ``.stop()`` and ``.start()`` for the tests of an outage:
  a test that stops it starts it again in a ``finally``).
- ``pg_database`` (per test): a new database ``t_<n>``; returns its name. Dropped at the
  end (after its replication slots).
"""

from __future__ import annotations

import itertools
import os

import pytest

from rivven_broker.bench.postgres import PostgresCluster, PostgresError, start_postgres

PostgresServer = PostgresCluster  # the name the tests know (.port, .dsn(), .stop(), .start())


@pytest.fixture(scope="session")
def postgres_server():
    import psycopg2  # noqa: F401  (fail here, clearly, when the connect extra is missing)

    try:
        cluster = start_postgres()
    except PostgresError as error:  # missing binaries FAIL the run (CI must have them)
        pytest.fail(str(error))
    try:
        yield cluster
    finally:
        try:
            cluster.remove()
        except PostgresError as error:
            pytest.fail(str(error))


_DATABASES = itertools.count()


@pytest.fixture
def pg_database(postgres_server):
    import psycopg2

    name = f"t_{os.getpid()}_{next(_DATABASES)}"
    admin = psycopg2.connect(postgres_server.dsn())
    admin.autocommit = True
    try:
        with admin.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {name}")
    finally:
        admin.close()
    yield name
    admin = psycopg2.connect(postgres_server.dsn())  # a new one: the test may restart it
    admin.autocommit = True
    try:
        with admin.cursor() as cursor:
            cursor.execute("SELECT pg_drop_replication_slot(slot_name) FROM "
                           "pg_replication_slots WHERE database = %s AND NOT active", (name,))
            cursor.execute(f"DROP DATABASE {name} WITH (FORCE)")
    finally:
        admin.close()
