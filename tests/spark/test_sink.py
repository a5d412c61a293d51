"""The Spark sink end to end: routing by a topic column, and no duplicates on replay.

Goal: ``writeStream.format("rivven")`` lands each row in the topic its ``topic`` column names
(admitted by the allowlist), exactly once even when Spark runs a micro-batch's write again:
(1) a whole batch replayed after a restart, as when the driver died after the tasks wrote but
before Spark recorded the batch as committed, and (2) a task retried after its write had
succeeded. Also: a batch write with key, headers and partition columns, and a clear error for
a topic outside the allowlist. Method: stream a source topic through Spark into two topics
with AvailableNow, read the outputs with the client's ``Consumer`` (read_committed), compare
multisets; (1) deletes the last entry of the checkpoint's commit log and runs again; (2) uses
a subclass of the sink, registered under another name, that fails each task's first attempt
right after a successful write (the session runs ``local[2,3]``, so Spark retries it).
"""

from __future__ import annotations

import pathlib
from collections import Counter

import pytest
from pyspark import TaskContext
from pyspark.sql.functions import expr

from rivven_spark.source import RivvenDataSource
from rivven_spark.writer import RivvenStreamWriter

QUERY_TIMEOUT_S = 120


class FailAfterWriteWriter(RivvenStreamWriter):
    """Writes, then fails the task's first attempt: Spark retries a task that succeeded."""

    def write(self, iterator):
        message = super().write(iterator)
        if TaskContext.get().attemptNumber() == 0:
            raise RuntimeError("injected failure after a successful write")
        return message


class FailAfterWriteSource(RivvenDataSource):
    @classmethod
    def name(cls) -> str:
        return "rivven_fail_after_write"

    def streamWriter(self, schema, overwrite):
        writer = super().streamWriter(schema, overwrite)
        return FailAfterWriteWriter(writer._options, writer._columns)


def values_of(broker, topic: str) -> Counter:
    return Counter(v for _, _, _, v in broker.read(topic, "read_committed"))


