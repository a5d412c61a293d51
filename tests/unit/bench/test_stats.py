"""Latency histograms and per-second buckets: what workers record is what the report reads.

Method: record known values in several ``Latency`` objects, ship them as ``encode()`` bytes
(as worker processes do) and check that the merged histogram has every value and the right
percentiles (HDR keeps 3 significant digits); check bucket counting and merging, and the
round-to-round spread used to flag unsteady runs.
"""

from __future__ import annotations

import pytest

from rivven_broker.bench.stats import LATENCY_US_MAX, Buckets, Latency, spread


def test_merged_histograms_hold_every_value():
    first, second = Latency(), Latency()
    for value in range(1, 1001):  # 1 us .. 1 ms
        first.record_us(value)
    for _ in range(10):
        second.record_us(50_000)  # 50 ms
    merged = Latency.merged([first.encode(), second.encode()])
    assert merged.count == 1010
    assert merged.percentile_ms(50) == pytest.approx(0.505, rel=0.01)
    assert merged.max_ms() == pytest.approx(50.0, rel=0.001)
    summary = merged.summary_ms()
    assert set(summary) == {"p50", "p99", "p999", "max"}
    assert summary["p999"] == pytest.approx(50.0, rel=0.001)


def test_merge_is_additive_not_replacing():
    latency = Latency()
    latency.record_us(100)
    encoded = latency.encode()
    merged = Latency.merged([encoded, encoded, encoded])
    assert merged.count == 3


def test_values_are_clamped_into_range():
    latency = Latency()
    latency.record_us(0.2)
    latency.record_us(10 * LATENCY_US_MAX)
    assert latency.count == 2
    assert latency.max_ms() == pytest.approx(LATENCY_US_MAX / 1000, rel=0.001)


def test_empty_histogram_reads_zero():
    assert Latency().summary_ms() == {"p50": 0.0, "p99": 0.0, "p999": 0.0, "max": 0.0}
    assert Latency.merged([]).count == 0


def test_buckets_count_per_second_inside_the_window():
    buckets = Buckets(3.0)
    buckets.add(0.0, 5)
    buckets.add(0.99, 1)
    buckets.add(2.5, 7)
    buckets.add(-0.1, 100)  # warmup: not counted
    buckets.add(3.0, 100)  # after the window: not counted
    assert buckets.counts == [6, 0, 7]
    assert Buckets.merged([[1, 2, 3], [10, 20], []]) == [11, 22, 3]


def test_spread_is_range_over_median():
    assert spread([100.0]) == 0.0
    assert spread([90.0, 100.0, 110.0]) == pytest.approx(0.2)
    assert spread([0.0, 0.0]) == 0.0
