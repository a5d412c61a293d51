"""The Spark source end to end: a real local SparkSession reading a real broker.

Goal: the guarantees docs/spark.md states for ``readStream``/``read.format("rivven")`` hold:
exact delivery with AvailableNow, resumption from a checkpoint with only new records, intake
split by ``maxOffsetsPerTrigger``, ``failOnDataLoss`` both ways after records were deleted,
new topics matching a pattern picked up between runs, batch reads with ``minPartitions`` and
headers, and ``read_committed`` skipping aborted transactions (when the broker has them).
Method: produce known records, run queries to completion (``trigger(availableNow=True)`` +
``awaitTermination``: no sleeps, no timing), and compare what the sink holds with what was
produced, as multisets of ``(partition, offset, value)``. ``format("rivven")`` is never
registered by hand: every test also checks the automatic ``pyspark_rivven`` lookup.
"""

from __future__ import annotations

import json
import pathlib
import time
from collections import Counter

import pytest

from rivven_broker.client import Producer, TopicPartition

QUERY_TIMEOUT_S = 120


def stream(spark, broker, **options):
    reader = spark.readStream.format("rivven").option("bootstrap", broker.address)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def run_available_now(df, checkpoint: pathlib.Path, sink: str = "noop", path=None):
    writer = (df.writeStream.format(sink).option("checkpointLocation", str(checkpoint))
              .trigger(availableNow=True))
    query = writer.start(str(path)) if path is not None else writer.start()
    finished = query.awaitTermination(QUERY_TIMEOUT_S)
    assert finished, "the AvailableNow query did not finish"
    return query


def parquet_rows(spark, path: pathlib.Path) -> Counter:
    rows = spark.read.parquet(str(path)).select("partition", "offset", "value").collect()
    return Counter((r.partition, r.offset, bytes(r.value)) for r in rows)


def test_available_now_delivers_exactly_then_resumes_with_only_new_records(
        spark, broker, tmp_path):
    topic = broker.create("stream-exact", partitions=4)
    broker.produce(topic, ((i % 4, None, b"v%07d" % i) for i in range(100_000)))
    produced = Counter((p, o, v) for p, o, _, v in broker.read(topic))
    assert sum(produced.values()) == 100_000

    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    df = stream(spark, broker, subscribe=topic, startingOffsets="earliest")
    run_available_now(df.select("partition", "offset", "value"), checkpoint, "parquet", out)
    assert parquet_rows(spark, out) == produced

    broker.produce(topic, ((i % 4, None, b"n%07d" % i) for i in range(10_000)))
    again = Counter((p, o, v) for p, o, _, v in broker.read(topic))
    query = run_available_now(df.select("partition", "offset", "value"), checkpoint, "parquet",
                              out)
    assert parquet_rows(spark, out) == again  # every old record once, every new one once
    assert sum(p["numInputRows"] for p in query.recentProgress) == 10_000


def test_max_offsets_per_trigger_splits_the_intake(spark, broker, tmp_path):
    topic = broker.create("stream-limit", partitions=2)
    broker.produce(topic, ((i % 2, None, b"x") for i in range(1000)))
    df = stream(spark, broker, subscribe=topic, startingOffsets="earliest",
                maxOffsetsPerTrigger="300")
    query = run_available_now(df, tmp_path / "checkpoint")
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [300, 300, 300, 100]
    latest = query.recentProgress[-1]["sources"][0]["latestOffset"]
    assert json.loads(latest) == {"stream-limit": {"0": 500, "1": 500}}  # reportLatestOffset


def test_min_offsets_per_trigger_is_accepted_and_available_now_ignores_it(
        spark, broker, tmp_path):
    """As Spark's Kafka source: an AvailableNow run reads everything whatever
    minOffsetsPerTrigger asks (the wait applies to processing-time triggers; its decision is
    unit-tested in tests/unit/spark/test_options.py)."""
    topic = broker.create("stream-min", partitions=1)
    broker.produce(topic, ((0, None, b"x") for i in range(50)))
    df = stream(spark, broker, subscribe=topic, startingOffsets="earliest",
                minOffsetsPerTrigger="1000000", maxTriggerDelay="10m")
    query = run_available_now(df, tmp_path / "checkpoint")
    assert sum(p["numInputRows"] for p in query.recentProgress) == 50


