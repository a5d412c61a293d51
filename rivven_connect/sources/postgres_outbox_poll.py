"""``postgres-outbox-poll``: the transactional outbox polled from a table, for databases
without logical decoding (docs/connect-postgres.md "Polling outbox").

Theory of operation
-------------------
A thin trio driver of ``pg.outbox_table.OutboxTable`` (the SQL, in worker threads) and the
pure ``pg.outbox_poll.OutboxPoller`` (records, positions, which ids wait for their side
effect); the batch cycle owns the exactly-once order:

- ``resume(position)`` keeps the stored position (checked at the first call that does I/O);
- ``poll(max_records)`` takes up to ``min(max_records, batch_size)`` pending rows, ordered by
  ``order_column``, ``FOR UPDATE SKIP LOCKED``, leaving them locked; none: it waits
  ``poll_interval_ms`` and looks again. Each row is one record: value = the row (typed as
  CDC types it), key = the id, ``op`` ``c``. With ``transforms: [{type: EventRouter}]``
  it becomes the event, routed like CDC's outbox (``outbox.event.{aggregatetype}``, key
  ``aggregateid``, value ``payload``, header ``id``), through admission and the DLQ;
- ``side_effect(position)`` — after the broker commit, and first thing after a restart for
  the stored position — deletes the batch's rows (``delete_after_read``, the default) or
  sets ``processed_column`` to true, by the ids the position carries, and commits.

A lost connection (``OutboxConnectionError``: Postgres restarted, the backend terminated,
the network gone) is retried, as the CDC source retries its replication connection: one
``pg.reconnect.ReconnectBudget`` per outage, the shared backoff before each attempt, and
after ``reconnect_attempts_max`` attempts or ``reconnect_timeout_ms`` of outage the call
fails with ``SourceError`` (a poll then stops the source; a side effect is retried by the
batch cycle, never skipped). A poll whose connection went has no locks left, which is safe:
the rows it returned are deleted by their ids, and the next poll excludes them until then.
The checks at start are not retried (a configuration that cannot connect fails at once).

Options: ``host``, ``port`` (5432), ``database``, ``user``, ``password``, ``table``
(``public.outbox``), ``id_column`` (``id``; unique on its own), ``order_column``
(= ``id_column``), ``delete_after_read`` (true unless ``processed_column`` is given),
``processed_column`` (a bool column: mark instead of delete), ``poll_interval_ms`` (1000),
``batch_size`` (100, at most 2,000), ``reconnect_attempts_max`` (20; 0: never),
``reconnect_timeout_ms`` (300,000).
"""

from __future__ import annotations

import logging
import random
from typing import Any, Callable, Mapping, TypeVar

import trio

from rivven_connect.core.records import Record
from rivven_connect.http_api import Metric
from rivven_connect.pg.outbox_poll import POLL_ROWS_MAX, OutboxPoller, OutboxPosition
from rivven_connect.pg.outbox_table import OutboxConnectionError, OutboxTable, OutboxTableError
from rivven_connect.pg.reconnect import (
    ReconnectBudget, reconnect_attempts_max_default, reconnect_timeout_ms_default,
)
from rivven_connect.pg.slot import PgConnectConfig, parse_table_name

__all__ = ["PostgresOutboxPollSource"]

_log = logging.getLogger("rivven_connect.postgres_outbox_poll")
T = TypeVar("T")

batch_size_default = 100
poll_interval_ms_default = 1000


