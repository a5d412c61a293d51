"""``postgres-cdc``: one initial snapshot in progress (docs/connect-postgres.md "Snapshots").

Theory of operation
-------------------
``SnapshotRun`` (blocking methods: run them in a worker thread) creates the slot exporting
its snapshot, imports it on a reader connection, and walks the configured tables by
primary-key keyset chunks with one row of look-ahead, so the snapshot's last row is known
when it is emitted; each row comes with its ``SnapshotPosition`` (a table's name and its key
columns' indexes are found once, when it opens, not per row). A chunk read is split in
``fetch_chunk`` (the query, blocking, changing nothing) and ``add_chunk`` (the
bookkeeping), so the source can run the query in a thread while it hands out the rows
before it (``take``): one fetch at a time, at most one chunk ahead of what ``take`` needs.

With ``encoded`` (the runtime's encoded path), a table whose every column type has a
Postgres-side JSON expression (``values_sql.table_json_supported``) is read with
``read_chunk_json``, and its rows come out as ``JsonRows``: runs of one table's rows as the
JSON Postgres wrote, with the positions of the first and last row only; other tables' rows
come one by one as before.
"""

from __future__ import annotations

import collections
from typing import Mapping, Union

import attrs

from rivven_connect.pg.pgoutput import ColumnValue, Relation
from rivven_connect.pg.slot import ReplicationSlot
from rivven_connect.pg.snapshot import SnapshotPosition
from rivven_connect.pg.snapshot_reader import ExportedSnapshot, SnapshotReader
from rivven_connect.pg.values_sql import table_json_supported
from rivven_connect.sources.postgres_cdc_incremental import key_text

__all__ = ["JsonRows", "SnapshotItem", "SnapshotRun"]


@attrs.frozen
class JsonRows:
    """Consecutive rows of one table as Postgres wrote them: ``afters`` and ``keys`` are
    JSON texts, one per row; the positions are the first and last row's."""

    relation: Relation
    afters: list[str]
    keys: list[str]
    first: SnapshotPosition
    last: SnapshotPosition


#: A row with its position, or a run of rows in JSON.
SnapshotItem = Union[tuple[Relation, tuple[ColumnValue, ...], SnapshotPosition], JsonRows]


