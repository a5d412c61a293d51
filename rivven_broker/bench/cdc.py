"""``rivven bench cdc``: Postgres change data capture, exactly once, against issue 23's goals.

Theory of operation
-------------------
Starts a throw-away Postgres 15 (``bench.postgres``, the tests' cluster: fsync off, but
``synchronous_commit = on``, see ``POSTGRES_SETTINGS``) and a
``rivven-broker`` process (``--sync``, default ``always``), then runs the phases asked for
(``--phases``), each in its own table with its own slot, publication, topic (one partition,
created first) and ``python -m rivven_connect`` process running one ``postgres-cdc``
source (``bench.cdc_load.Connector``), read by a ``read_committed`` consumer in this process
(``IdReader``). Rows are ~100 B: ``id bigint`` primary key, ``written_us`` (the wall clock
just before the row's commit), 84 characters of text. After each phase the writers stop,
the reader reads everything, the connector gets SIGTERM (exit 0 required), the reader reads
to the end, and every committed id must have been read exactly once (``lost``,
``duplicated``, ``unknown``: exit 1 otherwise). Each phase drops its slot.

- ``stream``: ``--writers`` threads insert ``--transaction-rows`` rows per transaction as fast
  as they can (never more than ``--backlog-max`` rows ahead of the reader); events/s is what
  the reader received in a ``--duration`` s window after ``--warmup`` s. Goal >= 25,000.
- ``latency``: one writer at ``--latency-rate`` rows/s (``--latency-transaction-rows`` per
  transaction); per row, receipt by the reader minus ``written_us``, in the window. Goal
  p50 <= 30 ms, p99 <= 150 ms.
- ``snapshot``: for each of ``--snapshot-rows``, a table of that many rows (loaded and
  vacuumed first), the source in ``snapshot.mode: initial_only`` (a temporary slot; the
  process exits when done): rows / (its exit - its start), and its peak RSS (``wait4``).
  Goal >= 100,000 rows/s, RSS independent of the table's size.
- ``restart``: one writer at ``--restart-rate`` rows/s; ``--kills`` times: SIGKILL the
  connector, wait ``--down`` s, start it again; the time from that start until the reader
  has a row written after it. Goal <= 5 s. Exactly once across the kills.
- ``wal``: the connector streams a quiet table while one writer inserts into a table no
  publication holds, as fast as it can (or ``--wal-rows-per-s``), for ``--wal-duration`` s; the slot's retained WAL
  (``pg_current_wal_lsn() - restart_lsn``) is sampled every 0.5 s. Goal max <= 64 MB
  (heartbeats: the source's default interval, 10 s).

CPU seconds per million events of the connector, the broker, Postgres (all its
processes) and this process (the reader and the writers) come from ``/proc``. Nothing is pinned: Postgres, the broker, the connector and
this process share the machine. The layering keeps ``rivven_broker`` from importing
``rivven_connect``: the connector is only ever a subprocess here.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import tempfile
import time
from typing import Any, Callable

from rivven_broker.bench.cdc_load import (
    Connector, IdReader, Writers, proc_cpu_s, sql, tree_cpu_s,
)
from rivven_broker.bench.postgres import PostgresCluster, start_postgres
from rivven_broker.bench.servers import ServerProcess, start_rivven
from rivven_broker.bench.storage import machine_description
from rivven_broker.client import Admin

__all__ = ["GOALS", "HELP", "PHASES", "add_arguments", "main", "run_cdc_bench"]

HELP = ("Postgres CDC (postgres-cdc source, exactly once): streaming events/s, commit-to-"
        "visible latency, snapshot rows/s and RSS, back to streaming after kill -9, "
        "retained WAL while only unpublished tables change")
PHASES = ("stream", "latency", "snapshot", "restart", "wal")
DATABASE = "bench"
MB = 1 << 20
#: Issue 23's goals: (figure, comparison, bound).
GOALS = {
    "stream_events_per_s": (">=", 25_000),
    "latency_p50_ms": ("<=", 30),
    "latency_p99_ms": ("<=", 150),
    "snapshot_rows_per_s": (">=", 100_000),
    "restart_back_s": ("<=", 5),
    "wal_retained_max_mb": ("<=", 64),
}
#: Over the tests' cluster settings: commits wait for their WAL write (the walsender sends
#: only written WAL; with ``synchronous_commit = off`` a commit waits for the WAL writer,
#: up to ``wal_writer_delay`` = 200 ms, and so does its change). fsync stays off.
POSTGRES_SETTINGS = {"synchronous_commit": "on"}
_ACTIVE_TIMEOUT_S = 60.0
_CATCH_UP_TIMEOUT_S = 300.0
_TABLE_SQL = ("CREATE TABLE {table} (id bigint PRIMARY KEY, written_us bigint NOT NULL, "
              "payload text NOT NULL)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    arg = parser.add_argument
    arg("--phases", default=",".join(PHASES), help=f"comma-separated, of {', '.join(PHASES)}")
    arg("--sync", choices=("always", "none"), default="always",
        help="the broker's sync policy (default always, its default)")
    arg("--batch-size", type=int, default=5000,
        help="the source's batch_size: records per broker transaction, rounded up to whole "
             "Postgres transactions (default 5000; max 10000)")
    arg("--duration", type=float, default=20.0, help="stream: seconds measured (default 20)")
    arg("--warmup", type=float, default=3.0,
        help="stream, latency: seconds after the first record before measuring (default 3)")
    arg("--writers", type=int, default=2, help="stream: writer connections (default 2)")
    arg("--transaction-rows", type=int, default=100,
        help="stream: rows per Postgres transaction (default 100)")
    arg("--backlog-max", type=int, default=100_000,
        help="stream: writers pause while this many committed rows are unread (default "
             "100000)")
    arg("--latency-rate", type=float, default=2000.0,
        help="latency: rows/s (default 2000)")
    arg("--latency-transaction-rows", type=int, default=10,
        help="latency: rows per Postgres transaction (default 10: 200 commits/s)")
    arg("--latency-duration", type=float, default=20.0,
        help="latency: seconds measured (default 20)")
    arg("--snapshot-rows", default="100000,1000000",
        help="snapshot: table sizes, comma-separated (default 100000,1000000)")
    arg("--snapshot-chunk", type=int, default=10_000,
        help="snapshot: rows per keyset query, the source's snapshot.chunk_size (default "
             "10000)")
    arg("--restart-rate", type=float, default=1000.0,
        help="restart: rows/s written throughout (default 1000)")
    arg("--kills", type=int, default=3, help="restart: kill -9 / start rounds (default 3)")
    arg("--down", type=float, default=1.0,
        help="restart: seconds between the kill and the start (default 1)")
    arg("--wal-duration", type=float, default=60.0,
        help="wal: seconds of unpublished writes (default 60)")
    arg("--wal-rows-per-s", type=float, default=0.0,
        help="wal: unpublished rows/s, 1000 per transaction (default 0: as fast as one "
             "connection can)")
    arg("--json", action="store_true", help="print one JSON document")


class _Bench:
    """The cluster, the broker and the working directory every phase shares."""

    def __init__(self, postgres: PostgresCluster, broker: ServerProcess,
                 directory: pathlib.Path, args: argparse.Namespace) -> None:
        self.postgres, self.broker, self.directory, self.args = postgres, broker, directory, args
        self.dsn = postgres.dsn(DATABASE)
        self.connectors: list[Connector] = []

    def table(self, name: str) -> None:
        sql(self.dsn, _TABLE_SQL.format(table=name))

    def connector(self, name: str, table: str, *, snapshot: str = "never") -> Connector:
        """Start the runtime with one postgres-cdc source ``name`` over ``table``, into
        topic ``bench.cdc.<name>`` (created first if missing)."""
        topic = f"bench.cdc.{name}"
        with Admin(self.broker.bootstrap) as admin:
            if topic not in [listing.name for listing in admin.list_topics()]:
                admin.create_topic(topic, partitions=1, replication_factor=1)
        config = self.directory / f"{name}.yaml"
        config.write_text(json.dumps({  # JSON is YAML
            "version": "1.0", "http": "off",
            "sources": {name: {
                "connector": "postgres-cdc", "topic": topic,
                "config": {"host": "127.0.0.1", "port": self.postgres.port,
                           "database": DATABASE, "user": "postgres",
                           "slot_name": f"bench_{name}", "publication_name": f"bench_{name}",
                           "tables": [f"public.{table}"], "batch_size": self.args.batch_size,
                           "snapshot": {"mode": snapshot,
                                        "chunk_size": self.args.snapshot_chunk}},
                "routing": {"topic_defaults": {"partitions": 1}},
            }},
        }))
        connector = Connector(config, self.broker.bootstrap, self.directory / f"{name}.log")
        self.connectors.append(connector)
        return connector

    def wait_active(self, connector: Connector, slot: str) -> None:
        """Until the slot is active (the connector streams). Raises ``RuntimeError``."""
        deadline = time.monotonic() + _ACTIVE_TIMEOUT_S
        while not sql(self.dsn, f"SELECT 1 FROM pg_replication_slots WHERE slot_name = "
                                f"'{slot}' AND active"):
            connector.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"slot {slot} not active after {_ACTIVE_TIMEOUT_S} s")
            time.sleep(0.05)

    def drop_slot(self, slot: str) -> None:
        sql(self.dsn, f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                      f"WHERE slot_name = '{slot}' AND NOT active", autocommit=True)

    def finish(self, connector: Connector, reader: IdReader,
               ranges: list[tuple[int, int]], latency: bool = False) -> dict[str, int]:
        """SIGTERM the connector (exit 0 required), read to the end, the verdict."""
        code = connector.terminate()
        if code != 0:
            raise RuntimeError(f"the connector exited {code}:\n{connector.log_tail()}")
        reader.drain(_CATCH_UP_TIMEOUT_S, latency=latency)
        return reader.verdict(ranges)

    def cpu(self, connector: Connector) -> tuple[float, float, float, float]:
        """CPU seconds so far of the connector, the broker, Postgres (every process) and
        this one (the reader and the writers' threads)."""
        return (proc_cpu_s(connector.pid), self.broker.cpu_seconds(),
                tree_cpu_s(self.postgres.postmaster_pid()), time.process_time())


def _per_million(before: tuple[float, ...], after: tuple[float, ...], events: int
                 ) -> dict[str, float]:
    scale = 1e6 / events if events else 0.0
    return {name: round((b - a) * scale, 1) for name, a, b in
            zip(("connector", "broker", "postgres", "bench"), before, after)}


def _first_record(reader: IdReader, checks: list[Callable[[], None]], latency: bool) -> None:
    deadline = time.monotonic() + _ACTIVE_TIMEOUT_S
    while not reader.received:
        for check in checks:
            check()
        if time.monotonic() > deadline:
            raise RuntimeError("no record arrived")
        reader.poll(latency=latency)


def phase_stream(bench: _Bench) -> dict[str, Any]:
    args = bench.args
    bench.table("stream_rows")
    connector = bench.connector("stream", "stream_rows")
    bench.wait_active(connector, "bench_stream")
    reader = IdReader(bench.broker.bootstrap, "bench.cdc.stream")
    writers = Writers(bench.dsn, "stream_rows", threads=args.writers,
                      rows_per_transaction=args.transaction_rows,
                      backlog=lambda: reader.received, backlog_max=args.backlog_max).start()
    try:
        _first_record(reader, [writers.check, connector.check], latency=False)
        start_s = time.time() + args.warmup
        end_s = start_s + args.duration
        while time.time() < start_s:
            reader.poll()
        cpu_before, written_before = bench.cpu(connector), writers.committed_rows
        counted = 0
        while time.time() < end_s:
            counted += reader.poll()
            writers.check()
            connector.check()
        cpu_after, written_after = bench.cpu(connector), writers.committed_rows
        rss = connector.peak_rss_bytes_now()
        writers.stop()
        reader.wait_for(writers.committed_rows, _CATCH_UP_TIMEOUT_S, connector.check)
        verdict = bench.finish(connector, reader, writers.committed_ranges)
    finally:
        writers.stop()
        reader.close()
    bench.drop_slot("bench_stream")
    return {
        "events_per_s": round(counted / args.duration),
        "written_per_s": round((written_after - written_before) / args.duration),
        "events": reader.received, "value_bytes_mean": round(reader.value_bytes /
                                                             max(1, reader.received), 1),
        "cpu_s_per_million": _per_million(cpu_before, cpu_after, counted),
        "connector_peak_rss_mb": round(rss / MB, 1) if rss else None, **verdict,
    }


def phase_latency(bench: _Bench) -> dict[str, Any]:
    args = bench.args
    bench.table("latency_rows")
    connector = bench.connector("latency", "latency_rows")
    bench.wait_active(connector, "bench_latency")
    reader = IdReader(bench.broker.bootstrap, "bench.cdc.latency")
    writer = Writers(bench.dsn, "latency_rows", threads=1,
                     rows_per_transaction=args.latency_transaction_rows,
                     rate=args.latency_rate).start()
    try:
        _first_record(reader, [writer.check, connector.check], latency=True)
        start_s = time.time() + args.warmup
        end_s = start_s + args.latency_duration
        cpu_before, counted_before = None, 0
        while time.time() < end_s:
            if cpu_before is None and time.time() >= start_s:
                cpu_before, counted_before = bench.cpu(connector), reader.received
            reader.poll(count_from_s=start_s, latency=True, timeout_ms=20)
            writer.check()
            connector.check()
        cpu_after, counted = bench.cpu(connector), reader.received - counted_before
        writer.stop()
        reader.wait_for(writer.committed_rows, _CATCH_UP_TIMEOUT_S, connector.check)
        verdict = bench.finish(connector, reader, writer.committed_ranges)
    finally:
        writer.stop()
        reader.close()
    bench.drop_slot("bench_latency")
    return {
        "rate": args.latency_rate, "rows_per_transaction": args.latency_transaction_rows,
        "latency_ms": reader.latency.summary_ms(), "measured": reader.latency.count,
        "writer_late_ms_max": round(writer.behind_s_max * 1000, 1),
        "cpu_s_per_million": _per_million(cpu_before or cpu_after, cpu_after, counted),
        **verdict,
    }


def phase_snapshot(bench: _Bench) -> dict[str, Any]:
    sizes = [int(size) for size in bench.args.snapshot_rows.split(",") if size]
    out = []
    for rows in sizes:
        table = f"snapshot_{rows}"
        bench.table(table)
        for first in range(1, rows + 1, 200_000):
            last = min(rows, first + 199_999)
            sql(bench.dsn, f"INSERT INTO {table} SELECT g, 0, "
                           f"substr(md5(g::text) || md5((g + 1)::text) || md5((g + 2)::text), "
                           f"1, 84) FROM generate_series({first}, {last}) g")
        sql(bench.dsn, f"VACUUM ANALYZE {table}", autocommit=True)
        connector = bench.connector(f"snap{rows}", table, snapshot="initial_only")
        code = connector.wait(_CATCH_UP_TIMEOUT_S * 4)
        elapsed_s = time.time() - connector.started_s
        if code != 0:
            raise RuntimeError(f"the snapshot connector exited {code}:\n{connector.log_tail()}")
        reader = IdReader(bench.broker.bootstrap, f"bench.cdc.snap{rows}")
        try:
            reader.wait_for(rows, _CATCH_UP_TIMEOUT_S)
            reader.drain(_CATCH_UP_TIMEOUT_S)
            verdict = reader.verdict([(1, rows)])
        finally:
            reader.close()
        sql(bench.dsn, f"DROP TABLE {table}")
        out.append({
            "rows": rows, "seconds": round(elapsed_s, 2), "rows_per_s": round(rows / elapsed_s),
            "connector_peak_rss_mb": round((connector.max_rss_bytes or 0) / MB, 1),
            "connector_cpu_s_per_million": round((connector.cpu_s or 0) * 1e6 / rows, 1),
            **verdict,
        })
    return {"sizes": out}


def phase_restart(bench: _Bench) -> dict[str, Any]:
    args = bench.args
    bench.table("restart_rows")
    connector = bench.connector("restart", "restart_rows")
    bench.wait_active(connector, "bench_restart")
    reader = IdReader(bench.broker.bootstrap, "bench.cdc.restart")
    writer = Writers(bench.dsn, "restart_rows", threads=1, rows_per_transaction=10,
                     rate=args.restart_rate).start()
    rounds = []
    try:
        _first_record(reader, [writer.check, connector.check], latency=True)
        for _ in range(args.kills):
            _read_for(reader, 2.0, [writer.check, connector.check])
            connector.kill()
            _read_for(reader, args.down, [writer.check])
            connector = bench.connector("restart", "restart_rows")
            started_us = connector.started_s * 1e6
            received = reader.received
            first_any_s = None
            deadline = time.monotonic() + _CATCH_UP_TIMEOUT_S
            while reader.newest_written_us <= started_us:
                if time.monotonic() > deadline:
                    raise RuntimeError("no new change after the restart")
                writer.check()
                connector.check()
                reader.poll(latency=True, timeout_ms=10)
                if first_any_s is None and reader.received > received:
                    first_any_s = time.time() - connector.started_s
            rounds.append({"back_s": round(time.time() - connector.started_s, 3),
                           "first_record_s": round(first_any_s or 0.0, 3)})
        writer.stop()
        reader.wait_for(writer.committed_rows, _CATCH_UP_TIMEOUT_S, connector.check,
                        latency=True)
        verdict = bench.finish(connector, reader, writer.committed_ranges, latency=True)
    finally:
        writer.stop()
        reader.close()
    bench.drop_slot("bench_restart")
    return {"rounds": rounds, "back_s_max": max((r["back_s"] for r in rounds), default=None),
            "rate": args.restart_rate, **verdict}


def _read_for(reader: IdReader, seconds: float, checks: list[Callable[[], None]]) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for check in checks:
            check()
        reader.poll(latency=True, timeout_ms=20)


def phase_wal(bench: _Bench) -> dict[str, Any]:
    args = bench.args
    bench.table("quiet_rows")
    bench.table("noise_rows")
    connector = bench.connector("wal", "quiet_rows")
    bench.wait_active(connector, "bench_wal")
    # The WAL position; the slot's retained WAL (restart_lsn) and how far its confirmed
    # position trails (confirmed_flush_lsn: the heartbeats' side effect).
    query = ("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, pg_current_wal_lsn() - "
             "restart_lsn, pg_current_wal_lsn() - confirmed_flush_lsn, wal_status "
             "FROM pg_replication_slots WHERE slot_name = 'bench_wal'")
    [(start_lsn, _, _, _)] = sql(bench.dsn, query)
    writer = Writers(bench.dsn, "noise_rows", threads=1, rows_per_transaction=1000,
                     rate=args.wal_rows_per_s or None).start()
    retained, unconfirmed, statuses, error = [], [], set(), None
    began = time.monotonic()
    try:
        while time.monotonic() < began + args.wal_duration:
            writer.check()
            [(wal_lsn, kept, behind, status)] = sql(bench.dsn, query)
            if kept is not None:
                retained.append(int(kept))
                unconfirmed.append(int(behind))
            statuses.add(status)
            if not connector.alive():  # e.g. the slot invalidated (max_slot_wal_keep_size)
                error = f"the connector exited {connector.returncode}: " + (
                    connector.log_tail().strip().splitlines() or [""])[-1]
                break
            time.sleep(0.5)
        seconds = time.monotonic() - began
        writer.stop()
        if error is None and connector.terminate() != 0:
            error = f"the connector exited {connector.returncode}: {connector.log_tail()}"
    finally:
        writer.stop()
    bench.drop_slot("bench_wal")
    written = int(wal_lsn - start_lsn)
    result = {"seconds": round(seconds, 1), "wal_written_mb": round(written / MB, 1),
              "wal_mb_per_s": round(written / MB / seconds, 1),
              "retained_max_mb": round(max(retained, default=0) / MB, 1),
              "retained_last_mb": round(retained[-1] / MB, 1) if retained else None,
              "unconfirmed_max_mb": round(max(unconfirmed, default=0) / MB, 1),
              "wal_status": sorted(str(status) for status in statuses),
              "noise_rows": writer.committed_rows,
              "noise_rows_per_s": round(writer.committed_rows / seconds)}
    if error is not None:
        result["error"] = error
    return result


_RUNNERS = {"stream": phase_stream, "latency": phase_latency, "snapshot": phase_snapshot,
            "restart": phase_restart, "wal": phase_wal}


def _commit() -> str:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10, cwd=pathlib.Path(__file__).parent)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10,
                               cwd=pathlib.Path(__file__).parent)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "") or "unknown"


