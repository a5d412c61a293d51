"""The moving parts of ``rivven bench cdc``: Postgres writers, the reader, the connector process.

Theory of operation
-------------------
- ``Writers``: threads, each with its own psycopg2 connection, inserting rows into one table
  in transactions of ``rows_per_transaction`` rows (one ``INSERT ... SELECT FROM
  generate_series`` each, so Postgres makes the rows and the writer's own CPU stays small).
  Ids come from one shared counter in blocks, so every committed id is known
  (``committed_ranges``). Each row carries ``written_us``: ``clock_timestamp()`` when the
  INSERT ran, just before its ``COMMIT`` (the commit wall time, to within the commit's own
  round trip). Unpaced writers go as fast as they can, but stop while more than
  ``backlog_max`` committed rows are not yet read (a bounded backlog: the measured rate is
  the pipeline's, not Postgres' alone); a paced writer (one thread) commits a transaction
  every ``rows_per_transaction / rate`` seconds. A writer's error is kept and raised by
  ``stop()``. A "noise" writer writes a table no connector publishes.
- ``IdReader``: the ``read_committed`` consumer of one topic (one partition): counts each
  row id it receives (``seen``: a byte per id), records per-record latency from the row's
  ``written_us`` to its receipt when asked, and ``verdict(ranges)`` says which committed ids
  were lost or read more than once.
- ``Connector``: ``python -m rivven_connect`` as a subprocess (this tree first on its
  ``PYTHONPATH``), stderr to a file; ``kill()`` (SIGKILL), ``terminate()`` (SIGTERM, wait),
  reaped with ``os.wait4`` so its peak RSS (``ru_maxrss``) is known after it exits.

Every wait has a deadline. Nothing here is measured in the connector's process.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable

from rivven_broker.bench.stats import Latency
from rivven_broker.client import Consumer, TopicPartition

__all__ = ["Connector", "IdReader", "Writers", "proc_cpu_s", "sql", "tree_cpu_s"]

_TREE = pathlib.Path(__file__).resolve().parents[2]
#: The payload makes a row of about 100 B: 8 B id, 8 B written_us, 84 B text.
PAYLOAD_SQL = "substr(md5(g::text) || md5((g + 1)::text) || md5((g + 2)::text), 1, 84)"
_GATE_SLEEP_S = 0.005
_STOP_TIMEOUT_S = 60.0


def sql(dsn: str, *statements: str, autocommit: bool = False) -> list[tuple[Any, ...]]:
    """Run ``statements`` (one transaction unless ``autocommit``); the last one's rows."""
    import psycopg2

    connection = psycopg2.connect(dsn)
    try:
        connection.autocommit = autocommit
        rows: list[tuple[Any, ...]] = []
        with connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)
                rows = cursor.fetchall() if cursor.description else []
        if not autocommit:
            connection.commit()
        return rows
    finally:
        connection.close()


