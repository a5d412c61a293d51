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
  not ``end_lsn``; Postgres resumes at our requested LSN either way). Idempotent. A confirm
  that cannot be sent yet (no frame read on the connection yet, or the connection is gone)
  is kept and sent after a later read: the slot only lags, which is always safe;
- positions are JSON (they go into ``__connect_offsets``): ``{"end_lsn": "X/X",
  "commit_lsn": "X/X", "seq": n, "last": bool}``, ordered by ``(end_lsn, seq)`` (keys
  ``(end_lsn, 1, seq)``, after the snapshot rows ``(consistent_lsn, 0, rows)``);
- **heartbeats** (``heartbeat_interval_ms``, default 0.5 s, 0 = off): when a poll has waited
  that long with nothing to return, the source writes a flushed ``rivven.cdc.heartbeat``
  logical message (content: the slot name) and, when the stream delivers it at LSN ``M``,
  queues a position-only record (``Record.heartbeat``) at ``{"end_lsn": M, "commit_lsn": M,
  "seq": 0, "last": true, "heartbeat": true}`` (key ``(M, 2, 0)``: after a transaction
  ending at ``M``). Every transaction committed before ``M`` was decoded before it, and any
  later one is resent from ``M``, so ``M`` is a safe resume point; the cycle commits it with
  no records and its side effect confirms ``M - 1``, below the marker's ``data_start``, so
  psycopg2 still never forwards the slot past the stored offset. The slot then follows
  unpublished WAL, and with a restart point after each marker (``pg.slot``, "Restart
  points") its ``restart_lsn`` does too.

``prepare_poll(max_records)`` (the driver calls it while a batch commits: docs/connect.md
"Preparing the next poll") does the next poll's work ahead: a snapshot's next rows read and
built (kept in ``_prepared``), or the frames readable at once decoded into whole
transactions (the queue ``poll`` takes from); no wait, no reconnect, no chunk read, no
heartbeat; an error is kept for the next poll. The slot is confirmed only by the side
effect, as before.

Reconnects (``ReplicationLink``, docs/connect-postgres.md "Reconnects"): when the
replication connection is lost the source drops the half-received transaction, the relation
cache and the frames not decoded yet (``TransactionAssembler.on_reconnect``), keeps the
whole transactions it queued and returns them first; the next read reconnects with backoff
and streams again from the last committed position. Postgres resends what followed; the
assembler's replay filter drops what was already decoded, and a heartbeat marker seen before
is dropped too, so the stream goes on exactly where it was. A batch polled but not yet
committed is unaffected: the cycle commits it and its side effect confirms it, now or after
the reconnect; if the runtime dies first, the restart resends it from the stored offset,
below which the slot always is.

Snapshots (``snapshot.mode``: ``never``, ``initial``, ``initial_only``, ``always``,
``when_needed``; ``pg.snapshot.plan_start`` decides from the mode, the stored position and
the slot's state): the slot is (re)created with an exported snapshot, ``SnapshotRun``
reads every table by primary-key keyset chunks under it and ``poll`` returns the rows as
``r`` records whose positions are ``SnapshotPosition`` JSON (``phase: snapshot``); after
the last one (``done``, ``source.snapshot = "last"``) the next poll starts streaming at
the slot's consistent LSN — no gap, no overlap — or, for ``initial_only``, returns
``None``. The side effect of a snapshot position does nothing (the slot already sits at
the consistent LSN). An interrupted snapshot is resumed (``on_interrupted: resume``, the
default): streaming from its consistent LSN while the rest of its tables is read by
incremental chunks; or refused, or restarted (docs/connect-postgres.md "Snapshots").

Incremental snapshots (``IncrementalRunner``, docs/connect-postgres.md "Incremental
snapshots"): every decoded transaction goes through the runner, which consumes signal-table
rows and our watermark/signal messages, drops superseded chunk rows and appends a chunk's
rows at its high watermark; the poll loop reads the next chunk as soon as one is due. A
table the publication lacks is added at start, with an ``execute-snapshot`` message in the
same Postgres transaction when a streaming offset is stored. A chunk read that loses its
connection counts as a lost replication connection: the chunk is dropped (its watermarks
match nothing) and read again after the reconnect; a chunk window already open is kept
(the stream continues exactly, see above), so its rows are emitted once, at its high
watermark.

Metrics (``metrics()``, rendered by ``/metrics``): the slot's retained WAL
(``pg_current_wal_lsn() - restart_lsn``, read on an ordinary connection at most every
``slot_stats_interval_ms``, from the poll loop; a failed read is logged and leaves the last
value), the replication lag (WAL bytes between the end of the last transaction read and the
last one confirmed), the changes read per table and op (``table`` is one of the
configured tables: a bounded label), the reconnects and failed attempts
(``ReplicationLink``), and, once streaming, the incremental chunks emitted or read again,
the chunk rows superseded and the signals accepted or refused (``postgres_cdc_metrics``).

The encoded path (docs/connect.md "The encoded path"): once the runtime calls
``use_encoded_records`` (nothing per-record is configured), a transaction that
``IncrementalRunner.take_unchanged`` lets through is queued as ``EnvelopeBuilder.encoded``
blocks — the same records, byte for byte, with no ``Record`` per row; the others (a
snapshot running, the signal table, logical messages) and heartbeats stay ``Record``s.

The ``config`` block is checked by ``postgres_cdc_config.parse_config``.

Non-transactional logical messages (our own ``rivven.cdc.resume`` among them) and, in this
build, transactional ones are not emitted; truncates are (``op: t``).
"""

from __future__ import annotations

import collections
import datetime
import logging
import random
from typing import Any, Callable, Mapping

import outcome
import trio

from rivven_connect.core.batch_cycle import batch_records_max
from rivven_connect.core.records import EncodedRecords, Record
from rivven_connect.http_api import Metric
from rivven_connect.pg.envelope import EnvelopeBuilder, EnvelopeError
from rivven_connect.pg.pgoutput import (
    LogicalMessage, PgOutputError, decode_message, format_lsn, parse_lsn,
)
from rivven_connect.pg.incremental import IncrementalSnapshotError, IncrementalState
from rivven_connect.pg.reconnect import (
    reconnect_attempts_max_default, reconnect_timeout_ms_default,
)
from rivven_connect.pg.slot import (
    HEARTBEAT_MESSAGE_PREFIX, ReplicationSlot, SlotActiveError, SlotConnectionError,
    SlotError, SlotInfo,
)
from rivven_connect.pg.snapshot import (
    SNAPSHOT_MODES, SnapshotPosition, StartPlan, plan_start, position_phase,
    snapshot_chunk_rows_default,
)
from rivven_connect.pg.transactions import (
    ReplicationStateError, Transaction, TransactionAssembler, TransactionTooLarge,
)
from rivven_connect.sources.postgres_cdc_config import (
    heartbeat_interval_ms_default, heartbeat_interval_ms_max, parse_config,
    reconnect_attempts_max_max, reconnect_timeout_ms_max,
)
from rivven_connect.sources.postgres_cdc_incremental import (
    IncrementalRunner, position_json, signal_message,
)
from rivven_connect.sources.postgres_cdc_link import ReplicationLink
from rivven_connect.sources.postgres_cdc_metrics import (
    cdc_metrics, count_encoded_events, count_events,
)
from rivven_connect.sources.postgres_cdc_snapshot import JsonRows, SnapshotRun

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
#: ``prepare_poll`` decodes this many records between checkpoints (the trio thread is the
#: producer's too: its sender answers the commit in flight between the slices).
prepare_slice_records = 256
#: The slot's retained WAL is read at most this often (one short ordinary connection).
slot_stats_interval_ms = 5_000

_log = logging.getLogger("rivven_connect.postgres_cdc")


def _wall_clock_ms() -> int:
    return int(datetime.datetime.now(datetime.timezone.utc).timestamp() * 1000)


def heartbeat_position(lsn: int) -> dict[str, Any]:
    """The position of a heartbeat marker delivered at ``lsn`` (a whole-transaction
    boundary: nothing before it is pending)."""
    text = format_lsn(lsn)
    return {"end_lsn": text, "commit_lsn": text, "seq": 0, "last": True, "heartbeat": True}


class PostgresCdcSource:
    def __init__(self, slot: ReplicationSlot, *, batch_size: int = 500,
                 snapshot_mode: str = "never",
                 snapshot_chunk_rows: int = snapshot_chunk_rows_default,
                 snapshot_on_interrupted: str = "resume",
                 heartbeat_interval_ms: int = heartbeat_interval_ms_default,
                 reconnect_attempts_max: int = reconnect_attempts_max_default,
                 reconnect_timeout_ms: int = reconnect_timeout_ms_default,
                 clock_ms: Callable[[], int] = _wall_clock_ms,
                 jitter: Callable[[], float] | None = None) -> None:
        assert snapshot_mode in SNAPSHOT_MODES
        assert 0 <= heartbeat_interval_ms <= heartbeat_interval_ms_max
        assert 0 <= reconnect_attempts_max <= reconnect_attempts_max_max
        assert 0 < reconnect_timeout_ms <= reconnect_timeout_ms_max
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
        #: Incremental snapshots and signals (made when streaming starts).
        self.incremental: IncrementalRunner | None = None
        self._incremental_state: IncrementalState | None = None
        #: Frames read but not decoded yet; transactions decoded but not returned yet
        #: (their record count: ``_queued``). Kept here, so a cancelled poll loses nothing.
        self._frames: collections.deque[tuple[int, bytes]] = collections.deque()
        self._transactions: collections.deque[tuple[list[Record | EncodedRecords], int]] = \
            collections.deque()  # (a transaction's records or blocks, its record count)
        self._queued = 0
        #: ``prepare_poll``'s work: snapshot records built for the next poll (None: none),
        #: and an error it met, raised by the next poll.
        self._prepared: list[Record | EncodedRecords] | None = None
        self._prepare_error: Exception | None = None
        #: The snapshot chunk being read in a worker thread (``_start_chunk_fetch``): set
        #: when its rows (or error) are in the list.
        self._chunk_fetch: tuple[trio.Event, list[outcome.Outcome]] | None = None
        #: The runtime allows ``EncodedRecords`` (``use_encoded_records``).
        self.encoded = False
        #: For ``metrics()``: the slot's retained WAL (None: not read yet) and when it was
        #: read; the end LSN of the last transaction read; changes read by (table, op).
        self.retained_wal_bytes: int | None = None
        self._slot_stats_at_ms: int | None = None
        self.received_end_lsn: int | None = None
        self.events: collections.Counter[tuple[str, str]] = collections.Counter()
        #: Records queued (heartbeats not counted) by path: ``encoded`` or ``record``.
        self.queued_by_path: collections.Counter[str] = collections.Counter()
        self._key_columns: dict[tuple[str, str], tuple[str, ...]] = {}
        #: Heartbeats: the interval (0 = off), when the next one is due, the server's WAL
        #: insert position after the last one (none is written while it has not moved).
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self._heartbeat_due_ms = 0
        self._heartbeat_wal_at: int | None = None
        self.heartbeats = 0  # delivered heartbeat markers
        self._heartbeat_lsn: int | None = None  # the last one queued (a resent one is dropped)
        #: The replication connection: reads, confirms, reconnects.
        self.link = ReplicationLink(
            slot, attempts_max=reconnect_attempts_max, timeout_ms=reconnect_timeout_ms,
            jitter=jitter if jitter is not None else random.Random().random,
            on_lost=self._on_connection_lost)

    @classmethod
    def from_config(cls, raw: Mapping[str, Any], path: str) -> PostgresCdcSource:
        """Checks the ``config`` block (``ConnectConfigError`` naming the option)."""
        slot, options = parse_config(raw, path)
        return cls(slot, **options)

    # --- the Source protocol ------------------------------------------------------------------
    def use_encoded_records(self) -> None:
        """Nothing per-record is configured: streamed transactions may be queued as
        ``EncodedRecords`` (module docstring). Never blocks."""
        self.encoded = True

    def resume(self, position: Any) -> None:
        self.stored = position  # checked in the first poll (resume does no I/O, raises nothing)

    async def poll(self, max_records: int) -> list[Record | EncodedRecords] | None:
        """The records of whole transactions, at least one transaction (waits for one), or
        a heartbeat (a position-only record) after ``heartbeat_interval_ms`` of nothing.
        Raises ``SourceError``. A checkpoint."""
        from rivven_connect.sources import SourceError

        wanted = min(max_records, self.batch_size)
        try:
            if self._prepare_error is not None:
                error, self._prepare_error = self._prepare_error, None
                raise error
            if not self._started:
                self._started = True
                await self._start()
            if self._prepared is not None:
                records, self._prepared = self._prepared, None
                if records:
                    return records  # built by prepare_poll (its handover is done)
            if self.snapshot is not None:
                records = await self._poll_snapshot(wanted)
                if records:
                    return records  # the handover (if the snapshot ended) waits for the next poll
            if self.finished:
                return None
            if self.assembler is None:
                await self._start_streaming(self.stream_from)
            link = self.link
            while True:
                assert self.incremental is not None
                if not link.lost:
                    await self._read_chunk_if_due()
                self._feed(wanted)
                if self._queued >= wanted:
                    break
                if link.lost:
                    if self._queued:
                        break  # whole transactions first; the next poll reconnects
                    await link.reconnect()
                if self.incremental.core.chunk_due and not self._frames:
                    continue  # the next chunk now, not after a wait for the stream
                await self._read_slot_stats()
                if link.lost:
                    continue  # Postgres is shutting down: the connection was let go
                # With whole transactions queued, take only what is readable now: the
                # batch goes out at once and what arrives during its commit makes the
                # next one (waiting here for ``wanted`` records cost a low-rate stream
                # up to batch_size / rate seconds of latency).
                frames = await link.read_frames(
                    frames_per_read, 0.0 if self._queued else read_wait_s)
                if link.lost:
                    continue
                if not frames and self._queued:
                    break
                if not frames:
                    await self._maybe_heartbeat()
                self._frames.extend(frames)
        except (SlotError, PgOutputError, ReplicationStateError, TransactionTooLarge,
                EnvelopeError, IncrementalSnapshotError) as error:
            raise SourceError(f"postgres-cdc {self.slot.slot_name}: {error}") from error
        self._heartbeat_due_ms = self.clock_ms() + self.heartbeat_interval_ms
        return self._take(wanted)

    async def prepare_poll(self, max_records: int) -> None:
        """Prepare the next poll while the runtime commits the batch before (the driver's
        overlap, docs/connect.md "Preparing the next poll"): a snapshot's next rows are read
        and built (one poll's worth: the chunk reads stay one chunk ahead), a stream's
        frames readable now are read and decoded into whole transactions (up to the batch
        size; no wait, no reconnect, no incremental chunk read, no heartbeat). Nothing is
        returned and nothing committed: the next ``poll`` returns it first. An error is
        kept and raised by that poll. A checkpoint."""
        wanted = min(max_records, self.batch_size)
        try:
            if self._prepare_error is not None or self._prepared is not None or (
                    not self._started or self.finished):
                return await trio.lowlevel.checkpoint()
            await trio.lowlevel.checkpoint()  # the producer's sender first: the commit
            if self.snapshot is not None:
                self._prepared = await self._poll_snapshot(wanted)
                return
            link = self.link
            if self.assembler is None or link.lost:
                return
            while self._queued < wanted:
                if not self._frames:
                    frames = await link.read_frames(frames_per_read, 0.0)
                    if not frames:  # (a lost connection too: the next poll reconnects)
                        break
                    self._frames.extend(frames)
                # In slices, with a checkpoint after each: the commit's requests and
                # answers go on meanwhile (one decode of a whole batch would hold them).
                self._feed(min(wanted, self._queued + prepare_slice_records))
                await trio.lowlevel.checkpoint()
        except (SlotError, PgOutputError, ReplicationStateError, TransactionTooLarge,
                EnvelopeError, IncrementalSnapshotError) as error:
            self._prepare_error = error

    async def poll_ready(self, max_records: int) -> list[Record | EncodedRecords]:
        """What ``poll`` would return now without waiting for the stream (the batch cycle's
        gathering): a snapshot's next rows, or the whole transactions readable now, read as
        ``prepare_poll`` reads them — at most ``min(max_records, batch_size)`` records (a
        transaction that does not fit waits for the next poll); maybe nothing. Raises
        ``SourceError``. A checkpoint."""
        from rivven_connect.sources import SourceError

        wanted = min(max_records, self.batch_size)
        await self.prepare_poll(wanted)
        if self._prepare_error is not None:
            error, self._prepare_error = self._prepare_error, None
            raise SourceError(f"postgres-cdc {self.slot.slot_name}: {error}") from error
        if self._prepared is not None:  # a snapshot's rows (or the commit's preparation)
            prepared = self._prepared
            if sum(record.record_count for record in prepared) > wanted:
                return []  # the next poll takes them
            self._prepared = None
            return prepared
        return self._take(wanted, fitting=True)

    async def _maybe_heartbeat(self) -> None:
        """Write the heartbeat marker if one is due (it comes back through the stream)."""
        now_ms = self.clock_ms()
        if self.heartbeat_interval_ms == 0 or now_ms < self._heartbeat_due_ms:
            return
        self._heartbeat_due_ms = now_ms + self.heartbeat_interval_ms
        try:
            wal_at = await trio.to_thread.run_sync(
                lambda: self.slot.emit_heartbeat(self._heartbeat_wal_at))
        except SlotConnectionError as error:  # the stream's own read will tell if it is gone
            _log.warning("postgres-cdc %s: writing a heartbeat failed: %s",
                         self.slot.slot_name, error)
            self.link.let_go_if_shutting_down(error)
            return
        if wal_at is not None:
            self._heartbeat_wal_at = wal_at

    async def _read_chunk_if_due(self) -> None:
        """The incremental snapshot's next chunk, if one is due; a lost connection is a lost
        replication connection (module docstring, "Incremental snapshots")."""
        assert self.incremental is not None
        try:
            await self.incremental.read_chunk_if_due()
        except SlotConnectionError as error:  # the chunk was dropped: read again later
            self.link.connection_lost(error)

    def _on_connection_lost(self) -> None:
        """Drop what Postgres resends after a reconnect: the half-received transaction, the
        relation cache, the frames not decoded yet; and the chunk reader's connection. The
        whole transactions queued and an open chunk window stay."""
        assert self.assembler is not None and self.incremental is not None
        self.assembler.on_reconnect()
        self._frames.clear()
        self.incremental.on_connection_lost()

    def _feed(self, wanted: int) -> None:
        """Decode read frames until ``wanted`` records of whole transactions are queued
        (the rest of the frames wait; a half-read transaction waits in the assembler)."""
        assembler, builder, incremental = self.assembler, self.builder, self.incremental
        assert assembler is not None and builder is not None and incremental is not None
        while self._frames and self._queued < wanted:
            lsn, payload = self._frames.popleft()
            result = assembler.feed(decode_message(payload), lsn)
            if isinstance(result, Transaction):
                self.received_end_lsn = result.end_lsn
                if self.encoded and incremental.take_unchanged(result):
                    blocks = builder.encoded(result, self.clock_ms(), position_json)
                    count_encoded_events(self.events, blocks)
                    count = sum(block.record_count for block in blocks)
                    if count:
                        self._transactions.append((blocks, count))  # type: ignore[arg-type]
                        self._queued += count
                        self.queued_by_path["encoded"] += count
                    continue
                records = incremental.process(
                    result, builder.records(result, self.clock_ms(), position_json))
                count_events(self.events, records)
                if records:
                    self._transactions.append((records, len(records)))  # type: ignore
                    self._queued += len(records)
                    self.queued_by_path["record"] += sum(
                        1 for record in records if not record.position_only)
            elif isinstance(result, LogicalMessage) and self._is_our_heartbeat(result):
                # Everything before it is queued: its position follows them (key (M, 2, 0)).
                marker_lsn = lsn or result.lsn
                if self._heartbeat_lsn is not None and marker_lsn <= self._heartbeat_lsn:
                    continue  # resent after a reconnect: queued already
                self._heartbeat_lsn = marker_lsn
                position = heartbeat_position(marker_lsn)
                if incremental.core.state is not None:
                    position["incremental"] = incremental.state_json()
                self._transactions.append(([Record.heartbeat(position)], 1))
                self._queued += 1
                self.heartbeats += 1
            else:  # other non-transactional messages (our resume marker among them): dropped
                assert result is None or isinstance(result, LogicalMessage)

    def _is_our_heartbeat(self, message: LogicalMessage) -> bool:
        return (message.prefix == HEARTBEAT_MESSAGE_PREFIX and not message.transactional
                and message.content == self.slot.slot_name.encode())

    def _take(self, wanted: int, *, fitting: bool = False) -> list[Record | EncodedRecords]:
        """Whole queued transactions: at least one, then more while under ``wanted`` and
        the cycle's ``batch_records_max`` records; or, ``fitting`` (``poll_ready``), only
        those that fit in ``wanted`` together (maybe none)."""
        out: list[Record | EncodedRecords] = []
        taken = 0
        transactions = self._transactions
        while transactions and (
                taken + transactions[0][1] <= wanted if fitting else not out or (
                    taken < wanted and taken + transactions[0][1] <= batch_records_max)):
            items, count = transactions.popleft()
            out.extend(items)
            taken += count
        self._queued -= taken
        assert (out or fitting) and taken <= batch_records_max
        return out

    async def _start(self) -> None:
        from rivven_connect.sources import SourceError

        name = self.slot.slot_name
        if self.stored is not None:
            try:
                self.position_key(self.stored)
                if position_phase(self.stored) == "snapshot":
                    SnapshotPosition.from_json(self.stored)  # every field, checked
                else:
                    assert self.stored["last"] is True
                    if "incremental" in self.stored:
                        self._incremental_state = IncrementalState.from_json(
                            self.stored["incremental"])
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
        self._key_columns = info.key_columns
        if plan.action == "snapshot":
            if info.unpublished:  # before the slot: the snapshot reads them
                await trio.to_thread.run_sync(
                    lambda: self.slot.add_to_publication(info.unpublished, None))
            await self._begin_snapshot(plan, info)
            return
        if plan.action == "resume":
            self._incremental_state = self._resume_state()
        assert plan.action in ("stream", "resume"), plan
        if info.unpublished:
            await self._publish(info.unpublished)
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

    def _resume_state(self) -> IncrementalState:
        """The rest of an interrupted snapshot, as an incremental snapshot's state."""
        from rivven_connect.sources import SourceError

        position = SnapshotPosition.from_json(self.stored)
        tables = [f"{schema}.{name}" for schema, name in self.slot.tables]
        if tables[position.table_index:position.table_index + 1] != [position.table]:
            raise SourceError(
                f"postgres-cdc {self.slot.slot_name}: the interrupted snapshot was reading "
                f"{position.table} as table {position.table_index} of the configured tables, "
                f"which are now {tables}: put them back in that order to resume, or set "
                f"snapshot.on_interrupted: restart")
        return IncrementalState(tuple(tables[position.table_index:]), position.last_key,
                                self.snapshot_chunk_rows)

    async def _publish(self, tables: tuple[tuple[str, str], ...]) -> None:
        """Add ``tables`` to the publication; while streaming on from a stored offset (and
        the mode takes snapshots), with an ``execute-snapshot`` signal for the configured
        ones in the same transaction (docs/connect-postgres.md "Tables added later")."""
        new = [f"{schema}.{name}" for schema, name in tables if (schema, name) in
               self.slot.tables]
        signal = None
        if new and self.stored is not None and self.snapshot_mode != "never":
            signal = signal_message(self.slot.slot_name, "execute-snapshot",
                                    {"data-collections": new})
        _log.info("postgres-cdc %s: adding %s to publication %s%s", self.slot.slot_name,
                  [f"{schema}.{name}" for schema, name in tables], self.slot.publication_name,
                  " with an incremental snapshot of them" if signal else "")
        await trio.to_thread.run_sync(lambda: self.slot.add_to_publication(tables, signal))

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
        assert self.builder is not None
        self.incremental = IncrementalRunner(self.slot, self.builder, self._key_columns,
                                             self._incremental_state, self.snapshot_chunk_rows,
                                             self.clock_ms)
        await self.link.start(start_lsn)

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
                          stop_after=plan.stop_after, encoded=self.encoded)
        self.snapshot = run  # closed by close() if what follows fails
        await trio.to_thread.run_sync(run.open)

    async def _poll_snapshot(self, wanted: int) -> list[Record | EncodedRecords]:
        """The next rows of the snapshot as ``r`` records (``JsonRows`` as blocks); at its
        end, the handover: streaming from the consistent LSN (or, for ``initial_only``, the
        end)."""
        run = self.snapshot
        builder = self.builder
        assert run is not None and builder is not None
        chunk_rows = self.snapshot_chunk_rows
        while run.chunk_needed(wanted):
            run.add_chunk(await self._fetched_chunk(run), chunk_rows)
        items = run.take(wanted)
        if run.chunk_needed(wanted) and self._chunk_fetch is None:
            self._start_chunk_fetch(run)  # the next poll needs a chunk: read it meanwhile
            # (one may be in flight already: started by a call that wanted more rows)
        now_ms = self.clock_ms()
        records: list[Record | EncodedRecords] = []
        for item in items:
            if isinstance(item, JsonRows):
                block = builder.encoded_snapshot(
                    item.relation, item.afters, item.keys, run.consistent_lsn,
                    item.first.rows - 1, item.last.done, item.first.to_json(),
                    item.last.to_json(), now_ms)
                count_encoded_events(self.events, [block])
                self.queued_by_path["encoded"] += block.record_count
                records.append(block)
                continue
            relation, row, position = item
            record = builder.snapshot_record(
                relation, row, run.consistent_lsn, position.rows - 1,
                "last" if position.done else "true", position.to_json(), now_ms)
            count_events(self.events, [record])
            self.queued_by_path["record"] += 1
            records.append(record)
        if run.exhausted:
            self.snapshot = None
            run.close()  # every row is read: the exported snapshot may go
            self.finished = run.stop_after
            self.stream_from = run.consistent_lsn
        return records

    def _start_chunk_fetch(self, run: SnapshotRun) -> None:
        """Read the snapshot's next chunk in a worker thread, not waited for here
        (``_fetched_chunk`` takes its rows): the query runs while the rows before it are
        built, sent and committed. One at a time; only ``add_chunk`` moves the keyset."""
        assert self._chunk_fetch is None
        done = trio.Event()
        fetched: list[outcome.Outcome] = []
        token = trio.lowlevel.current_trio_token()

        def deliver(result: outcome.Outcome) -> None:  # (in the worker thread)
            fetched.append(result)
            try:
                token.run_sync_soon(done.set)
            except trio.RunFinishedError:
                pass  # the runtime ended first: nobody waits for these rows

        chunk_rows = self.snapshot_chunk_rows
        trio.lowlevel.start_thread_soon(lambda: run.fetch_chunk(chunk_rows), deliver)
        self._chunk_fetch = (done, fetched)

    async def _fetched_chunk(self, run: SnapshotRun) -> list[tuple[str | None, ...]]:
        """The rows of the chunk fetch in flight (started now if none is). A cancel leaves
        the fetch in flight and its rows for the next call: nothing read is lost. Raises
        what ``fetch_chunk`` raises (``SlotError``)."""
        if self._chunk_fetch is None:
            self._start_chunk_fetch(run)
        assert self._chunk_fetch is not None
        done, fetched = self._chunk_fetch
        await done.wait()
        self._chunk_fetch = None
        return fetched[0].unwrap()

    async def side_effect(self, position: Any) -> None:
        """Confirm the slot for the committed ``position`` (the end of a transaction), now
        or — before the stream's first frame, or with the connection lost — after a later
        read (module docstring, "Reconnects"). A later position supersedes an unsent
        confirm. Raises ``SourceError`` (the cycle retries). A checkpoint."""
        from rivven_connect.sources import SourceError

        await trio.lowlevel.checkpoint()
        if position_phase(position) == "snapshot":
            return  # nothing to confirm: the slot stays at the consistent LSN until streaming
        end_lsn = self.position_key(position)[0]
        assert position["last"], position  # the cycle commits whole transactions only
        try:
            self.link.committed(end_lsn)
        except SlotError as error:
            raise SourceError(str(error)) from error

    # --- metrics ------------------------------------------------------------------------------
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
            if isinstance(error, SlotConnectionError):
                self.link.let_go_if_shutting_down(error)

    def metrics(self) -> list[Metric]:
        """The CDC gauges and counters (``postgres_cdc_metrics``). Never blocks."""
        return cdc_metrics(
            retained_wal_bytes=self.retained_wal_bytes, confirmed_lsn=self.link.confirmed_lsn,
            received_end_lsn=self.received_end_lsn, stream_from=self.stream_from,
            link_metrics=self.link.metrics(), incremental=self.incremental, events=self.events,
            queued_by_path=self.queued_by_path)

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
        """Close the connections (a snapshot chunk still being read finishes first: psycopg2
        closes a connection only between its queries). Blocks."""
        if self.snapshot is not None:
            self.snapshot.close()
            self.snapshot = None
        if self.incremental is not None:
            self.incremental.close()
        self.slot.close()
