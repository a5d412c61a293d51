"""``postgres-cdc`` configuration: every problem names its option; positions order as the
stream does; heartbeats over a fake slot. (The source itself runs against a real Postgres in
tests/integration/connect/pg/test_postgres_cdc_source.py.)"""

from __future__ import annotations

import json
import struct

import pytest
import trio

from rivven_connect.core.config import ConnectConfigError, load_config
from rivven_connect.pg.envelope import EnvelopeBuilder
from rivven_connect.pg.slot import HEARTBEAT_MESSAGE_PREFIX
from rivven_connect.pg.snapshot import SnapshotPosition
from rivven_connect.pg.transactions import TransactionAssembler
from rivven_connect.sources import build_source
from rivven_connect.sources.postgres_cdc import PostgresCdcSource, heartbeat_position
from rivven_connect.sources.postgres_cdc_incremental import IncrementalRunner

GOOD = {"host": "127.0.0.1", "port": 5432, "database": "shop", "user": "rivven",
        "password": "pw", "slot_name": "rivven_slot", "publication_name": "rivven_pub",
        "tables": ["public.orders", "items"], "snapshot": {"mode": "never"}}


def _build(**changes):
    config = {**GOOD, **changes}
    for key in [key for key, value in changes.items() if value is ...]:
        del config[key]
    loaded = load_config({"sources": {"db": {"connector": "postgres-cdc",
                                              "topic": "cdc.{schema}.{table}",
                                              "config": config}}}, {})
    return build_source(loaded.sources["db"])


def test_a_good_config_builds_the_source():
    source = _build()
    assert isinstance(source, PostgresCdcSource)
    assert source.slot.tables == (("public", "orders"), ("public", "items"))
    assert source.slot.config.port == 5432 and source.slot.config.password == "pw"
    assert "pw" not in repr(source.slot.config)
    assert _build(port="6543", password=...).slot.config.port == 6543  # ${ENV} text


@pytest.mark.parametrize("changes,path,words", [
    ({"host": ...}, "config.host", "required"),
    ({"database": ""}, "config.database", "required"),
    ({"user": 3}, "config.user", "required"),
    ({"password": 3}, "config.password", "string"),
    ({"port": 0}, "config.port", "[1, 65535]"),
    ({"port": "x"}, "config.port", "integer"),
    ({"slot_name": ...}, "config.slot_name", "required"),
    ({"slot_name": "Bad-Name"}, "config.slot_name", "identifier"),
    ({"publication_name": "a.b"}, "config.publication_name", "identifier"),
    ({"tables": []}, "config.tables", "non-empty"),
    ({"tables": ["public.orders", "a.b.c"]}, "config.tables[1]", "schema.table"),
    ({"tables": ["orders", "public.orders"]}, "config.tables[1]", "twice"),
    ({"snapshot": ...}, "config.snapshot", "is required"),
    ({"snapshot": {"mode": "sometimes"}}, "config.snapshot.mode", "when_needed"),
    ({"snapshot": {"mode": "initial", "chunk_size": 0}}, "config.snapshot.chunk_size",
     "[1, 10000]"),
    ({"snapshot": {"mode": "never", "chunk": 3}}, "config.snapshot.chunk", "unknown"),
    ({"snapshot": {"mode": "initial", "on_interrupted": "later"}},
     "config.snapshot.on_interrupted", "resume, fail, restart"),
    ({"signal_table": "a.b.c"}, "config.signal_table", "schema.table"),
    ({"signal_table": "orders"}, "config.signal_table", "outside tables"),
    ({"slot": "x"}, "config.slot", "unknown option"),
])
def test_config_errors_name_the_option(changes, path, words):
    with pytest.raises(ConnectConfigError) as caught:
        _build(**changes)
    message = str(caught.value)
    assert message.startswith(f"sources.db.{path}"), message
    assert words in message, message


def test_positions_order_by_end_lsn_then_seq():
    source = _build()
    positions = [{"end_lsn": "0/FF", "commit_lsn": "0/F0", "seq": 2, "last": True},
                 {"end_lsn": "1/0", "commit_lsn": "0/100", "seq": 0, "last": False},
                 {"end_lsn": "1/0", "commit_lsn": "0/100", "seq": 1, "last": True}]
    keys = [source.position_key(p) for p in positions]
    assert keys == sorted(keys) and keys[0] == (0xFF, 1, 2) and keys[1] == (1 << 32, 1, 0)


