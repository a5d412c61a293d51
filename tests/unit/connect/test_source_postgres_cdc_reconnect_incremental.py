"""``postgres-cdc``: reconnects during an incremental (DBLog) snapshot, over a fake database
whose WAL grows while the source runs (a writer's changes, the chunk reader's watermarks and
a signal), a fake slot that streams it from the requested LSN the way Postgres does and a
fake chunk reader (``WindowReader``) that commits the low watermark, reads the table, lets
the writer commit inside the window, then commits the high watermark.

The connection is lost at every read of the stream in turn (so also between a chunk's low
and high watermark, with the window open), and in the middle of a chunk read (the low
watermark committed, the high one never); sometimes Postgres stays down for a few
attempts. Whatever the point: the topic materialised by key equals the table, each key is
at most once an ``r`` (no chunk row emitted twice, no superseded row emitted), every key the
writer never touched is an ``r``, the slot is never confirmed past a commit and the source
never reads a chunk while its replication connection is down. The real thing:
tests/integration/connect/pg/test_postgres_cdc_incremental.py and
test_postgres_cdc_reconnect.py."""

from __future__ import annotations

import json
import random

import pytest
import trio

from rivven_connect.pg.pgoutput import (
    Begin, Column, ColumnValue, Commit, Delete, Insert, LogicalMessage, Relation, Update,
)
from rivven_connect.pg.slot import SIGNAL_MESSAGE_PREFIX, SlotConnectionError, SlotInfo
from rivven_connect.pg.snapshot_reader import WATERMARK_MESSAGE_PREFIX
from rivven_connect.sources import postgres_cdc_incremental
from rivven_connect.sources.postgres_cdc import PostgresCdcSource
from rivven_connect.sources.postgres_cdc_incremental import signal_message
from tests.unit.connect.pg.encoder import encode

ORDERS = Relation(16384, "public", "orders", "d",
                  (Column("id", 23, -1, True), Column("status", 25, -1, False)))
KEYS = 24            # ids 1..24 in the table before the snapshot
CHUNK_ROWS = 5
WRITES = 12          # the writer's changes between reads (ids 1..30), then it stops


class FakeDb:
    """The table and its WAL: transactions of frames ``(data_start, payload)``."""

    database = "shop"

    def __init__(self, seed: int) -> None:
        self.table = {key: "old" for key in range(1, KEYS + 1)}
        self.wal: list[tuple[int, int, list[tuple[int, bytes]]]] = []  # (commit, end, frames)
        self.lsn, self.xid = 0x10000, 700
        self.rng = random.Random(seed)
        self.writes = 0
        self.touched: set[int] = set()
        self.down_attempts = 0  # connections refused (Postgres down)
        self.restarts = 0       # connections made before a restart are dead

    def commit(self, *messages: object) -> int:
        """One transaction of ``messages``; its commit LSN."""
        self.lsn += 0x1000
        self.xid += 1
        commit, end = self.lsn + 0x100, self.lsn + 0x130
        frames = [(self.lsn, encode(Begin(commit, 0, self.xid)))]
        for n, message in enumerate(messages):
            if isinstance(message, LogicalMessage):
                message = LogicalMessage(True, self.lsn + 0x10 + n, message.prefix,
                                         message.content)
            frames.append((self.lsn + 0x10 + n, encode(message)))  # type: ignore[arg-type]
        frames.append((end, encode(Commit(0, commit, end, 0))))
        self.wal.append((commit, end, frames))
        return commit

    def maybe_write(self, chance: float, keys: list[int] | None = None) -> None:
        """Perhaps one change by the writer (an insert, update or delete of one row): of
        one of ``keys`` (inside a chunk's window), else of any id up to 30 (up to
        ``WRITES`` of those)."""
        if self.rng.random() >= chance or (keys is None and self.writes >= WRITES):
            return
        if keys is None:
            self.writes += 1
            key = self.rng.randrange(1, 31)
        else:
            key = self.rng.choice(keys)
        self.touched.add(key)
        status = f"w{self.xid}"
        row = (ColumnValue("t", str(key).encode()), ColumnValue("t", status.encode()))
        if key in self.table and self.rng.random() < 0.3:
            del self.table[key]
            self.commit(Delete(ORDERS.oid, (row[0], ColumnValue("n")), None))
        elif key in self.table:
            self.table[key] = status
            self.commit(Update(ORDERS.oid, row, None, None))
        else:
            self.table[key] = status
            self.commit(Insert(ORDERS.oid, row))

    def check_up(self) -> None:
        if self.down_attempts:
            self.down_attempts -= 1
            raise SlotConnectionError("cannot connect to postgres: connection refused")


class Finished(Exception):
    """Raised by an empty read once nothing more will come (a poll would wait forever)."""


