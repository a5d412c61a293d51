"""``postgres-cdc``: the driver of incremental (DBLog) snapshots inside the streaming source
(docs/connect-postgres.md "Incremental snapshots"; the decisions are ``pg.incremental``'s).

Theory of operation
-------------------
``IncrementalRunner`` sits between the source's decoded transactions and its queue:

- ``read_chunk_if_due()`` (from the poll loop, between reads of the stream) asks the core
  for a chunk; if there is one, a worker thread commits the low watermark, reads the
  chunk under a ``REPEATABLE READ`` snapshot and commits the high watermark
  (``pg.snapshot_reader.WindowReader``); the rows become ``r`` records (``source.snapshot
  = "incremental"``, ``source.lsn`` the low watermark's LSN) and go into the core's buffer.
  Watermarks are transactional ``rivven.cdc.watermark`` messages whose content names the
  slot, this process's run id and the chunk: an earlier process's (replayed after a crash)
  or another connector's match nothing and are ignored.
- ``process(transaction, records)`` feeds the core, in stream order, the transaction's row
  changes and truncates, its watermarks and its signals (rows inserted into the signal
  table, or transactional ``rivven.cdc.signal`` messages), and returns the records to
  queue: the transaction's own (the signal table's are consumed, never sent) followed, at
  a high watermark, by the chunk rows the window left. Their positions are renumbered
  ``seq`` 0.. with ``last`` on the final one and carry ``"incremental": state`` while a
  snapshot runs, so the stored offset always says where it stands (with no snapshot
  running and no record dropped or added, the builder's positions — ``position_json``,
  given to it by the source — already are those: the records are returned as they came,
  without a copy per record). A transaction that
  changes that state but has no record of its own (a signal, an emptied chunk) yields a
  position-only record, so the change is committed without waiting for traffic.
- ``on_connection_lost()``: the source lost its replication connection and will resume the
  stream exactly where it was (``postgres_cdc_link``), so an open chunk window is kept; a
  chunk read that fails (``SlotConnectionError`` when its connection is lost) is dropped
  and read again with a new chunk id.
- A bad signal is logged at WARNING and counted (``signals{outcome="refused"}``), never a
  crash: it sits in the WAL and would stop every restart again.
"""

from __future__ import annotations

import collections
import functools
import json
import logging
from typing import Any, Callable

import attrs
import trio

from rivven_connect.core.records import Record
from rivven_connect.pg.envelope import CdcPosition, EnvelopeBuilder
from rivven_connect.pg.incremental import (
    IncrementalSnapshot, IncrementalState, SignalError, key_id, parse_signal,
)
from rivven_connect.pg.pgoutput import ColumnValue, LogicalMessage, Relation, format_lsn
from rivven_connect.pg.slot import SIGNAL_MESSAGE_PREFIX, ReplicationSlot
from rivven_connect.pg.snapshot_reader import WATERMARK_MESSAGE_PREFIX, WindowReader
from rivven_connect.pg.transactions import Transaction

__all__ = ["IncrementalRunner", "key_text", "position_json", "signal_message"]

_log = logging.getLogger("rivven_connect.postgres_cdc")


def position_json(position: CdcPosition) -> dict[str, Any]:
    """A streamed record's position in its stored form (the builder's ``position``)."""
    return {"end_lsn": _lsn_text(position.end_lsn), "commit_lsn": _lsn_text(
        position.commit_lsn), "seq": position.seq, "last": position.last}


#: ``format_lsn`` remembered for the last few LSNs: every record of a transaction has the
#: same end and commit LSN.
_lsn_text = functools.lru_cache(maxsize=16)(format_lsn)


def key_text(relation: Relation, key: tuple[str, ...], row: tuple[str | None, ...]
             ) -> tuple[str, ...]:
    """The Postgres text of a row's key columns (the keyset's ``after``)."""
    names = [column.name for column in relation.columns]
    values = tuple(row[names.index(column)] for column in key)
    assert all(value is not None for value in values)  # primary key columns are NOT NULL
    return values  # type: ignore[return-value]


def signal_message(slot_name: str, signal_type: str, data: dict[str, Any]) -> str:
    """The content of a ``rivven.cdc.signal`` message for this slot."""
    return json.dumps({"slot": slot_name, "type": signal_type, "data": data})