def copy_query(spark, broker, source: str, checkpoint: pathlib.Path, out_prefix: str,
               sink_format: str = "rivven"):
    df = (spark.readStream.format("rivven").option("bootstrap", broker.address)
          .option("subscribe", source).option("startingOffsets", "earliest")
          .option("maxOffsetsPerTrigger", "400").load())
    routed = df.select(
        expr(f"IF(substring(value, 1, 1) = X'61', '{out_prefix}-a', '{out_prefix}-b')")
        .alias("topic"), "key", "value")
    query = (routed.writeStream.format(sink_format).option("bootstrap", broker.address)
             .option("topicAllowlist", f"{out_prefix}-a,{out_prefix}-b")
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    assert query.awaitTermination(QUERY_TIMEOUT_S), "the copy query did not finish"
    return query


def produce_ab(broker, topic: str, start: int, count: int) -> Counter:
    records = [(i % 2, None, (b"a" if i % 3 else b"b") + b"-%06d" % i)
               for i in range(start, start + count)]
    broker.produce(topic, records)
    return Counter(v for _, _, v in records)


def test_topic_column_routes_rows_and_a_replayed_batch_writes_nothing(spark, broker, tmp_path):
    source = broker.create("sink-src", partitions=2)
    for name in ("sink-out-a", "sink-out-b"):
        broker.create(name, partitions=2)
    sent = produce_ab(broker, source, 0, 1000)
    checkpoint = tmp_path / "checkpoint"
    query = copy_query(spark, broker, source, checkpoint, "sink-out")
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [
        400, 400, 200]
    a, b = values_of(broker, "sink-out-a"), values_of(broker, "sink-out-b")
    assert a + b == sent
    assert all(v.startswith(b"a") for v in a) and all(v.startswith(b"b") for v in b)

    # The driver "died" after batch 2's tasks wrote and before Spark logged the commit:
    # the restart replays batch 2 with the same offsets.
    commits = checkpoint / "commits"
    assert max(int(p.name) for p in commits.iterdir() if p.name.isdigit()) == 2
    (commits / "2").unlink()
    (commits / ".2.crc").unlink(missing_ok=True)
    more = produce_ab(broker, source, 1000, 100)
    query = copy_query(spark, broker, source, checkpoint, "sink-out")
    replayed = [p for p in query.recentProgress if p["batchId"] == 2]
    assert replayed and replayed[0]["numInputRows"] == 200  # it really ran again
    assert values_of(broker, "sink-out-a") + values_of(broker, "sink-out-b") == sent + more


def test_a_task_retried_after_its_write_succeeded_writes_nothing(spark, broker, tmp_path):
    spark.dataSource.register(FailAfterWriteSource)
    source = broker.create("retry-src", partitions=2)
    for name in ("retry-out-a", "retry-out-b"):
        broker.create(name, partitions=1)
    sent = produce_ab(broker, source, 0, 600)
    copy_query(spark, broker, source, tmp_path / "checkpoint", "retry-out",
               sink_format="rivven_fail_after_write")
    got = values_of(broker, "retry-out-a") + values_of(broker, "retry-out-b")
    assert got == sent  # every row exactly once although every task wrote twice


def test_batch_write_with_key_headers_and_partition(spark, broker):
    topic = broker.create("batch-write", partitions=3)
    df = spark.createDataFrame(
        [(b"k%d" % i, "value-%d" % i, i % 3, [("h", b"%d" % i)]) for i in range(30)],
        "key binary, value string, partition int, headers array<struct<key:string,value:binary>>")
    (df.write.format("rivven").mode("append").option("bootstrap", broker.address)
     .option("topic", topic).save())
    got = broker.read(topic)
    assert sorted((p, k, v) for p, _, k, v in got) == sorted(
        (i % 3, b"k%d" % i, b"value-%d" % i) for i in range(30))
    headers = (spark.read.format("rivven").option("bootstrap", broker.address)
               .option("subscribe", topic).option("includeHeaders", "true").load()
               .select("key", "headers").collect())
    assert {bytes(r.key): [(h.key, bytes(h.value)) for h in r.headers] for r in headers}[
        b"k7"] == [("h", b"7")]


def test_a_topic_outside_the_allowlist_fails_the_write_clearly(spark, broker):
    broker.create("allowed", partitions=1)
    df = spark.createDataFrame([("allowed", b"x"), ("forbidden", b"y")],
                               "topic string, value binary").coalesce(1)
    with pytest.raises(Exception, match="topicAllowlist"):
        (df.write.format("rivven").mode("append").option("bootstrap", broker.address)
         .option("topicAllowlist", "allowed").save())


def _rows(values: list[bytes]):
    import pyarrow as pa

    return [pa.RecordBatch.from_pydict({"value": pa.array(values, pa.binary())})]


@pytest.mark.parametrize("transactions", [True, False])
def test_write_task_consults_the_ledger(broker, monkeypatch, transactions):
    """``write_task`` without Spark: the same (query, batch, task) twice writes once; the next
    batch writes again; with the broker's transactions or the flush-then-marker fallback."""
    from rivven_broker.client import FeatureNotAvailableError, Producer
    from rivven_spark.ledger import TaskIdentity
    from rivven_spark.options import parse_writer_options
    from rivven_spark.writer import SinkColumns, write_task

    if not transactions:
        def no_transactions(self):
            raise FeatureNotAvailableError("pretend the broker is older")

        monkeypatch.setattr(Producer, "init_transactions", no_transactions)
    topic = broker.create(f"ledger-direct-{transactions}", partitions=1)
    options = parse_writer_options({"bootstrap": broker.address, "topic": topic})
    columns = SinkColumns(value_is_text=False)
    query = f"query-{transactions}"
    first = write_task(options, columns, _rows([b"a", b"b"]), TaskIdentity(query, 0, 0))
    again = write_task(options, columns, _rows([b"a", b"b"]), TaskIdentity(query, 0, 0))
    other = write_task(options, columns, _rows([b"c"]), TaskIdentity(query, 0, 1))
    later = write_task(options, columns, _rows([b"d"]), TaskIdentity(query, 1, 0))
    assert (first.rows, first.skipped, first.transactional) == (2, False, transactions)
    assert again.skipped and again.rows == 0
    assert not other.skipped and not later.skipped
    assert sorted(v for *_, v in broker.read(topic, "read_committed")) == [b"a", b"b", b"c", b"d"]