def proc_cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` (all threads); 0.0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(pid: int) -> float:
    """CPU of ``pid`` and its live children (Postgres: the postmaster and its backends)."""
    total = proc_cpu_s(pid)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


class Writers:
    """Insert rows into ``table`` from ``threads`` connections (module docstring)."""

    def __init__(self, dsn: str, table: str, *, threads: int, rows_per_transaction: int,
                 rate: float | None = None, backlog: Callable[[], int] | None = None,
                 backlog_max: int = 0, first_id: int = 1) -> None:
        assert threads >= 1 and rows_per_transaction >= 1
        assert rate is None or threads == 1, "a paced writer is one thread"
        self.dsn, self.table = dsn, table
        self.rows_per_transaction = rows_per_transaction
        self.rate = rate
        self.backlog, self.backlog_max = backlog, backlog_max
        self._lock = threading.Lock()
        self._next_id = first_id
        self.committed_ranges: list[tuple[int, int]] = []  # (first id, rows)
        self.committed_rows = 0
        self.transactions = 0
        self.behind_s_max = 0.0  # a paced writer: how late its worst transaction started
        self._stop = threading.Event()
        self._errors: list[BaseException] = []
        self._threads = [threading.Thread(target=self._run, daemon=True, name=f"writer-{n}")
                         for n in range(threads)]

    def start(self) -> Writers:
        for thread in self._threads:
            thread.start()
        return self

    def _take(self) -> int:
        with self._lock:
            first = self._next_id
            self._next_id += self.rows_per_transaction
            return first

    def _run(self) -> None:
        import psycopg2

        try:
            connection = psycopg2.connect(self.dsn)
        except psycopg2.Error as error:
            self._errors.append(error)
            return
        statement = (f"INSERT INTO {self.table} (id, written_us, payload) SELECT g, "
                     f"(extract(epoch FROM clock_timestamp()) * 1000000)::bigint, "
                     f"{PAYLOAD_SQL} FROM generate_series(%s, %s) g")
        period_s = self.rows_per_transaction / self.rate if self.rate else 0.0
        due_s = time.monotonic()
        try:
            with connection.cursor() as cursor:
                while not self._stop.is_set():
                    if self.rate:
                        now_s = time.monotonic()
                        if now_s < due_s:
                            self._stop.wait(due_s - now_s)
                            continue
                        self.behind_s_max = max(self.behind_s_max, now_s - due_s)
                        due_s += period_s
                    elif self.backlog is not None and (
                            self.committed_rows - self.backlog() > self.backlog_max):
                        self._stop.wait(_GATE_SLEEP_S)
                        continue
                    first = self._take()
                    cursor.execute(statement, (first, first + self.rows_per_transaction - 1))
                    connection.commit()
                    with self._lock:
                        self.committed_ranges.append((first, self.rows_per_transaction))
                        self.committed_rows += self.rows_per_transaction
                        self.transactions += 1
        except BaseException as error:  # kept, raised by stop()
            self._errors.append(error)
        finally:
            connection.close()

    def stop(self) -> None:
        """Stop every thread (after its transaction in flight); raise a writer's error."""
        self._stop.set()
        for thread in self._threads:
            thread.join(_STOP_TIMEOUT_S)
            if thread.is_alive():
                raise RuntimeError(f"{thread.name} did not stop")
        if self._errors:
            raise RuntimeError(f"a writer failed: {self._errors[0]!r}") from self._errors[0]

    def check(self) -> None:
        """Raise a writer's error now (while the others run)."""
        if self._errors:
            self.stop()


class IdReader:
    """The ``read_committed`` reader of one topic (module docstring)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = Consumer(bootstrap=bootstrap, isolation_level="read_committed",
                                 enable_auto_commit=False, auto_offset_reset="earliest")
        self.partition = TopicPartition(topic, 0)
        self.consumer.assign([self.partition])
        self.consumer.seek(self.partition, 0)
        self.seen = bytearray()
        self.received = 0
        self.value_bytes = 0
        self.latency = Latency()
        self.newest_written_us = 0  # the newest ``written_us`` read (when latencies are read)

    def poll(self, *, count_from_s: float | None = None, latency: bool = False,
             timeout_ms: int = 100) -> int:
        """One poll. Returns the records received; with ``latency``, records the latency
        of those received at or after ``count_from_s`` (wall seconds)."""
        records = self.consumer.poll(timeout_ms=timeout_ms)
        now_s = time.time()
        seen = self.seen
        measure = latency and count_from_s is not None and now_s >= count_from_s
        for record in records:
            row_id = json.loads(record.key)["id"]
            if row_id >= len(seen):
                seen.extend(bytes(row_id + 1 - len(seen) + (1 << 20)))
            if seen[row_id] < 255:
                seen[row_id] += 1
            if latency:
                written_us = json.loads(record.value)["after"]["written_us"]
                self.newest_written_us = max(self.newest_written_us, written_us)
                if measure:
                    self.latency.record_us(now_s * 1e6 - written_us)
            self.value_bytes += len(record.value)
        self.received += len(records)
        return len(records)

    def wait_for(self, rows: int, timeout_s: float, check: Callable[[], None] | None = None,
                 latency: bool = False) -> None:
        """Poll until ``rows`` records were received. Raises ``RuntimeError`` on timeout."""
        deadline = time.monotonic() + timeout_s
        while self.received < rows:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the reader got {self.received} of {rows} rows in "
                                   f"{timeout_s} s")
            if check is not None:
                check()
            self.poll(latency=latency)

    def drain(self, timeout_s: float, latency: bool = False) -> None:
        """Read to the partition's end (the last stable offset: run it once the connector
        stopped). Raises ``RuntimeError`` on timeout."""
        end = self.consumer.end_offsets([self.partition])[self.partition]
        deadline = time.monotonic() + timeout_s
        while self.consumer.position(self.partition) < end:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the reader did not reach offset {end} in {timeout_s} s")
            self.poll(latency=latency)

    def verdict(self, ranges: list[tuple[int, int]]) -> dict[str, int]:
        """``lost`` (committed, never read), ``duplicated`` (read more than once),
        ``unknown`` (read, never committed)."""
        committed = bytearray(len(self.seen))
        lost = 0
        for first, rows in ranges:
            for row_id in range(first, first + rows):
                if row_id >= len(self.seen) or not self.seen[row_id]:
                    lost += 1
                else:
                    committed[row_id] = 1
        duplicated = sum(count - 1 for count in self.seen if count > 1)
        unknown = sum(1 for row_id, count in enumerate(self.seen)
                      if count and not committed[row_id])
        return {"lost": lost, "duplicated": duplicated, "unknown": unknown}

    def close(self) -> None:
        self.consumer.close()


class Connector:
    """``python -m rivven_connect --config CONFIG --bootstrap B`` (module docstring)."""

    def __init__(self, config: pathlib.Path, bootstrap: str, log: pathlib.Path) -> None:
        paths = [str(_TREE)] + [os.path.abspath(p) for p in
                                os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}
        self.log = log
        self.started_s = time.time()
        with log.open("ab") as handle:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "rivven_connect", "--config", str(config),
                 "--bootstrap", bootstrap], env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=handle)
        self.returncode: int | None = None
        self.max_rss_bytes: int | None = None  # known once reaped
        self.cpu_s: float | None = None  # user + system, known once reaped

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.returncode is None and self._reap(block=False) is None

    def peak_rss_bytes_now(self) -> int | None:
        """VmHWM while it runs (the peak so far)."""
        try:
            with open(f"/proc/{self.pid}/status") as status:
                for line in status:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def _reap(self, block: bool) -> int | None:
        if self.returncode is not None:
            return self.returncode
        pid, status, usage = os.wait4(self.pid, 0 if block else os.WNOHANG)
        if pid == 0:
            return None
        self.returncode = os.waitstatus_to_exitcode(status)
        self.popen.returncode = self.returncode  # so Popen never waits for a reaped pid
        self.max_rss_bytes = usage.ru_maxrss * 1024
        self.cpu_s = usage.ru_utime + usage.ru_stime
        return self.returncode

    def wait(self, timeout_s: float) -> int:
        """Wait for it to exit. Raises ``RuntimeError`` (with its log) on timeout."""
        deadline = time.monotonic() + timeout_s
        while self._reap(block=False) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the connector did not exit in {timeout_s} s:\n"
                                   f"{self.log_tail()}")
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode

    def terminate(self) -> int:
        """SIGTERM (its batch in flight commits) and wait; the exit code."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
        return self.wait(_STOP_TIMEOUT_S)

    def kill(self) -> None:
        """SIGKILL and reap (no-op if it exited)."""
        if self.alive():
            self.popen.kill()
        self.wait(_STOP_TIMEOUT_S)

    def log_tail(self) -> str:
        try:
            return self.log.read_bytes()[-3000:].decode(errors="replace")
        except OSError:
            return ""

    def check(self) -> None:
        """Raise ``RuntimeError`` (with its log) if it exited."""
        if not self.alive():
            raise RuntimeError(f"the connector exited {self.returncode}:\n{self.log_tail()}")
