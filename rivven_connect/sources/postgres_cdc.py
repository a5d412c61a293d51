"""``postgres-cdc``: the streaming Postgres CDC source (docs/connect-postgres.md "The source").

Theory of operation
-------------------
The source drives ``pg.slot.ReplicationSlot`` (SQL and the replication stream) and the pure
cores (``pgoutput`` → ``TransactionAssembler`` → ``EnvelopeBuilder``). The batch cycle owns
the exactly-once order; the source only keeps to its part:

- ``resume(position)`` keeps the stored offset (the ``end_lsn`` of the last transaction
  committed to the broker). The first ``poll`` does the I/O: the start checks
  (``ReplicationSlot.prepare``); **the slot's ``confirmed_flush_lsn`` must not be ahead of
  the stored ``end_lsn``**, else ``SourceError`` (the slot ran ahead: changes between were
  confirmed without being delivered); a missing slot is created only when there is no
  stored offset; then ``START_REPLICATION`` at the stored ``end_lsn``;
- ``poll(max_records)`` returns the records of **whole** Postgres transactions: it stops
  reading at the first Commit after ``min(max_records, batch_size)`` records, or as soon as
  whole transactions are queued and nothing more is readable at once (no wait: the batch
  size follows the load, the latency does not grow with ``batch_size``), so a
  transaction is never split across batches; one larger than that is returned whole (up to
  ``changes_per_transaction_max`` changes, ≤ the cycle's 100,000 records; more stops the
  source with ``SourceError``). Transactions with ``end_lsn`` at or below the stored offset
  are dropped by the assembler (the replay filter) and again by the cycle;
- ``side_effect(position)`` runs only after the broker committed the batch whose last
  position it is: it confirms the slot at ``end_lsn - 1`` (``pg.slot`` "Keepalives" says why
  not ``end_lsn``; Postgres resumes at our requested LSN either way). Idempotent;
- positions are JSON (they go into ``__connect_offsets``): ``{"end_lsn": "X/X",
  "commit_lsn": "X/X", "seq": n, "last": bool}``, ordered by ``(end_lsn, seq)`` (keys
  ``(end_lsn, 1, seq)``, after the snapshot rows ``(consistent_lsn, 0, rows)``);
- **heartbeats** (``heartbeat_interval_ms``, default 10 s, 0 = off): when a poll has waited
  that long with nothing to return, the source writes a flushed ``rivven.cdc.heartbeat``
  logical message (content: the slot name) and, when the stream delivers it at LSN ``M``,
  queues a position-only record (``Record.heartbeat``) at ``{"end_lsn": M, "commit_lsn": M,
  "seq": 0, "last": true, "heartbeat": true}`` (key ``(M, 2, 0)``: after a transaction
  ending at ``M``). Every transaction committed before ``M`` was decoded before it, and any
  later one is resent from ``M``, so ``M`` is a safe resume point; the cycle commits it with
  no records and its side effect confirms ``M - 1``, below the marker's ``data_start``, so
  psycopg2 still never forwards the slot past the stored offset. The slot then follows
  unpublished WAL.

Snapshots (``snapshot.mode``: ``never``, ``initial``, ``initial_only``, ``always``,
``when_needed``; ``pg.snapshot.plan_start`` decides from the mode, the stored position and
the slot's state): the slot is (re)created with an exported snapshot, ``SnapshotRun``
reads every table by primary-key keyset chunks under it and ``poll`` returns the rows as
``r`` records whose positions are ``SnapshotPosition`` JSON (``phase: snapshot``); after
the last one (``done``, ``source.snapshot = "last"``) the next poll starts streaming at
the slot's consistent LSN — no gap, no overlap — or, for ``initial_only``, returns
``None``. The side effect of a snapshot position does nothing (the slot already sits at
the consistent LSN). An interrupted snapshot is refused at the next start
(docs/connect-postgres.md "Snapshots" says why).

Metrics (``metrics()``, rendered by ``/metrics``): the slot's retained WAL
(``pg_current_wal_lsn() - restart_lsn``, read on an ordinary connection at most every
``slot_stats_interval_ms``, from the poll loop; a failed read is logged and leaves the last
value), the replication lag (WAL bytes between the end of the last transaction read and the
last one confirmed) and the changes read per table and op (``table`` is one of the
configured tables: a bounded label).

Non-transactional logical messages (our own ``rivven.cdc.resume`` among them) and, in this
build, transactional ones are not emitted; truncates are (``op: t``).
"""