class FakeSlot:
    """Streams the growing WAL from the start LSN (the Relation once per connection),
    ``frames_per_read`` frames a read; ``fail_reads`` (read counts) lose the connection, and
    Postgres then refuses ``down_on_loss`` connections. The writer may commit at each read."""

    slot_name = "rivven_slot"
    publication_name = "rivven_pub"
    tables = (("public", "orders"),)
    signal_table = None

    def __init__(self, db: FakeDb, frames_per_read: int = 3) -> None:
        self.config = db
        self.db, self.frames_per_read = db, frames_per_read
        self.cursor: tuple[int, int] | None = None  # (transaction, frame) next to send
        self.sent_relation = False
        self.last_data_start: int | None = None
        self.starts: list[int] = []
        self.confirmed = 0
        self.reads = 0
        self.fail_reads: set[int] = set()
        self.down_on_loss = 0
        self.on_loss = lambda: None
        self.finished = lambda: False
        self.empty_reads = 0  # in a row

    @property
    def started(self) -> bool:
        return self.cursor is not None

    def prepare(self) -> SlotInfo:
        self.db.check_up()
        return SlotInfo(self.confirmed or None, "ok", {("public", "orders"): ("id",)})

    def start(self, start_lsn: int) -> None:
        assert self.cursor is None
        self.starts.append(start_lsn)
        first = next((i for i, (commit, _end, _frames) in enumerate(self.db.wal)
                      if commit >= max(start_lsn, self.confirmed)), len(self.db.wal))
        self.cursor, self.sent_relation, self.last_data_start = (first, 0), False, None

    def at_end(self) -> bool:
        return self.cursor is not None and self.cursor[0] == len(self.db.wal)

    async def read_frames(self, max_frames: int, wait_s: float) -> list[tuple[int, bytes]]:
        await trio.lowlevel.checkpoint()
        assert self.cursor is not None
        self.reads += 1
        if self.reads in self.fail_reads:
            self.on_loss()
            self.cursor, self.db.down_attempts = None, self.down_on_loss
            self.db.restarts += bool(self.down_on_loss)  # down for a while: a restart
            raise SlotConnectionError("replication stream failed: terminating connection "
                                      "due to administrator command")
        self.db.maybe_write(0.3)
        frames: list[tuple[int, bytes]] = []
        index, frame = self.cursor
        while len(frames) < self.frames_per_read and index < len(self.db.wal):
            txn = self.db.wal[index][2]
            frames.append(txn[frame])
            if frame == 0 and not self.sent_relation:
                frames.append((txn[0][0], encode(ORDERS)))
                self.sent_relation = True
            index, frame = (index + 1, 0) if frame + 1 == len(txn) else (index, frame + 1)
        self.cursor = (index, frame)
        if frames:
            self.last_data_start, self.empty_reads = frames[-1][0], 0
            return frames
        if self.finished():
            raise Finished
        self.empty_reads += 1
        assert self.empty_reads < 1000, "stuck: nothing comes, the source is not finished"
        return frames

    def may_confirm(self, flush_lsn: int) -> bool:
        return (self.cursor is not None and self.last_data_start is not None
                and self.last_data_start > flush_lsn)

    def confirm(self, flush_lsn: int) -> None:
        assert self.may_confirm(flush_lsn)
        self.confirmed = max(self.confirmed, flush_lsn)

    def retained_wal_bytes(self) -> int:
        return 0

    def close(self) -> None:
        self.cursor = None


class FakeWindowReader:
    """``WindowReader`` over the fake database; ``fail_windows`` (counts of read_window
    calls) lose the connection after the low watermark is committed."""

    slot: FakeSlot  # set by the test
    fail_windows: set[int] = set()

    def __init__(self, db: FakeDb) -> None:
        self.db, self.is_open = db, False
        self.windows = 0
        self.opens = 0
        self.opened_in = 0  # the server's life (restarts) the connection was made in

    def open(self) -> None:
        assert self.slot.started, "a chunk read while the replication connection is down"
        self.db.check_up()
        self.is_open, self.opened_in = True, self.db.restarts
        self.opens += 1

    def read_window(self, table, key, after, limit, low, high):
        assert self.is_open and table == ("public", "orders") and key == ("id",)
        if self.opened_in != self.db.restarts:
            self.is_open = False
            raise SlotConnectionError("opening the incremental snapshot connection failed: "
                                      "server closed the connection unexpectedly")
        self.windows += 1
        low_lsn = self.db.commit(LogicalMessage(True, 0, WATERMARK_MESSAGE_PREFIX, low.encode()))
        if self.windows in self.fail_windows:
            self.is_open = False
            raise SlotConnectionError("incremental snapshot chunk of public.orders failed: "
                                      "server closed the connection unexpectedly")
        keys = sorted(k for k in self.db.table if after is None or k > int(after[0]))[:limit]
        rows = [(str(k), self.db.table[k]) for k in keys]
        if keys:  # inside the window: after the chunk's snapshot, before H
            self.db.maybe_write(0.7, keys)
        self.db.commit(LogicalMessage(True, 0, WATERMARK_MESSAGE_PREFIX, high.encode()))
        return low_lsn, ORDERS, rows, []

    def close(self) -> None:
        self.is_open = False


