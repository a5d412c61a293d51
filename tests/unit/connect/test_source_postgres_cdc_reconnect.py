"""``postgres-cdc`` reconnects, over a fake slot that replays a WAL of transactions the way
Postgres does (from the requested start, Relation messages again on each connection) and
loses its connection when told: while reading mid-transaction, while confirming, with the
server down for a few attempts, for longer than the budget, and with the slot gone. The
source is driven as the batch cycle drives it (poll, commit, then side effect); the real
thing runs in tests/integration/connect/pg/test_postgres_cdc_reconnect.py."""

from __future__ import annotations

import json

import pytest
import trio

from rivven_connect.pg.pgoutput import Begin, Column, ColumnValue, Commit, Insert, Relation
from rivven_connect.pg.slot import SlotConnectionError, SlotInfo
from rivven_connect.sources import SourceError
from rivven_connect.sources.postgres_cdc import PostgresCdcSource
from tests.unit.connect.pg.encoder import encode

ORDERS = Relation(16384, "public", "orders", "d",
                  (Column("id", 23, -1, True), Column("note", 25, -1, False)))
TRANSACTIONS = 12  # two inserts each


def _wal() -> list[tuple[int, int, list[tuple[int, bytes]]]]:
    """(commit_lsn, end_lsn, frames without the Relation) per transaction; the Begin's
    ``data_start`` is the transaction's first LSN, before the previous commit (concurrent
    writers), the Commit's its ``end_lsn``."""
    wal = []
    for n in range(1, TRANSACTIONS + 1):
        commit, end = 0x1000 * n, 0x1000 * n + 0x30
        frames = [(commit - 0x1800, encode(Begin(commit, 0, 700 + n)))]
        for k in range(2):
            row = (ColumnValue("t", str(2 * n + k).encode()), ColumnValue("t", b"x"))
            frames.append((commit - 0x100 + k, encode(Insert(ORDERS.oid, row))))
        frames.append((end, encode(Commit(0, commit, end, 0))))
        wal.append((commit, end, frames))
    return wal


class FakeSlot:
    """A connection that streams ``_wal()`` from the start LSN, ``frames_per_read`` frames
    a read; ``fail_reads`` / ``fail_confirms`` (counts of calls) lose the connection there,
    after a lost read the next ``down_on_loss`` ``prepare`` calls fail to connect."""

    slot_name = "rivven_slot"
    tables = (("public", "orders"),)
    signal_table = None

    def __init__(self, frames_per_read: int = 3) -> None:
        self.config = type("Config", (), {"database": "shop"})()
        self.frames_per_read = frames_per_read
        self.stream: list[tuple[int, bytes]] | None = None
        self.starts: list[int] = []
        self.confirmed: list[int] = []
        self.slot_confirmed = 0
        self.reads = self.confirms = 0
        self.fail_reads: set[int] = set()
        self.fail_confirms: set[int] = set()
        self.down_attempts = self.down_on_loss = 0
        self.state = "ok"
        self.last_data_start: int | None = None

    @property
    def started(self) -> bool:
        return self.stream is not None

    def prepare(self) -> SlotInfo:
        if self.down_attempts:
            self.down_attempts -= 1
            raise SlotConnectionError("cannot connect to postgres: connection refused")
        return SlotInfo(self.slot_confirmed or None, self.state,
                        {("public", "orders"): ("id",)})

    def start(self, start_lsn: int) -> None:
        assert self.stream is None
        self.starts.append(start_lsn)
        frames: list[tuple[int, bytes]] = []
        for commit, _end, txn in _wal():
            if commit >= max(start_lsn, self.slot_confirmed):  # as Postgres skips
                schema = [] if frames else [(0, encode(ORDERS))]  # once per connection
                frames += [txn[0], *schema, *txn[1:]]
        self.stream, self.last_data_start = frames, None

    async def read_frames(self, max_frames: int, wait_s: float) -> list[tuple[int, bytes]]:
        await trio.lowlevel.checkpoint()
        assert self.stream is not None
        self.reads += 1
        if self.reads in self.fail_reads:
            self.stream, self.down_attempts = None, self.down_on_loss
            raise SlotConnectionError("replication stream failed: terminating connection "
                                      "due to administrator command")
        frames = self.stream[:self.frames_per_read]
        del self.stream[:self.frames_per_read]
        if not frames:
            await trio.sleep(wait_s)
        else:
            self.last_data_start = frames[-1][0]
        return frames

    def may_confirm(self, flush_lsn: int) -> bool:
        return (self.stream is not None and self.last_data_start is not None
                and self.last_data_start > flush_lsn)

    def confirm(self, flush_lsn: int) -> None:
        assert self.may_confirm(flush_lsn)
        self.confirms += 1
        if self.confirms in self.fail_confirms:
            self.stream = None
            raise SlotConnectionError("confirming failed: server closed the connection")
        self.confirmed.append(flush_lsn)
        self.slot_confirmed = max(self.slot_confirmed, flush_lsn)

    def retained_wal_bytes(self) -> int:
        return 0

    def close(self) -> None:
        self.stream = None


