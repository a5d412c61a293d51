"""Tiny record-batch factory for storage tests (the storage layer never looks at records).

A batch is a valid 61-byte header (CRC computed) followed by arbitrary "records" bytes, which
is all the partition log needs. ``stored`` computes what the log must hold for a batch once it
has assigned an offset and leader epoch.
"""

from __future__ import annotations

import trio

from rivven_broker.records import header
from rivven_broker.storage.errors import SyncFailedError

__all__ = ["make_batch", "stored", "batch_header", "append_and_sync", "run_until_failed"]


def make_batch(
    record_count: int = 1,
    payload: bytes = b"",
    *,
    max_timestamp: int = 0,
    first_timestamp: int | None = None,
    base_offset: int = 0,
    attributes: int = 0,
) -> bytes:
    """One valid batch of ``record_count`` dense offsets whose records section is ``payload``."""
    assert record_count >= 1
    first = max_timestamp if first_timestamp is None else first_timestamp
    body_length = header.HEADER_BYTES - header.LOG_OVERHEAD_BYTES + len(payload)
    fields = [
        base_offset, body_length, -1, header.MAGIC, 0, attributes, record_count - 1,
        first, max_timestamp, -1, -1, -1, record_count,
    ]
    raw = bytearray(header.HEADER.pack(*fields) + payload)
    fields[4] = header.compute_crc(raw)
    header.HEADER.pack_into(raw, 0, *fields)
    return bytes(raw)


def stored(batch: bytes, base_offset: int, leader_epoch: int = 0) -> bytes:
    """The bytes the log keeps for ``batch`` after assigning ``base_offset``."""
    length = len(batch) - header.LOG_OVERHEAD_BYTES
    return header.stamp(base_offset, length, leader_epoch) + batch[16:]


def batch_header(batch: bytes, position: int = 0) -> header.BatchHeader:
    return header.parse_header(batch, position)


async def append_and_sync(worker, logs, batch: bytes) -> None:
    """Append ``batch`` to each of ``logs``, mark it dirty with ``worker`` (a ``SyncWorker``)
    and run the worker until every append is durable; then close the worker."""
    infos = []
    for log in logs:
        infos.append(log.append(batch, 0))
        worker.mark_dirty(log)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        for log, info in zip(logs, infos):
            await worker.wait_durable(log, info.last_offset)
        await worker.aclose()


async def run_until_failed(worker, failures: list[BaseException]) -> None:
    """Run ``worker`` (a ``SyncWorker``); the ``SyncFailedError`` that stops it goes to
    ``failures`` (the fsync-failure tests count it beside their waiters')."""
    try:
        await worker.run()
    except SyncFailedError as exc:
        failures.append(exc)
