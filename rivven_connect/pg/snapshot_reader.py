"""The snapshot's I/O (psycopg2, blocking: run in a worker thread): the exporting slot
creation and the keyset reads (docs/connect-postgres.md "Snapshots").

Theory of operation
-------------------
``ExportedSnapshot.create()`` opens a *replication* connection and runs
``CREATE_REPLICATION_SLOT s [TEMPORARY] LOGICAL pgoutput EXPORT_SNAPSHOT``: the answer is
the slot's ``consistent_point`` and the name of a snapshot that sees exactly the
transactions the slot will not stream. That snapshot lives only while the replication
connection runs no other command and stays open, so the object keeps the connection open
and idle until ``close()`` — after the last chunk. (Strictly, Postgres needs the exporting
connection only until ``SET TRANSACTION SNAPSHOT`` succeeded in the reader; keeping it is
cheap and leaves no doubt. psycopg2 sends nothing on an idle replication connection: no
keepalive thread, no status updates before ``start_replication``, so "idle" really is.)

``SnapshotReader.open(name)``: an ordinary connection (``DateStyle=ISO``,
``extra_float_digits=3``, as the replication connection) runs ``BEGIN ISOLATION LEVEL
REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '<name>'`` (psycopg2 opens the
transaction itself, with the session set to repeatable read, read only). Every read then
sees the exported snapshot. ``describe(table, key)`` gives the table's published columns
(no dropped, no generated ones, in ``attnum`` order: what pgoutput's Relation lists) as a
pgoutput ``Relation``; values are fetched as Postgres' text output (a per-connection
caster returns the text untouched for every column type), so ``values.py`` types them
exactly as streamed rows. ``read_chunk(relation, key, after, limit)`` is ``SELECT cols
FROM t [WHERE (key) > (after)] ORDER BY key LIMIT limit``; ``after`` is the key's text,
compared by Postgres with the columns' own types and collations (the same order as
``ORDER BY``), so no row is read twice or skipped. ``read_chunk_json`` is the same read
with Postgres writing each row's ``after`` image and key as JSON (``values_sql``: the
encoded path, for tables whose every column type has an expression), plus the key's text
for the keyset; the transaction runs at ``TimeZone = UTC`` for it (the per-row path's
values do not depend on the zone).

``WindowReader`` (incremental snapshots, ``pg.incremental``) reuses ``describe`` and
``read_chunk`` on an autocommit connection without an imported snapshot: per chunk it
commits the low watermark message, reads the chunk in its own ``REPEATABLE READ``
transaction together with ``pg_current_snapshot()`` (the in-progress xids), and commits the
high watermark message.
"""

from __future__ import annotations

from typing import Any, Sequence

import psycopg2
import psycopg2.extensions
import psycopg2.extras
from psycopg2 import sql

from .pgoutput import Column, Relation, parse_lsn
from .slot import PgConnectConfig, SlotError, slot_error, statement_timeout_ms
from .values_sql import column_json_sql

__all__ = ["ExportedSnapshot", "SnapshotReader", "WATERMARK_MESSAGE_PREFIX", "WindowReader"]