from __future__ import annotations

import collections
import datetime
import functools
import logging
from typing import Any, Callable, Mapping

import trio

from rivven_connect.core.batch_cycle import batch_records_max
from rivven_connect.core.records import Record
from rivven_connect.http_api import Metric
from rivven_connect.pg.envelope import CdcPosition, EnvelopeBuilder, EnvelopeError
from rivven_connect.pg.pgoutput import (
    ColumnValue, LogicalMessage, PgOutputError, Relation, decode_message, format_lsn, parse_lsn,
)
from rivven_connect.pg.slot import (
    HEARTBEAT_MESSAGE_PREFIX, PgConnectConfig, ReplicationSlot, SlotActiveError, SlotError,
    SlotInfo, parse_table_name,
)
from rivven_connect.pg.snapshot import (
    ON_INTERRUPTED, SNAPSHOT_MODES, SnapshotPosition, StartPlan, plan_start, position_phase,
    snapshot_chunk_rows_default, snapshot_chunk_rows_max,
)
from rivven_connect.pg.snapshot_reader import ExportedSnapshot, SnapshotReader
from rivven_connect.pg.transactions import (
    ReplicationStateError, Transaction, TransactionAssembler, TransactionTooLarge,
)

__all__ = ["PostgresCdcSource", "changes_per_transaction_max"]

#: A change makes at most 3 records (a primary-key change: d, tombstone, c), and the cycle
#: takes at most 100,000 records per batch: the largest transaction this build delivers.
changes_per_transaction_max = 33_333
#: How long one wait for the replication socket lasts (psycopg2 sends its status updates
#: from ``read_message``, so it is called at least this often).
read_wait_s = 1.0
#: An active slot at start is waited for this long (a crashed predecessor's walsender may
#: not have noticed yet), trying every ``slot_active_retry_s``.
slot_active_wait_s = 15.0
slot_active_retry_s = 0.5
#: Frames one read takes from the replication connection.
frames_per_read = 1000
#: The slot's retained WAL is read at most this often (one short ordinary connection).
slot_stats_interval_ms = 5_000
#: Heartbeats: the default interval, and the largest one accepted (0 = off).
heartbeat_interval_ms_default = 10_000
heartbeat_interval_ms_max = 3_600_000

_log = logging.getLogger("rivven_connect.postgres_cdc")


def _wall_clock_ms() -> int:
    return int(datetime.datetime.now(datetime.timezone.utc).timestamp() * 1000)


def position_json(position: CdcPosition) -> dict[str, Any]:
    return {"end_lsn": _lsn_text(position.end_lsn), "commit_lsn": _lsn_text(
        position.commit_lsn), "seq": position.seq, "last": position.last}


#: ``format_lsn`` remembered for the last few LSNs: every record of a transaction has the
#: same end and commit LSN.
_lsn_text = functools.lru_cache(maxsize=16)(format_lsn)


def heartbeat_position(lsn: int) -> dict[str, Any]:
    """The position of a heartbeat marker delivered at ``lsn`` (a whole-transaction
    boundary: nothing before it is pending)."""
    text = format_lsn(lsn)
    return {"end_lsn": text, "commit_lsn": text, "seq": 0, "last": True, "heartbeat": True}