def test_min_offsets_per_trigger_holds_processing_time_batches_back(spark, broker, tmp_path):
    """Spark Kafka's minOffsetsPerTrigger under a processing-time trigger: while fewer new
    offsets than asked are available (10 of 50) no micro-batch runs, trigger after trigger
    (Spark reports each one: noDataProgressEventInterval 0); once enough arrive they are read
    in one batch. maxTriggerDelay (1 h here) never releases the hold."""
    topic = broker.create("stream-min-held", partitions=1)
    broker.produce(topic, ((0, None, b"early") for _ in range(10)))
    df = stream(spark, broker, subscribe=topic, startingOffsets="earliest",
                minOffsetsPerTrigger="50", maxTriggerDelay="1h")
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "0")
    query = (df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "c"))
             .trigger(processingTime="100 milliseconds").start())
    try:
        deadline = time.monotonic() + QUERY_TIMEOUT_S
        while len(query.recentProgress) < 5:  # triggers that found 10 offsets, not 50
            assert time.monotonic() < deadline, "no triggers reported"
            time.sleep(0.1)
        assert all(p["numInputRows"] == 0 for p in query.recentProgress)
        broker.produce(topic, ((0, None, b"late") for _ in range(45)))
        while sum(p["numInputRows"] for p in query.recentProgress) < 55:
            assert time.monotonic() < deadline, "the held batch never ran"
            time.sleep(0.1)
        assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [55]
    finally:
        query.stop()
        spark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_fail_on_data_loss_after_retention_removed_needed_offsets(
        spark, broker, tmp_path, fail_on_data_loss):
    topic = broker.create(f"stream-loss-{str(fail_on_data_loss).lower()}", partitions=1)
    broker.produce(topic, ((0, None, b"%03d" % i) for i in range(100)))
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    df = stream(spark, broker, subscribe=topic, startingOffsets="earliest",
                maxOffsetsPerTrigger="40", failOnDataLoss=str(fail_on_data_loss).lower())
    selected = df.select("partition", "offset", "value")
    # First run: Trigger.Once reads everything available in one batch: all 100.
    query = (selected.writeStream.format("parquet").option("checkpointLocation", str(checkpoint))
             .trigger(once=True).start(str(out)))
    assert query.awaitTermination(QUERY_TIMEOUT_S)
    assert sum(parquet_rows(spark, out).values()) == 100
    broker.produce(topic, ((0, None, b"%03d" % i) for i in range(100, 200)))
    # Retention removes records the query has not read yet: the log now starts at 150 while
    # the checkpoint says 100. The next run (40 offsets per batch) meets the gap at once.
    broker.admin.delete_records({TopicPartition(topic, 0): 150})
    query = (selected.writeStream.format("parquet").option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start(str(out)))
    if fail_on_data_loss:
        with pytest.raises(Exception, match="failOnDataLoss"):
            query.awaitTermination(QUERY_TIMEOUT_S)
        return
    assert query.awaitTermination(QUERY_TIMEOUT_S)
    offsets = sorted(o for _, o, _ in parquet_rows(spark, out))
    assert offsets == list(range(100)) + list(range(150, 200))  # [100, 150) skipped


def test_subscribe_pattern_picks_up_new_topics_between_runs(spark, broker, tmp_path):
    broker.create("pattern-a", partitions=2)
    broker.produce("pattern-a", ((i % 2, None, b"a") for i in range(10)))
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    df = stream(spark, broker, subscribePattern="pattern-.*", startingOffsets="earliest")
    selected = df.select("topic", "partition", "offset", "value")
    run_available_now(selected, checkpoint, "parquet", out)
    broker.create("pattern-b", partitions=3)
    broker.produce("pattern-b", ((i % 3, None, b"b") for i in range(30)))
    broker.produce("pattern-a", ((0, None, b"a2") for i in range(5)))
    run_available_now(selected, checkpoint, "parquet", out)
    rows = spark.read.parquet(str(out)).groupBy("topic").count().collect()
    assert {r["topic"]: r["count"] for r in rows} == {"pattern-a": 15, "pattern-b": 30}


def test_partitions_added_to_a_topic_are_read_from_their_start(spark, broker, tmp_path):
    topic = broker.create("grown", partitions=2)
    broker.produce(topic, ((i % 2, None, b"old%d" % i) for i in range(20)))
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    df = stream(spark, broker, subscribe=topic, startingOffsets="latest")
    selected = df.select("partition", "offset", "value")
    run_available_now(selected, checkpoint, "parquet", out)  # starts at the end: reads nothing
    broker.admin.create_partitions(topic, 4)
    broker.produce(topic, ((p, None, b"new%d" % p) for p in (0, 1, 2, 3, 3)))
    run_available_now(selected, checkpoint, "parquet", out)
    assert parquet_rows(spark, out) == Counter(
        {(0, 10, b"new0"): 1, (1, 10, b"new1"): 1, (2, 0, b"new2"): 1, (3, 0, b"new3"): 1,
         (3, 1, b"new3"): 1}
    )  # the new partitions from offset 0 (Kafka's rule), though the query began at "latest"