class SnapshotRun:
    """One snapshot in progress (blocking methods: run them in a worker thread): the
    exporting slot creation, the reader, and the keyset walk over the tables with one row
    of look-ahead, so the snapshot's last row is known when it is emitted."""

    def __init__(self, slot: ReplicationSlot,
                 key_columns: Mapping[tuple[str, str], tuple[str, ...]], *, temporary: bool,
                 stop_after: bool, encoded: bool = False) -> None:
        self.slot, self.key_columns = slot, key_columns
        self.stop_after = stop_after
        self.encoded = encoded
        self.export = ExportedSnapshot(slot.config, slot.slot_name, temporary=temporary)
        self.reader = SnapshotReader(slot.config)
        self.consistent_lsn = 0
        self.relations: list[Relation] = []
        self.table_names: list[str] = []         # per table: "schema.table"
        self.key_indexes: list[tuple[int, ...]] = []  # per table: its key columns' indexes
        self.json_tables: list[bool] = []  # per table: read as JSON (``encoded`` and typed)
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
        self.json_tables = [self.encoded and table_json_supported(
            [column.type_oid for column in r.columns]) for r in self.relations]

    def next_rows(self, wanted: int, chunk_rows: int) -> list[SnapshotItem]:
        """Up to ``wanted`` rows: each with its position, or in ``JsonRows`` runs (the
        snapshot's last row is ``done``). Reads the chunks it needs first (blocking)."""
        while self.chunk_needed(wanted):
            self.add_chunk(self.fetch_chunk(chunk_rows), chunk_rows)
        return self.take(wanted)

    def chunk_needed(self, wanted: int) -> bool:
        """Whether a chunk must be added before ``take(wanted)``: no more than ``wanted``
        rows ahead (one row of look-ahead tells the last one) and tables left to read."""
        return len(self.ahead) <= wanted and self.table_index < len(self.relations)

    def fetch_chunk(self, chunk_rows: int) -> list[tuple[str | None, ...]]:
        """The next chunk of the table being read (blocking I/O; nothing changes here:
        ``add_chunk`` takes the rows, and no other fetch may run before it did). Raises
        ``SlotError``."""
        assert self.table_index < len(self.relations)
        relation = self.relations[self.table_index]
        key = self.key_columns[(relation.schema, relation.name)]
        if self.json_tables[self.table_index]:
            return self.reader.read_chunk_json(relation, key, self.read_after, chunk_rows)
        return self.reader.read_chunk(relation, key, self.read_after, chunk_rows)

    def add_chunk(self, rows: list[tuple[str | None, ...]], chunk_rows: int) -> None:
        """The rows ``fetch_chunk`` read into ``ahead`` (rows of a JSON table are ``(after,
        key, *key texts)``, of the others their columns' texts); the keyset moves on."""
        index = self.table_index
        relation = self.relations[index]
        if self.json_tables[index]:
            last = rows[-1][2:] if rows else None
        else:
            key = self.key_columns[(relation.schema, relation.name)]
            last = key_text(relation, key, rows[-1]) if rows else None
        self.ahead.extend((index, row) for row in rows)
        if len(rows) < chunk_rows:
            self.table_index, self.read_after = index + 1, None
        else:
            self.read_after = last

    def take(self, wanted: int) -> list[SnapshotItem]:
        """Up to ``wanted`` rows from ``ahead`` (no I/O: ``chunk_needed`` says when to add a
        chunk first)."""
        out: list[SnapshotItem] = []
        taken = 0
        null = ColumnValue("n")
        while self.ahead and taken < wanted:
            index = self.ahead[0][0]
            if self.json_tables[index]:
                run = self._json_run(index, wanted - taken)
                out.append(run)
                taken += len(run.afters)
                continue
            index, row = self.ahead.popleft()
            relation = self.relations[index]
            out.append((relation, tuple(null if value is None else ColumnValue(
                "t", value.encode()) for value in row), self._position(index, row)))
            taken += 1
        self.exhausted = not self.ahead and self.table_index == len(self.relations)
        return out

    def _position(self, index: int, row: tuple, key: tuple[str, ...] | None = None
                  ) -> SnapshotPosition:
        """The position of the next row handed out (counted here)."""
        self.rows += 1
        done = not self.ahead and self.table_index == len(self.relations)
        if key is None:
            key = tuple(row[at] for at in self.key_indexes[index])
        return SnapshotPosition(self.consistent_lsn, index, self.table_names[index], key,
                                self.rows, done)

    def _json_run(self, index: int, wanted: int) -> JsonRows:
        """Up to ``wanted`` rows of table ``index`` from the front of ``ahead``."""
        ahead = self.ahead
        afters: list[str] = []
        keys: list[str] = []
        first_row = ahead[0][1]
        while ahead and ahead[0][0] == index and len(afters) < wanted:
            row = ahead.popleft()[1]
            afters.append(row[0])
            keys.append(row[1])
        self.rows += len(afters) - 1  # (the last one is counted by _position)
        last = self._position(index, row, tuple(row[2:]))
        first = last if len(afters) == 1 else attrs.evolve(
            last, last_key=tuple(first_row[2:]), rows=last.rows - len(afters) + 1, done=False)
        return JsonRows(self.relations[index], afters, keys, first, last)

    def close(self) -> None:
        self.reader.close()
        self.export.close()


def _key_indexes(relation: Relation, key: tuple[str, ...]) -> tuple[int, ...]:
    names = [column.name for column in relation.columns]
    return tuple(names.index(column) for column in key)

