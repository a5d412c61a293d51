"""The sink's pure parts: the input schema check, topic admission, and the ledger lookup.

Goal: a bad input schema fails at query start; rows reach only admitted topics; a task finds
its own marker (or learns there is none) after reading about one batch of markers. Method:
direct calls; the ledger reads through a fake ``BrokerIO`` over a list of markers, which also
counts how many records the lookup read.
"""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")
from pyspark.sql.types import (  # noqa: E402
    ArrayType,
    BinaryType,
    DoubleType,
    IntegerType,
    StringType,
    StructField,
    StructType,
)

from rivven_broker.client import Record  # noqa: E402
from rivven_spark.ledger import Ledger, TaskIdentity  # noqa: E402
from rivven_spark.offsets import PartitionSnapshot  # noqa: E402
from rivven_spark.options import OptionError, parse_writer_options  # noqa: E402
from rivven_spark.writer import SinkColumns, SinkTopicError, TopicRouter, sink_columns  # noqa: E402

HEADERS = ArrayType(StructType([StructField("key", StringType()),
                                StructField("value", BinaryType())]))


def schema(**columns) -> StructType:
    return StructType([StructField(name, kind) for name, kind in columns.items()])


def test_sink_columns():
    options = parse_writer_options({"topic": "out"})
    columns = sink_columns(schema(value=StringType(), key=BinaryType(), partition=IntegerType(),
                                  headers=HEADERS), options)
    assert columns == SinkColumns(value_is_text=True, key="binary", partition=True,
                                  headers="binary")
    assert sink_columns(schema(value=BinaryType(), topic=StringType()),
                        parse_writer_options({})).topic


@pytest.mark.parametrize(
    "columns, options, fragment",
    [
        ({"key": BinaryType()}, {"topic": "o"}, "needs a value column"),
        ({"value": DoubleType()}, {"topic": "o"}, "binary or string"),
        ({"value": BinaryType()}, {}, "topic option or a topic column"),
        ({"value": BinaryType(), "extra": StringType()}, {"topic": "o"}, "extra"),
        ({"value": BinaryType(), "partition": StringType()}, {"topic": "o"}, "integer"),
        ({"value": BinaryType(), "headers": StringType()}, {"topic": "o"}, "headers"),
    ],
)
def test_bad_input_schemas(columns, options, fragment):
    with pytest.raises(OptionError, match=fragment):
        sink_columns(schema(**columns), parse_writer_options(options))


def test_router_allowlist_cap_and_default():
    router = TopicRouter(parse_writer_options({"topic": "a", "topicAllowlist": "a,b,c",
                                               "maxTopics": "2"}))
    assert router.admit(None) == "a" and router.admit("b") == "b" and router.admit("a") == "a"
    with pytest.raises(SinkTopicError, match="maxTopics"):
        router.admit("c")
    with pytest.raises(SinkTopicError, match="topicAllowlist"):
        router.admit("evil")
    with pytest.raises(SinkTopicError, match="null topic"):
        TopicRouter(parse_writer_options({"topicAllowlist": "a"})).admit(None)


class FakeLedgerIO:
    """Serves ``offsets_of`` and ``read_records`` from a list of marker records."""

    def __init__(self, markers: list[tuple[int, int]], log_start: int = 0) -> None:
        self.records = []
        for offset, (batch, task) in enumerate(markers, start=log_start):
            key, value = Ledger.marker(TaskIdentity("q", batch, task), rows=1)
            self.records.append(Record("ledger", 0, offset, 0, key, value, ()))
        self.log_start = log_start
        self.read = 0

    def offsets_of(self, topic, partition, isolation_level):
        return PartitionSnapshot(topic, 0, self.log_start, self.log_start + len(self.records))

    def read_records(self, topic, partition, start, end, isolation_level):
        out = [r for r in self.records if start <= r.offset < end]
        self.read += len(out)
        return out


def markers_of(batches: int, tasks: int) -> list[tuple[int, int]]:
    return [(b, t) for b in range(batches) for t in range(tasks)]


def lookup(io: FakeLedgerIO, batch: int, task: int):
    return Ledger(io, "unused:1", "ledger").committed(TaskIdentity("q", batch, task))


def test_ledger_finds_the_task_marker_of_the_current_batch():
    io = FakeLedgerIO(markers_of(1000, 4))
    assert lookup(io, 999, 2) == 999
    assert io.read <= 256  # one window, however long the query has run


def test_ledger_says_not_committed_for_a_new_batch_or_a_missing_task():
    io = FakeLedgerIO(markers_of(10, 4) + [(10, 0), (10, 1)])  # batch 10: tasks 2, 3 died
    assert lookup(io, 10, 0) == 10
    assert lookup(io, 10, 3) is None
    assert lookup(io, 11, 0) is None
    assert lookup(FakeLedgerIO([]), 0, 0) is None


def test_ledger_grows_its_window_for_wide_batches():
    io = FakeLedgerIO(markers_of(3, 600), log_start=50)
    assert lookup(io, 2, 0) == 2
    assert lookup(io, 2, 599) == 2
    assert lookup(io, 3, 5) is None