class IncrementalRunner:
    def __init__(self, slot: ReplicationSlot, builder: EnvelopeBuilder,
                 key_columns: dict[tuple[str, str], tuple[str, ...]],
                 state: IncrementalState | None, chunk_rows_default: int,
                 clock_ms: Callable[[], int]) -> None:
        self.slot, self.builder, self.key_columns = slot, builder, key_columns
        self.core: IncrementalSnapshot[Record] = IncrementalSnapshot(state, chunk_rows_default)
        self.reader = WindowReader(slot.config)
        self.tables = [f"{schema}.{name}" for schema, name in slot.tables]
        self.clock_ms = clock_ms
        self.run_id = str(clock_ms())  # distinct per process start: old watermarks match nothing
        self.signals: collections.Counter[str] = collections.Counter()

    def state_json(self) -> dict[str, Any] | None:
        state = self.core.state
        return None if state is None else state.to_json()

    # --- chunks -------------------------------------------------------------------------------
    async def read_chunk_if_due(self) -> None:
        """Read the chunk the core wants, if any. Raises ``SlotError``. A checkpoint."""
        request = self.core.next_chunk()
        if request is None:
            return await trio.lowlevel.checkpoint()
        schema, name = request.table.split(".")
        key = self.key_columns[(schema, name)]
        marks = [json.dumps({"slot": self.slot.slot_name, "run": self.run_id,
                             "chunk": request.chunk_id, "kind": kind}) for kind in ("low", "high")]

        def read() -> Any:
            if not self.reader.is_open:
                self.reader.open()
            return self.reader.read_window((schema, name), key, request.after, request.limit,
                                           *marks)

        try:
            low_lsn, relation, rows, running = await trio.to_thread.run_sync(read)
        except BaseException:
            self.core.chunk_failed(request.chunk_id)  # its watermarks will match nothing
            raise
        now_ms = self.clock_ms()
        records = [self.builder.snapshot_record(
            relation, tuple(ColumnValue("n") if value is None else ColumnValue(
                "t", value.encode()) for value in row), low_lsn, seq, "incremental", None, now_ms)
            for seq, row in enumerate(rows)]
        last = key_text(relation, key, rows[-1]) if rows else None
        if not self.core.chunk_read(request.chunk_id, [(key_id(r.key), r) for r in records],
                                    last, running):
            _log.info("postgres-cdc %s: chunk %d of %s read again (a transaction was "
                      "committing while it was read)", self.slot.slot_name, request.chunk_id,
                      request.table)

    # --- the stream ---------------------------------------------------------------------------
    def take_unchanged(self, transaction: Transaction) -> bool:
        """If ``process`` would return ``transaction``'s records as the builder made them
        (no snapshot running or chunk in flight, no change of the signal table, no logical
        message), note the transaction as ``process`` does and say True: the caller may
        queue them without ``process`` (the source's encoded path). Else False, noting
        nothing."""
        core = self.core
        if core.state is not None or core.chunk is not None:
            return False
        signal_table = self.slot.signal_table
        for change in transaction.changes:
            relations = change.relations
            if not relations or any((relation.schema, relation.name) == signal_table
                                    for relation in relations):
                return False  # a logical message, or the signal table
        core.on_transaction(transaction.xid)
        return True

    def process(self, transaction: Transaction, records: list[Record]) -> list[Record]:
        """The records to queue for ``transaction`` (module docstring); ``records`` are the
        builder's, positioned by ``position_json``. Raises ``IncrementalSnapshotError``."""
        core, xid = self.core, transaction.xid
        before = core.state
        core.on_transaction(xid)
        out: list[Record] = []
        for record in records:
            if record.table is not None and (record.schema, record.table) == \
                    self.slot.signal_table:
                if record.op == "c" and isinstance(record.value, dict):
                    after = record.value["after"] or {}
                    self._signal(after.get("type"), after.get("data"), f"row {after.get('id')!r}")
                continue
            if record.table is not None:
                table = f"{record.schema}.{record.table}"
                if record.op == "t":
                    core.on_truncate(xid, table)
                elif record.key is not None:
                    core.on_change(xid, table, key_id(record.key))
            out.append(record)
        for change in transaction.changes:
            message = change.message
            if not isinstance(message, LogicalMessage):
                continue
            if message.prefix == WATERMARK_MESSAGE_PREFIX:
                out.extend(self._watermark(message.content))
            elif message.prefix == SIGNAL_MESSAGE_PREFIX:
                self._signal_message(message.content)
        if not out and core.state != before:
            out = [Record.heartbeat({})]  # (the position follows)
        state = self.state_json()
        if state is None and len(out) == len(records) and all(
                mine is given for mine, given in zip(out, records)):
            return out  # the transaction's own records: the builder's positions stand
        positioned = []
        for seq, record in enumerate(out):
            position: dict[str, Any] = {
                "end_lsn": _lsn_text(transaction.end_lsn),
                "commit_lsn": _lsn_text(transaction.commit_lsn), "seq": seq,
                "last": seq == len(out) - 1}
            if state is not None:
                position["incremental"] = state
            positioned.append(attrs.evolve(record, position=position))
        return positioned

    def _watermark(self, content: bytes) -> list[Record]:
        try:
            mark = json.loads(content)
            ours = mark["slot"] == self.slot.slot_name and mark["run"] == self.run_id
            kind, chunk_id = mark["kind"], int(mark["chunk"])
        except (ValueError, TypeError, KeyError):
            return []  # not one of ours
        if not ours or kind not in ("low", "high"):
            return []
        return self.core.on_watermark(kind, chunk_id) or []

    def _signal_message(self, content: bytes) -> None:
        try:
            body = json.loads(content)
            assert isinstance(body, dict)
        except (ValueError, AssertionError):
            self._refuse(f"message {content[:200]!r}", "not a JSON object")
            return
        if body.get("slot", self.slot.slot_name) != self.slot.slot_name:
            return  # another connector's
        self._signal(body.get("type"), body.get("data"), "message")

    def _signal(self, signal_type: Any, data: Any, origin: str) -> None:
        try:
            signal = parse_signal(signal_type, data, self.tables)
        except SignalError as error:
            self._refuse(origin, str(error))
            return
        self.core.on_signal(signal)
        self.signals["accepted"] += 1
        _log.info("postgres-cdc %s: signal %s (%s) accepted: %s", self.slot.slot_name,
                  signal.type, origin, self.core.state)

    def _refuse(self, origin: str, reason: str) -> None:
        self.signals["refused"] += 1
        _log.warning("postgres-cdc %s: signal %s refused: %s", self.slot.slot_name, origin,
                     reason)

    def on_connection_lost(self) -> None:
        """The replication connection was lost (the source reconnects and the stream goes on
        exactly where it was): the chunk window in flight stays, only the reader's
        connection is closed (after a Postgres restart it is dead; the next chunk opens a
        new one)."""
        chunk = self.core.chunk
        assert chunk is None or chunk.phase != "reading"  # reads are awaited, never left
        self.reader.close()

    def close(self) -> None:
        self.reader.close()
