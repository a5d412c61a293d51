"""The values ``PartitionLog`` hands out: append receipts, read results, sync tickets, counters.

Theory of operation
-------------------
Frozen, self-describing records with no behaviour, kept apart from ``partition_log.py`` so
that module holds only the log's logic. ``partition_log`` re-exports them; import them from
there. ``AppendInfo``, made per produce, is a ``NamedTuple``: a frozen attrs class costs
~2.5x as much to build (250 against 100 ns here).
"""

from __future__ import annotations

from typing import NamedTuple

import attrs

from rivven_broker.file_region import FileRegion

__all__ = ["AppendInfo", "ReadResult", "SyncTicket", "LogStatistics"]


class AppendInfo(NamedTuple):
    """Where an append landed. ``log_append_time_ms`` is the broker clock at the append
    (record timestamps are the producer's and are never rewritten)."""

    base_offset: int
    last_offset: int
    log_append_time_ms: int
    batch_count: int
    size_bytes: int


@attrs.frozen
class ReadResult:
    """Whole stored batches, concatenated, and the offset to read next. ``records`` may be a
    read-only ``memoryview`` (the read's buffer without its partial tail, not a copy), or,
    for a ``zero_copy`` read, a ``FileRegion`` naming them in the segment file."""

    records: bytes | memoryview | FileRegion
    next_offset: int
    batch_count: int = 0


@attrs.frozen(eq=False)
class SyncTicket:
    """One group-commit step: fsync every handle, then ``directory`` (when set) with
    ``fsync_dir``, then ``complete_sync``."""

    handles: tuple[int, ...]
    end_offset: int
    ticket_id: int
    segment_versions: tuple[tuple[int, int], ...] = ()  # (base, version) of rolled segments
    #: The log's directory when names in it changed (a roll's new segment, retention): the
    #: sync makes them durable too. ``directory_generation`` says which changes it covers.
    directory: str | None = None
    directory_generation: int = 0


@attrs.frozen
class LogStatistics:
    """Offsets and cumulative counters of one log, for metrics."""

    log_start_offset: int
    log_end_offset: int
    durable_offset: int
    recovery_point: int
    size_bytes: int
    segments: int
    appends: int  # writes: ``append`` calls and ``write_staged`` groups
    appended_batches: int
    appended_bytes: int
    rolls: int
    syncs_completed: int
    syncs_outstanding: int
    segments_deleted: int
    failed: bool
