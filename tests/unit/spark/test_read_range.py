"""The executor's read loop against a fake broker: ranges, fetch steps and data loss.

Goal: ``read_range`` returns exactly the records of its range over many fetches, and handles
records that vanished (retention moved the log start; the partition now ends below the range)
per ``failOnDataLoss``: a ``DataLossError`` naming the range and the option, or a skip to what
still exists. Method: a fake ``BrokerIO`` serving real record batches from a list, answering
``OffsetOutOfRangeError`` below its log start like the broker, with a small byte budget so a
range takes many fetches.
"""

from __future__ import annotations

import struct

import pytest

pytest.importorskip("pyspark")

from rivven_broker.client import OffsetOutOfRangeError  # noqa: E402
from rivven_broker.records import BatchBuilder  # noqa: E402
from rivven_spark.broker_io import FetchResult  # noqa: E402
from rivven_spark.offsets import PartitionSnapshot  # noqa: E402
from rivven_spark.options import parse_reader_options  # noqa: E402
from rivven_spark.reader import DataLossError, RivvenInputPartition, read_range  # noqa: E402
from rivven_broker.protocol import messages as m  # noqa: E402


def batch(base: int, count: int) -> bytes:
    builder = BatchBuilder(batch_bytes_max=1 << 16)
    for i in range(count):
        builder.append(0, None, b"%05d" % (base + i))
    return struct.pack(">q", base) + builder.build()[8:]


class FakeIO:
    """One partition of ``batches`` (10 records each); ``log_start``/``end`` limit it."""

    def __init__(self, batches: int, log_start: int = 0, end: int | None = None) -> None:
        self.batches = [(b * 10, batch(b * 10, 10)) for b in range(batches)]
        self.log_start = log_start
        self.end = batches * 10 if end is None else end
        self.fetches = 0

    def fetch(self, topic, partition, offset, bytes_max, isolation_level):
        self.fetches += 1
        if not self.log_start <= offset <= self.end:
            raise OffsetOutOfRangeError(f"{offset} out of range")
        body = b""
        for base, data in self.batches:
            if base + 10 > offset and base < self.end and base + 10 > self.log_start:
                if body and len(body) + len(data) > bytes_max:
                    break
                body += data
        return FetchResult(m.FetchPartitionResponse(
            partition, high_watermark=self.end, last_stable_offset=self.end,
            log_start_offset=self.log_start, records=body))

    def offsets_of(self, topic, partition, isolation_level):
        return PartitionSnapshot(topic, partition, self.log_start, self.end)


def options(**extra):
    return parse_reader_options({"subscribe": "t", "fetchMaxBytes": "300", **extra},
                                streaming=True)


def offsets(io, part, **extra) -> list[int]:
    return [o for b in read_range(options(**extra), part, io) for o in b.column("offset")
            .to_pylist()]


def test_a_range_over_many_fetches():
    io = FakeIO(batches=20)
    assert offsets(io, RivvenInputPartition("t", 0, 15, 187)) == list(range(15, 187))
    assert io.fetches >= 10


def test_retention_gap_fails_by_default():
    io = FakeIO(batches=20, log_start=100)
    with pytest.raises(DataLossError, match=r"\[40, 100\).*failOnDataLoss"):
        offsets(io, RivvenInputPartition("t", 0, 40, 150))


def test_retention_gap_is_skipped_when_allowed():
    io = FakeIO(batches=20, log_start=100)
    assert offsets(io, RivvenInputPartition("t", 0, 40, 150), failOnDataLoss="false") == list(
        range(100, 150))
    assert offsets(io, RivvenInputPartition("t", 0, 40, 90), failOnDataLoss="false") == []


def test_a_partition_that_now_ends_below_the_range():
    io = FakeIO(batches=20, end=120)
    with pytest.raises(DataLossError, match="ends at 120"):
        offsets(io, RivvenInputPartition("t", 0, 100, 150))
    assert offsets(io, RivvenInputPartition("t", 0, 100, 150), failOnDataLoss="false") == list(
        range(100, 120))


def test_read_records_gives_empty_header_tuples_for_null_headers():
    """``BrokerIO.read_records`` (the sink's ledger reads markers through it) turns the Arrow
    rows back into ``Record``s: a record without headers (null in Arrow) has ``()``."""
    from rivven_spark.broker_io import BrokerIO

    builder = BatchBuilder(batch_bytes_max=1 << 16)
    builder.append(0, b"k0", b"plain")
    builder.append(0, b"k1", b"marked", (("h", b"v"),))
    body = struct.pack(">q", 0) + builder.build()[8:]
    io = BrokerIO.__new__(BrokerIO)  # no connection: fetch is served below
    io.fetch = lambda topic, partition, offset, bytes_max, isolation: FetchResult(
        m.FetchPartitionResponse(partition, high_watermark=2, last_stable_offset=2,
                                 log_start_offset=0, records=body))
    records = io.read_records("t", 0, 0, 2, "read_uncommitted")
    assert [(r.offset, r.key, r.value, r.headers) for r in records] == [
        (0, b"k0", b"plain", ()), (1, b"k1", b"marked", (("h", b"v"),))]
