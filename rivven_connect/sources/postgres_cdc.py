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
  reading at the first Commit after ``min(max_records, batch_size)`` records, so a
  transaction is never split across batches; one larger than that is returned whole (up to
  ``changes_per_transaction_max`` changes, ≤ the cycle's 100,000 records; more stops the
  source with ``SourceError``). Transactions with ``end_lsn`` at or below the stored offset
  are dropped by the assembler (the replay filter) and again by the cycle;
- ``side_effect(position)`` runs only after the broker committed the batch whose last
  position it is: it confirms the slot at ``end_lsn - 1`` (``pg.slot`` "Keepalives" says why
  not ``end_lsn``; Postgres resumes at our requested LSN either way). Idempotent;
- positions are JSON (they go into ``__connect_offsets``): ``{"end_lsn": "X/X",
  "commit_lsn": "X/X", "seq": n, "last": bool}``, ordered by ``(end_lsn, seq)``.

Non-transactional logical messages (our own ``rivven.cdc.resume`` among them) and, in this
build, transactional ones are not emitted; truncates are (``op: t``).
"""

from __future__ import annotations

import collections
import datetime
from typing import Any, Callable, Mapping

import attrs
import trio

from rivven_connect.core.batch_cycle import batch_records_max
from rivven_connect.core.records import Record
from rivven_connect.pg.envelope import CdcPosition, EnvelopeBuilder, EnvelopeError
from rivven_connect.pg.pgoutput import (
    LogicalMessage, PgOutputError, decode_message, format_lsn, parse_lsn,
)
from rivven_connect.pg.slot import (
    PgConnectConfig, ReplicationSlot, SlotActiveError, SlotError, parse_table_name,
)
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
SNAPSHOT_MODES_LATER = ("initial", "initial_only", "always", "when_needed", "no_data")


def _wall_clock_ms() -> int:
    return int(datetime.datetime.now(datetime.timezone.utc).timestamp() * 1000)


def position_json(position: CdcPosition) -> dict[str, Any]:
    return {"end_lsn": format_lsn(position.end_lsn), "commit_lsn": format_lsn(
        position.commit_lsn), "seq": position.seq, "last": position.last}


class PostgresCdcSource:
    def __init__(self, slot: ReplicationSlot, *, batch_size: int = 500,
                 clock_ms: Callable[[], int] = _wall_clock_ms) -> None:
        self.slot = slot
        self.batch_size = batch_size
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

    @classmethod
    def from_config(cls, raw: Mapping[str, Any], path: str) -> PostgresCdcSource:
        """Checks the ``config`` block (``ConnectConfigError`` naming the option)."""
        from rivven_connect.core.config import ConnectConfigError
        from rivven_connect.sources import Options

        options = Options(raw, path, ("host", "port", "database", "user", "password",
                                      "slot_name", "publication_name", "tables", "snapshot",
                                      "batch_size", "status_interval_ms"))
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
        _check_snapshot(raw.get("snapshot"), f"{path}.snapshot")
        interval = options.int("status_interval_ms", 10_000, 1000, 60_000)
        assert port is not None and interval is not None
        config = PgConnectConfig(options.string("host"), port, options.string("database"),
                                 options.string("user"), password)
        slot = ReplicationSlot(config, names["slot_name"], names["publication_name"], parsed,
                               status_interval_s=interval / 1000)
        return cls(slot, batch_size=options.batch_size())

    # --- the Source protocol ------------------------------------------------------------------
    def resume(self, position: Any) -> None:
        self.stored = position  # checked in the first poll (resume does no I/O, raises nothing)

    async def poll(self, max_records: int) -> list[Record] | None:
        """The records of whole transactions, at least one transaction (waits for one).
        Raises ``SourceError``. A checkpoint."""
        from rivven_connect.sources import SourceError

        wanted = min(max_records, self.batch_size)
        try:
            if self.assembler is None:
                await self._start()
            while True:
                self._feed(wanted)
                if self._queued >= wanted:
                    break
                frames = await self.slot.read_frames(frames_per_read, read_wait_s)
                if not frames and self._queued:
                    break
                self._frames.extend(frames)
        except (SlotError, PgOutputError, ReplicationStateError, TransactionTooLarge,
                EnvelopeError) as error:
            raise SourceError(f"postgres-cdc {self.slot.slot_name}: {error}") from error
        return self._take(wanted)

    def _feed(self, wanted: int) -> None:
        """Decode read frames until ``wanted`` records of whole transactions are queued
        (the rest of the frames wait; a half-read transaction waits in the assembler)."""
        assembler, builder = self.assembler, self.builder
        assert assembler is not None and builder is not None
        while self._frames and self._queued < wanted:
            lsn, payload = self._frames.popleft()
            result = assembler.feed(decode_message(payload), lsn)
            if isinstance(result, Transaction):
                records = [attrs.evolve(record, position=position_json(record.position))
                           for record in builder.records(result, self.clock_ms())]
                if records:
                    self._transactions.append(records)
                    self._queued += len(records)
            else:  # non-transactional messages (our resume marker among them) are dropped
                assert result is None or isinstance(result, LogicalMessage)

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

        stored_end = None
        if self.stored is not None:
            try:
                stored_end = self.position_key(self.stored)[0]
                assert self.stored["last"] is True
            except (KeyError, TypeError, ValueError, AssertionError, IndexError):
                raise SourceError(f"postgres-cdc {self.slot.slot_name}: the stored offset "
                                  f"{self.stored!r} is not a postgres-cdc position at the end "
                                  f"of a transaction") from None
        info = None
        with trio.move_on_after(slot_active_wait_s):
            while info is None:
                try:
                    info = await trio.to_thread.run_sync(
                        lambda: self.slot.prepare(create_slot=stored_end is None))
                except SlotActiveError:
                    await trio.sleep(slot_active_retry_s)
        if info is None:  # still active: another consumer, really
            info = await trio.to_thread.run_sync(
                lambda: self.slot.prepare(create_slot=stored_end is None))
        confirmed = info.confirmed_flush_lsn
        if stored_end is not None and confirmed is not None and confirmed > stored_end:
            raise SourceError(
                f"postgres-cdc {self.slot.slot_name}: the slot ran ahead: its "
                f"confirmed_flush_lsn {format_lsn(confirmed)} is past the stored offset "
                f"end_lsn {format_lsn(stored_end)}, so changes in between were confirmed "
                f"without being delivered (pg_replication_slot_advance by hand, or the slot "
                f"was recreated); refusing to start — check what is missing, then delete "
                f"the source's offset (or recreate the slot) to start over")
        self.builder = EnvelopeBuilder(db=self.slot.config.database, key_columns=info.key_columns,
                                       emit_messages=False)
        self.assembler = TransactionAssembler(resume_end_lsn=stored_end or 0,
                                              changes_max=changes_per_transaction_max)
        await trio.to_thread.run_sync(lambda: self.slot.start(stored_end or 0))

    async def side_effect(self, position: Any) -> None:
        """Confirm the slot for the committed ``position`` (the end of a transaction).
        Raises ``SourceError`` (the cycle retries). A checkpoint."""
        from rivven_connect.sources import SourceError

        await trio.lowlevel.checkpoint()
        end_lsn = self.position_key(position)[0]
        assert position["last"], position  # the cycle commits whole transactions only
        if not self.slot.started:
            return  # replays only, before the stream started: nothing to confirm
        try:
            self.slot.confirm(end_lsn - 1)
        except SlotError as error:
            raise SourceError(str(error)) from error
        self.confirmed_lsn = end_lsn - 1

    def position_key(self, position: Any) -> tuple[int, int]:
        return parse_lsn(position["end_lsn"]), int(position["seq"])

    def close(self) -> None:
        self.slot.close()


def _check_snapshot(snapshot: Any, path: str) -> None:
    from rivven_connect.core.config import ConnectConfigError

    if not isinstance(snapshot, dict) or "mode" not in snapshot:
        raise ConnectConfigError(path, "is required: { mode: never } (the only mode of this "
                                       "build; snapshots come next)")
    unknown = sorted(set(snapshot) - {"mode"})
    if unknown:
        raise ConnectConfigError(f"{path}.{unknown[0]}", "unknown option; known: mode")
    mode = snapshot["mode"]
    if mode != "never":
        later = f" ({mode!r} comes with snapshots)" if mode in SNAPSHOT_MODES_LATER else ""
        raise ConnectConfigError(f"{path}.mode", f"only 'never' is supported in this build: "
                                                 f"snapshots come next{later}")
