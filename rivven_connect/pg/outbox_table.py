"""The polling outbox's SQL (psycopg2, blocking: run every method in a worker thread).

Theory of operation
-------------------
One ordinary connection (``DateStyle=ISO``, ``extra_float_digits=3``, a statement timeout;
values fetched as Postgres' text, as the snapshot reader does). ``describe()`` checks the
table: it exists, the id column exists and is unique on its own (the primary key or a
unique index: the side effect deletes by it), the order column exists, and in mark mode the
processed column is a ``bool``. It returns the ``OutboxTableShape``.

``poll(limit, exclude_ids)`` runs, in a transaction it leaves **open** when rows came back::

    SELECT cols::text... FROM t [WHERE processed IS NOT TRUE] [AND id <> ALL(excluded)]
    ORDER BY order_column LIMIT n FOR UPDATE SKIP LOCKED

so the rows stay locked (another poller skips them) until ``finish(ids)`` deletes them
(``DELETE ... WHERE id = ANY(ids)``) or marks them (``UPDATE ... SET processed = true``) and
commits — after the broker commit. With no rows the transaction is committed at once.
``finish`` is idempotent. A failed statement closes the connection (an open poll's locks go
with it) and raises ``OutboxTableError`` with the SQL error's text — ``OutboxConnectionError``
when the connection was lost or could not be made (``slot.connection_lost``: the source
retries those with backoff) —; the next call reconnects, so a retried ``finish`` deletes by
the same ids in a new transaction: the ids decide, not the locks.
"""

from __future__ import annotations

from typing import Any, Sequence

import psycopg2
import psycopg2.extensions
from psycopg2 import sql

from .outbox_poll import OutboxTableShape
from .slot import (
    PgConnectConfig, SlotConnectionError, SlotError, connection_lost, statement_timeout_ms,
)

__all__ = ["OutboxTable", "OutboxTableError", "OutboxConnectionError"]

BOOL_OID = 16


class OutboxTableError(Exception):
    """The outbox table is unusable (missing, no unique id) or a statement on it failed."""


class OutboxConnectionError(OutboxTableError):
    """The connection to Postgres was lost or could not be made (worth another attempt)."""


