"""Source offsets, admission control and partition planning: the reader's pure core.

Theory of operation
-------------------
Spark keeps a streaming source's position as JSON in the checkpoint and decides whether a
micro-batch has new data by comparing those JSON *strings*. Our offset is Kafka's shape,
``{"topic": {"partition": next_offset}}`` (the next offset to read, so a range is
``[start, end)``), always built **canonically**: topics sorted, partition ids as decimal
strings sorted as strings, values plain ints. Python keeps dict insertion order and Spark
serialises with ``json.dumps``, so equal positions always give equal strings (a different key
order would make Spark plan an empty batch on every trigger).

Three decisions live here, as functions of plain data:

- ``resolve``: a ``startingOffsets``/``endingOffsets`` spec (``earliest``, ``latest``, or JSON
  with -2/-1) against a snapshot of the partitions (their earliest and latest offsets).
- ``admit``: the end of the next micro-batch (``latestOffset``). Partitions new since
  ``start`` begin at offset 0 (Kafka's rule: a new partition is read from its beginning; if
  retention already removed some of it, reading reports data loss). Offsets never move
  backwards. An AvailableNow target caps every partition and leaves out partitions born after
  it. A row limit (``maxOffsetsPerTrigger``) is shared among partitions in proportion to their
  lag by the largest-remainder rule: exactly ``min(limit, total lag)`` offsets are admitted,
  none beyond a partition's lag, so every batch with a limit makes progress.
- ``plan_ranges``: the ``[start, end)`` ranges of a batch, split so there are at least
  ``minPartitions`` of them (in proportion to their sizes) and none longer than
  ``maxRecordsPerPartition``.

Offsets count offsets, not records: with ``read_committed`` or after compaction a range may
hold fewer records than its width (as in Kafka).

Pure: no I/O, no clocks. Malformed offsets raise ``OffsetsError``.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, NamedTuple

__all__ = [
    "Offsets",
    "TopicPartitionKey",
    "PartitionSnapshot",
    "OffsetRange",
    "Admission",
    "OffsetsError",
    "canonical",
    "from_pairs",
    "to_pairs",
    "resolve",
    "timestamp_targets",
    "apply_timestamps",
    "share_rows",
    "admit",
    "plan_ranges",
]

#: The JSON-ready offset: ``{"topic": {"partition": next_offset}}``, canonically ordered.
Offsets = dict[str, dict[str, int]]
TopicPartitionKey = tuple[str, int]

EARLIEST = -2
LATEST = -1


class OffsetsError(ValueError):
    """An offset document or spec that cannot be used (malformed, or names no partition)."""


class PartitionSnapshot(NamedTuple):
    """What the broker said about one partition: its first retained offset and the offset
    after its last readable record (the high watermark, or the last stable offset under
    ``read_committed``)."""

    topic: str
    partition: int
    earliest: int
    latest: int


class OffsetRange(NamedTuple):
    """``[start, end)`` of one partition: the unit an executor reads."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


class Admission(NamedTuple):
    """The end of the next batch, and the problems seen on the way (partitions whose latest
    offset fell below the position already reached: the data there was lost)."""

    end: Offsets
    went_backwards: tuple[tuple[TopicPartitionKey, int, int], ...]


def from_pairs(pairs: Mapping[TopicPartitionKey, int]) -> Offsets:
    """The canonical offset document of ``{(topic, partition): offset}``."""
    by_topic: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in pairs.items():
        by_topic.setdefault(topic, {})[str(partition)] = int(offset)
    return {topic: dict(sorted(by_topic[topic].items())) for topic in sorted(by_topic)}


def to_pairs(offsets: Mapping) -> dict[TopicPartitionKey, int]:
    """``{(topic, partition): offset}`` of an offset document (partition keys as strings,
    the way JSON brings them back, or ints).

    Raises:
        OffsetsError: not a ``{str: {partition: int >= 0}}`` document.
    """
    if not isinstance(offsets, Mapping):
        raise OffsetsError(f"an offset must be a JSON object, not {offsets!r}")
    pairs: dict[TopicPartitionKey, int] = {}
    for topic, partitions in offsets.items():
        if not isinstance(topic, str) or not isinstance(partitions, Mapping):
            raise OffsetsError(f"bad offset entry {topic!r}: {partitions!r}")
        for partition, offset in partitions.items():
            try:
                number = int(partition)
            except (TypeError, ValueError):
                raise OffsetsError(f"bad partition {partition!r} of {topic!r}") from None
            if type(offset) is not int or offset < 0 or number < 0:
                raise OffsetsError(f"bad offset {offset!r} for {topic}/{partition}")
            pairs[(topic, number)] = offset
    return pairs


