"""Snapshots, the pure part: which start to make, snapshot positions, ``op = r`` records.

Theory of operation (docs/connect-postgres.md "Snapshots")
----------------------------------------------------------
A snapshot reads every configured table under a snapshot *exported by the creation of the
slot* (``CREATE_REPLICATION_SLOT ... EXPORT_SNAPSHOT``): a transaction is visible in that
snapshot exactly when the slot will not stream it, so reading the tables and then
streaming from the slot's ``consistent_lsn`` has no gap and no overlap. Tables are read in
the configured order, each by primary-key keyset chunks (``WHERE (pk) > (last) ORDER BY pk
LIMIT n``); each row becomes one ``r`` record whose position is a ``SnapshotPosition``:
the consistent LSN, the table and the last key read (Postgres' text of the key columns),
the number of rows emitted so far and whether it is the snapshot's last row.

``plan_start(mode, stored, slot_state)`` decides the start from the snapshot mode, the
stored position (none, a streaming position, a snapshot position mid-way or done) and the
slot's state (``ok``, ``missing``, ``lost``) — a pure table, tested alone.

Positions order as the records are produced: ``(lsn, phase, n)`` with phase 0 for the
snapshot (lsn = its consistent LSN, n = rows so far) and 1 for streaming (lsn = end LSN,
n = seq). Streamed transactions after a snapshot end past its consistent LSN, so they sort
after it; a later snapshot (``always``, ``when_needed``) has a later consistent LSN.
"""

from __future__ import annotations

from typing import Any

import attrs

from .pgoutput import format_lsn, parse_lsn

__all__ = ["ON_INTERRUPTED", "SNAPSHOT_MODES", "SnapshotPosition", "StartPlan", "plan_start",
           "position_phase", "snapshot_chunk_rows_default", "snapshot_chunk_rows_max"]

SNAPSHOT_MODES = ("never", "initial", "initial_only", "always", "when_needed")
#: After an interrupted snapshot: read the rest by incremental (DBLog) chunks while
#: streaming from its consistent LSN, stop with an error, or snapshot again from the start.
ON_INTERRUPTED = ("resume", "fail", "restart")
#: Rows one keyset query reads (the ``chunk_size`` option).
snapshot_chunk_rows_default = 1024
snapshot_chunk_rows_max = 10_000


@attrs.frozen
class SnapshotPosition:
    """Where a snapshot is: every row of the tables before ``table_index`` and the rows of
    that table up to ``last_key`` (Postgres text of the key columns) are emitted."""

    consistent_lsn: int
    table_index: int
    table: str                          # "schema.table", checked against the config
    last_key: tuple[str, ...] | None    # None: the table's first row is next
    rows: int                           # r records emitted so far in this snapshot
    done: bool                          # the snapshot's last row

    def to_json(self) -> dict[str, Any]:
        return {"phase": "snapshot", "consistent_lsn": format_lsn(self.consistent_lsn),
                "table_index": self.table_index, "table": self.table,
                "last_key": None if self.last_key is None else list(self.last_key),
                "rows": self.rows, "done": self.done}

    @classmethod
    def from_json(cls, value: Any) -> SnapshotPosition:
        """Raises ``ValueError`` for anything that is not a snapshot position."""
        try:
            assert value["phase"] == "snapshot"
            last_key = value["last_key"]
            assert last_key is None or all(isinstance(part, str) for part in last_key)
            position = cls(parse_lsn(value["consistent_lsn"]), int(value["table_index"]),
                           str(value["table"]), None if last_key is None else tuple(last_key),
                           int(value["rows"]), bool(value["done"]))
            assert position.table_index >= 0 and position.rows >= 0
            return position
        except (KeyError, TypeError, ValueError, AssertionError) as error:
            raise ValueError(f"not a snapshot position: {value!r}") from error

    def key(self) -> tuple[int, int, int]:
        return (self.consistent_lsn, 0, self.rows)


def position_phase(position: Any) -> str:
    """``snapshot`` or ``stream`` (a stored position of the streaming source has no phase)."""
    if isinstance(position, dict) and position.get("phase") == "snapshot":
        return "snapshot"
    return "stream"


