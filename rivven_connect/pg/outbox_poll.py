"""The polling outbox, pure: outbox rows -> records, and the positions that make the deferred
DELETE (or mark) of delivered rows exactly-once (docs/connect-postgres.md "Polling outbox").

Theory of operation
-------------------
For databases without logical decoding the ``postgres-outbox-poll`` source reads the outbox
table itself: ``SELECT ... ORDER BY order_column LIMIT n FOR UPDATE SKIP LOCKED`` on an
ordinary connection (``pg.outbox_table``), the rows' text typed exactly as CDC types them
(``values.decode_text``), so the ``EventRouter`` transform routes them like CDC outbox rows.
The rows leave the table (``DELETE``, or ``UPDATE ... SET processed_column = true``) only in
the source's side effect, i.e. after the broker committed the batch and its offset record.

Positions: each poll that returns rows is one batch, numbered ``poll`` (0, 1, 2, ... across
restarts: the stored position's ``poll`` + 1 comes next); its records get ``n`` 0, 1, ...
and the **last** one also carries ``ids``, the id-column text of *every* row of the batch.
The batch cycle commits the batch's last position with the batch, so the offsets topic
always names exactly the rows the last committed batch delivered. Hence:

- a crash before the broker commit: the batch's transaction aborts (invisible to
  ``read_committed``), Postgres rolls back the poll's row locks, and the rows are polled
  again after the restart: nothing lost;
- a crash between the broker commit and the ``DELETE``: the stored position holds the ids;
  the cycle's first step after the restart is the side effect of the stored position, which
  deletes exactly those rows, before any poll: nothing twice. As a second line,
  ``exclude_ids`` keeps the ids of the last batch out of polls until its side effect
  succeeded (or the next batch is polled, which the cycle never does before that).

Nothing is filtered by "id greater than the last one": ids from a sequence are not committed
in order (a transaction holding id 5 may commit after id 6 was delivered), and a row that
shows up late with a lower id is simply in a later batch.

The side effect is idempotent (deleting or marking rows already gone or marked does
nothing), as the cycle requires. Bounds: ``POLL_ROWS_MAX`` rows per batch (the ids ride in
the offset record: 2,000 uuids are ~80 KB).
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs

from rivven_connect.core.records import Record

from .values import decode_text

__all__ = ["POLL_ROWS_MAX", "OutboxPoller", "OutboxPosition", "OutboxTableShape"]

#: The most rows one poll takes (the batch's ids are stored in its offset record).
POLL_ROWS_MAX = 2_000


@attrs.frozen
class OutboxPosition:
    """Record ``n`` of batch ``poll``; ``ids`` (the id text of every row of the batch) only
    on the batch's last record."""

    poll: int
    n: int
    ids: tuple[str, ...] | None = None

    def __attrs_post_init__(self) -> None:
        assert self.poll >= 0 and self.n >= 0
        assert self.ids is None or 0 < len(self.ids) <= POLL_ROWS_MAX

    def key(self) -> tuple[int, int]:
        return self.poll, self.n

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"poll": self.poll, "n": self.n, "last": self.ids is not None}
        if self.ids is not None:
            out["ids"] = list(self.ids)
        return out

    @classmethod
    def from_json(cls, raw: Any) -> OutboxPosition:
        """Raises ``ValueError`` for what is not a polling-outbox position."""
        if not isinstance(raw, dict):
            raise ValueError(f"not a postgres-outbox-poll position: {raw!r}")
        poll, n, ids = raw.get("poll"), raw.get("n"), raw.get("ids")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (poll, n)):
            raise ValueError(f"not a postgres-outbox-poll position: {raw!r}")
        if ids is not None and not (isinstance(ids, list) and 0 < len(ids) <= POLL_ROWS_MAX
                                    and all(isinstance(i, str) for i in ids)):
            raise ValueError(f"a postgres-outbox-poll position with bad ids: {raw!r}")
        if (ids is not None) != (raw.get("last") is True):
            raise ValueError(f"a postgres-outbox-poll position's ids must be on (and only on) "
                             f"a batch's last record: {raw!r}")
        return cls(poll, n, None if ids is None else tuple(ids))