def test_snapshot_options_and_positions():
    source = _build(snapshot={"mode": "initial", "chunk_size": "64"})
    assert (source.snapshot_mode, source.snapshot_chunk_rows) == ("initial", 64)
    assert _build(snapshot={"mode": "when_needed"}).snapshot_chunk_rows == 1024
    assert _build(snapshot={"mode": "initial"}).snapshot_on_interrupted == "resume"
    assert _build(signal_table="ops.signals").slot.published == (
        ("public", "orders"), ("public", "items"), ("ops", "signals"))
    assert _build(snapshot={"mode": "initial", "on_interrupted": "restart"}
                  ).snapshot_on_interrupted == "restart"
    rows = [SnapshotPosition(0x100, 0, "public.orders", ("1",), 1, False),
            SnapshotPosition(0x100, 1, "public.items", ("a", "2"), 2, True)]
    stored = [json.loads(json.dumps(p.to_json())) for p in rows]  # as the offsets topic keeps it
    assert [SnapshotPosition.from_json(p) for p in stored] == rows
    streamed = {"end_lsn": "0/101", "commit_lsn": "0/100", "seq": 0, "last": True}
    later = SnapshotPosition(0x200, 0, "public.orders", None, 1, False).to_json()
    keys = [source.position_key(p) for p in [*stored, streamed, later]]
    assert keys == sorted(keys) and len(set(keys)) == 4
    with pytest.raises(ValueError):
        source.position_key({"phase": "snapshot", "consistent_lsn": "0/1"})


def test_metrics_are_the_lag_the_retained_wal_once_read_and_the_changes_per_table():
    source = _build()
    queued = [("cdc_records_queued", 0, (("path", "encoded"),)),
              ("cdc_records_queued", 0, (("path", "record"),))]
    assert [(m.name, m.value) for m in source.metrics()] == [
        ("cdc_replication_lag_bytes", 0), ("cdc_reconnects", 0), ("cdc_reconnect_failures", 0),
        ("cdc_records_queued", 0), ("cdc_records_queued", 0)]
    source.stream_from = 0x1000  # resumed at a stored end LSN: that much is confirmed
    source.received_end_lsn = 0x1800
    source.events.update({("public.orders", "c"): 2, ("public.items", "d"): 1})
    source.retained_wal_bytes = 4096
    assert [(m.name, m.value, m.labels) for m in source.metrics()] == [
        ("cdc_retained_wal_bytes", 4096, ()),
        ("cdc_replication_lag_bytes", 0x800, ()),
        ("cdc_reconnects", 0, ()),
        ("cdc_reconnect_failures", 0, ()),
        ("cdc_events", 1, (("table", "public.items"), ("op", "d"))),
        ("cdc_events", 2, (("table", "public.orders"), ("op", "c"))), *queued]
    source.link.confirmed_lsn = 0x17ff  # confirmed at end_lsn - 1: caught up
    assert source.metrics()[1].value == 0


def test_heartbeat_interval_option():
    assert _build().heartbeat_interval_ms == 500
    assert _build(heartbeat_interval_ms=0).heartbeat_interval_ms == 0
    with pytest.raises(ConnectConfigError, match="config.heartbeat_interval_ms"):
        _build(heartbeat_interval_ms=-1)


def test_restart_points_option():
    assert _build().slot.restart_points is True
    assert _build(restart_points=False).slot.restart_points is False
    with pytest.raises(ConnectConfigError, match="config.restart_points"):
        _build(restart_points="sometimes")


def test_a_heartbeat_orders_after_a_transaction_ending_at_its_lsn():
    source = _build()
    ending_there = {"end_lsn": "0/500", "commit_lsn": "0/4F0", "seq": 3, "last": True}
    heartbeat = heartbeat_position(0x500)
    later = {"end_lsn": "0/501", "commit_lsn": "0/500", "seq": 0, "last": True}
    keys = [source.position_key(p) for p in (ending_there, heartbeat, later)]
    assert keys == sorted(keys) and keys[1] == (0x500, 2, 0)


