"""The reader's pure core: canonical offsets, spec resolution, admission control, planning.

Goal: the decisions Spark's planner process makes every trigger are right without Spark
running. Method: direct calls on plain data, and Hypothesis properties for the two pieces of
arithmetic (sharing a row limit, splitting ranges) against their simple specifications: the
shares sum to ``min(limit, total lag)`` and never exceed a lag; the ranges tile ``[start,
end)`` of every partition exactly.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rivven_spark.offsets import (
    OffsetsError,
    PartitionSnapshot,
    admit,
    canonical,
    from_pairs,
    plan_ranges,
    resolve,
    share_rows,
    to_pairs,
)


def snap(topic: str, partition: int, earliest: int, latest: int) -> PartitionSnapshot:
    return PartitionSnapshot(topic, partition, earliest, latest)


# --- canonical form --------------------------------------------------------------------------


def test_equal_positions_give_equal_json_strings_whatever_the_input_order():
    a = canonical({"b": {"10": 5, "2": 1}, "a": {"0": 3}})
    b = canonical({"a": {0: 3}, "b": {2: 1, 10: 5}})
    assert json.dumps(a) == json.dumps(b)
    assert json.dumps(a) == '{"a": {"0": 3}, "b": {"10": 5, "2": 1}}'
    assert json.dumps(a) == json.dumps(a, sort_keys=True)  # Spark may sort: same string


def test_json_round_trip_is_stable():
    offsets = from_pairs({("t", 3): 7, ("t", 11): 2, ("s", 0): 0})
    assert canonical(json.loads(json.dumps(offsets))) == offsets
    assert json.dumps(canonical(json.loads(json.dumps(offsets)))) == json.dumps(offsets)


@pytest.mark.parametrize(
    "bad",
    [[], {"t": [1]}, {"t": {"x": 1}}, {"t": {"0": -1}}, {"t": {"0": "5"}}, {"t": {"-1": 2}}],
)
def test_malformed_offsets_are_refused(bad):
    with pytest.raises(OffsetsError):
        to_pairs(bad)


# --- resolving specs ------------------------------------------------------------------------


SNAPSHOT = [snap("t", 0, 5, 50), snap("t", 1, 0, 7)]


def test_earliest_and_latest():
    assert resolve("earliest", SNAPSHOT) == {("t", 0): 5, ("t", 1): 0}
    assert resolve("latest", SNAPSHOT) == {("t", 0): 50, ("t", 1): 7}


def test_json_spec_with_special_values_and_defaults_for_unnamed_partitions():
    assert resolve({"t": {0: -1}}, SNAPSHOT) == {("t", 0): 50, ("t", 1): 0}
    assert resolve({"t": {0: 20, 1: -2}}, SNAPSHOT) == {("t", 0): 20, ("t", 1): 0}


def test_json_spec_naming_an_unknown_partition_is_an_error():
    with pytest.raises(OffsetsError, match="t/9"):
        resolve({"t": {9: 1}}, SNAPSHOT)


# --- sharing a row limit --------------------------------------------------------------------


def test_share_rows_is_proportional_and_exact():
    shares = share_rows({("t", 0): 900, ("t", 1): 100}, 300)
    assert shares == {("t", 0): 270, ("t", 1): 30}
    shares = share_rows({("t", 0): 1, ("t", 1): 1, ("t", 2): 1}, 2)
    assert sum(shares.values()) == 2 and shares[("t", 0)] == shares[("t", 1)] == 1


def test_share_rows_takes_everything_below_the_limit():
    assert share_rows({("t", 0): 3, ("t", 1): 0}, 10) == {("t", 0): 3, ("t", 1): 0}


@given(
    lags=st.dictionaries(st.tuples(st.sampled_from("abc"), st.integers(0, 20)),
                         st.integers(0, 10_000), max_size=30),
    limit=st.integers(0, 50_000),
)
def test_share_rows_properties(lags, limit):
    shares = share_rows(lags, limit)
    assert shares.keys() == lags.keys()
    assert sum(shares.values()) == min(limit, sum(lags.values()))
    assert all(0 <= shares[k] <= lags[k] for k in lags)


# --- admission ------------------------------------------------------------------------------


def test_nothing_new_returns_start_itself():
    start = {"t": {"0": 50, "1": 7}}
    admission = admit(start, SNAPSHOT)
    assert admission.end == canonical(start)
    assert json.dumps(admission.end) == json.dumps(canonical(start))


def test_everything_available_without_a_limit():
    assert admit({"t": {"0": 10, "1": 0}}, SNAPSHOT).end == {"t": {"0": 50, "1": 7}}


def test_limit_is_split_by_lag():
    end = admit({"t": {"0": 10, "1": 0}}, SNAPSHOT, max_rows=10).end
    assert end["t"]["0"] - 10 + end["t"]["1"] == 10
    assert end == {"t": {"0": 19, "1": 1}}  # lags 40 and 7: 8.5 and 1.5 -> 9 and 1


def test_new_partitions_start_at_zero_and_empty_ones_are_not_recorded():
    snapshot = [*SNAPSHOT, snap("u", 0, 3, 9), snap("u", 1, 0, 0)]
    end = admit({"t": {"0": 50, "1": 7}}, snapshot).end
    assert end == {"t": {"0": 50, "1": 7}, "u": {"0": 9}}
    assert plan_ranges({"t": {"0": 50, "1": 7}}, end)[0][:4] == ("u", 0, 0, 9)


def test_offsets_never_go_backwards_and_the_loss_is_reported():
    admission = admit({"t": {"0": 60, "1": 7}}, SNAPSHOT)
    assert admission.end == {"t": {"0": 60, "1": 7}}
    assert admission.went_backwards == ((("t", 0), 60, 50),)


def test_vanished_partitions_are_carried_forward():
    assert admit({"gone": {"0": 4}, "t": {"0": 50, "1": 7}}, SNAPSHOT).end == {
        "gone": {"0": 4}, "t": {"0": 50, "1": 7}}


def test_available_now_target_caps_and_excludes_later_partitions():
    target = {"t": {"0": 30, "1": 7}}
    snapshot = [*SNAPSHOT, snap("later", 0, 0, 100)]
    end = admit({"t": {"0": 10, "1": 0}}, snapshot, target=target).end
    assert end == {"t": {"0": 30, "1": 7}}
    assert admit(end, snapshot, target=target).end == end  # done: end == start


def test_available_now_with_a_limit_takes_several_batches_then_stops():
    target = {"t": {"0": 50, "1": 7}}
    position = {"t": {"0": 5, "1": 0}}
    batches = 0
    while True:
        end = admit(position, SNAPSHOT, max_rows=20, target=target).end
        if end == position:
            break
        batches += 1
        moved = sum(end["t"][p] - position["t"][p] for p in ("0", "1"))
        assert moved == min(20, 57 - sum(position["t"].values()))
        position = end
    assert batches == 3 and position == target  # 52 rows: 20 + 20 + 12


# --- planning ranges -----------------------------------------------------------------------


def test_ranges_skip_empty_partitions():
    ranges = plan_ranges({"t": {"0": 5, "1": 7}}, {"t": {"0": 9, "1": 7}})
    assert [tuple(r) for r in ranges] == [("t", 0, 5, 9)]


def test_min_partitions_splits_in_proportion():
    ranges = plan_ranges({"t": {"0": 0, "1": 0}}, {"t": {"0": 300, "1": 100}}, min_partitions=4)
    assert [(r.partition, r.size) for r in ranges] == [(0, 100), (0, 100), (0, 100), (1, 100)]


def test_max_records_caps_every_range():
    ranges = plan_ranges({"t": {"0": 0}}, {"t": {"0": 10}}, max_records=3)
    assert [r.size for r in ranges] == [3, 3, 2, 2]


@given(
    sizes=st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 5000)), min_size=1,
                   max_size=8),
    min_partitions=st.none() | st.integers(1, 40),
    max_records=st.none() | st.integers(1, 2000),
)
def test_ranges_tile_every_partition_exactly(sizes, min_partitions, max_records):
    start = from_pairs({("t", i): s for i, (s, _) in enumerate(sizes)})
    end = from_pairs({("t", i): s + n for i, (s, n) in enumerate(sizes)})
    ranges = plan_ranges(start, end, min_partitions=min_partitions, max_records=max_records)
    for i, (first, size) in enumerate(sizes):
        mine = [r for r in ranges if r.partition == i]
        covered = [o for r in mine for o in range(r.start, r.end)]
        assert covered == list(range(first, first + size))
        assert all(r.size > 0 for r in mine)
        if max_records is not None:
            assert all(r.size <= max_records for r in mine)
    total = sum(n for _, n in sizes)
    if min_partitions is not None and total >= min_partitions and len(sizes) < min_partitions:
        assert len(ranges) >= min(min_partitions, total) // 2  # rounding may lose some