def _source(slot: FakeSlot, **options) -> PostgresCdcSource:
    source = PostgresCdcSource(slot, batch_size=4, heartbeat_interval_ms=0,  # type: ignore
                               jitter=lambda: 0.0, **options)
    source.resume(None)
    return source


async def _run_cycle(source: PostgresCdcSource, slot: FakeSlot) -> list[int]:
    """Poll, "commit" (drop replays as the cycle does), side effect, until every row is
    delivered; the ids in delivery order. The slot is never confirmed past a commit."""
    delivered: list[int] = []
    committed = None
    while len(delivered) < 2 * TRANSACTIONS:
        records = await source.poll(100)
        assert records
        for record in records:
            key = source.position_key(record.position)
            if committed is None or key > source.position_key(committed):
                delivered.append(json.loads(json.dumps(record.value))["after"]["id"])
        committed = records[-1].position
        await source.side_effect(committed)
        assert slot.slot_confirmed < source.position_key(committed)[0]
    return delivered


EVERY_ROW = list(range(2, 2 * TRANSACTIONS + 2))


@pytest.fixture
def clock(mock_clock):
    """Virtual time that jumps when trio has been idle for 0.1 s of real time: the source
    calls the slot in worker threads, and a clock jumping at once would pass deadlines
    while a thread runs."""
    mock_clock.autojump_threshold = 0.1
    return mock_clock


async def test_lost_mid_transaction_several_times_every_row_once_in_order(clock):
    slot = FakeSlot()
    slot.fail_reads = {3, 7, 12, 13}  # mid-transaction, and again at the first read after
    source = _source(slot)
    assert await _run_cycle(source, slot) == EVERY_ROW
    assert source.link.reconnects == 4 and source.link.attempts_failed == 0
    assert slot.starts[0] == 0 and all(lsn > 0 for lsn in slot.starts[1:])
    assert slot.starts == sorted(slot.starts)  # each at the last committed end_lsn
    metrics = {m.name: m.value for m in source.metrics()}
    assert metrics["cdc_reconnects"] == 4 and metrics["cdc_reconnect_failures"] == 0


async def test_lost_while_confirming_the_confirm_is_sent_after_the_reconnect(clock):
    slot = FakeSlot(frames_per_read=100)  # a poll ends at a whole transaction
    slot.fail_confirms = {2}
    source = _source(slot)
    first = await source.poll(100)
    await source.side_effect(first[-1].position)
    second = await source.poll(100)
    end_lsn = source.position_key(second[-1].position)[0]
    await source.side_effect(second[-1].position)  # the connection is lost here
    assert not slot.started and slot.confirmed[-1] < end_lsn - 1
    rest = await source.poll(100)  # reconnects at end_lsn, then confirms end_lsn - 1
    assert slot.starts[-1] == end_lsn
    assert slot.confirmed[-1] == end_lsn - 1 and source.link.confirmed_lsn == end_lsn - 1
    ids = [r.value["after"]["id"] for r in first + second + rest]
    assert ids == EVERY_ROW[:len(ids)] and source.link.reconnects == 1


async def test_a_server_down_for_a_few_attempts_is_waited_for(clock):
    slot = FakeSlot()
    slot.fail_reads, slot.down_on_loss = {4}, 5
    source = _source(slot, reconnect_attempts_max=6)
    before = trio.current_time()
    assert await _run_cycle(source, slot) == EVERY_ROW
    assert source.link.attempts_failed == 5 and source.link.reconnects == 1
    # waits of 50, 100, 200, 400, 800, 1600 ms (jitter 0: the lower half of each backoff)
    assert trio.current_time() - before >= 3.15


async def test_an_outage_longer_than_the_budget_stops_the_source(clock):
    slot = FakeSlot()
    slot.fail_reads, slot.down_on_loss = {2}, 10**6
    source = _source(slot, reconnect_attempts_max=1000, reconnect_timeout_ms=20_000)
    with pytest.raises(SourceError) as caught:
        await _run_cycle(source, slot)
    message = str(caught.value)
    assert "could not be re-established" in message and "in 20.0 s" in message, message
    assert "connection refused" in message and "administrator command" in message
    few = FakeSlot()
    few.fail_reads, few.down_on_loss = {2}, 10**6
    with pytest.raises(SourceError, match=r"3 attempt\(s\)"):
        await _run_cycle(_source(few, reconnect_attempts_max=3), few)


async def test_a_slot_dropped_during_the_outage_stops_the_source_at_once(clock):
    slot = FakeSlot()
    slot.fail_reads = {5}
    source = _source(slot)
    polled = await source.poll(100)
    await source.side_effect(polled[-1].position)
    slot.state = "missing"
    with pytest.raises(SourceError, match="the slot is missing"):
        await _run_cycle(source, slot)
    assert source.link.attempts_failed == 0


async def test_zero_attempts_stops_at_the_first_loss(clock):
    slot = FakeSlot()
    slot.fail_reads = {2}
    with pytest.raises(SourceError, match=r"0 attempt\(s\)"):
        await _run_cycle(_source(slot, reconnect_attempts_max=0), slot)