def _message_frame(prefix: str, content: bytes, lsn: int) -> bytes:
    return (b"M" + struct.pack(">BQ", 0, lsn) + prefix.encode() + b"\0"
            + struct.pack(">i", len(content)) + content)


class FakeSlot:
    """The stream as a list of frames; a heartbeat marker comes back at the next LSN; the
    clock moves 600 ms per empty read."""

    slot_name = "rivven_slot"
    started = True
    config = None
    tables = (("public", "orders"),)
    signal_table = None

    def __init__(self, clock: list[int], foreign_first: bool = False) -> None:
        self.clock, self.frames, self.confirmed, self.emitted = clock, [], [], 0
        self.lsn = 0x1000
        if foreign_first:  # another connector's heartbeat in the same WAL
            self.frames.append((0x800, _message_frame(HEARTBEAT_MESSAGE_PREFIX, b"other", 0x800)))

    async def read_frames(self, max_frames, wait_s):
        await trio.lowlevel.checkpoint()
        frames, self.frames = self.frames, []
        if not frames:
            self.clock[0] += 600
        return frames

    def emit_heartbeat(self, unless_wal_at):
        self.emitted += 1
        self.lsn += 0x100
        self.frames.append((self.lsn, _message_frame(HEARTBEAT_MESSAGE_PREFIX,
                                                     self.slot_name.encode(), self.lsn)))
        return self.lsn + 0x80

    def confirm(self, flush_lsn):
        self.confirmed.append(flush_lsn)

    def may_confirm(self, flush_lsn):
        return True

    def retained_wal_bytes(self):  # (the metrics' gauge, read every few seconds)
        return 0


def _streaming(slot, clock, interval_ms):
    source = PostgresCdcSource(slot, heartbeat_interval_ms=interval_ms,  # type: ignore[arg-type]
                               clock_ms=lambda: clock[0])
    source._started = True
    source.builder = EnvelopeBuilder(db="shop", key_columns={}, emit_messages=False)
    source.assembler = TransactionAssembler(resume_end_lsn=0, changes_max=10)
    source.incremental = IncrementalRunner(slot, source.builder, {}, None, 1024,
                                           lambda: clock[0])
    return source


async def test_an_idle_stream_returns_a_heartbeat_and_its_side_effect_confirms_below_it():
    clock = [0]
    slot = FakeSlot(clock, foreign_first=True)
    source = _streaming(slot, clock, 1000)
    [record] = await source.poll(100)
    assert record.position_only and record.position == heartbeat_position(0x1100)
    assert slot.emitted == 1 and clock[0] >= 1000  # not before the interval
    await source.side_effect(record.position)
    assert slot.confirmed == [0x10FF]  # below the marker's data_start: psycopg2 never forwards


async def test_no_heartbeat_when_switched_off():
    clock = [0]
    slot = FakeSlot(clock)
    source = _streaming(slot, clock, 0)
    for _ in range(60):
        await source._maybe_heartbeat()
        clock[0] += 1000
    assert slot.emitted == 0


class TrickleSlot(FakeSlot):
    """One transaction readable per read; every ``wait_s`` asked for is kept."""

    def __init__(self, clock: list[int], transactions: int) -> None:
        super().__init__(clock)
        self.waits: list[float] = []
        self.pending = [_transaction_frames(n) for n in range(transactions)]

    async def read_frames(self, max_frames, wait_s):
        await trio.lowlevel.checkpoint()
        self.waits.append(wait_s)
        if wait_s == 0 or not self.pending:  # a transaction arrives only while we wait
            return []
        return self.pending.pop(0)


def _transaction_frames(n: int) -> list[tuple[int, bytes]]:
    from rivven_connect.pg.pgoutput import Begin, Column, ColumnValue, Commit, Insert, Relation

    from tests.unit.connect.pg.encoder import encode

    relation = Relation(16384, "public", "orders", "d", (Column("id", 23, -1, True),))
    lsn = 0x2000 + 0x100 * n
    messages = [Begin(lsn + 0x10, 0, 700 + n), relation,
                Insert(16384, (ColumnValue("t", str(n).encode()),)),
                Commit(0, lsn + 0x10, lsn + 0x40, 0)]
    return [(lsn, encode(message)) for message in messages]


