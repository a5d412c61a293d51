"""The replication slot: the one module that talks SQL and the replication protocol (psycopg2).

Theory of operation
-------------------
``ReplicationSlot`` owns two connections to one database: a plain one for the start checks
and a ``LogicalReplicationConnection`` for the stream. Everything else of the CDC source is
pure (``pgoutput``, ``transactions``, ``envelope``) or the trio source that drives this.

``prepare()`` (blocking: run it in a worker thread) checks, in order, and raises
``SlotError`` with a message an operator can act on:

1. ``wal_level = logical``; ``server_encoding = UTF8`` (the value decoding assumes it);
2. every configured table exists and has a primary key or ``REPLICA IDENTITY FULL``
   (DEFAULT without a key, NOTHING, or INDEX are refused); the primary key columns are
   read from ``pg_index`` for every table, because under FULL pgoutput flags *every* column
   as key and the envelope needs the real key;
3. the publication exists, else it is created ``FOR TABLE ...`` (the tables and the
   signal table, if any); it must exist before the slot, or decoding WAL from before its
   creation fails. The configured tables an existing publication does not publish are
   returned (``SlotInfo.unpublished``) and added by ``add_to_publication`` when the source
   has decided what follows (an incremental snapshot of them, after a streaming start);
4. the slot, if it exists, has plugin ``pgoutput``, is in this database and is not
   ``active`` (another consumer).

It returns a ``SlotInfo``: the slot's ``confirmed_flush_lsn``, its state (``ok``,
``missing``, ``lost``: ``wal_status = 'lost'``) and the key columns per table. What a
missing or lost slot means is the snapshot mode's business (``pg.snapshot.plan_start``):
``create()`` makes it without a snapshot, ``drop()`` removes an inactive one before it is
recreated with an exported snapshot (``pg.snapshot_reader``).

``start(start_lsn)`` (blocking) emits a non-transactional logical message
``rivven.cdc.resume`` (see "Keepalives" below), opens the replication connection with
``DateStyle=ISO`` and runs ``START_REPLICATION SLOT s LOGICAL start_lsn`` with
``proto_version '1'``, ``publication_names``, ``messages 'true'``.

``await read_frames(max_frames, wait_s)`` returns the ``(data_start, payload)`` of the
XLogData frames available now — ``read_message()`` never blocks — and waits for the socket
with ``trio.lowlevel.wait_readable`` (bounded by ``wait_s``) only when none is.

``confirm(lsn)``: ``send_feedback(flush_lsn=lsn, force=True)``, the slot advance;
``may_confirm(lsn)`` says whether that is safe yet on this connection (below).

Errors: ``SlotError`` says what failed; its subclass ``SlotConnectionError`` means the
connection itself is gone or cannot be made (psycopg2's ``OperationalError`` and
``InterfaceError``: refused, the server shutting down or starting up, the walsender
terminated, a broken socket; not a statement timeout or a rolled-back transaction) — the
source reconnects after those (docs/connect-postgres.md "Reconnects") — and
``SlotActiveError`` that the slot is still in use. Anything else (a missing slot, a check
that fails) is not retried. ``slot_error`` sorts psycopg2's errors so, for this module and
``pg.snapshot_reader`` (whose incremental chunk reads lose their connection too). The replication connection asks for TCP
keepalives and a ``tcp_user_timeout``, so a silent network drop also ends in an error
(within about ``replication_dead_peer_s``) instead of a wait forever.

Shutdowns: a "fast" or "smart" shutdown of Postgres waits until each walsender's client
has confirmed all WAL sent, the shutdown checkpoint included — which this client never
does (it confirms ``end_lsn - 1``, below). The source therefore watches its ordinary
connections (the retained-WAL read, every few seconds): refused with "the database system
is shutting down", it closes the replication connection itself, and the shutdown goes on.

Keepalives
----------
psycopg2 answers the server's keepalives itself and *moves its flush LSN to the keepalive's
``wal_end``* whenever the last flush LSN we gave is at or past the start of the last data
message received (measured: after ``send_feedback(flush_lsn=end_lsn)`` of the last
transaction, an idle stream with unpublished writes moves ``confirmed_flush_lsn`` to the
server's WAL end). That is safe for the data — nothing published lies in between — but it
puts the slot ahead of the stored offset, and then a restart cannot tell it from a slot
advanced by hand past undelivered changes. The source therefore confirms ``end_lsn - 1``
(Postgres resumes from the LSN we ask for, and a transaction whose commit record starts
below the start point is never resent, so ``end_lsn - 1`` loses and repeats nothing), and
``start`` emits the ``rivven.cdc.resume`` message — and flushes it, with a commit under
``synchronous_commit = on`` — before ``START_REPLICATION``, so the first data frame comes
before any keepalive that could carry a ``wal_end`` past the stored offset (the walsender
pings when it must wait for WAL beyond the flush point it knows, i.e. only after it
decoded the flushed marker; measured: without the flush, an idle restart moved the slot
past the stored offset). With both, psycopg2 never forwards, and ``confirmed_flush_lsn``
stays at or below the stored offset. (Relation messages arrive with ``data_start`` 0; a
keepalive right after one, in the middle of a transaction, would let psycopg2 forward —
the walsender pings there only after ``wal_sender_timeout / 2`` without a status update,
and psycopg2 sends one every ``status_interval``: keep that well below it.) With only
unpublished writes the slot would retain WAL until the next published transaction; the
source's heartbeats (``emit_heartbeat``: a flushed marker, committed as a position-only
offset, then confirmed at its LSN - 1, below the marker's own ``data_start``, so psycopg2
still never forwards) let it follow.

Restart points
--------------
Confirming moves ``confirmed_flush_lsn``, but the WAL Postgres keeps for a slot ends at its
``restart_lsn``, which moves only when the walsender decodes a *running-transactions* record
(and then to a point before the transactions it lists, once the client confirmed past it).
Postgres writes one at each checkpoint and, from the background writer, at most every 15 s:
under heavy writes the slot kept 15-40 s of WAL whatever we confirmed (hundreds of MB at
tens of MB/s). So each heartbeat marker is preceded by one (``restart_points``, on by
default), on the marker's connection: ``pg_log_standby_snapshot()`` on Postgres 16 and
later; on 15 (and where that function is refused) a temporary logical slot is created and
dropped, because creating a logical slot first logs a running-transactions record; its wait
for a consistent point (for transactions open then to end) is cut by a statement timeout of
``restart_point_timeout_ms``, after which the record is still there. The walsender decodes
the record before the marker, so the marker's own confirm lets ``restart_lsn`` move up to
it: the slot keeps about one heartbeat interval of WAL plus the time a heartbeat takes to
come back confirmed. A refusal (no privilege, every slot in ``max_replication_slots`` taken)
is logged once and the heartbeats go on without restart points until one succeeds again.

After a reconnect, nothing is confirmed before the first data frame of the new connection
arrives: psycopg2 forwards whenever our explicit flush LSN is at or past the ``data_start``
of the last data message, and with none received yet that is always true.
``may_confirm(lsn)`` is true only when the last frame read on this connection starts after
``lsn``; the source keeps a confirm it may not send yet and sends it after a later read.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Sequence

import attrs
import psycopg2
import psycopg2.errors
import psycopg2.extensions
import psycopg2.extras
from psycopg2 import sql
from psycopg2.extensions import QueryCanceledError, TransactionRollbackError
import trio

from .pgoutput import format_lsn, parse_lsn

__all__ = ["HEARTBEAT_MESSAGE_PREFIX", "PgConnectConfig", "RESUME_MESSAGE_PREFIX",
           "SIGNAL_MESSAGE_PREFIX", "ReplicationSlot", "SlotActiveError", "SlotConnectionError",
           "SlotError", "SlotInfo", "parse_table_name", "slot_error"]

_log = logging.getLogger(__name__)

#: The prefix of the non-transactional message ``start`` emits (the source drops it).
RESUME_MESSAGE_PREFIX = "rivven.cdc.resume"
#: The prefix of the heartbeat marker ``emit_heartbeat`` writes (the source turns ours into a
#: position-only record; docs/connect-postgres.md "Idle and heartbeats").
HEARTBEAT_MESSAGE_PREFIX = "rivven.cdc.heartbeat"
#: The prefix of signals sent as transactional logical messages (``add_to_publication``
#: sends one; users may too: docs/connect-postgres.md "Incremental snapshots").
SIGNAL_MESSAGE_PREFIX = "rivven.cdc.signal"
#: Bounds of the blocking calls.
connect_timeout_s = 10
statement_timeout_ms = 60_000
#: How long a restart point's temporary slot may wait for a consistent point ("Restart points").
restart_point_timeout_ms = 1000
#: Frames one ``read_frames`` returns at most.
frames_per_read_max = 10_000
#: The replication connection's TCP keepalives (idle, interval, probes) and libpq's
#: ``tcp_user_timeout``: a peer gone silent is an error after about this long.
replication_keepalive_idle_s, replication_keepalive_interval_s = 10, 5
replication_keepalive_count = 3
replication_dead_peer_s = 30

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")


class SlotError(Exception):
    """A start check failed or the connection to Postgres did (the message says which)."""


class SlotConnectionError(SlotError):
    """The connection to Postgres is gone or cannot be made (the source reconnects)."""

    @property
    def shutting_down(self) -> bool:
        """The server refused a connection because it is shutting down (libpq's message;
        an untranslated server, ``lc_messages`` C or English, says so)."""
        return "the database system is shutting down" in str(self)


class SlotActiveError(SlotError):
    """The slot is in use by another connection (maybe our own previous process, whose
    walsender has not noticed its death yet: the source retries for a while)."""


def slot_error(message: str, error: Exception) -> SlotError:
    """``message`` and psycopg2's ``error`` as the ``SlotError`` subclass it means. A
    statement timeout or a rolled-back transaction is an ``OperationalError`` to psycopg2
    but says nothing about the connection: a plain ``SlotError``."""
    text = f"{message}: {str(error).strip()}"
    if isinstance(error, psycopg2.errors.ObjectInUse) or getattr(
            error, "pgcode", None) == "55006":  # object_in_use: the slot is active
        return SlotActiveError(text)
    if connection_lost(error):
        return SlotConnectionError(text)
    return SlotError(text)


def connection_lost(error: Exception) -> bool:
    """Whether psycopg2's ``error`` means the connection is gone or could not be made (worth
    reconnecting), not that a statement failed on a live one. A statement timeout or a
    rolled-back transaction is an ``OperationalError`` to psycopg2 but says nothing about
    the connection."""
    return isinstance(error, (psycopg2.OperationalError, psycopg2.InterfaceError)) and not \
        isinstance(error, (QueryCanceledError, TransactionRollbackError))


def parse_table_name(text: str) -> tuple[str, str] | None:
    """``schema.table`` or ``table`` (schema ``public``) of plain identifiers; None if not."""
    parts = text.split(".")
    if len(parts) == 1:
        parts = ["public", parts[0]]
    if len(parts) != 2 or not all(_IDENTIFIER.fullmatch(part) for part in parts):
        return None
    return parts[0], parts[1]


@attrs.frozen
class PgConnectConfig:
    host: str
    port: int
    database: str
    user: str
    password: str | None = attrs.field(default=None, repr=False)

    def connect(self, **extra: Any) -> Any:
        """A psycopg2 connection (blocking). Raises ``SlotError`` (``SlotConnectionError``
        when the server cannot be reached)."""
        try:
            return psycopg2.connect(
                host=self.host, port=self.port, dbname=self.database, user=self.user,
                password=self.password, connect_timeout=connect_timeout_s,
                application_name="rivven-connect", **extra)
        except psycopg2.Error as error:
            raise slot_error(f"cannot connect to postgres {self.user}@{self.host}:"
                              f"{self.port}/{self.database}", error) from error


@attrs.frozen
class SlotInfo:
    confirmed_flush_lsn: int | None
    state: str  # ok, missing or lost (the source's snapshot mode decides what follows)
    #: (schema, table) -> primary key column names (() for a FULL table without a key).
    key_columns: dict[tuple[str, str], tuple[str, ...]]
    #: Tables (configured ones, or the signal table) the existing publication lacks.
    unpublished: tuple[tuple[str, str], ...] = ()


class ReplicationSlot:
    """One slot of one database (see the module docstring). Not thread-safe: ``prepare``
    and ``start`` run in a worker thread before any ``read_frames``/``confirm``."""

    def __init__(self, config: PgConnectConfig, slot_name: str, publication_name: str,
                 tables: Sequence[tuple[str, str]], *, status_interval_s: float = 10.0,
                 signal_table: tuple[str, str] | None = None,
                 restart_points: bool = True) -> None:
        assert _IDENTIFIER.fullmatch(slot_name) and _IDENTIFIER.fullmatch(publication_name)
        assert tables and signal_table not in tables
        self.config = config
        self.slot_name, self.publication_name = slot_name, publication_name
        self.tables = tuple(tables)
        self.signal_table = signal_table
        #: What the publication must hold: the tables, then the signal table.
        self.published = self.tables + ((signal_table,) if signal_table else ())
        self.status_interval_s = status_interval_s
        #: Log a running-transactions record after each heartbeat ("Restart points").
        self.restart_points = restart_points
        self.restart_points_logged = 0
        self._restart_point_refused = False  # (a refusal is logged once until one succeeds)
        self._connection: Any = None
        self._cursor: Any = None
        #: The ``data_start`` of the last frame read on this connection (None: none yet).
        self.last_data_start: int | None = None

    # --- start (blocking) ---------------------------------------------------------------------
    def prepare(self) -> SlotInfo:
        """The start checks (module docstring). Blocking; raises ``SlotError``."""
        connection = self.config.connect()
        connection.autocommit = True
        try:
            with connection.cursor() as cursor:
                cursor.execute(f"SET statement_timeout = {statement_timeout_ms}")
                self._check_server(cursor)
                keys = {table: self._check_table(cursor, table) for table in self.published}
                unpublished = self._ensure_publication(cursor)
                confirmed, state = self._inspect_slot(cursor)
            return SlotInfo(confirmed, state, keys, unpublished)
        except psycopg2.Error as error:
            raise slot_error("postgres", error) from error
        finally:
            connection.close()

    @staticmethod
    def _check_server(cursor: Any) -> None:
        cursor.execute("SHOW wal_level")
        (wal_level,) = cursor.fetchone()
        if wal_level != "logical":
            raise SlotError(f"wal_level is {wal_level!r}; logical decoding needs "
                            f"wal_level = logical (postgresql.conf, then restart Postgres)")
        cursor.execute("SHOW server_encoding")
        (encoding,) = cursor.fetchone()
        if encoding != "UTF8":
            raise SlotError(f"server_encoding is {encoding!r}; only UTF8 is supported")

    @staticmethod
    def _check_table(cursor: Any, table: tuple[str, str]) -> tuple[str, ...]:
        schema, name = table
        cursor.execute(
            "SELECT c.oid, c.relreplident FROM pg_class c JOIN pg_namespace n ON "
            "n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s AND "
            "c.relkind IN ('r', 'p')", (schema, name))
        row = cursor.fetchone()
        if row is None:
            raise SlotError(f"table {schema}.{name} does not exist")
        oid, identity = row
        cursor.execute(
            "SELECT a.attname FROM pg_index i JOIN LATERAL unnest(i.indkey) WITH ORDINALITY "
            "AS k(attnum, n) ON true JOIN pg_attribute a ON a.attrelid = i.indrelid AND "
            "a.attnum = k.attnum WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.n",
            (oid,))
        key = tuple(column for (column,) in cursor.fetchall())
        if identity == "f":
            return key
        if identity == "d" and key:
            return key
        what = {"d": "has no primary key", "n": "has REPLICA IDENTITY NOTHING",
                "i": "has REPLICA IDENTITY USING INDEX"}.get(identity, f"identity {identity}")
        raise SlotError(f"table {schema}.{name} {what}: give it a primary key or "
                        f"ALTER TABLE {schema}.{name} REPLICA IDENTITY FULL")

    def _ensure_publication(self, cursor: Any) -> tuple[tuple[str, str], ...]:
        """Create the publication if missing; the tables an existing one lacks."""
        cursor.execute("SELECT 1 FROM pg_publication WHERE pubname = %s",
                       (self.publication_name,))
        if cursor.fetchone() is None:
            cursor.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                sql.Identifier(self.publication_name),
                sql.SQL(", ").join(sql.Identifier(schema, name)
                                   for schema, name in self.published)))
            return ()
        cursor.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE "
                       "pubname = %s", (self.publication_name,))
        published = {tuple(row) for row in cursor.fetchall()}
        return tuple(table for table in self.published if table not in published)

    def add_to_publication(self, tables: Sequence[tuple[str, str]],
                           signal: str | None) -> None:
        """``ALTER PUBLICATION ... ADD TABLE`` (the tables passed ``prepare``'s checks) and,
        in the same transaction, the transactional ``rivven.cdc.signal`` message
        ``signal`` (an ``execute-snapshot`` of them): the stream delivers the signal at the
        commit that publishes the tables, so a crash cannot separate the two. Blocking;
        raises ``SlotError``."""
        assert tables
        connection = self.config.connect()
        try:
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit = on")
                cursor.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                    sql.Identifier(self.publication_name),
                    sql.SQL(", ").join(sql.Identifier(schema, name)
                                       for schema, name in tables)))
                if signal is not None:
                    cursor.execute("SELECT pg_logical_emit_message(true, %s, %s)",
                                   (SIGNAL_MESSAGE_PREFIX, signal))
            connection.commit()
        except psycopg2.Error as error:
            raise slot_error(f"adding {', '.join(f'{s}.{t}' for s, t in tables)} to "
                              f"publication {self.publication_name} failed", error) from error
        finally:
            connection.close()

    def _inspect_slot(self, cursor: Any) -> tuple[int | None, str]:
        """The slot's ``confirmed_flush_lsn`` and state: ``ok``, ``missing`` or ``lost``."""
        cursor.execute(
            "SELECT plugin, slot_type, database, active, active_pid, wal_status, "
            "confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (self.slot_name,))
        row = cursor.fetchone()
        if row is None:
            return None, "missing"
        plugin, slot_type, database, active, pid, wal_status, confirmed = row
        name = self.slot_name
        if slot_type != "logical" or plugin != "pgoutput":
            raise SlotError(f"replication slot {name} uses {slot_type}/{plugin}, not "
                            f"logical/pgoutput")
        if database != self.config.database:
            raise SlotError(f"replication slot {name} belongs to database {database}")
        if active:
            raise SlotActiveError(f"replication slot {name} is active (pid {pid}): another "
                            f"consumer reads it")
        if wal_status == "lost":
            return None, "lost"
        return (None if confirmed is None else parse_lsn(confirmed)), "ok"

    def create(self) -> int:
        """Create the slot without a snapshot (mode ``never``); its LSN. Raises
        ``SlotError``."""
        return parse_lsn(self._run("SELECT lsn::text FROM pg_create_logical_replication_slot("
                                   "%s, 'pgoutput')", (self.slot_name,)))

    def drop(self) -> None:
        """Drop the (inactive) slot, to recreate it with an exported snapshot. Raises
        ``SlotError``."""
        self._run("SELECT pg_drop_replication_slot(slot_name)::text FROM pg_replication_slots "
                  "WHERE slot_name = %s AND NOT active", (self.slot_name,))

    def retained_wal_bytes(self) -> int | None:
        """``pg_current_wal_lsn() - restart_lsn`` of the slot: the WAL Postgres keeps for it
        (None when the slot is missing or has no restart LSN). On an ordinary connection,
        never the replication one. Blocking; raises ``SlotError``."""
        value = self._run("SELECT (pg_current_wal_lsn() - restart_lsn)::bigint FROM "
                          "pg_replication_slots WHERE slot_name = %s", (self.slot_name,))
        return None if value is None else int(value)

    def _run(self, query: str, arguments: tuple) -> Any:
        connection = self.config.connect()
        connection.autocommit = True
        try:
            with connection.cursor() as cursor:
                cursor.execute(query, arguments)
                row = cursor.fetchone()
                return None if row is None else row[0]
        except psycopg2.Error as error:
            raise slot_error("postgres", error) from error
        finally:
            connection.close()

    def start(self, start_lsn: int) -> None:
        """Emit the resume message, open the replication connection and start streaming at
        ``start_lsn`` (0: the slot's ``confirmed_flush_lsn``). Blocking; raises
        ``SlotError`` (``SlotConnectionError``, ``SlotActiveError``: worth retrying)."""
        assert self._connection is None, "start on a started slot"
        self._emit_marker(RESUME_MESSAGE_PREFIX, None)
        connection = self.config.connect(
            connection_factory=psycopg2.extras.LogicalReplicationConnection,
            options="-c DateStyle=ISO,MDY -c extra_float_digits=3",
            keepalives=1, keepalives_idle=replication_keepalive_idle_s,
            keepalives_interval=replication_keepalive_interval_s,
            keepalives_count=replication_keepalive_count,
            tcp_user_timeout=replication_dead_peer_s * 1000)
        try:
            cursor = connection.cursor()
            cursor.start_replication(
                slot_name=self.slot_name, decode=False, start_lsn=format_lsn(start_lsn),
                status_interval=self.status_interval_s,
                options={"proto_version": "1", "publication_names": self.publication_name,
                         "messages": "true"})
        except psycopg2.Error as error:
            connection.close()
            raise slot_error(f"START_REPLICATION of {self.slot_name} failed",
                              error) from error
        self._connection, self._cursor = connection, cursor
        self.last_data_start = None

    def _emit_marker(self, prefix: str, unless_wal_at: int | None, *,
                     restart_point: bool = False) -> int | None:
        """A flushed non-transactional logical message ``prefix`` with our slot name as
        content (the server decodes only flushed WAL: a commit under ``synchronous_commit =
        on`` flushes it). With ``unless_wal_at``: nothing when the server's WAL insert
        position is still there. With ``restart_point``: a restart point first ("Restart
        points"). Returns the insert position after the marker (None: none written).
        Blocking; raises ``SlotError``."""
        try:
            marker = self.config.connect()
        except psycopg2.Error as error:
            raise slot_error("postgres", error) from error
        try:
            marker.autocommit = True
            with marker.cursor() as cursor:
                if unless_wal_at is not None:
                    cursor.execute("SELECT pg_current_wal_insert_lsn()::text")
                    if parse_lsn(cursor.fetchone()[0]) == unless_wal_at:
                        return None
                if restart_point:
                    self._restart_point(marker, cursor)
            marker.autocommit = False
            with marker.cursor() as cursor:
                cursor.execute("SET synchronous_commit = on")
                cursor.execute("SELECT pg_logical_emit_message(false, %s, %s)",
                               (prefix, self.slot_name))
                cursor.execute("SELECT txid_current()")  # a commit record, flushed
            marker.commit()
            with marker.cursor() as cursor:
                cursor.execute("SELECT pg_current_wal_insert_lsn()::text")
                return parse_lsn(cursor.fetchone()[0])
        except psycopg2.Error as error:
            raise slot_error("postgres", error) from error
        finally:
            marker.close()

    def emit_heartbeat(self, unless_wal_at: int | None) -> int | None:
        """Write the ``rivven.cdc.heartbeat`` marker (flushed), unless the WAL insert
        position is still ``unless_wal_at`` (nothing happened since the last one), after a
        restart point (with ``restart_points``; module docstring). Returns the insert
        position after the marker, or None. Blocking; raises ``SlotError``."""
        return self._emit_marker(HEARTBEAT_MESSAGE_PREFIX, unless_wal_at,
                                 restart_point=self.restart_points)

    def log_restart_point(self) -> bool:
        """Have Postgres write a running-transactions record now ("Restart points"). Returns
        whether it did; a refusal is logged (once until one succeeds again). Blocking; raises
        ``SlotError`` when Postgres cannot be reached."""
        try:
            connection = self.config.connect()
        except psycopg2.Error as error:
            raise slot_error("postgres", error) from error
        connection.autocommit = True
        try:
            with connection.cursor() as cursor:
                return self._restart_point(connection, cursor)
        except psycopg2.Error as error:
            raise slot_error("postgres", error) from error
        finally:
            connection.close()

    def _restart_point(self, connection: Any, cursor: Any) -> bool:
        """``log_restart_point`` on an open autocommit ``connection``; leaves its statement
        timeout as it was. Raises psycopg2's error only when the connection is lost."""
        try:
            if connection.server_version >= 160000 and self._log_standby_snapshot(cursor):
                return self._restart_point_logged()
            cursor.execute(f"SET statement_timeout = {restart_point_timeout_ms}")
            try:
                name = f"rivven_rp_{self.slot_name}"[:63]
                try:
                    cursor.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', "
                                   "true)", (name,))
                except QueryCanceledError:
                    return self._restart_point_logged()  # (written before the wait)
                cursor.execute("SELECT pg_drop_replication_slot(%s)", (name,))
                return self._restart_point_logged()
            finally:
                cursor.execute("RESET statement_timeout")
        except psycopg2.Error as error:
            if connection_lost(error) and getattr(error, "pgcode", None) is None:
                raise  # (the server said nothing: the connection is gone)
            if not self._restart_point_refused:
                _log.warning("postgres-cdc %s: no restart point (the slot keeps WAL until "
                             "Postgres logs running transactions itself): %s",
                             self.slot_name, str(error).strip())
            self._restart_point_refused = True
            return False

    @staticmethod
    def _log_standby_snapshot(cursor: Any) -> bool:
        try:
            cursor.execute("SELECT pg_log_standby_snapshot()")
            return True
        except psycopg2.errors.InsufficientPrivilege:
            return False

    def _restart_point_logged(self) -> bool:
        self.restart_points_logged += 1
        self._restart_point_refused = False
        return True

    # --- streaming (trio) ---------------------------------------------------------------------
    async def read_frames(self, max_frames: int, wait_s: float) -> list[tuple[int, bytes]]:
        """The XLogData frames available now, at most ``max_frames``; if none, waits up to
        ``wait_s`` for the socket and reads again. Raises ``SlotConnectionError`` when the
        connection is lost, ``SlotError`` for another error of the stream. A checkpoint."""
        assert self._cursor is not None and 0 < max_frames <= frames_per_read_max
        frames = self._read_now(max_frames)
        if frames:
            await trio.lowlevel.checkpoint()
            return frames
        with trio.move_on_after(wait_s):
            await trio.lowlevel.wait_readable(self._cursor.fileno())
        return self._read_now(max_frames)

    def _read_now(self, max_frames: int) -> list[tuple[int, bytes]]:
        frames = []
        try:
            while len(frames) < max_frames:
                message = self._cursor.read_message()
                if message is None:
                    break
                frames.append((message.data_start, bytes(message.payload)))
        except psycopg2.Error as error:
            raise slot_error(f"replication stream of {self.slot_name} failed",
                              error) from error
        if frames:
            self.last_data_start = frames[-1][0]
        return frames

    def confirm(self, flush_lsn: int) -> None:
        """Tell the server everything below ``flush_lsn`` is safe (the slot advance).
        Only when ``may_confirm(flush_lsn)``. Raises ``SlotError`` (``SlotConnectionError``:
        the connection is gone)."""
        assert self._cursor is not None and flush_lsn >= 0 and self.may_confirm(flush_lsn)
        try:
            self._cursor.send_feedback(flush_lsn=flush_lsn, force=True)
        except psycopg2.Error as error:
            raise slot_error(f"confirming {format_lsn(flush_lsn)} on {self.slot_name} "
                              f"failed", error) from error

    def may_confirm(self, flush_lsn: int) -> bool:
        """Whether confirming ``flush_lsn`` now keeps psycopg2 from forwarding the slot to a
        keepalive's ``wal_end``: the last frame read on this connection starts after it
        (module docstring, "Keepalives")."""
        return (self._cursor is not None and self.last_data_start is not None
                and self.last_data_start > flush_lsn)

    @property
    def started(self) -> bool:
        return self._cursor is not None

    def close(self) -> None:
        """Close the replication connection (the slot stays). From the trio thread."""
        if self._connection is None:
            return
        try:
            trio.lowlevel.notify_closing(self._connection.fileno())
        except (RuntimeError, psycopg2.Error):
            pass  # outside trio, or the connection is already gone: nothing waits on it
        self._connection.close()
        self._connection = self._cursor = None