class ExportedSnapshot:
    """The replication connection that created the slot and exported its snapshot."""

    def __init__(self, config: PgConnectConfig, slot_name: str, *, temporary: bool) -> None:
        self.config, self.slot_name, self.temporary = config, slot_name, temporary
        self._connection: Any = None

    def create(self) -> tuple[int, str]:
        """Create the slot; ``(consistent_lsn, snapshot_name)``. Raises ``SlotError``."""
        assert self._connection is None
        connection = self.config.connect(
            connection_factory=psycopg2.extras.LogicalReplicationConnection)
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql.SQL("CREATE_REPLICATION_SLOT {} {} LOGICAL pgoutput "
                                       "EXPORT_SNAPSHOT").format(
                    sql.Identifier(self.slot_name),
                    sql.SQL("TEMPORARY" if self.temporary else "")))
                _slot, consistent, name, _plugin = cursor.fetchone()
        except psycopg2.Error as error:
            connection.close()
            raise SlotError(f"creating the slot {self.slot_name} with an exported snapshot "
                            f"failed: {str(error).strip()}") from error
        self._connection = connection
        return parse_lsn(consistent), name

    def close(self) -> None:
        """End the export (a temporary slot goes with it)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class SnapshotReader:
    """Keyset reads of the configured tables under one imported snapshot."""

    def __init__(self, config: PgConnectConfig) -> None:
        self.config = config
        self._connection: Any = None

    def open(self, snapshot_name: str) -> None:
        """Import the snapshot. Raises ``SlotError``."""
        connection = self.config.connect(options="-c DateStyle=ISO,MDY -c extra_float_digits=3")
        try:
            connection.set_session(
                isolation_level=psycopg2.extensions.ISOLATION_LEVEL_REPEATABLE_READ,
                readonly=True)
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))
                cursor.execute(f"SET LOCAL statement_timeout = {statement_timeout_ms}")
                cursor.execute("SET LOCAL TimeZone = 'UTC'")  # (read_chunk_json)
        except psycopg2.Error as error:
            connection.close()
            raise SlotError(f"importing snapshot {snapshot_name} failed: "
                            f"{str(error).strip()}") from error
        self._connection = connection

    def describe(self, table: tuple[str, str], key: Sequence[str]) -> Relation:
        """The table's published columns as a ``Relation``. Raises ``SlotError``."""
        schema, name = table
        if not key:
            raise SlotError(f"table {schema}.{name} has no primary key: a snapshot reads "
                            f"by primary key (give it one, or use snapshot mode never)")
        try:
            with self._connection.cursor() as cursor:
                cursor.execute(  # numbers as text: the caster below may hold int and oid
                    "SELECT c.oid::text, a.attname, a.atttypid::text, a.atttypmod::text "
                    "FROM pg_class c JOIN "
                    "pg_namespace n ON n.oid = c.relnamespace JOIN pg_attribute a ON "
                    "a.attrelid = c.oid WHERE n.nspname = %s AND c.relname = %s AND "
                    "a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' "
                    "ORDER BY a.attnum", (schema, name))
                rows = [(int(oid), column, int(type_oid), int(modifier))
                        for oid, column, type_oid, modifier in cursor.fetchall()]
        except psycopg2.Error as error:
            raise slot_error(f"reading the columns of {schema}.{name} failed",
                             error) from error
        if not rows:
            raise SlotError(f"table {schema}.{name} does not exist in the snapshot")
        oids = tuple({type_oid for _oid, _name, type_oid, _mod in rows})
        psycopg2.extensions.register_type(
            psycopg2.extensions.new_type(oids, "RIVVEN_TEXT", lambda text, _cursor: text),
            self._connection)
        columns = tuple(Column(column, type_oid, modifier, column in key)
                        for _oid, column, type_oid, modifier in rows)
        return Relation(rows[0][0], schema, name, "d", columns)

    def read_chunk(self, relation: Relation, key: Sequence[str],
                   after: Sequence[str] | None, limit: int) -> list[tuple[str | None, ...]]:
        """The next ``limit`` rows after key ``after`` (None: from the first), in key order,
        each column as Postgres' text (None for NULL). Raises ``SlotError``."""
        assert key and limit > 0 and (after is None or len(after) == len(key))
        names = sql.SQL(", ").join(sql.Identifier(column.name) for column in relation.columns)
        order = sql.SQL(", ").join(sql.Identifier(column) for column in key)
        query = sql.SQL("SELECT {} FROM {}").format(
            names, sql.Identifier(relation.schema, relation.name))
        if after is not None:
            query += sql.SQL(" WHERE ({}) > ({})").format(
                order, sql.SQL(", ").join(sql.Placeholder() * len(key)))
        query += sql.SQL(" ORDER BY {} LIMIT {}").format(order, sql.Literal(limit))
        try:
            with self._connection.cursor() as cursor:
                cursor.execute(query, tuple(after) if after is not None else None)
                return [tuple(row) for row in cursor.fetchall()]
        except psycopg2.Error as error:
            raise slot_error(f"snapshot read of {relation.schema}.{relation.name} failed",
                             error) from error

    def read_chunk_json(self, relation: Relation, key: Sequence[str],
                        after: Sequence[str] | None, limit: int
                        ) -> list[tuple[str, ...]]:
        """``read_chunk`` with each row as ``(after image JSON, key JSON, *key texts)``,
        the JSON written by Postgres (``values_sql.column_json_sql``; every column must have
        an expression: ``table_json_supported``). Raises ``SlotError``."""
        assert key and limit > 0 and (after is None or len(after) == len(key))
        by_name = {column.name: column for column in relation.columns}

        def expression(name: str) -> sql.Composable:
            column = by_name[name]
            made = column_json_sql(column.type_oid, sql.Identifier("t", name))
            assert made is not None, (relation, name)
            return sql.SQL("{} AS {}").format(made, sql.Identifier(name))

        def row_json(names: Sequence[str], alias: str) -> sql.Composable:
            return sql.SQL("(SELECT row_to_json({a})::text FROM (SELECT {}) AS {a})").format(
                sql.SQL(", ").join(expression(name) for name in names),
                a=sql.Identifier(alias))

        order = sql.SQL(", ").join(sql.Identifier("t", column) for column in key)
        query = sql.SQL("SELECT {}, {}, {} FROM {} AS t").format(
            row_json([column.name for column in relation.columns], "after"),
            row_json(key, "key"),
            sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier("t", column))
                               for column in key),
            sql.Identifier(relation.schema, relation.name))
        if after is not None:
            query += sql.SQL(" WHERE ({}) > ({})").format(
                order, sql.SQL(", ").join(sql.Placeholder() * len(key)))
        query += sql.SQL(" ORDER BY {} LIMIT {}").format(order, sql.Literal(limit))
        try:
            with self._connection.cursor() as cursor:  # (always parameters: ``%%`` is ``%``)
                cursor.execute(query, tuple(after) if after is not None else ())
                return cursor.fetchall()
        except psycopg2.Error as error:
            raise slot_error(f"snapshot read of {relation.schema}.{relation.name} failed",
                             error) from error

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