async def test_a_poll_returns_queued_transactions_without_waiting_for_a_full_batch():
    clock = [0]
    slot = TrickleSlot(clock, transactions=3)
    source = _streaming(slot, clock, 0)
    source.builder = EnvelopeBuilder(db="shop", key_columns={("public", "orders"): ("id",)},
                                     emit_messages=False)
    records = await source.poll(100)
    # One transaction was read while waiting; the next read took only what was there.
    assert [record.key["id"] for record in records] == [0]
    assert slot.waits[-1] == 0 and slot.waits[0] > 0
    assert [r.key["id"] for r in await source.poll(100)] == [1]


async def test_with_encoded_records_on_transactions_come_as_blocks_and_signals_as_records():
    clock = [0]
    slot = TrickleSlot(clock, transactions=2)
    slot.signal_table = ("public", "signals")
    source = _streaming(slot, clock, 0)
    source.builder = EnvelopeBuilder(db="shop", key_columns={("public", "orders"): ("id",)},
                                     emit_messages=False)
    source.use_encoded_records()
    [block] = await source.poll(100)
    assert block.keys == [b'{"id":0}'] and block.position["last"] is True
    assert source.events[("public.orders", "c")] == 1
    # The signal table's rows are the incremental runner's (the per-record path), the next
    # transaction is a block again.
    signal = [(lsn, payload.replace(b"orders", b"signals")) for lsn, payload in
              _transaction_frames(1)]
    slot.pending = [signal + _transaction_frames(2)]
    [block] = await source.poll(100)
    assert block.keys == [b'{"id":2}']
    assert source.incremental.signals["refused"] == 1  # (a row without a type)
    assert source.queued_by_path == {"encoded": 2}


class ReadySlot(TrickleSlot):
    """Every pending transaction is readable at once (no wait needed)."""

    async def read_frames(self, max_frames, wait_s):
        await trio.lowlevel.checkpoint()
        self.waits.append(wait_s)
        return self.pending.pop(0) if self.pending else []


def _ready_source(transactions: int, batch_size: int = 500):
    clock = [0]
    slot = ReadySlot(clock, transactions=transactions)
    source = _streaming(slot, clock, 0)
    source.batch_size = batch_size
    source.builder = EnvelopeBuilder(db="shop", key_columns={("public", "orders"): ("id",)},
                                     emit_messages=False)
    return slot, source


async def test_prepare_poll_decodes_what_is_readable_now_and_the_next_poll_returns_it():
    slot, source = _ready_source(transactions=3, batch_size=2)
    await source.prepare_poll(100)
    # Up to the batch size (whole transactions), never waiting for the stream.
    assert source._queued == 2 and slot.waits == [0.0, 0.0] and len(slot.pending) == 1
    reads = len(slot.waits)
    assert [r.key["id"] for r in await source.poll(100)] == [0, 1]
    assert len(slot.waits) == reads  # the poll read nothing: it was prepared
    await source.prepare_poll(100)  # the last one, then nothing readable: no wait either
    assert slot.waits[reads:] == [0.0, 0.0] and source._queued == 1
    assert [r.key["id"] for r in await source.poll(100)] == [2]


async def test_prepare_poll_does_nothing_before_the_start_or_with_the_connection_lost():
    slot, source = _ready_source(transactions=1)
    source._started = False
    await source.prepare_poll(100)
    assert slot.waits == [] and source._queued == 0
    source._started = True
    source.link.outage = object()  # (lost: only the next poll reconnects)
    await source.prepare_poll(100)
    assert slot.waits == [] and source._queued == 0


async def test_an_error_met_while_preparing_is_raised_by_the_next_poll():
    from rivven_connect.sources import SourceError

    slot, source = _ready_source(transactions=0)
    slot.pending = [[(0x3000, b"?not a pgoutput message")]]
    await source.prepare_poll(100)  # never raises: the commit in flight is not disturbed
    with pytest.raises(SourceError, match="rivven_slot"):
        await source.poll(100)
