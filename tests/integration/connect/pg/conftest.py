"""A real Postgres 15 for the CDC tests: one server per session, a fresh database per test.

- ``postgres_server`` (session): ``initdb`` into a temporary directory (through ``runuser -u
  postgres --`` when the tests run as root, which initdb refuses, after ``chown``), with
  ``wal_level = logical``, replication slots and senders, ``listen_addresses = 127.0.0.1`` on
  a free port and the unix socket in the same directory; ``pg_ctl -w start``; at the end
  ``pg_ctl -m immediate stop``. Missing binaries FAIL the run (never skip): CI must have
  ``postgresql-15``. Returns a ``PostgresServer`` (``.port``, ``.dsn(database)``,
  ``.stop()`` and ``.start()`` for the tests of an outage: a test that stops it starts it
  again in a ``finally``).
- ``pg_database`` (per test): a new database ``t_<n>``; returns its name. Dropped at the
  end (after its replication slots).
"""

from __future__ import annotations

import itertools
import os
import pathlib
import pwd
import shutil
import socket
import subprocess
import tempfile

import attrs
import pytest

PG_BIN = pathlib.Path(os.environ.get("RIVVEN_PG_BIN", "/usr/lib/postgresql/15/bin"))
START_TIMEOUT_S = 60


@attrs.frozen
class PostgresServer:
    port: int
    data_dir: pathlib.Path

    def stop(self) -> None:
        """``pg_ctl -m fast stop``: sessions (walsenders among them) are terminated."""
        _pg_ctl(self.data_dir, "-m", "fast", "stop")

    def start(self) -> None:
        _pg_ctl(self.data_dir, "-l", str(self.data_dir.parent / "log"), "start")

    def dsn(self, database: str = "postgres", **extra: str) -> str:
        parts = {"host": "127.0.0.1", "port": str(self.port), "user": "postgres",
                 "dbname": database, **extra}
        return " ".join(f"{k}={v}" for k, v in parts.items())


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _pg_ctl(data_dir: pathlib.Path, *arguments: str) -> None:
    _run([str(PG_BIN / "pg_ctl"), "-D", str(data_dir), "-w", "-t", str(START_TIMEOUT_S),
          *arguments], as_postgres=os.geteuid() == 0)


def _run(argv: list[str], *, as_postgres: bool) -> None:
    if as_postgres:
        argv = ["runuser", "-u", "postgres", "--", *argv]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=START_TIMEOUT_S)
    if result.returncode != 0:
        pytest.fail(f"{argv} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")


@pytest.fixture(scope="session")
def postgres_server():
    for tool in ("initdb", "pg_ctl"):
        if not (PG_BIN / tool).exists():
            pytest.fail(f"{PG_BIN / tool} is missing: install postgresql-15 (CI must have it)")
    import psycopg2  # noqa: F401  (fail here, clearly, when the connect extra is missing)

    as_postgres = os.geteuid() == 0
    root = pathlib.Path(tempfile.mkdtemp(prefix="rivven-pg-"))
    data_dir = root / "data"
    if as_postgres:
        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
    _run([str(PG_BIN / "initdb"), "-D", str(data_dir), "-A", "trust", "-U", "postgres",
          "--no-sync", "-E", "UTF8", "--locale=C"], as_postgres=as_postgres)
    port = _free_port()
    settings = {
        "wal_level": "logical", "max_wal_senders": "10", "max_replication_slots": "10",
        "listen_addresses": "'127.0.0.1'", "port": str(port),
        "unix_socket_directories": f"'{root}'", "max_slot_wal_keep_size": "'1GB'",
        "fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
        "shared_buffers": "'32MB'", "DateStyle": "'ISO, MDY'", "TimeZone": "'UTC'",
    }
    with open(data_dir / "postgresql.conf", "a") as conf:
        conf.writelines(f"{name} = {value}\n" for name, value in settings.items())
    _run([str(PG_BIN / "pg_ctl"), "-D", str(data_dir), "-l", str(root / "log"), "-w",
          "-t", str(START_TIMEOUT_S), "start"], as_postgres=as_postgres)
    try:
        yield PostgresServer(port, data_dir)
    finally:
        _run([str(PG_BIN / "pg_ctl"), "-D", str(data_dir), "-m", "immediate", "-w", "stop"],
             as_postgres=as_postgres)
        shutil.rmtree(root, ignore_errors=True)


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
