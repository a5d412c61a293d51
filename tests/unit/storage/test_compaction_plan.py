"""Compaction planning keeps the latest value per key, and nothing it should not touch.

Method: Hypothesis builds a partition as a list of records (keys from a small alphabet so
keys repeat, some keyless, some tombstones, increasing offsets with gaps, timestamps), cuts it
into segments and picks the active segment. The model is the key -> value map a consumer
reading the whole log would end with (a tombstone deletes). Applying the plan (keeping only
the planned offsets of the cleaned segments, everything from the first uncleaned offset on)
must give the same map; keyless records and the active segment are untouched; offsets are a
subset, in order; each key survives at most once in the cleaned range; old tombstones go,
young ones stay; planning again over the result removes nothing more; a tiny key budget
still preserves the map (it only cleans less).
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from rivven_broker.storage.compaction import RecordInfo, SegmentRecords, plan_compaction

NOW_MS = 1_000_000
RETENTION_MS = 1_000


_RECORD = st.tuples(
    st.none() | st.sampled_from([b"a", b"b", b"c", b"d", b"e"]),  # key
    st.integers(0, 3),  # 0: a tombstone (when keyed)
    st.integers(NOW_MS - 3 * RETENTION_MS, NOW_MS),  # timestamp
    st.integers(1, 3),  # distance to the next offset (gaps, as after an earlier compaction)
)


@st.composite
def partitions(draw):
    offset = draw(st.integers(0, 5))
    records, values = [], {}
    for key, kind, timestamp, gap in draw(st.lists(_RECORD, max_size=30)):
        tombstone = key is not None and kind == 0
        records.append(RecordInfo(offset, key, tombstone, timestamp))
        values[offset] = None if tombstone else f"v{offset}"
        offset += gap
    end = offset
    cuts = sorted(set(draw(st.lists(st.integers(0, end), max_size=4)) + [0, end]))
    segments = []
    for base, next_offset in zip(cuts, cuts[1:]):
        inside = [r for r in records if base <= r.offset < next_offset]
        segments.append(SegmentRecords(base, next_offset, inside))
    active = draw(st.sampled_from([s.base_offset for s in segments] + [end]))
    return segments, active, values


def _model(records, values):
    state = {}
    for record in records:
        if record.key is None:
            continue
        if record.is_tombstone:
            state.pop(record.key, None)
        else:
            state[record.key] = values[record.offset]
    return state


def _all(segments):
    return [r for s in segments for r in s.records]


def _apply(segments, plan):
    """The records a reader sees after the plan is carried out, as new segments."""
    by_base = {p.base_offset: p for p in plan.segments}
    result = []
    for segment in segments:
        chosen = by_base.get(segment.base_offset)
        if chosen is None:
            result.append(segment)
            continue
        keep = set(chosen.kept_offsets)
        kept = [r for r in segment.records if r.offset in keep]
        result.append(SegmentRecords(segment.base_offset, segment.next_offset, kept))
    return result


@settings(max_examples=150, deadline=None)
@given(partitions(), st.sampled_from([1, 2, 1_000_000]))
def test_compaction_preserves_the_latest_value_per_key(partition, keys_max):
    segments, active, values = partition
    plan = plan_compaction(segments, active, NOW_MS, RETENTION_MS, keys_max)
    after = _apply(segments, plan)
    assert _model(_all(after), values) == _model(_all(segments), values)
    before_offsets = [r.offset for r in _all(segments)]
    after_offsets = [r.offset for r in _all(after)]
    assert set(after_offsets) <= set(before_offsets) and after_offsets == sorted(after_offsets)
    for original, cleaned in zip(segments, after):
        assert (cleaned.base_offset, cleaned.next_offset) == (
            original.base_offset,
            original.next_offset,
        )
        if original.base_offset >= plan.cleaned_up_to_offset:
            assert cleaned.records == original.records  # active and uncleaned: untouched
    assert plan.cleaned_up_to_offset <= max(active, 0) or not plan.segments
    # Keyless records all survive; each key at most once in the cleaned range.
    keyless_after = [r for r in _all(after) if r.key is None]
    assert keyless_after == [r for r in _all(segments) if r.key is None]
    if keys_max > 5:
        cleaned = [r.key for r in _all(after) if r.key and r.offset < plan.cleaned_up_to_offset]
        assert len(cleaned) == len(set(cleaned))
    assert plan.records_removed == len(before_offsets) - len(after_offsets)


@settings(max_examples=100, deadline=None)
@given(partitions())
def test_tombstones_go_only_after_delete_retention(partition):
    segments, active, values = partition
    plan = plan_compaction(segments, active, NOW_MS, RETENTION_MS)
    kept = {o for p in plan.segments for o in p.kept_offsets}
    latest = {}
    for record in _all(segments):
        if record.key is not None and record.offset < plan.cleaned_up_to_offset:
            latest[record.key] = record
    for record in latest.values():
        young = record.timestamp_ms > NOW_MS - RETENTION_MS
        assert (record.offset in kept) == (not record.is_tombstone or young)


@settings(max_examples=100, deadline=None)
@given(partitions())
def test_planning_again_removes_nothing_more(partition):
    segments, active, values = partition
    plan = plan_compaction(segments, active, NOW_MS, RETENTION_MS)
    again = plan_compaction(_apply(segments, plan), active, NOW_MS, RETENTION_MS)
    assert not again.is_worthwhile()
    assert all(p.unchanged for p in again.segments)


def test_a_worked_example():
    records = [
        RecordInfo(0, b"k", False, 10),
        RecordInfo(1, None, False, 10),
        RecordInfo(2, b"k", False, 10),
        RecordInfo(3, b"gone", False, 10),
        RecordInfo(4, b"gone", True, 10),  # old tombstone: dropped with the value it deletes
        RecordInfo(5, b"new", True, 990),  # young tombstone: kept
        RecordInfo(6, b"k", False, 10),  # active segment: never read by the planner
    ]
    segments = [
        SegmentRecords(0, 3, records[:3]),
        SegmentRecords(3, 6, records[3:6]),
        SegmentRecords(6, 7, records[6:]),
    ]
    plan = plan_compaction(segments, 6, now_ms=1000, delete_retention_ms=100)
    assert [list(p.kept_offsets) for p in plan.segments] == [[1, 2], [5]]
    removed = [(p.superseded_removed, p.tombstones_removed) for p in plan.segments]
    assert removed == [(1, 0), (1, 1)]
    assert plan.cleaned_up_to_offset == 6 and plan.keys == 3 and plan.is_worthwhile()
    assert plan_compaction(segments, 0, 1000, 100).segments == ()