class PostgresOutboxPollSource:
    def __init__(self, table: OutboxTable, *, batch_size: int = batch_size_default,
                 poll_interval_ms: int = poll_interval_ms_default,
                 reconnect_attempts_max: int = reconnect_attempts_max_default,
                 reconnect_timeout_ms: int = reconnect_timeout_ms_default,
                 jitter: Callable[[], float] | None = None) -> None:
        assert 0 < batch_size <= POLL_ROWS_MAX and poll_interval_ms > 0
        self.table = table
        self.batch_size, self.poll_interval_ms = batch_size, poll_interval_ms
        self.reconnect_attempts_max = reconnect_attempts_max
        self.reconnect_timeout_ms = reconnect_timeout_ms
        self.jitter = jitter if jitter is not None else random.Random().random
        self.poller = OutboxPoller()
        self.stored: Any = None
        self._started = False
        self.deleted_rows = 0  # rows deleted (or marked) by side effects: for tests and logs
        self.reconnects = 0  # outages ended by a call that worked again
        self.reconnect_failures = 0  # attempts that found the connection still gone

    @classmethod
    def from_config(cls, raw: Mapping[str, Any], path: str) -> PostgresOutboxPollSource:
        """Checks the ``config`` block (``ConnectConfigError`` naming the option)."""
        from rivven_connect.core.config import ConnectConfigError
        from rivven_connect.sources import Options
        from rivven_connect.sources.postgres_cdc_config import (
            reconnect_attempts_max_max, reconnect_timeout_ms_max,
        )

        options = Options(raw, path, (
            "host", "port", "database", "user", "password", "table", "id_column",
            "order_column", "delete_after_read", "processed_column", "poll_interval_ms",
            "batch_size", "reconnect_attempts_max", "reconnect_timeout_ms"))
        port = options.int("port", 5432, 1, 65535)
        password = raw.get("password")
        if password is not None and not isinstance(password, str):
            raise ConnectConfigError(f"{path}.password", "must be a string")
        table_text = raw.get("table", "public.outbox")
        table = parse_table_name(table_text) if isinstance(table_text, str) else None
        if table is None:
            raise ConnectConfigError(f"{path}.table", f"{table_text!r} is not schema.table "
                                                      f"(plain identifiers)")
        columns = {}
        for key, default in (("id_column", "id"), ("order_column", None),
                             ("processed_column", None)):
            value = raw.get(key, default)
            if value is not None and (not isinstance(value, str)
                                      or parse_table_name(value) != ("public", value)):
                raise ConnectConfigError(f"{path}.{key}", f"{value!r} is not a plain column "
                                                          f"name")
            columns[key] = value
        processed = columns["processed_column"]
        delete = options.bool("delete_after_read", processed is None)
        if delete == (processed is not None):
            raise ConnectConfigError(
                f"{path}.delete_after_read", "delivered rows are either deleted "
                "(delete_after_read: true) or marked (processed_column: a bool column), "
                "exactly one of the two")
        interval = options.int("poll_interval_ms", poll_interval_ms_default, 10, 60_000)
        batch_size = options.int("batch_size", batch_size_default, 1, POLL_ROWS_MAX)
        attempts = options.int("reconnect_attempts_max", reconnect_attempts_max_default, 0,
                               reconnect_attempts_max_max)
        outage_ms = options.int("reconnect_timeout_ms", reconnect_timeout_ms_default, 1000,
                                reconnect_timeout_ms_max)
        assert port is not None and interval is not None and batch_size is not None
        assert attempts is not None and outage_ms is not None
        config = PgConnectConfig(options.string("host"), port, options.string("database"),
                                 options.string("user"), password)
        outbox = OutboxTable(config, table, id_column=columns["id_column"],
                             order_column=columns["order_column"] or columns["id_column"],
                             processed_column=processed)
        return cls(outbox, batch_size=batch_size, poll_interval_ms=interval,
                   reconnect_attempts_max=attempts, reconnect_timeout_ms=outage_ms)

    # --- the Source protocol ------------------------------------------------------------------
    def resume(self, position: Any) -> None:
        self.stored = position  # checked by the first call that does I/O

    async def _start(self) -> None:
        from rivven_connect.sources import SourceError

        if self._started:
            return
        try:
            self.poller.resume(self.stored)
        except ValueError as error:
            raise SourceError(f"postgres-outbox-poll: {error}") from None
        await trio.to_thread.run_sync(self.table.describe)
        self._started = True

    async def poll(self, max_records: int) -> list[Record]:
        """The next pending rows as records (waits for some). Raises ``SourceError``. A
        checkpoint."""
        from rivven_connect.sources import SourceError

        wanted = min(max_records, self.batch_size)
        try:
            await self._start()
            while True:
                exclude = self.poller.exclude_ids()
                rows = await self._reconnecting(lambda: self.table.poll(wanted, exclude))
                if rows:
                    assert self.table.shape is not None
                    try:
                        return self.poller.records(self.table.shape, rows)
                    except ValueError:
                        await trio.to_thread.run_sync(self.table.release)
                        raise
                await trio.sleep(self.poll_interval_ms / 1000)
        except (OutboxTableError, ValueError) as error:
            raise SourceError(f"postgres-outbox-poll {self._name()}: {error}") from error

    async def side_effect(self, position: Any) -> None:
        """Delete (or mark) the rows of the committed batch ending at ``position`` and
        commit. Idempotent. Raises ``SourceError`` (the cycle retries). A checkpoint."""
        from rivven_connect.sources import SourceError

        try:
            await self._start()
            ids = self.poller.side_effect_ids(position)
            changed = await self._reconnecting(lambda: self.table.finish(ids))
        except (OutboxTableError, ValueError) as error:
            raise SourceError(f"postgres-outbox-poll {self._name()}: {error}") from error
        self.poller.side_effect_done(position)
        self.deleted_rows += changed

    async def _reconnecting(self, call: Callable[[], T]) -> T:
        """``call()`` in a worker thread, again after a lost connection, with backoff, until
        it works or the outage's budget is spent (then ``OutboxConnectionError``)."""
        outage: ReconnectBudget | None = None
        while True:
            try:
                result = await trio.to_thread.run_sync(call)
            except OutboxConnectionError as error:
                now_ms = round(trio.current_time() * 1000)
                if outage is None:
                    _log.warning("postgres-outbox-poll %s: the connection was lost (%s); "
                                 "reconnecting", self._name(), error)
                    outage = ReconnectBudget(self.reconnect_attempts_max,
                                             self.reconnect_timeout_ms, now_ms)
                else:
                    self.reconnect_failures += 1
                delay_ms = outage.next_delay_ms(now_ms, self.jitter())
                if delay_ms is None:
                    raise OutboxConnectionError(
                        f"the connection could not be re-established: "
                        f"{outage.describe(now_ms)}; last error: {error}") from error
                await trio.sleep(delay_ms / 1000)
                continue
            if outage is not None:
                self.reconnects += 1
                _log.warning("postgres-outbox-poll %s: reconnected after %s", self._name(),
                             outage.describe(round(trio.current_time() * 1000)))
            return result

    def metrics(self) -> list[Metric]:
        return [Metric("outbox_poll_reconnects", "counter",
                       "Connections to Postgres re-established after one was lost.",
                       self.reconnects),
                Metric("outbox_poll_reconnect_failures", "counter",
                       "Reconnect attempts that failed (a poll stops the source when an "
                       "outage outlasts reconnect_attempts_max or reconnect_timeout_ms).",
                       self.reconnect_failures)]

    def position_key(self, position: Any) -> tuple[int, int]:
        """``(poll, n)``. Raises ``ValueError`` for what is not a position."""
        return OutboxPosition.from_json(position).key()

    def close(self) -> None:
        self.table.close()

    def _name(self) -> str:
        return ".".join(self.table.table)