@attrs.frozen
class StartPlan:
    """What the first poll does. ``action``:

    - ``stream``: start streaming at ``stream_from`` (0: the slot's position); ``create_slot``
      without a snapshot when the slot is missing (``never`` with nothing stored);
    - ``snapshot``: drop the slot if ``drop_slot``, create it exporting a snapshot
      (``temporary`` for ``initial_only``), read every table, then stream from its
      consistent LSN, or stop (``stop_after``);
    - ``resume``: an interrupted snapshot: stream from its consistent LSN (``stream_from``)
      and read the rest of its tables by incremental chunks;
    - ``stop``: nothing to do (``initial_only`` whose snapshot is done);
    - ``refuse``: stop the source with ``reason``.
    """

    action: str
    stream_from: int = 0
    create_slot: bool = False
    drop_slot: bool = False
    temporary: bool = False
    stop_after: bool = False
    reason: str = ""


def plan_start(mode: str, stored: Any, slot_state: str, on_interrupted: str = "fail"
               ) -> StartPlan:
    """The start for snapshot ``mode``, the stored position (``None`` or as stored), the
    slot's state (``ok``, ``missing`` or ``lost``) and what to do after an interrupted
    snapshot (``resume`` it by incremental chunks — ``initial`` and ``when_needed`` with
    their slot; ``when_needed`` without it snapshots again —, ``fail``, or ``restart`` it
    from scratch: the rows it sent are sent again). Raises ``ValueError`` for a stored
    snapshot position that does not parse."""
    assert mode in SNAPSHOT_MODES and slot_state in ("ok", "missing", "lost"), (mode, slot_state)
    assert on_interrupted in ON_INTERRUPTED, on_interrupted
    snapshot = StartPlan("snapshot", drop_slot=slot_state != "missing")
    interrupted = position_phase(stored) == "snapshot" and not SnapshotPosition.from_json(
        stored).done
    if interrupted and on_interrupted == "restart" and mode != "never":
        return attrs.evolve(snapshot, temporary=mode == "initial_only",
                            stop_after=mode == "initial_only")
    if interrupted and on_interrupted == "resume" and mode in ("initial", "when_needed"):
        if slot_state == "ok":
            return StartPlan("resume", stream_from=SnapshotPosition.from_json(
                stored).consistent_lsn)
        if mode == "when_needed":
            return snapshot
        return StartPlan("refuse", reason=_LOST if slot_state == "lost" else _MISSING)
    if mode == "initial_only":
        if stored is None:
            return StartPlan("snapshot", temporary=True, stop_after=True)
        if position_phase(stored) == "snapshot" and not interrupted:
            return StartPlan("stop")
        return StartPlan("refuse", reason=_interrupted(stored) if interrupted else
                         "the stored offset is a streaming position; initial_only "
                         "snapshots only when nothing is stored")
    if mode == "always":
        return snapshot
    if stored is None:
        if mode in ("initial", "when_needed"):
            return snapshot
        if slot_state == "lost":
            return StartPlan("refuse", reason=_LOST)
        return StartPlan("stream", create_slot=slot_state == "missing")
    if position_phase(stored) == "snapshot":
        position = SnapshotPosition.from_json(stored)
        if not position.done:
            return StartPlan("refuse", reason=_interrupted(stored))
        stream_from = position.consistent_lsn
    else:
        stream_from = parse_lsn(stored["end_lsn"])
    if slot_state != "ok":
        if mode == "when_needed":
            return snapshot
        return StartPlan("refuse", reason=_LOST if slot_state == "lost" else _MISSING)
    return StartPlan("stream", stream_from=stream_from)


_LOST = ("the slot has lost required WAL (max_slot_wal_keep_size): changes are gone; "
         "snapshot mode when_needed (or always) takes a new snapshot")
_MISSING = ("the slot does not exist but a stored offset does: the WAL since that offset "
            "is gone (the slot was dropped); recreating it would silently skip changes — "
            "use snapshot mode when_needed, or delete the source's offset to start over")


def _interrupted(stored: Any) -> str:
    return (f"a snapshot was interrupted (stored offset {stored!r}); its exported snapshot "
            f"died with the process (docs/connect-postgres.md \"Snapshots\"); "
            f"set snapshot.on_interrupted: resume to read the rest by incremental chunks "
            f"(modes initial and when_needed), restart to snapshot again from the start "
            f"(the rows already sent are sent again), or delete the connector's topics and "
            f"offset and start again")