class OutboxTable:
    """The outbox table of one source (see the module docstring). Not thread-safe."""

    def __init__(self, config: PgConnectConfig, table: tuple[str, str], *, id_column: str,
                 order_column: str, processed_column: str | None) -> None:
        self.config, self.table = config, table
        self.id_column, self.order_column = id_column, order_column
        self.processed_column = processed_column
        self.shape: OutboxTableShape | None = None
        self._id_type = ""
        self._connection: Any = None

    def _connect(self) -> Any:
        if self._connection is None:
            try:
                connection = self.config.connect(
                    options=f"-c DateStyle=ISO,MDY -c extra_float_digits=3 "
                            f"-c statement_timeout={statement_timeout_ms}")
            except SlotConnectionError as error:
                raise OutboxConnectionError(str(error)) from error
            except SlotError as error:
                raise OutboxTableError(str(error)) from error
            self._connection = connection
            if self.shape is not None:
                self._register_text(self.shape)
        return self._connection

    def _register_text(self, shape: OutboxTableShape) -> None:
        oids = tuple({oid for _name, oid in shape.columns})
        psycopg2.extensions.register_type(
            psycopg2.extensions.new_type(oids, "RIVVEN_TEXT", lambda text, _cursor: text),
            self._connection)

    def _fail(self, what: str, error: psycopg2.Error) -> OutboxTableError:
        self.close()  # the next call reconnects; an open transaction (and its locks) is gone
        schema, name = self.table
        kind = OutboxConnectionError if connection_lost(error) else OutboxTableError
        return kind(f"{what} on {schema}.{name} failed: {str(error).strip()}")

    def describe(self) -> OutboxTableShape:
        """Check the table (module docstring) and return its shape. Raises
        ``OutboxTableError``."""
        schema, name = self.table
        connection = self._connect()
        try:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT a.attname, a.atttypid, format_type(a.atttypid, a.atttypmod) "
                    "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace JOIN "
                    "pg_attribute a ON a.attrelid = c.oid WHERE n.nspname = %s AND "
                    "c.relname = %s AND c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT "
                    "a.attisdropped ORDER BY a.attnum", (schema, name))
                columns = cursor.fetchall()
                if not columns:
                    connection.commit()
                    raise OutboxTableError(f"the outbox table {schema}.{name} does not exist")
                cursor.execute(
                    "SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                    "AND a.attnum = i.indkey[0] WHERE i.indrelid = %s::regclass AND "
                    "i.indisunique AND i.indnkeyatts = 1 AND i.indpred IS NULL AND "
                    "a.attname = %s",
                    (sql.Identifier(schema, name).as_string(connection), self.id_column))
                unique = cursor.fetchall()
            connection.commit()
        except psycopg2.Error as error:
            raise self._fail("reading the columns", error) from error
        types = {column: (oid, text) for column, oid, text in columns}
        for option, column in (("id_column", self.id_column),
                               ("order_column", self.order_column),
                               ("processed_column", self.processed_column)):
            if column is not None and column not in types:
                raise OutboxTableError(f"the outbox table {schema}.{name} has no column "
                                       f"{column!r} ({option})")
        if not unique:
            raise OutboxTableError(
                f"{schema}.{name}.{self.id_column} is not unique on its own (no primary key "
                f"or unique index on just it): delivered rows are deleted by it")
        if self.processed_column is not None and types[self.processed_column][0] != BOOL_OID:
            raise OutboxTableError(f"{schema}.{name}.{self.processed_column} must be a bool "
                                   f"(processed_column: true once delivered)")
        self._id_type = types[self.id_column][1]
        self.shape = OutboxTableShape(schema, name, tuple(
            (column, oid) for column, oid, _text in columns), self.id_column)
        self._register_text(self.shape)
        return self.shape

    def poll(self, limit: int, exclude_ids: Sequence[str]) -> list[tuple[str | None, ...]]:
        """Up to ``limit`` pending rows (each column's text), locked until ``finish`` (or
        ``release``) when there are any. Raises ``OutboxTableError``."""
        assert self.shape is not None and limit > 0
        connection = self._connect()
        query = sql.SQL("SELECT {} FROM {}").format(
            sql.SQL(", ").join(sql.Identifier(n) for n in self.shape.column_names),
            sql.Identifier(*self.table))
        conditions, params = [], []
        if self.processed_column is not None:
            conditions.append(sql.SQL("{} IS NOT TRUE").format(
                sql.Identifier(self.processed_column)))
        if exclude_ids:
            conditions.append(sql.SQL("{} <> ALL(%s::{}[])").format(
                sql.Identifier(self.id_column), sql.SQL(self._id_type)))
            params.append(list(exclude_ids))
        if conditions:
            query += sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions)
        query += sql.SQL(" ORDER BY {} LIMIT {} FOR UPDATE SKIP LOCKED").format(
            sql.Identifier(self.order_column), sql.Literal(limit))
        try:
            with connection.cursor() as cursor:
                cursor.execute(query, params)
                rows = [tuple(row) for row in cursor.fetchall()]
            if not rows:
                connection.commit()
        except psycopg2.Error as error:
            raise self._fail("polling", error) from error
        return rows

    def finish(self, ids: Sequence[str]) -> int:
        """Delete (or mark) the rows ``ids`` and commit; idempotent. Returns the rows
        changed now. Raises ``OutboxTableError``."""
        assert self.shape is not None and ids
        column = sql.Identifier(self.id_column)
        if self.processed_column is None:
            query = sql.SQL("DELETE FROM {} WHERE {} = ANY(%s::{}[])").format(
                sql.Identifier(*self.table), column, sql.SQL(self._id_type))
        else:
            query = sql.SQL("UPDATE {} SET {} = true WHERE {} = ANY(%s::{}[])").format(
                sql.Identifier(*self.table), sql.Identifier(self.processed_column), column,
                sql.SQL(self._id_type))
        connection = self._connect()
        try:
            with connection.cursor() as cursor:
                cursor.execute(query, (list(ids),))
                changed = cursor.rowcount
            connection.commit()
        except psycopg2.Error as error:
            raise self._fail("deleting delivered rows" if self.processed_column is None
                             else "marking delivered rows", error) from error
        return changed

    def release(self) -> None:
        """Roll back an open poll (its locks go; the rows are polled again)."""
        if self._connection is not None:
            try:
                self._connection.rollback()
            except psycopg2.Error:
                self.close()

    def close(self) -> None:
        if self._connection is not None:
            try:
                self._connection.close()
            finally:
                self._connection = None
