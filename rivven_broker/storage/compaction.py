"""Log compaction planning (pure): which records of a compacted partition to keep.

Theory of operation
-------------------
A topic with ``cleanup.policy=compact`` (or ``compact,delete``) promises that, for every key,
at least the latest record survives. The cleaner is split, Kafka-style, into *planning* (this
module: pure, fed an abstract description of the segments, returns a ``CompactionPlan``) and
*doing* (rewriting segment files and swapping them in, against the partition log's segment
code; not here yet). ``compact,delete`` compacts exactly like ``compact``; its time and size
retention removes whole old segments through the partition log's ordinary retention, so it
needs nothing from the planner.

Input: the segments, oldest first, each with ``base_offset``, ``next_offset`` and its records
as ``RecordInfo(offset, key, is_tombstone, timestamp_ms)`` (a tombstone is a record with a
null value), plus the active segment's base offset. The planner never looks at a segment
starting at or after ``active_base_offset`` (the active segment is still being written).

Two passes, as Kafka's cleaner does:

1. **Offset map.** Scan the cleanable segments in order and remember, per key, the offset of
   its latest record. The map holds at most ``keys_max`` keys: when the next segment would
   overflow it, cleaning stops before that segment (``cleaned_up_to_offset``) and a later run
   continues from there. The first segment is always taken in whole.
2. **Plan.** A keyed record is kept iff it is its key's latest in the map; if that latest is
   a tombstone it is kept only while ``timestamp_ms + delete_retention_ms > now_ms`` (so
   consumers that are behind still see the delete), and then dropped with every older value.

Choices. Keyless records are **kept** (never silently lost): the broker should refuse keyless
records on compacted topics at produce time, as Kafka does, so they only exist from before a
policy change. Control records are passed as keyless and so always kept. Offsets are never
renumbered: a compacted segment has gaps, and a consumer fetching a removed offset gets the
next kept record. A tombstone's age is its record timestamp (not the time it was first
cleaned, as in Kafka before KIP-534): simpler, pure, and conservative for log-append-time
topics.

The doing part (for the lead / H3's segment code). Rewrite each segment whose plan removes
anything into ``<base>.log.cleaned`` (plus indexes), keeping every kept batch with its
original base offset and last offset delta - a batch that loses all its records is kept as an
empty batch, so batch offsets stay dense within the segment; fsync the new files and the
directory; rename ``.cleaned`` to ``.swap`` (fsync the directory: from here the new version
wins); delete the old files; rename ``.swap`` to the final names; fsync the directory. On
start, recovery finishes a swap: a ``.swap`` present means the old files go and the swap is
renamed in; a ``.cleaned`` without ``.swap`` is deleted. So a crash leaves the old segment or
the new one visible, never neither and never both. Several small cleaned segments may be
merged into one (named after the first base offset) the same way.

Pure: no I/O, no clocks; ``now_ms`` is passed in.
"""

from __future__ import annotations

from array import array
from typing import Iterable, NamedTuple, Sequence

import attrs

from rivven_broker.protocol import limits

__all__ = [
    "RecordInfo",
    "SegmentRecords",
    "SegmentPlan",
    "CompactionPlan",
    "plan_compaction",
]


class RecordInfo(NamedTuple):
    """What the planner needs of one record."""

    offset: int
    key: bytes | None
    is_tombstone: bool
    timestamp_ms: int


@attrs.frozen
class SegmentRecords:
    """One segment: its offset range and its records, oldest first. ``records`` is iterated
    twice, so it must be a collection or an object that rescans the segment on ``iter``."""

    base_offset: int
    next_offset: int
    records: Iterable[RecordInfo]


@attrs.frozen
class SegmentPlan:
    """What to keep of one segment. ``kept_offsets`` is sorted; the range is unchanged."""

    base_offset: int
    next_offset: int
    kept_offsets: array  # array("q")
    records_total: int
    superseded_removed: int
    tombstones_removed: int

    @property
    def removed(self) -> int:
        return self.superseded_removed + self.tombstones_removed

    @property
    def unchanged(self) -> bool:
        """Nothing to remove: the doer leaves this segment alone."""
        return self.removed == 0


@attrs.frozen
class CompactionPlan:
    """The plan for the segments below ``cleaned_up_to_offset``, oldest first."""

    segments: tuple[SegmentPlan, ...]
    cleaned_up_to_offset: int
    keys: int

    @property
    def records_total(self) -> int:
        return sum(s.records_total for s in self.segments)

    @property
    def records_removed(self) -> int:
        return sum(s.removed for s in self.segments)

    @property
    def tombstones_removed(self) -> int:
        return sum(s.tombstones_removed for s in self.segments)

    def is_worthwhile(self) -> bool:
        """True when cleaning would remove at least one record."""
        return self.records_removed > 0


def _cleanable(
    segments: Sequence[SegmentRecords], active_base_offset: int
) -> list[SegmentRecords]:
    previous_next = None
    chosen = []
    for segment in segments:
        assert segment.base_offset <= segment.next_offset, segment
        assert previous_next is None or previous_next <= segment.base_offset, "overlap"
        previous_next = segment.next_offset
        if segment.base_offset >= active_base_offset:
            continue
        assert segment.next_offset <= active_base_offset, "a segment spans the active base"
        assert iter(segment.records) is not segment.records, "records must be re-iterable"
        chosen.append(segment)
    return chosen


def _latest_offsets(
    segments: list[SegmentRecords], keys_max: int
) -> tuple[dict[bytes, RecordInfo], int]:
    """Key -> its latest record, over the longest prefix of ``segments`` that fits."""
    latest: dict[bytes, RecordInfo] = {}
    taken = 0
    for segment in segments:
        fresh: dict[bytes, RecordInfo] = {}
        previous = segment.base_offset - 1
        for record in segment.records:
            assert segment.base_offset <= record.offset < segment.next_offset, record
            assert record.offset > previous, "records must be in offset order"
            previous = record.offset
            if record.key is not None:
                fresh[record.key] = record
        new_keys = sum(1 for key in fresh if key not in latest)
        if taken and len(latest) + new_keys > keys_max:
            break
        latest.update(fresh)
        taken += 1
    return latest, taken


def plan_compaction(
    segments: Sequence[SegmentRecords],
    active_base_offset: int,
    now_ms: int,
    delete_retention_ms: int,
    keys_max: int = limits.compaction_keys_max,
) -> CompactionPlan:
    """Plan one cleaning of a compacted partition. Pure, never blocks (beyond iterating the
    records it is given); raises nothing for valid input (ordering is asserted)."""
    assert delete_retention_ms >= 0 and keys_max > 0
    cleanable = _cleanable(segments, active_base_offset)
    latest, taken = _latest_offsets(cleanable, keys_max)
    horizon_ms = now_ms - delete_retention_ms
    plans = []
    for segment in cleanable[:taken]:
        kept = array("q")
        total = superseded = tombstones = 0
        for record in segment.records:
            total += 1
            if record.key is None:
                kept.append(record.offset)
                continue
            newest = latest[record.key]
            if newest.offset != record.offset:
                superseded += 1
            elif record.is_tombstone and record.timestamp_ms <= horizon_ms:
                tombstones += 1
            else:
                kept.append(record.offset)
        plans.append(
            SegmentPlan(
                segment.base_offset, segment.next_offset, kept, total, superseded, tombstones
            )
        )
    if taken < len(cleanable):
        cleaned_up_to = cleanable[taken].base_offset
    else:
        cleaned_up_to = cleanable[-1].next_offset if cleanable else active_base_offset
    return CompactionPlan(tuple(plans), cleaned_up_to, len(latest))