async def _run(fail_reads=(), fail_windows=(), down_on_loss=0, seed=1):
    """The scenario: an execute-snapshot signal, chunks under a writer, losses as given.
    Returns the delivered (op, id, status) and the source."""
    db = FakeDb(seed)
    slot = FakeSlot(db)
    slot.fail_reads, slot.down_on_loss = set(fail_reads), down_on_loss
    FakeWindowReader.slot, FakeWindowReader.fail_windows = slot, set(fail_windows)
    db.commit(LogicalMessage(True, 0, SIGNAL_MESSAGE_PREFIX, signal_message(
        slot.slot_name, "execute-snapshot", {"data-collections": ["public.orders"],
                                             "chunk-size": CHUNK_ROWS}).encode()))
    source = PostgresCdcSource(slot, batch_size=4, heartbeat_interval_ms=0,  # type: ignore
                               jitter=lambda: 0.0, clock_ms=lambda: 1000)
    source.resume(None)
    slot.lost_in: list[str | None] = []  # the chunk's phase at each loss of the stream

    def on_loss() -> None:
        chunk = source.incremental and source.incremental.core.chunk
        slot.lost_in.append(chunk.phase if chunk else None)

    slot.on_loss = on_loss
    delivered: list[tuple[str, int, str | None]] = []
    committed = None
    slot.finished = lambda: (source.incremental.core.state is None and db.writes == WRITES
                             and source.incremental.core.chunks_emitted > 0
                             and not source._frames and not source._queued)
    for _ in range(1000):
        try:
            records = await source.poll(100)
        except Finished:  # the stream is read to its end, the snapshot is over
            break
        for record in records:
            key = source.position_key(record.position)
            if committed is not None and key <= source.position_key(committed):
                continue  # a replay: the cycle drops it
            if record.position_only:
                continue
            if record.value is None:
                delivered.append(("tombstone", json.loads(json.dumps(record.key))["id"], None))
                continue
            value = json.loads(json.dumps(record.value))
            image = value["after"] or value["before"]
            delivered.append((value["op"], image["id"], (value["after"] or {}).get("status")))
        committed = records[-1].position
        await source.side_effect(committed)
        assert slot.confirmed < source.position_key(committed)[0]  # never past a commit
    else:
        raise AssertionError("the scenario did not finish")
    return delivered, source, db


def _check(delivered, db) -> None:
    state: dict[int, str | None] = {}
    for op, key, status in delivered:
        if op in ("r", "c", "u"):
            state[key] = status
        elif op == "d":
            state.pop(key, None)
    assert state == db.table
    r_keys = [key for op, key, _ in delivered if op == "r"]
    assert len(r_keys) == len(set(r_keys)), r_keys  # no chunk row twice
    assert set(range(1, KEYS + 1)) - db.touched <= set(r_keys)  # untouched rows: an r each


@pytest.fixture
def clock(mock_clock, monkeypatch):
    """Virtual time that jumps when trio has been idle 10 ms (only backoff waits are
    pending then: the fake slot never waits)."""
    mock_clock.autojump_threshold = 0.01
    monkeypatch.setattr(postgres_cdc_incremental, "WindowReader", FakeWindowReader)
    return mock_clock


async def test_no_loss_baseline(clock):
    delivered, source, db = await _run()
    _check(delivered, db)
    core = source.incremental.core
    assert core.chunks_emitted >= KEYS // CHUNK_ROWS and core.rows_dropped >= 1  # a window bit
    assert source.link.reconnects == 0


async def test_lost_at_every_read_in_turn_also_with_a_window_open(clock):
    _delivered, undisturbed, _db = await _run()
    phases = []
    for read in range(1, undisturbed.slot.reads + 1):  # the same run up to that read
        delivered, source, db = await _run(fail_reads=[read], down_on_loss=read % 3)
        _check(delivered, db)
        assert source.link.reconnects == 1, read  # (a dead chunk connection: a second)
        assert source.link.attempts_failed == read % 3
        # an open window survives the reconnect: no chunk is read twice
        assert source.incremental.reader.windows == source.incremental.core.chunks_emitted
        phases += source.slot.lost_in
    assert "open" in phases and "read" in phases  # between L and H, and before L


async def test_a_chunk_read_that_loses_its_connection_reconnects_and_reads_it_again(clock):
    for window in (1, 2, 4):
        delivered, source, db = await _run(fail_windows=[window], down_on_loss=0)
        _check(delivered, db)
        assert source.link.reconnects == 1
        reader = source.incremental.reader
        assert reader.windows == source.incremental.core.chunks_emitted + 1  # one read again
        assert reader.opens == 2  # a new connection after the loss
