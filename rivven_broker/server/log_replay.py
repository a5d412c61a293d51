"""Replaying an internal topic's partition: what the coordinators rebuild their state from.

Theory of operation
-------------------
The group and transaction coordinators keep no state but their internal topics'
records. ``keyed_records`` reads one partition from its log start to its log end, one read of
at most ``READ_BYTES`` at a time, as ``(key, value)`` pairs (a tombstone's value is None);
``replay`` does the same from a trio task, with a checkpoint after every chunk, so a broker
that becomes a coordinator while serving stays responsive. Blocks on file reads (the chunks
are bounded). Records without a key are left to the caller to judge.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import trio

from rivven_broker.records.reader import decode_records

if TYPE_CHECKING:
    from rivven_broker.storage.partition_log import PartitionLog

__all__ = ["READ_BYTES", "keyed_chunks", "keyed_records", "replay"]

READ_BYTES = 1 << 20

Keyed = tuple[bytes | None, bytes | None]


def keyed_chunks(plog: PartitionLog) -> Iterator[list[Keyed]]:
    """The partition's records, log start to log end, one read chunk at a time."""
    offset = plog.log_start_offset
    while offset < plog.log_end_offset:
        result = plog.read(offset, READ_BYTES)
        yield [(r.key, r.value) for r in decode_records(result.records, min_offset=offset)]
        offset = result.next_offset


def keyed_records(plog: PartitionLog) -> list[Keyed]:
    """Every record of the partition (blocks for the whole read)."""
    return [record for chunk in keyed_chunks(plog) for record in chunk]


async def replay(plog: PartitionLog) -> list[Keyed]:
    """Every record of the partition, with a checkpoint after each chunk."""
    records: list[Keyed] = []
    for chunk in keyed_chunks(plog):
        records.extend(chunk)
        await trio.lowlevel.checkpoint()
    return records