def canonical(offsets: Mapping) -> Offsets:
    """The canonical form of an offset document (see the module docstring)."""
    return from_pairs(to_pairs(offsets))


def resolve(
    spec: str | Mapping[str, Mapping[int, int]], snapshot: Iterable[PartitionSnapshot]
) -> dict[TopicPartitionKey, int]:
    """Turn a ``startingOffsets``/``endingOffsets`` spec into offsets for every partition of
    ``snapshot``. A JSON spec may use -2 (earliest) and -1 (latest); snapshot partitions it
    does not name take their earliest offset.

    Raises:
        OffsetsError: the spec names a partition that is not in the snapshot.
    """
    parts = {(s.topic, s.partition): s for s in snapshot}
    if spec == "earliest":
        return {key: s.earliest for key, s in parts.items()}
    if spec == "latest":
        return {key: s.latest for key, s in parts.items()}
    assert isinstance(spec, Mapping), spec
    out = {key: s.earliest for key, s in parts.items()}
    for topic, partitions in spec.items():
        for partition, offset in partitions.items():
            key = (topic, int(partition))
            if key not in parts:
                raise OffsetsError(f"offsets name {topic}/{partition}, which is not subscribed"
                                   " or does not exist")
            s = parts[key]
            out[key] = {EARLIEST: s.earliest, LATEST: s.latest}.get(offset, offset)
    return out


def timestamp_targets(
    every: int | None, by_partition: Iterable[tuple[str, Iterable[tuple[int, int]]]],
    snapshot: Iterable[PartitionSnapshot],
) -> dict[TopicPartitionKey, int]:
    """``{(topic, partition): ms}`` to look up: ``every`` (``startingTimestamp``) for every
    partition of ``snapshot``, else the partitions ``by_partition`` names.

    Raises:
        OffsetsError: ``by_partition`` names a partition that is not in the snapshot.
    """
    keys = {(s.topic, s.partition) for s in snapshot}
    if every is not None:
        return {key: every for key in keys}
    wanted = {}
    for topic, partitions in by_partition:
        for partition, ms in partitions:
            if (topic, partition) not in keys:
                raise OffsetsError(f"offsets by timestamp name {topic}/{partition}, which is "
                                   "not subscribed or does not exist")
            wanted[(topic, partition)] = ms
    return wanted


def apply_timestamps(
    offsets: Mapping[TopicPartitionKey, int], wanted: Mapping[TopicPartitionKey, int],
    found: Mapping[TopicPartitionKey, int], snapshot: Iterable[PartitionSnapshot], *,
    missing: str,
) -> dict[TopicPartitionKey, int]:
    """``offsets`` with the partitions looked up by time replaced by what was ``found``
    (the first offset at or after the time; -1: no such record). ``missing`` says what a
    partition without one gets: "latest" its latest offset, "error" an ``OffsetsError``
    (Spark's ``startingOffsetsByTimestampStrategy``).

    Raises:
        OffsetsError: a partition without a record that late, under "error".
    """
    latest = {(s.topic, s.partition): s.latest for s in snapshot}
    out = dict(offsets)
    for key, ms in sorted(wanted.items()):
        offset = found.get(key, -1)
        if offset < 0:
            if missing == "error":
                raise OffsetsError(f"{key[0]}/{key[1]} has no record at or after {ms} ms "
                                   "(startingOffsetsByTimestampStrategy=latest starts at "
                                   "its latest offset instead)")
            offset = latest[key]
        out[key] = offset
    return out