class PostgresCdcSource:
    def __init__(self, slot: ReplicationSlot, *, batch_size: int = 500,
                 snapshot_mode: str = "never",
                 snapshot_chunk_rows: int = snapshot_chunk_rows_default,
                 snapshot_on_interrupted: str = "fail",
                 heartbeat_interval_ms: int = heartbeat_interval_ms_default,
                 clock_ms: Callable[[], int] = _wall_clock_ms) -> None:
        assert snapshot_mode in SNAPSHOT_MODES
        assert 0 <= heartbeat_interval_ms <= heartbeat_interval_ms_max
        self.slot = slot
        self.batch_size = batch_size
        self.snapshot_mode = snapshot_mode
        self.snapshot_chunk_rows = snapshot_chunk_rows
        self.snapshot_on_interrupted = snapshot_on_interrupted
        #: The running snapshot (None when none runs); ``finished``: ``initial_only`` is done.
        self.snapshot: SnapshotRun | None = None
        self.finished = False
        self._started = False
        #: Where streaming starts once the start (and the snapshot, if any) is done.
        self.stream_from = 0
        self.clock_ms = clock_ms
        self.stored: Any = None
        self.assembler: TransactionAssembler | None = None
        self.builder: EnvelopeBuilder | None = None
        #: Frames read but not decoded yet; transactions decoded but not returned yet
        #: (their record count: ``_queued``). Kept here, so a cancelled poll loses nothing.
        self._frames: collections.deque[tuple[int, bytes]] = collections.deque()
        self._transactions: collections.deque[list[Record]] = collections.deque()
        self._queued = 0
        self.confirmed_lsn: int | None = None
        #: For ``metrics()``: the slot's retained WAL (None: not read yet) and when it was
        #: read; the end LSN of the last transaction read; changes read by (table, op).
        self.retained_wal_bytes: int | None = None
        self._slot_stats_at_ms: int | None = None
        self.received_end_lsn: int | None = None
        self.events: collections.Counter[tuple[str, str]] = collections.Counter()
        #: Heartbeats: the interval (0 = off), when the next one is due, the server's WAL
        #: insert position after the last one (none is written while it has not moved).
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self._heartbeat_due_ms = 0
        self._heartbeat_wal_at: int | None = None
        self.heartbeats = 0  # delivered heartbeat markers

    @classmethod
    def from_config(cls, raw: Mapping[str, Any], path: str) -> PostgresCdcSource:
        """Checks the ``config`` block (``ConnectConfigError`` naming the option)."""
        from rivven_connect.core.config import ConnectConfigError
        from rivven_connect.sources import Options

        options = Options(raw, path, ("host", "port", "database", "user", "password",
                                      "slot_name", "publication_name", "tables", "snapshot",
                                      "batch_size", "status_interval_ms",
                                      "heartbeat_interval_ms"))
        port = options.int("port", 5432, 1, 65535)
        password = raw.get("password")
        if password is not None and not isinstance(password, str):
            raise ConnectConfigError(f"{path}.password", "must be a string")
        names = {}
        for key in ("slot_name", "publication_name"):
            names[key] = options.string(key)
            if parse_table_name(names[key]) != ("public", names[key]) or (
                    key == "slot_name" and not names[key].islower()):
                raise ConnectConfigError(
                    f"{path}.{key}", f"{names[key]!r} must be an identifier of at most 63 "
                    f"letters, digits and _ (a slot name: lower case)")
        tables = raw.get("tables")
        if not isinstance(tables, list) or not tables:
            raise ConnectConfigError(f"{path}.tables", "is required: a non-empty list of "
                                                        "schema.table names")
        parsed = []
        for index, table in enumerate(tables):
            name = parse_table_name(table) if isinstance(table, str) else None
            if name is None:
                raise ConnectConfigError(f"{path}.tables[{index}]",
                                         f"{table!r} is not schema.table (plain identifiers)")
            if name in parsed:
                raise ConnectConfigError(f"{path}.tables[{index}]", f"{table!r} is listed twice")
            parsed.append(name)
        mode, chunk_rows, on_interrupted = _check_snapshot(raw.get("snapshot"),
                                                           f"{path}.snapshot")
        interval = options.int("status_interval_ms", 10_000, 1000, 60_000)
        heartbeat = options.int("heartbeat_interval_ms", heartbeat_interval_ms_default, 0,
                                heartbeat_interval_ms_max)
        assert port is not None and interval is not None and heartbeat is not None
        config = PgConnectConfig(options.string("host"), port, options.string("database"),
                                 options.string("user"), password)
        slot = ReplicationSlot(config, names["slot_name"], names["publication_name"], parsed,
                               status_interval_s=interval / 1000)
        return cls(slot, batch_size=options.batch_size(), snapshot_mode=mode,
                   snapshot_chunk_rows=chunk_rows, snapshot_on_interrupted=on_interrupted,
                   heartbeat_interval_ms=heartbeat)

    # --- the Source protocol ------------------------------------------------------------------
    def resume(self, position: Any) -> None:
        self.stored = position  # checked in the first poll (resume does no I/O, raises nothing)

    async def poll(self, max_records: int) -> list[Record] | None:
        """The records of whole transactions, at least one transaction (waits for one), or
        a heartbeat (a position-only record) after ``heartbeat_interval_ms`` of nothing.
        Raises ``SourceError``. A checkpoint."""
        from rivven_connect.sources import SourceError

        wanted = min(max_records, self.batch_size)
        try:
            if not self._started:
                self._started = True
                await self._start()
            if self.snapshot is not None:
                records = await self._poll_snapshot(wanted)
                if records:
                    return records  # the handover (if the snapshot ended) waits for the next poll
            if self.finished:
                return None
            if self.assembler is None:
                await self._start_streaming(self.stream_from)
            while True:
                self._feed(wanted)
                if self._queued >= wanted:
                    break
                await self._read_slot_stats()
                # With whole transactions queued, take only what is readable now: the
                # batch goes out at once and what arrives during its commit makes the
                # next one (waiting here for ``wanted`` records cost a low-rate stream
                # up to batch_size / rate seconds of latency).
                frames = await self.slot.read_frames(
                    frames_per_read, 0.0 if self._queued else read_wait_s)
                if not frames and self._queued:
                    break
                if not frames:
                    await self._maybe_heartbeat()
                self._frames.extend(frames)
        except (SlotError, PgOutputError, ReplicationStateError, TransactionTooLarge,
                EnvelopeError) as error:
            raise SourceError(f"postgres-cdc {self.slot.slot_name}: {error}") from error
        self._heartbeat_due_ms = self.clock_ms() + self.heartbeat_interval_ms
        return self._take(wanted)

    async def _maybe_heartbeat(self) -> None:
        """Write the heartbeat marker if one is due (it comes back through the stream)."""
        now_ms = self.clock_ms()
        if self.heartbeat_interval_ms == 0 or now_ms < self._heartbeat_due_ms:
            return
        self._heartbeat_due_ms = now_ms + self.heartbeat_interval_ms
        wal_at = await trio.to_thread.run_sync(
            lambda: self.slot.emit_heartbeat(self._heartbeat_wal_at))
        if wal_at is not None:
            self._heartbeat_wal_at = wal_at

    def _feed(self, wanted: int) -> None:
        """Decode read frames until ``wanted`` records of whole transactions are queued
        (the rest of the frames wait; a half-read transaction waits in the assembler)."""
        assembler, builder = self.assembler, self.builder
        assert assembler is not None and builder is not None
        while self._frames and self._queued < wanted:
            lsn, payload = self._frames.popleft()
            result = assembler.feed(decode_message(payload), lsn)
            if isinstance(result, Transaction):
                records = builder.records(result, self.clock_ms(), position_json)
                self.received_end_lsn = result.end_lsn
                self._count(records)
                if records:
                    self._transactions.append(records)
                    self._queued += len(records)
            elif isinstance(result, LogicalMessage) and self._is_our_heartbeat(result):
                # Everything before it is queued: its position follows them (key (M, 2, 0)).
                position = heartbeat_position(lsn or result.lsn)
                self._transactions.append([Record.heartbeat(position)])
                self._queued += 1
                self.heartbeats += 1
            else:  # other non-transactional messages (our resume marker among them): dropped
                assert result is None or isinstance(result, LogicalMessage)

    def _is_our_heartbeat(self, message: LogicalMessage) -> bool:
        return (message.prefix == HEARTBEAT_MESSAGE_PREFIX and not message.transactional
                and message.content == self.slot.slot_name.encode())

    def _take(self, wanted: int) -> list[Record]:
        """Whole queued transactions: at least one, then more while under ``wanted`` and
        the cycle's ``batch_records_max``."""
        out: list[Record] = []
        while self._transactions and (not out or (
                len(out) < wanted
                and len(out) + len(self._transactions[0]) <= batch_records_max)):
            out.extend(self._transactions.popleft())
        self._queued -= len(out)
        assert out and len(out) <= batch_records_max
        return out

    async def _start(self) -> None:
        from rivven_connect.sources import SourceError

        name = self.slot.slot_name
        if self.stored is not None:
            try:
                self.position_key(self.stored)
                if position_phase(self.stored) == "snapshot":
                    SnapshotPosition.from_json(self.stored)  # every field, checked
                assert position_phase(self.stored) == "snapshot" or self.stored["last"] is True
            except (KeyError, TypeError, ValueError, AssertionError, IndexError):
                raise SourceError(f"postgres-cdc {name}: the stored offset {self.stored!r} is "
                                  f"not a postgres-cdc position at the end of a transaction "
                                  f"or a snapshot row") from None
        info = await self._prepare()
        try:
            plan = plan_start(self.snapshot_mode, self.stored, info.state,
                              self.snapshot_on_interrupted)
        except ValueError as error:
            raise SourceError(f"postgres-cdc {name}: {error}") from None
        if plan.action == "refuse":
            raise SourceError(f"postgres-cdc {name}: {plan.reason}")
        if plan.action == "stop":
            self.finished = True
            return
        self.builder = EnvelopeBuilder(db=self.slot.config.database, key_columns=info.key_columns,
                                       emit_messages=False)
        if plan.action == "snapshot":
            await self._begin_snapshot(plan, info)
            return
        assert plan.action == "stream", plan
        confirmed = info.confirmed_flush_lsn
        if plan.create_slot:
            confirmed = await trio.to_thread.run_sync(self.slot.create)
        stored_end = plan.stream_from if self.stored is not None else None
        if stored_end is not None and confirmed is not None and confirmed > stored_end:
            raise SourceError(
                f"postgres-cdc {name}: the slot ran ahead: its "
                f"confirmed_flush_lsn {format_lsn(confirmed)} is past the stored offset "
                f"end_lsn {format_lsn(stored_end)}, so changes in between were confirmed "
                f"without being delivered (pg_replication_slot_advance by hand, or the slot "
                f"was recreated); refusing to start — check what is missing, then delete "
                f"the source's offset (or recreate the slot) to start over")
        self.stream_from = stored_end or 0

    async def _prepare(self) -> SlotInfo:
        info = None
        with trio.move_on_after(slot_active_wait_s):
            while info is None:
                try:
                    info = await trio.to_thread.run_sync(self.slot.prepare)
                except SlotActiveError:
                    await trio.sleep(slot_active_retry_s)
        if info is None:  # still active: another consumer, really
            info = await trio.to_thread.run_sync(self.slot.prepare)
        return info

    async def _start_streaming(self, start_lsn: int) -> None:
        self._heartbeat_due_ms = self.clock_ms() + self.heartbeat_interval_ms
        self.assembler = TransactionAssembler(resume_end_lsn=start_lsn,
                                              changes_max=changes_per_transaction_max)
        await trio.to_thread.run_sync(lambda: self.slot.start(start_lsn))

    async def _begin_snapshot(self, plan: StartPlan, info: SlotInfo) -> None:
        from rivven_connect.sources import SourceError

        for (schema, table), key in info.key_columns.items():
            if not key:  # checked before the slot is touched
                raise SourceError(f"postgres-cdc {self.slot.slot_name}: table {schema}.{table} "
                                  f"has no primary key: a snapshot reads by primary key "
                                  f"(give it one, or use snapshot mode never)")
        if plan.drop_slot:
            await trio.to_thread.run_sync(self.slot.drop)
        run = SnapshotRun(self.slot, info.key_columns, temporary=plan.temporary,
                          stop_after=plan.stop_after)
        self.snapshot = run  # closed by close() if what follows fails
        await trio.to_thread.run_sync(run.open)

    async def _poll_snapshot(self, wanted: int) -> list[Record]:
        """The next rows of the snapshot as ``r`` records; at its end, the handover:
        streaming from the consistent LSN (or, for ``initial_only``, the end)."""
        run = self.snapshot
        assert run is not None and self.builder is not None
        rows = await trio.to_thread.run_sync(
            lambda: run.next_rows(wanted, self.snapshot_chunk_rows))
        now_ms = self.clock_ms()
        records = [self.builder.snapshot_record(
            relation, row, run.consistent_lsn, position.rows - 1,
            "last" if position.done else "true", position.to_json(), now_ms)
            for relation, row, position in rows]
        self._count(records)
        if run.exhausted:
            self.snapshot = None
            run.close()  # every row is read: the exported snapshot may go
            self.finished = run.stop_after
            self.stream_from = run.consistent_lsn
        return records

    async def side_effect(self, position: Any) -> None:
        """Confirm the slot for the committed ``position`` (the end of a transaction).
        Raises ``SourceError`` (the cycle retries). A checkpoint."""
        from rivven_connect.sources import SourceError

        await trio.lowlevel.checkpoint()
        if position_phase(position) == "snapshot":
            return  # nothing to confirm: the slot stays at the consistent LSN until streaming
        end_lsn = self.position_key(position)[0]
        assert position["last"], position  # the cycle commits whole transactions only
        if not self.slot.started:
            return  # replays only, before the stream started: nothing to confirm
        try:
            self.slot.confirm(end_lsn - 1)
        except SlotError as error:
            raise SourceError(str(error)) from error
        self.confirmed_lsn = end_lsn - 1

    # --- metrics ------------------------------------------------------------------------------
    def _count(self, records: list[Record]) -> None:
        for record in records:
            if record.value is not None and record.table is not None and record.op:
                self.events[(f"{record.schema}.{record.table}", record.op)] += 1

    async def _read_slot_stats(self) -> None:
        """Read the slot's retained WAL if the last read is ``slot_stats_interval_ms``
        old. A failure is logged (the gauge keeps its last value): a metric never stops
        the stream. A checkpoint."""
        now_ms = self.clock_ms()
        if self._slot_stats_at_ms is not None and (
                now_ms - self._slot_stats_at_ms < slot_stats_interval_ms):
            return await trio.lowlevel.checkpoint()
        self._slot_stats_at_ms = now_ms
        try:
            self.retained_wal_bytes = await trio.to_thread.run_sync(
                self.slot.retained_wal_bytes)
        except SlotError as error:
            _log.warning("postgres-cdc %s: reading the slot's retained WAL failed: %s",
                         self.slot.slot_name, error)

    def metrics(self) -> list[Metric]:
        """The CDC gauges and counters (module docstring "Metrics"). Never blocks."""
        out = []
        if self.retained_wal_bytes is not None:
            out.append(Metric("cdc_retained_wal_bytes", "gauge",
                              "WAL Postgres keeps for the slot (pg_current_wal_lsn() - "
                              "restart_lsn), read every few seconds.", self.retained_wal_bytes))
        confirmed_end = None if self.confirmed_lsn is None else self.confirmed_lsn + 1
        lag = 0
        if self.received_end_lsn is not None:
            lag = max(0, self.received_end_lsn - max(confirmed_end or 0, self.stream_from))
        out.append(Metric("cdc_replication_lag_bytes", "gauge",
                          "WAL bytes between the end of the last transaction read and the "
                          "last one confirmed to the slot (committed to the broker).", lag))
        for (table, op), count in sorted(self.events.items()):
            out.append(Metric("cdc_events", "counter",
                              "Changes read from Postgres, by table (one of the configured "
                              "tables) and op (c, u, d, t, r).", count,
                              (("table", table), ("op", op))))
        return out

    def position_key(self, position: Any) -> tuple[int, int, int]:
        """``(lsn, phase, n)``: snapshot rows (phase 0) by count under their consistent
        LSN, streamed records (phase 1) by ``(end_lsn, seq)``, a heartbeat (phase 2) after
        them at its LSN. Raises ``ValueError``, ``KeyError``, ``TypeError`` for what is not
        a position. (Only the fields of the key are read: the batch cycle keys every record;
        a stored position is checked whole at start.)"""
        if position_phase(position) == "snapshot":
            try:
                return parse_lsn(position["consistent_lsn"]), 0, int(position["rows"])
            except (KeyError, TypeError) as error:  # as SnapshotPosition.from_json says it
                raise ValueError(f"not a snapshot position: {position!r}") from error
        phase = 2 if position.get("heartbeat") is True else 1  # after a transaction ending there
        return parse_lsn(position["end_lsn"]), phase, int(position["seq"])

    def close(self) -> None:
        if self.snapshot is not None:
            self.snapshot.close()
            self.snapshot = None
        self.slot.close()


