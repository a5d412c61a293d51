"""A throw-away Postgres 15 cluster: the CDC tests' fixture and ``rivven bench cdc`` share it.

Theory of operation
-------------------
``start_postgres()`` runs ``initdb`` into a fresh temporary directory (through ``runuser -u
postgres --`` when this process is root, which initdb refuses, after ``chown`` of the
directory), appends ``CLUSTER_SETTINGS`` (``wal_level = logical``, replication slots and
senders, ``listen_addresses = 127.0.0.1`` on a free port, the unix socket in the same
directory, and — a throw-away cluster — ``fsync``, ``synchronous_commit`` and
``full_page_writes`` off) plus the caller's ``settings``, and ``pg_ctl -w start``\\s it. The
returned ``PostgresCluster`` knows its port and data directory, makes DSNs, reads the
postmaster's PID, ``stop()``\\s it (``pg_ctl -m fast stop``: sessions, walsenders among
them, are terminated) and ``start()``\\s it again on the same port and data (the tests of
an outage), and ``remove()``\\s it (``pg_ctl -m immediate stop``, then removes the
directory). Callers remove it in a ``finally``.

Missing binaries are a ``PostgresError`` naming the package (``postgresql-15``): the tests
turn it into a failure, never a skip. Every step is bounded by ``start_timeout_s``. Blocks.
"""

from __future__ import annotations

import os
import pathlib
import pwd
import shutil
import socket
import subprocess
import tempfile
from typing import Mapping

import attrs

__all__ = ["CLUSTER_SETTINGS", "PG_BIN", "PostgresCluster", "PostgresError", "start_postgres"]

PG_BIN = pathlib.Path(os.environ.get("RIVVEN_PG_BIN", "/usr/lib/postgresql/15/bin"))
start_timeout_s = 60
#: Appended to postgresql.conf (``port`` and the socket directory are added per cluster).
CLUSTER_SETTINGS: Mapping[str, str] = {
    "wal_level": "logical", "max_wal_senders": "10", "max_replication_slots": "10",
    "listen_addresses": "'127.0.0.1'", "max_slot_wal_keep_size": "'1GB'",
    "fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
    "shared_buffers": "'32MB'", "DateStyle": "'ISO, MDY'", "TimeZone": "'UTC'",
}


class PostgresError(RuntimeError):
    """The binaries are missing, or initdb / pg_ctl failed (the message has their output)."""


@attrs.frozen
class PostgresCluster:
    port: int
    data_dir: pathlib.Path
    root: pathlib.Path
    as_postgres: bool

    def dsn(self, database: str = "postgres", **extra: str) -> str:
        parts = {"host": "127.0.0.1", "port": str(self.port), "user": "postgres",
                 "dbname": database, **extra}
        return " ".join(f"{k}={v}" for k, v in parts.items())

    def postmaster_pid(self) -> int:
        """The server's PID (first line of ``postmaster.pid``). Raises ``OSError``."""
        return int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])

    def stop(self) -> None:
        """``pg_ctl -m fast stop``: sessions (walsenders among them) are terminated; the
        data stays for ``start()``. Raises ``PostgresError``."""
        self._pg_ctl("-m", "fast", "stop")

    def start(self) -> None:
        """Start it again after ``stop()`` (same port, same data). Raises
        ``PostgresError``."""
        self._pg_ctl("-l", str(self.root / "log"), "start")

    def _pg_ctl(self, *arguments: str) -> None:
        _run([str(PG_BIN / "pg_ctl"), "-D", str(self.data_dir), "-w", "-t",
              str(start_timeout_s), *arguments], as_postgres=self.as_postgres)

    def remove(self) -> None:
        """``pg_ctl -m immediate stop``, then remove the directory (also when stop failed).
        Raises ``PostgresError``."""
        try:
            _run([str(PG_BIN / "pg_ctl"), "-D", str(self.data_dir), "-m", "immediate", "-w",
                  "stop"], as_postgres=self.as_postgres)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _run(argv: list[str], *, as_postgres: bool) -> None:
    if as_postgres:
        argv = ["runuser", "-u", "postgres", "--", *argv]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=start_timeout_s)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise PostgresError(f"{argv}: {error}") from error
    if result.returncode != 0:
        raise PostgresError(f"{argv} exited {result.returncode}:\n{result.stdout}\n"
                            f"{result.stderr}")


def start_postgres(settings: Mapping[str, str] | None = None,
                   parent: str | None = None) -> PostgresCluster:
    """initdb + start a cluster under a new directory in ``parent`` (default: the temporary
    directory), ``CLUSTER_SETTINGS`` then ``settings`` in its postgresql.conf (later lines
    win). Raises ``PostgresError``; leaves nothing behind when it does."""
    for tool in ("initdb", "pg_ctl"):
        if not (PG_BIN / tool).exists():
            raise PostgresError(f"{PG_BIN / tool} is missing: install postgresql-15")
    as_postgres = os.geteuid() == 0
    root = pathlib.Path(tempfile.mkdtemp(prefix="rivven-pg-", dir=parent))
    data_dir = root / "data"
    started = False
    try:
        if as_postgres:
            user = pwd.getpwnam("postgres")
            os.chown(root, user.pw_uid, user.pw_gid)
        _run([str(PG_BIN / "initdb"), "-D", str(data_dir), "-A", "trust", "-U", "postgres",
              "--no-sync", "-E", "UTF8", "--locale=C"], as_postgres=as_postgres)
        port = _free_port()
        lines = {**CLUSTER_SETTINGS, "port": str(port), "unix_socket_directories": f"'{root}'",
                 **(settings or {})}
        with open(data_dir / "postgresql.conf", "a") as conf:
            conf.writelines(f"{name} = {value}\n" for name, value in lines.items())
        cluster = PostgresCluster(port, data_dir, root, as_postgres)
        try:
            _run([str(PG_BIN / "pg_ctl"), "-D", str(data_dir), "-l", str(root / "log"), "-w",
                  "-t", str(start_timeout_s), "start"], as_postgres=as_postgres)
        except PostgresError:
            if (data_dir / "postmaster.pid").exists():  # started, but too slowly
                try:
                    cluster.remove()
                except PostgresError:
                    pass  # the start's error is the one to report
            raise
        started = True
        return cluster
    finally:
        if not started:
            shutil.rmtree(root, ignore_errors=True)
