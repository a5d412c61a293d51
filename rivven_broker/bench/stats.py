"""Latency histograms and throughput buckets, recorded in workers and merged by the coordinator.

Theory of operation
-------------------
Each worker process records one latency per *request* (a produce request's batch, a peer's
pipelined group of commands, an e2e batch), never per record, into an HDR histogram of
microseconds (1 us .. 60 s, 3 significant digits; ``record_value`` costs about 1 us, so per
request is affordable). It ships the histogram as ``encode()`` bytes; the coordinator merges
them with ``decode_and_add`` into one ``Latency`` and reads p50/p99/p99.9/max from it.

Throughput is counted in whole-second buckets of the measured window (``Buckets``), so the
report can give mean, stddev, min and max per second and flag an unsteady run. Bucket times
are seconds since the window opened; events outside it are not counted.

Pure: no clocks; callers pass times.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

from hdrh.histogram import HdrHistogram

__all__ = ["Latency", "Buckets", "LATENCY_US_MAX", "spread"]

LATENCY_US_MIN = 1
LATENCY_US_MAX = 60_000_000
_DIGITS = 3


class Latency:
    """An HDR histogram of latencies in microseconds; mergeable across processes."""

    __slots__ = ("_histogram", "record_us")

    def __init__(self) -> None:
        self._histogram = HdrHistogram(LATENCY_US_MIN, LATENCY_US_MAX, _DIGITS)
        #: Record one latency in microseconds (clamped into the histogram's range).
        self.record_us = self._record

    def _record(self, value_us: float) -> None:
        value = int(value_us)
        if value < LATENCY_US_MIN:
            value = LATENCY_US_MIN
        elif value > LATENCY_US_MAX:
            value = LATENCY_US_MAX
        self._histogram.record_value(value)

    @property
    def count(self) -> int:
        return self._histogram.get_total_count()

    def encode(self) -> bytes:
        """The histogram as compact bytes, for ``merge`` in another process."""
        return self._histogram.encode()

    def merge(self, encoded: bytes) -> None:
        """Add a histogram produced by ``encode`` (any process) into this one."""
        self._histogram.decode_and_add(encoded)

    @classmethod
    def merged(cls, encoded: Iterable[bytes]) -> Latency:
        """One histogram holding every value of the ``encoded`` ones."""
        out = cls()
        for item in encoded:
            out.merge(item)
        return out

    def percentile_ms(self, percentile: float) -> float:
        """The latency at ``percentile`` (0..100) in milliseconds; 0.0 when empty."""
        if not self.count:
            return 0.0
        return self._histogram.get_value_at_percentile(percentile) / 1000.0

    def max_ms(self) -> float:
        return self._histogram.get_max_value() / 1000.0 if self.count else 0.0

    def summary_ms(self) -> dict[str, float]:
        """``{"p50", "p99", "p999", "max"}`` in milliseconds (rounded to 1 us)."""
        return {
            "p50": round(self.percentile_ms(50), 3),
            "p99": round(self.percentile_ms(99), 3),
            "p999": round(self.percentile_ms(99.9), 3),
            "max": round(self.max_ms(), 3),
        }


class Buckets:
    """Counts per whole second of a window ``[0, seconds)``; events outside are dropped."""

    __slots__ = ("counts",)

    def __init__(self, seconds: float) -> None:
        self.counts = [0] * max(1, math.ceil(seconds))

    def add(self, at_s: float, count: int) -> None:
        """Add ``count`` at ``at_s`` seconds after the window opened."""
        if at_s >= 0:
            index = int(at_s)
            if index < len(self.counts):
                self.counts[index] += count

    @staticmethod
    def merged(many: Sequence[Sequence[int]]) -> list[int]:
        """Element-wise sum of bucket lists of equal length."""
        if not many:
            return []
        length = max(len(item) for item in many)
        return [sum(item[i] for item in many if i < len(item)) for i in range(length)]


def spread(values: Sequence[float]) -> float:
    """(max - min) / median of ``values``; 0.0 for fewer than two or a zero median."""
    if len(values) < 2:
        return 0.0
    ordered = sorted(values)
    middle = len(ordered) // 2
    median = (
        ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    )
    return (ordered[-1] - ordered[0]) / median if median else 0.0