#: The prefix of the chunk watermarks (transactional logical messages; content: JSON with
#: the slot, the process's run id, the chunk id and ``low``/``high``).
WATERMARK_MESSAGE_PREFIX = "rivven.cdc.watermark"


class WindowReader(SnapshotReader):
    """The I/O of incremental snapshot chunks (``pg.incremental``): an ordinary connection
    in autocommit that commits the low watermark, reads the chunk in its own ``REPEATABLE
    READ`` transaction with that snapshot's in-progress xids, then commits the high
    watermark. Blocking: run it in a worker thread."""

    def open(self, snapshot_name: str | None = None) -> None:
        """Connect (no snapshot is imported). Raises ``SlotError``."""
        assert snapshot_name is None
        connection = self.config.connect(options="-c DateStyle=ISO,MDY -c extra_float_digits=3")
        connection.autocommit = True
        try:
            with connection.cursor() as cursor:
                cursor.execute("SET synchronous_commit = on")  # the watermarks are flushed
                cursor.execute(f"SET statement_timeout = {statement_timeout_ms}")
        except psycopg2.Error as error:
            connection.close()
            raise slot_error("opening the incremental snapshot connection failed",
                             error) from error
        self._connection = connection

    @property
    def is_open(self) -> bool:
        return self._connection is not None

    def read_window(self, table: tuple[str, str], key: Sequence[str],
                    after: Sequence[str] | None, limit: int, low: str, high: str
                    ) -> tuple[int, Relation, list[tuple[str | None, ...]], list[int]]:
        """Commit watermark ``low``, read the chunk, commit watermark ``high``:
        ``(low_lsn, relation, rows, in_progress_xids)``. Raises ``SlotError`` (the
        connection is closed then; ``open`` again), ``SlotConnectionError`` when the
        connection was lost (the source reconnects)."""
        try:
            low_lsn = self._emit(low)
            with self._connection.cursor() as cursor:
                cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                cursor.execute("SELECT pg_current_snapshot()::text")
                snapshot = cursor.fetchone()[0]
            relation = self.describe(table, key)
            rows = self.read_chunk(relation, key, after, limit)
            with self._connection.cursor() as cursor:
                cursor.execute("COMMIT")
            self._emit(high)
        except (psycopg2.Error, SlotError) as error:
            self.close()
            if isinstance(error, SlotError):
                raise
            raise slot_error(f"incremental snapshot chunk of {table[0]}.{table[1]} failed",
                             error) from error
        _xmin, _xmax, running = snapshot.split(":")
        return low_lsn, relation, rows, [int(xid) for xid in running.split(",") if xid]

    def _emit(self, content: str) -> int:
        with self._connection.cursor() as cursor:
            cursor.execute("SELECT pg_logical_emit_message(true, %s, %s)::text",
                           (WATERMARK_MESSAGE_PREFIX, content))
            return parse_lsn(cursor.fetchone()[0])