def test_batch_read_with_ending_offsets_min_partitions_and_headers(spark, broker):
    topic = broker.create("batch-read", partitions=2)
    records = [(i % 2, b"k%d" % i, b"v%d" % i, [("h", b"%d" % i)] if i % 3 == 0 else None)
               for i in range(2000)]
    broker.produce(topic, records)
    df = (spark.read.format("rivven").option("bootstrap", broker.address)
          .option("subscribe", topic).option("minPartitions", "8").option("includeHeaders", "true")
          .option("endingOffsets", '{"batch-read": {"0": 600, "1": -1}}').load())
    assert df.rdd.getNumPartitions() >= 8
    rows = df.collect()
    assert len(rows) == 600 + 1000
    by_key = {bytes(r.key): r for r in rows}
    r3 = by_key[b"k3"]
    assert bytes(r3.value) == b"v3" and [(h.key, bytes(h.value)) for h in r3.headers] == [
        ("h", b"3")]
    assert by_key[b"k1"].headers is None and r3.topic == topic and r3.timestamp is not None
    assert r3.timestampType == 0
    plain = (spark.read.format("rivven").option("bootstrap", broker.address)
             .option("subscribe", topic).load())
    assert "headers" not in plain.columns  # as Spark's Kafka source without includeHeaders


def test_read_committed_skips_aborted_transactions(spark, broker, tmp_path):
    topic = broker.create("stream-txn", partitions=2)
    with Producer(broker.address, transactional_id="spark-test-txn") as producer:
        producer.init_transactions()
        for kept, batch in ((True, 0), (False, 1), (True, 2)):
            producer.begin_transaction()
            for i in range(50):
                producer.send(topic, value=b"%d-%d" % (batch, i), partition=i % 2)
            if kept:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
    out = tmp_path / "out"
    df = stream(spark, broker, subscribe=topic, startingOffsets="earliest",
                **{"isolation.level": "read_committed"})
    run_available_now(df.select("partition", "offset", "value"), tmp_path / "checkpoint",
                      "parquet", out)
    values = sorted(v for _, _, v in parquet_rows(spark, out))
    assert values == sorted(b"%d-%d" % (b, i) for b in (0, 2) for i in range(50))


def test_batch_read_between_timestamps(spark, broker):
    """Spark Kafka's startingTimestamp / startingOffsetsByTimestamp / endingTimestamp /
    endingOffsetsByTimestamp: the first record at or after each time (inside a batch too), a
    time with no record that late an error unless startingOffsetsByTimestampStrategy=latest;
    and the same job with the Kafka source's spellings of its options."""
    topic = broker.create("by-time", partitions=1)
    with Producer(broker.address, acks="all", linger_ms=50) as producer:
        for base in (1_000, 2_000, 3_000):  # three batches, one per second of "time"
            for i in range(100):
                producer.send(topic, value=b"%d" % (base + i), partition=0,
                              timestamp_ms=base + i)
            producer.flush()

    def read(**options):
        reader = spark.read.format("rivven").option("bootstrap", broker.address)
        for key, value in {"subscribe": topic, **options}.items():
            reader = reader.option(key, value)
        return sorted(int(bytes(r.value)) for r in reader.load().collect())

    middle = read(startingTimestamp="2000",
                  endingOffsetsByTimestamp=json.dumps({topic: {"0": 3_000}}))
    assert middle == list(range(2_000, 2_100))
    by_partition = read(startingOffsetsByTimestamp=json.dumps({topic: {"0": 2_500}}))
    assert by_partition == list(range(3_000, 3_100))  # the batch reaching 2500 starts at 3000
    with pytest.raises(Exception, match="no record at or after"):
        read(startingTimestamp="9000")
    assert read(startingTimestamp="9000", startingOffsetsByTimestampStrategy="latest") == []
    inside = read(startingTimestamp="2050", endingTimestamp="3010")
    assert inside == list(range(2_050, 2_100)) + list(range(3_000, 3_010))
    assert read(endingTimestamp="9000") == read()  # no record that late: the latest
    ported = (spark.read.format("rivven").option("kafka.bootstrap.servers", broker.address)
              .option("subscribe", topic).option("kafka.isolation.level", "read_committed")
              .option("startingTimestamp", "2050").option("endingTimestamp", "3010").load())
    assert sorted(int(bytes(r.value)) for r in ported.collect()) == inside
