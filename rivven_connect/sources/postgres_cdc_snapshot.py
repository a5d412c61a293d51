"""``postgres-cdc``: one initial snapshot in progress (docs/connect-postgres.md "Snapshots").

Theory of operation
-------------------
``SnapshotRun`` (blocking methods: run them in a worker thread) creates the slot exporting
its snapshot, imports it on a reader connection, and walks the configured tables by
primary-key keyset chunks with one row of look-ahead, so the snapshot's last row is known
when it is emitted; each row comes with its ``SnapshotPosition`` (a table's name and its key
columns' indexes are found once, when it opens, not per row).
"""

from __future__ import annotations

import collections
from typing import Mapping

from rivven_connect.pg.pgoutput import ColumnValue, Relation
from rivven_connect.pg.slot import ReplicationSlot
from rivven_connect.pg.snapshot import SnapshotPosition
from rivven_connect.pg.snapshot_reader import ExportedSnapshot, SnapshotReader
from rivven_connect.sources.postgres_cdc_incremental import key_text

__all__ = ["SnapshotRun"]


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
                self.read_after = key_text(relation, key, rows[-1])
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

