"""How big the executor's fetches are (no Spark needed).

Goal: a range asks the broker for about what it still needs, not a whole ``fetchMaxBytes``
past its end (a short range, a split range or a small micro-batch used to pull 8 MiB per
partition), and still returns exactly its records. Method: the pure budget function
``fetch_bytes`` with examples and Hypothesis properties; ``read_range`` against a fake broker
that serves real record batches, honours the byte budget like the broker (at least one whole
batch) and records every budget it was given.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from rivven_broker.protocol import messages as m  # noqa: E402
from rivven_broker.records import BatchBuilder  # noqa: E402
from rivven_spark.broker_io import FetchResult  # noqa: E402
from rivven_spark.options import parse_reader_options  # noqa: E402
from rivven_spark.reader import RivvenInputPartition, fetch_bytes, read_range  # noqa: E402

KIB = 1024
MIB = 1024 * KIB
RECORDS_PER_BATCH = 50


def _batch(base: int, count: int) -> bytes:
    builder = BatchBuilder(batch_bytes_max=1 << 20)
    for i in range(count):
        builder.append(0, None, b"v%07d" % (base + i) + bytes(100))
    return struct.pack(">q", base) + builder.build()[8:]


class RecordingIO:
    """One partition of ``batches`` batches; every Fetch's byte budget is kept."""

    def __init__(self, batches: int) -> None:
        self.batches = [(b * RECORDS_PER_BATCH, _batch(b * RECORDS_PER_BATCH, RECORDS_PER_BATCH))
                        for b in range(batches)]
        self.end = batches * RECORDS_PER_BATCH
        self.budgets: list[int] = []

    def fetch(self, topic, partition, offset, bytes_max, isolation_level):
        self.budgets.append(bytes_max)
        body = b""
        for base, data in self.batches:
            if base + RECORDS_PER_BATCH > offset:
                if body and len(body) + len(data) > bytes_max:
                    break
                body += data
        return FetchResult(m.FetchPartitionResponse(
            partition, high_watermark=self.end, last_stable_offset=self.end,
            log_start_offset=0, records=body))


def _read(io: RecordingIO, start: int, end: int, fetch_max: int) -> list[int]:
    options = parse_reader_options({"subscribe": "t", "fetchMaxBytes": str(fetch_max)},
                                   streaming=True)
    part = RivvenInputPartition("t", 0, start, end)
    return [o for b in read_range(options, part, io) for o in b.column("offset").to_pylist()]


def test_first_fetch_is_sized_by_the_range_not_by_fetch_max():
    assert fetch_bytes(10, 0, 0, 2 * MIB) == 64 * KIB  # the floor
    assert fetch_bytes(1000, 0, 0, 2 * MIB) == 1000 * KIB
    assert fetch_bytes(1_000_000, 0, 0, 2 * MIB) == 2 * MIB  # the cap


def test_later_fetches_follow_the_bytes_per_offset_seen():
    # 150 B per offset seen; 10,000 offsets left: 1.5 MB and an eighth.
    assert fetch_bytes(10_000, 150_000, 1000, 16 * MIB) == 1_500_000 + 1_500_000 // 8
    assert fetch_bytes(10_000, 150_000, 1000, MIB) == MIB
    assert fetch_bytes(3, 150_000, 1000, MIB) == 64 * KIB


@given(remaining=st.integers(1, 10**9), offsets_seen=st.integers(0, 10**7),
       bytes_per_offset=st.integers(0, 10**6), bytes_max=st.integers(1, 64 * MIB))
def test_the_budget_stays_within_its_bounds(remaining, offsets_seen, bytes_per_offset,
                                            bytes_max):
    seen = offsets_seen * bytes_per_offset
    budget = fetch_bytes(remaining, seen, offsets_seen, bytes_max)
    assert min(bytes_max, 64 * KIB) <= budget <= bytes_max
    assert fetch_bytes(remaining + 1, seen, offsets_seen, bytes_max) >= budget


def test_a_short_range_fetches_a_small_budget_and_exactly_its_records():
    io = RecordingIO(batches=400)  # about 2.7 MB in all
    assert _read(io, 120, 125, fetch_max=2 * MIB) == list(range(120, 125))
    assert io.budgets == [64 * KIB]


def test_a_long_range_shrinks_its_last_fetches_to_what_is_left():
    io = RecordingIO(batches=400)
    assert _read(io, 0, 5_000, fetch_max=256 * KIB) == list(range(5_000))
    assert io.budgets[0] == 256 * KIB
    assert all(b <= 256 * KIB for b in io.budgets)
    assert io.budgets[-1] < 256 * KIB  # sized by the bytes per offset seen, not the cap