def share_rows(lags: Mapping[TopicPartitionKey, int], limit: int) -> dict[TopicPartitionKey, int]:
    """Split ``limit`` rows among partitions in proportion to their lag (largest remainder).

    The shares sum to ``min(limit, sum(lags))``; no share exceeds its lag; ties go to the
    smaller ``(topic, partition)``. Deterministic.
    """
    assert limit >= 0
    total = sum(lags.values())
    if total <= limit:
        return dict(lags)
    shares: dict[TopicPartitionKey, int] = {}
    remainders = []
    for key in sorted(lags):
        lag = lags[key]
        assert lag >= 0
        exact_numerator = limit * lag  # share = exact_numerator / total
        share = exact_numerator // total
        shares[key] = share
        remainders.append((-(exact_numerator % total), key))
    left = limit - sum(shares.values())
    for _, key in sorted(remainders):
        if left == 0:
            break
        if shares[key] < lags[key]:
            shares[key] += 1
            left -= 1
    assert left == 0
    return shares


def admit(
    start: Mapping,
    snapshot: Iterable[PartitionSnapshot],
    *,
    max_rows: int | None = None,
    target: Mapping | None = None,
    min_rows: int | None = None,
    waited_ms: int = 0,
    max_delay_ms: int = 0,
) -> Admission:
    """The end offset of the next micro-batch (see the module docstring).

    ``start``: the previous end (an offset document); ``snapshot``: the partitions now
    subscribed; ``max_rows``: the row limit Spark passed (None: all available); ``target``:
    the AvailableNow end (an offset document) or None. ``min_rows`` (``minOffsetsPerTrigger``):
    fewer new offsets than this make no batch (``end`` is ``start``) until ``waited_ms``, the
    time since the last batch, reaches ``max_delay_ms`` (``maxTriggerDelay``); an AvailableNow
    run ignores it, as Spark's Kafka source does.

    Returns ``Admission(end, went_backwards)``. ``end`` equals ``canonical(start)`` when there
    is nothing to read.
    """
    begin = to_pairs(start)
    caps = None if target is None else to_pairs(target)
    candidates: dict[TopicPartitionKey, int] = dict(begin)
    backwards = []
    lags: dict[TopicPartitionKey, int] = {}
    for s in snapshot:
        key = (s.topic, s.partition)
        first = begin.get(key)
        if caps is not None and key not in caps:
            continue  # born after the AvailableNow target was taken
        latest = s.latest if caps is None else min(s.latest, caps[key])
        if first is None:
            first = 0  # a new partition is read from its beginning
            candidates[key] = 0
        if s.latest < first:
            backwards.append((key, first, s.latest))
        lags[key] = max(0, latest - first)
    if (min_rows is not None and caps is None and sum(lags.values()) < min_rows
            and waited_ms < max_delay_ms):
        return Admission(canonical(start), tuple(sorted(backwards)))
    admitted = lags if max_rows is None else share_rows(lags, max_rows)
    for key, rows in admitted.items():
        candidates[key] = candidates[key] + rows
    new_keys = [key for key in candidates if key not in begin]
    for key in new_keys:
        if candidates[key] == 0 and not lags.get(key):
            del candidates[key]  # an empty new partition: nothing to record yet
    return Admission(from_pairs(candidates), tuple(sorted(backwards)))


def plan_ranges(
    start: Mapping,
    end: Mapping,
    *,
    min_partitions: int | None = None,
    max_records: int | None = None,
) -> list[OffsetRange]:
    """The ranges between two offset documents, split per ``min_partitions`` (at least that
    many ranges when the data allows) and ``max_records`` (no range longer). Partitions only
    in ``end`` start at 0; empty ranges are left out. Sorted by topic, partition, start.
    """
    begin = to_pairs(start)
    ranges = []
    for key, stop in sorted(to_pairs(end).items()):
        first = begin.get(key, 0)
        if stop > first:
            ranges.append(OffsetRange(key[0], key[1], first, stop))
    total = sum(r.size for r in ranges)
    out: list[OffsetRange] = []
    for r in ranges:
        parts = 1
        if min_partitions is not None and len(ranges) < min_partitions and total > 0:
            parts = max(1, round(r.size * min_partitions / total))
        if max_records is not None:
            parts = max(parts, math.ceil(r.size / max_records))
        out.extend(_split(r, min(parts, r.size)))
    return out


def _split(r: OffsetRange, parts: int) -> list[OffsetRange]:
    """``r`` cut into ``parts`` ranges whose sizes differ by at most one."""
    base, extra = divmod(r.size, parts)
    out = []
    position = r.start
    for index in range(parts):
        size = base + (1 if index < extra else 0)
        out.append(OffsetRange(r.topic, r.partition, position, position + size))
        position += size
    assert position == r.end
    return out