def run_cdc_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Every phase of ``args.phases`` (module docstring). Blocks for minutes."""
    phases = [phase for phase in args.phases.split(",") if phase]
    postgres = start_postgres(POSTGRES_SETTINGS)
    broker = None
    bench = None
    results: dict[str, Any] = {}
    try:
        broker = start_rivven(args.sync, None, None)
        sql(postgres.dsn(), f"CREATE DATABASE {DATABASE}", autocommit=True)
        with tempfile.TemporaryDirectory(prefix="rivven-bench-cdc-") as directory:
            bench = _Bench(postgres, broker, pathlib.Path(directory), args)
            try:
                for phase in phases:
                    began = time.monotonic()
                    try:
                        results[phase] = _RUNNERS[phase](bench)
                    except RuntimeError as error:  # reported; the other phases still run
                        results[phase] = {"error": str(error)[-3000:]}
                    results[phase]["phase_s"] = round(time.monotonic() - began, 1)
            finally:
                for connector in bench.connectors:
                    connector.kill()
    finally:
        if broker is not None:
            broker.stop()
        postgres.remove()
    summary = {"phases": results, "goals": _goals(results), "commit": _commit(),
               "options": {k: v for k, v in vars(args).items() if k != "suite"},
               "machine": machine_description("/tmp")}
    summary["failed"] = [phase for phase, result in results.items()
                         if any(_verdicts(result)) or "error" in result]
    return summary


def _verdicts(result: dict[str, Any]) -> list[int]:
    parts = result.get("sizes", [result])
    return [part.get(name, 0) for part in parts for name in ("lost", "duplicated", "unknown")]


def _goals(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    figures: dict[str, Any] = {}
    results = {phase: result for phase, result in results.items()
               if "error" not in result or phase == "wal"}  # wal: its samples until then
    if "stream" in results:
        figures["stream_events_per_s"] = results["stream"]["events_per_s"]
    if "latency" in results:
        figures["latency_p50_ms"] = results["latency"]["latency_ms"]["p50"]
        figures["latency_p99_ms"] = results["latency"]["latency_ms"]["p99"]
    if "snapshot" in results and results["snapshot"]["sizes"]:
        figures["snapshot_rows_per_s"] = min(s["rows_per_s"] for s in
                                             results["snapshot"]["sizes"])
    if "restart" in results and results["restart"]["back_s_max"] is not None:
        figures["restart_back_s"] = results["restart"]["back_s_max"]
    if "wal" in results:
        figures["wal_retained_max_mb"] = results["wal"]["retained_max_mb"]
    out = {}
    for name, value in figures.items():
        comparison, bound = GOALS[name]
        met = value >= bound if comparison == ">=" else value <= bound
        if name == "wal_retained_max_mb" and "error" in results["wal"]:
            met = False  # the connector stopped (the slot invalidated, say)
        out[name] = {"value": value, "goal": f"{comparison} {bound:,}", "met": met}
    return out


def format_summary(summary: dict[str, Any]) -> str:
    lines = [f"rivven bench cdc at {summary['commit']}, {summary['machine']['date']}, "
             f"broker sync {summary['options']['sync']}, batch_size "
             f"{summary['options']['batch_size']}"]
    phases = {phase: result for phase, result in summary["phases"].items()
              if "error" not in result or phase == "wal"}
    for phase, result in summary["phases"].items():
        if "error" in result:
            lines.append(f"{phase:<9} ERROR {result['error'].strip().splitlines()[-1]}")
    if "stream" in phases:
        s = phases["stream"]
        lines.append(f"stream    {s['events_per_s']:>9,} events/s (written {s['written_per_s']:,}/s)"
                     f"  cpu s/M {s['cpu_s_per_million']}  rss {s['connector_peak_rss_mb']} MB"
                     f"  value {s['value_bytes_mean']} B  {_verdict_text(s)}")
    if "latency" in phases:
        s = phases["latency"]
        latency = s["latency_ms"]
        lines.append(f"latency   p50 {latency['p50']:.1f} p99 {latency['p99']:.1f} p999 "
                     f"{latency['p999']:.1f} max {latency['max']:.1f} ms at {s['rate']:,.0f} "
                     f"rows/s ({s['rows_per_transaction']} per transaction)  "
                     f"{_verdict_text(s)}")
    for size in phases.get("snapshot", {}).get("sizes", []):
        lines.append(f"snapshot  {size['rows']:>9,} rows in {size['seconds']} s: "
                     f"{size['rows_per_s']:,} rows/s  peak rss {size['connector_peak_rss_mb']} "
                     f"MB  connector cpu {size['connector_cpu_s_per_million']} s/M  "
                     f"{_verdict_text(size)}")
    if "restart" in phases:
        s = phases["restart"]
        rounds = ", ".join(f"{r['back_s']} s" for r in s["rounds"])
        lines.append(f"restart   back to streaming after kill -9: {rounds}  {_verdict_text(s)}")
    if "wal" in phases:
        s = phases["wal"]
        lines.append(f"wal       retained max {s['retained_max_mb']} MB (last "
                     f"{s['retained_last_mb']}), unconfirmed max {s['unconfirmed_max_mb']} MB, "
                     f"while {s['wal_written_mb']} MB of unpublished WAL "
                     f"({s['wal_mb_per_s']} MB/s, {s['noise_rows_per_s']:,} rows/s) was "
                     f"written in {s['seconds']} s; wal_status {s['wal_status']}")
    for name, goal in summary["goals"].items():
        lines.append(f"goal  {name:<22} {goal['value']:>10,} {goal['goal']:>10}  "
                     f"{'met' if goal['met'] else 'MISSED'}")
    return "\n".join(lines)


def _verdict_text(result: dict[str, Any]) -> str:
    return (f"lost {result['lost']} dup {result['duplicated']} unknown {result['unknown']}")


def main(args: argparse.Namespace) -> int:
    unknown = [phase for phase in args.phases.split(",") if phase and phase not in PHASES]
    if unknown or not 1 <= args.batch_size <= 10_000 or args.writers < 1 or args.kills < 0:
        raise SystemExit(f"rivven bench cdc: --phases of {', '.join(PHASES)}, --batch-size "
                         f"1..10000, --writers >= 1, --kills >= 0")
    summary = run_cdc_bench(args)
    print(json.dumps(summary, indent=1) if args.json else format_summary(summary))
    return 1 if summary["failed"] else 0
