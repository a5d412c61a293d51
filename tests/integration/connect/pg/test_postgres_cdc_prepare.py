"""``PostgresCdcSource.prepare_poll`` against a real Postgres 15 (no broker: the source
alone). A snapshot polled with a preparation before every poll after the first (as the
driver does while each batch commits) hands out the same records, in the same order, as
one polled without; the reader stays at most one chunk ahead of what was handed out, so
memory does not grow with the table; after the handover the stream is prepared too."""

from __future__ import annotations

import json

import psycopg2
import pytest
import trio

from rivven_connect.core.config import load_config
from rivven_connect.sources import build_source

ROWS = 230
CHUNK = 40
BATCH = 25


def _source(port: int, database: str, slot: str):
    loaded = load_config({"sources": {"db": {
        "connector": "postgres-cdc", "topic": "cdc.{schema}.{table}",
        "config": {"host": "127.0.0.1", "port": port, "database": database,
                   "user": "postgres", "slot_name": slot, "publication_name": "prep_pub",
                   "tables": ["public.items"], "batch_size": BATCH,
                   "snapshot": {"mode": "initial", "chunk_size": CHUNK}}}}}, {})
    source = build_source(loaded.sources["db"])
    source.resume(None)
    return source


def _sql(dsn: str, statement: str) -> None:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cursor:
        cursor.execute(statement)
    conn.close()


def _keys(records) -> list:
    out = []
    for record in records:
        out.extend(json.loads(key) for key in record.keys) if hasattr(record, "keys") else \
            out.append(record.key)
    return out


@pytest.mark.parametrize("encoded", [True, False])
def test_a_prepared_snapshot_is_the_polled_one_and_stays_one_chunk_ahead(
        postgres_server, pg_database, encoded):
    dsn = postgres_server.dsn(pg_database)
    _sql(dsn, f"CREATE TABLE items (id int PRIMARY KEY, body text); "
              f"INSERT INTO items SELECT n, 'row ' || n FROM generate_series(1, {ROWS}) n")

    async def snapshot(slot: str, prepare: bool) -> tuple[list, int]:
        source = _source(postgres_server.port, pg_database, slot)
        if encoded:
            source.use_encoded_records()
        batches, ahead_max = [], 0
        try:
            while True:
                records = await source.poll(100)
                batches.append([({**r.position, "consistent_lsn": "(its slot's)"},
                                 r.record_count) for r in records])
                if source.snapshot is None:  # the handover: the stream comes next
                    break
                if prepare:
                    await source.prepare_poll(100)
                    assert source._prepared is not None
                ahead_max = max(ahead_max, len(source.snapshot.ahead)
                                if source.snapshot is not None else 0)
            if prepare:  # streaming (started by a poll): what is readable is prepared
                _sql(dsn, "INSERT INTO items VALUES (0, 'streamed')")
                assert _keys(await source.poll(100)) == [{"id": 0}]
                _sql(dsn, "INSERT INTO items VALUES (-1, 'streamed')")
                with trio.fail_after(10):
                    while not source._queued:
                        await source.prepare_poll(100)
                        await trio.sleep(0.01)
                assert _keys(await source.poll(100)) == [{"id": -1}]
            return batches, ahead_max
        finally:
            source.close()

    polled, _ = trio.run(snapshot, "prep_plain", False)
    _sql(dsn, "DELETE FROM items WHERE id <= 0")
    prepared, ahead_max = trio.run(snapshot, "prep_ahead", True)
    assert prepared == polled
    assert sum(count for batch in polled for _, count in batch) == ROWS
    assert ahead_max <= CHUNK + BATCH  # one chunk ahead of what the next poll takes


def test_a_poll_cancelled_while_its_chunk_is_read_loses_no_row(postgres_server, pg_database):
    """The next chunk is read in a worker thread while the rows before it go out; a poll
    cancelled while it waits for that read (a stop) leaves the read and its rows to the
    next poll, so every row is still handed out once, in order."""
    dsn = postgres_server.dsn(pg_database)
    _sql(dsn, f"CREATE TABLE items (id int PRIMARY KEY, body text); "
              f"INSERT INTO items SELECT n, 'row ' || n FROM generate_series(1, {ROWS}) n")

    async def main() -> list[int]:
        source = _source(postgres_server.port, pg_database, "prep_cancel")
        source.use_encoded_records()
        ids: list[int] = []
        cancelled = 0
        try:
            while source.snapshot is not None or not ids:
                if source._chunk_fetch is not None:  # a read in flight: cancel the wait
                    with trio.move_on_after(0):
                        await source.poll(100)
                        raise AssertionError("not cancelled")  # pragma: no cover
                    cancelled += 1
                ids.extend(key["id"] for key in _keys(await source.poll(100)))
            assert cancelled >= ROWS // CHUNK - 1  # (every chunk after the first)
            return ids
        finally:
            source.close()

    assert trio.run(main) == list(range(1, ROWS + 1))


def _row_keys(records) -> list:
    """``_keys`` of the change records (a heartbeat, position only, has none)."""
    return _keys([record for record in records if not record.position_only])


def test_ready_polls_hand_out_the_same_rows_and_only_whole_transactions_that_fit(
        postgres_server, pg_database):
    """``poll_ready`` (the batch cycle's gathering) between polls: the snapshot's rows come
    out once, in order, never more than asked; while streaming, a ready poll takes the
    whole transactions readable now that fit and leaves a bigger one to the next poll."""
    dsn = postgres_server.dsn(pg_database)
    _sql(dsn, f"CREATE TABLE items (id int PRIMARY KEY, body text); "
              f"INSERT INTO items SELECT n, 'row ' || n FROM generate_series(1, {ROWS}) n")

    async def main() -> None:
        source = _source(postgres_server.port, pg_database, "ready_slot")
        try:
            ids = [key["id"] for key in _row_keys(await source.poll(100))]
            while source.snapshot is not None:
                ready = await source.poll_ready(10)
                assert sum(record.record_count for record in ready) <= 10
                ids.extend(key["id"] for key in _row_keys(ready))
                if not ready:
                    ids.extend(key["id"] for key in _row_keys(await source.poll(100)))
            assert ids == list(range(1, ROWS + 1))
            _sql(dsn, "INSERT INTO items VALUES (1001, 'small'), (1002, 'small')")
            streamed = [key["id"] for key in _row_keys(await source.poll(100))]
            _sql(dsn, "INSERT INTO items SELECT n, 'big' FROM generate_series(2001, 2040) n")
            with trio.fail_after(10):
                while source._queued < 40:  # read and queued, but never handed out ...
                    assert await source.poll_ready(BATCH) == []  # ... 40 rows > BATCH
                    await trio.sleep(0.01)
            streamed.extend(key["id"] for key in _row_keys(await source.poll(100)))
            assert streamed == [1001, 1002, *range(2001, 2041)]
            _sql(dsn, "INSERT INTO items VALUES (3001, 'fits')")
            with trio.fail_after(10):
                while not (ready := await source.poll_ready(BATCH)):
                    await trio.sleep(0.01)
            assert [key["id"] for key in _row_keys(ready)] == [3001]
        finally:
            source.close()

    trio.run(main)