@attrs.frozen
class OutboxTableShape:
    """What the poller needs of the table: its columns (name, type oid) in the order the
    driver selects them, and which one is the id."""

    schema: str
    name: str
    columns: tuple[tuple[str, int], ...]
    id_column: str

    def __attrs_post_init__(self) -> None:
        assert self.id_column in self.column_names, (self.id_column, self.columns)

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(name for name, _oid in self.columns)

    @property
    def id_index(self) -> int:
        return self.column_names.index(self.id_column)


class OutboxPoller:
    """Numbers batches and remembers which delivered rows still wait for their side effect.
    Not thread-safe; never blocks."""

    def __init__(self) -> None:
        self.next_poll = 0
        #: The ids of the last batch handed out (or stored) whose side effect has not run.
        self.pending_ids: tuple[str, ...] = ()

    def resume(self, stored: Any) -> None:
        """Continue after the stored position (None: from the start). Raises ``ValueError``
        for a stored position of another shape, or one inside a batch (the cycle only
        commits a batch's last record)."""
        if stored is None:
            return
        position = OutboxPosition.from_json(stored)
        if position.ids is None:
            raise ValueError(f"the stored position {stored!r} is not the end of a batch")
        self.next_poll = position.poll + 1
        self.pending_ids = position.ids

    def exclude_ids(self) -> tuple[str, ...]:
        """Ids a poll must not return: delivered (committed or about to be), not yet
        deleted or marked."""
        return self.pending_ids

    def records(self, shape: OutboxTableShape, rows: Sequence[Sequence[str | None]]
                ) -> list[Record]:
        """One batch: a record per row (value: the row typed as CDC types it, key: the id,
        ``op`` ``c``). Raises ``ValueError`` for a value that is not its type's text or a
        null id."""
        assert 0 < len(rows) <= POLL_ROWS_MAX
        ids = []
        for row in rows:
            assert len(row) == len(shape.columns)
            identifier = row[shape.id_index]
            if identifier is None:
                raise ValueError(f"{shape.schema}.{shape.name}: a row with a null "
                                 f"{shape.id_column}")
            ids.append(identifier)
        if len(set(ids)) != len(ids):
            raise ValueError(f"{shape.schema}.{shape.name}: {shape.id_column} is not unique "
                             f"in one poll")
        poll = self.next_poll
        records = []
        for n, row in enumerate(rows):
            value = {name: None if text is None else decode_text(oid, text)
                     for (name, oid), text in zip(shape.columns, row)}
            last = n == len(rows) - 1
            position = OutboxPosition(poll, n, tuple(ids) if last else None)
            records.append(Record(value, key=value[shape.id_column], table=shape.name,
                                  schema=shape.schema, op="c", position=position.to_json()))
        self.next_poll = poll + 1
        self.pending_ids = tuple(ids)
        return records

    @staticmethod
    def side_effect_ids(position: Any) -> tuple[str, ...]:
        """The rows to delete (or mark) for the committed ``position``. Raises
        ``ValueError`` when it is not the end of a batch."""
        parsed = OutboxPosition.from_json(position)
        if parsed.ids is None:
            raise ValueError(f"a side effect for {position!r}, which is not the end of a batch")
        return parsed.ids

    def side_effect_done(self, position: Any) -> None:
        """The rows of ``position`` are deleted (or marked) and committed in Postgres."""
        if OutboxPosition.from_json(position).ids == self.pending_ids:
            self.pending_ids = ()

    def check_invariants(self) -> None:
        assert self.next_poll >= 0
        assert len(self.pending_ids) <= POLL_ROWS_MAX