def _check_snapshot(snapshot: Any, path: str) -> tuple[str, int, str]:
    from rivven_connect.core.config import ConnectConfigError
    from rivven_connect.sources import Options

    if not isinstance(snapshot, dict) or "mode" not in snapshot:
        raise ConnectConfigError(path, f"is required: {{ mode: M }} with M one of "
                                       f"{', '.join(SNAPSHOT_MODES)}")
    options = Options(snapshot, path, ("mode", "chunk_size", "on_interrupted"))
    mode = snapshot["mode"]
    if mode not in SNAPSHOT_MODES:
        raise ConnectConfigError(f"{path}.mode", f"{mode!r} is not one of "
                                                 f"{', '.join(SNAPSHOT_MODES)}")
    chunk_rows = options.int("chunk_size", snapshot_chunk_rows_default, 1,
                             snapshot_chunk_rows_max)
    assert chunk_rows is not None
    on_interrupted = snapshot.get("on_interrupted", "fail")
    if on_interrupted not in ON_INTERRUPTED:
        raise ConnectConfigError(f"{path}.on_interrupted", f"{on_interrupted!r} is not one "
                                                           f"of {', '.join(ON_INTERRUPTED)}")
    return mode, chunk_rows, on_interrupted


class SnapshotRun:
    """One snapshot in progress (blocking methods: run them in a worker thread): the
    exporting slot creation, the reader, and the keyset walk over the tables with one row
    of look-ahead, so the snapshot's last row is known when it is emitted."""

    def __init__(self, slot: ReplicationSlot,
                 key_columns: Mapping[tuple[str, str], tuple[str, ...]], *, temporary: bool,
                 stop_after: bool) -> None:
        self.slot, self.key_columns = slot, key_columns
        self.stop_after = stop_after
        self.export = ExportedSnapshot(slot.config, slot.slot_name, temporary=temporary)
        self.reader = SnapshotReader(slot.config)
        self.consistent_lsn = 0
        self.relations: list[Relation] = []
        self.table_names: list[str] = []         # per table: "schema.table"
        self.key_indexes: list[tuple[int, ...]] = []  # per table: its key columns' indexes
        self.table_index = 0            # the table being read
        self.read_after: tuple[str, ...] | None = None  # its last key read
        self.rows = 0                   # rows handed out
        self.ahead: collections.deque[tuple[int, tuple[str | None, ...]]] = collections.deque()
        self.exhausted = False          # every row handed out

    def open(self) -> None:
        self.consistent_lsn, name = self.export.create()
        self.reader.open(name)
        self.relations = [self.reader.describe(table, self.key_columns[table])
                          for table in self.slot.tables]
        self.table_names = [f"{r.schema}.{r.name}" for r in self.relations]
        self.key_indexes = [_key_indexes(r, self.key_columns[(r.schema, r.name)])
                            for r in self.relations]

    def next_rows(self, wanted: int, chunk_rows: int
                  ) -> list[tuple[Relation, tuple[ColumnValue, ...], SnapshotPosition]]:
        """Up to ``wanted`` rows with their positions (the last one ``done``)."""
        while len(self.ahead) <= wanted and self.table_index < len(self.relations):
            relation = self.relations[self.table_index]
            key = self.key_columns[(relation.schema, relation.name)]
            rows = self.reader.read_chunk(relation, key, self.read_after, chunk_rows)
            self.ahead.extend((self.table_index, row) for row in rows)
            if len(rows) < chunk_rows:
                self.table_index, self.read_after = self.table_index + 1, None
            else:
                self.read_after = _key_text(relation, key, rows[-1])
        out = []
        null = ColumnValue("n")
        while self.ahead and len(out) < wanted:
            index, row = self.ahead.popleft()
            relation = self.relations[index]
            self.rows += 1
            done = not self.ahead and self.table_index == len(self.relations)
            position = SnapshotPosition(self.consistent_lsn, index, self.table_names[index],
                                        tuple(row[at] for at in self.key_indexes[index]),
                                        self.rows, done)
            out.append((relation, tuple(null if value is None else ColumnValue(
                "t", value.encode()) for value in row), position))
        self.exhausted = not self.ahead and self.table_index == len(self.relations)
        return out

    def close(self) -> None:
        self.reader.close()
        self.export.close()


def _key_indexes(relation: Relation, key: tuple[str, ...]) -> tuple[int, ...]:
    names = [column.name for column in relation.columns]
    return tuple(names.index(column) for column in key)


def _key_text(relation: Relation, key: tuple[str, ...], row: tuple[str | None, ...]
              ) -> tuple[str, ...]:
    names = [column.name for column in relation.columns]
    values = tuple(row[names.index(column)] for column in key)
    assert all(value is not None for value in values)  # primary key columns are NOT NULL
    return values  # type: ignore[return-value]
