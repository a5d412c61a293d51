"""Option parsing of format("rivven"): defaults, Kafka names, and errors that name the option.

Goal: a bad option fails when the query is defined, with a message naming it, and good ones
become the typed settings the reader and writer use. Method: direct calls with plain dicts.
"""

from __future__ import annotations

import pytest

from rivven_spark.options import (
    OptionError,
    Subscription,
    parse_reader_options,
    parse_writer_options,
)


def test_stream_defaults():
    options = parse_reader_options({"subscribe": "b,a, a"}, streaming=True)
    assert options.subscription == Subscription(topics=("a", "b"))
    assert options.starting == "latest" and options.fail_on_data_loss
    assert options.isolation_level == "read_uncommitted"
    assert options.bootstrap == "127.0.0.1:9092"
    assert options.max_offsets_per_trigger is None


def test_batch_defaults_read_everything():
    options = parse_reader_options({"subscribe": "a"}, streaming=False)
    assert (options.starting, options.ending) == ("earliest", "latest")


def test_option_names_are_case_insensitive_and_typed():
    options = parse_reader_options(
        {"BOOTSTRAP": "h:1", "SubscribePattern": "orders-.*", "MAXOFFSETSPERTRIGGER": "300",
         "minPartitions": "8", "failOnDataLoss": "False", "isolation.level": "read_committed",
         "startingOffsets": '{"orders-1": {"0": 5, "2": -2}}'},
        streaming=True,
    )
    assert options.bootstrap == "h:1"
    assert options.subscription.matches("orders-1") and not options.subscription.matches("x")
    assert options.max_offsets_per_trigger == 300 and options.min_partitions == 8
    assert not options.fail_on_data_loss and options.isolation_level == "read_committed"
    assert options.starting_spec() == {"orders-1": {0: 5, 2: -2}}


def test_spark_kafka_spellings_port_a_job():
    reader = parse_reader_options(
        {"kafka.bootstrap.servers": "h:1,h:2", "subscribe": "a",
         "kafka.isolation.level": "read_committed"}, streaming=True)
    assert reader.bootstrap == "h:1,h:2" and reader.isolation_level == "read_committed"
    writer = parse_writer_options({"kafka.bootstrap.servers": "h:3", "topic": "out"})
    assert writer.bootstrap == "h:3"
    with pytest.raises(OptionError, match="bootstrap is given twice"):
        parse_reader_options({"bootstrap": "h:1", "kafka.bootstrap.servers": "h:2",
                              "subscribe": "a"}, streaming=True)


def test_assign():
    options = parse_reader_options({"assign": '{"t": [1, 0], "u": [2]}'}, streaming=True)
    sub = options.subscription
    assert sub.assign == (("t", 0), ("t", 1), ("u", 2))
    assert sub.wants("t", 1) and not sub.wants("t", 2) and sub.fixed_topics() == ("t", "u")


@pytest.mark.parametrize(
    "options, streaming, fragment",
    [
        ({}, True, "exactly one of"),
        ({"subscribe": "a", "assign": '{"a": [0]}'}, True, "exactly one of"),
        ({"subscribe": "a", "typo": "1"}, True, "typo"),
        ({"subscribe": "bad name!"}, True, "subscribe"),
        ({"subscribePattern": "("}, True, "subscribePattern"),
        ({"assign": '{"a": "0"}'}, True, "assign"),
        ({"subscribe": "a", "maxOffsetsPerTrigger": "0"}, True, "maxoffsetspertrigger"),
        ({"subscribe": "a", "maxOffsetsPerTrigger": "x"}, True, "maxoffsetspertrigger"),
        ({"subscribe": "a", "maxOffsetsPerTrigger": "5"}, False, "streaming"),
        ({"subscribe": "a", "endingOffsets": "latest"}, True, "batch"),
        ({"subscribe": "a", "endingOffsets": '{"a": {"0": -2}}'}, False, "earliest"),
        ({"subscribe": "a", "startingOffsets": "soon"}, True, "startingoffsets"),
        ({"subscribe": "a", "failOnDataLoss": "maybe"}, True, "failondataloss"),
        ({"subscribe": "a", "isolation.level": "dirty"}, True, "isolation.level"),
        ({"subscribe": "a", "fetchMaxBytes": str(1 << 30)}, True, "fetchMaxBytes"),
    ],
)
def test_bad_reader_options_name_the_option(options, streaming, fragment):
    with pytest.raises(OptionError, match=fragment):
        parse_reader_options(options, streaming=streaming)


def test_writer_options():
    options = parse_writer_options({"topic": "out", "topicAllowlist": "out, other",
                                    "maxTopics": "2"})
    assert options.topic == "out" and options.topic_allowlist == ("other", "out")
    assert options.topics_max == 2 and options.exactly_once and options.acks == "all"


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"topic": "out", "topicAllowlist": "other"}, "topicAllowlist"),
        ({"topic": "out", "acks": "1"}, "exactlyOnce"),
        ({"topic": "out", "acks": "2", "exactlyOnce": "false"}, "acks"),
        ({"topic": "out", "compression": "brotli"}, "compression"),
        ({"topic": "out", "subscribe": "x"}, "subscribe"),
    ],
)
def test_bad_writer_options(options, fragment):
    with pytest.raises(OptionError, match=fragment):
        parse_writer_options(options)


def test_timestamp_options():
    from rivven_spark.offsets import PartitionSnapshot, apply_timestamps, timestamp_targets
    from rivven_spark.options import OptionError as Refused

    options = parse_reader_options(
        {"subscribe": "a", "startingOffsetsByTimestamp": '{"a": {"1": 5000}}',
         "startingOffsetsByTimestampStrategy": "LATEST"}, streaming=True)
    assert options.starting_timestamps == (("a", ((1, 5000),)),)
    assert options.timestamp_strategy == "latest" and options.starting_timestamp is None
    snapshot = [PartitionSnapshot("a", 0, 0, 10), PartitionSnapshot("a", 1, 3, 20)]
    wanted = timestamp_targets(None, options.starting_timestamps, snapshot)
    assert wanted == {("a", 1): 5000}
    assert timestamp_targets(7, (), snapshot) == {("a", 0): 7, ("a", 1): 7}
    start = {("a", 0): 10, ("a", 1): 20}
    assert apply_timestamps(start, wanted, {("a", 1): 12}, snapshot, missing="error") == {
        ("a", 0): 10, ("a", 1): 12}
    assert apply_timestamps(start, wanted, {("a", 1): -1}, snapshot, missing="latest")[
        ("a", 1)] == 20
    with pytest.raises(Exception, match="no record at or after 5000"):
        apply_timestamps(start, wanted, {("a", 1): -1}, snapshot, missing="error")
    with pytest.raises(Exception, match="not subscribed"):
        timestamp_targets(None, (("b", ((0, 1),)),), snapshot)
    with pytest.raises(Refused, match="batch reads only"):
        parse_reader_options({"subscribe": "a", "endingOffsetsByTimestamp": '{"a": {"0": 1}}'},
                             streaming=True)
    with pytest.raises(Refused, match="bad timestamp"):
        parse_reader_options({"subscribe": "a", "startingOffsetsByTimestamp": '{"a": {"0": -4}}'},
                             streaming=True)
    with pytest.raises(Refused, match="error or latest"):
        parse_reader_options({"subscribe": "a", "startingOffsetsByTimestampStrategy": "x"},
                             streaming=True)


def test_min_offsets_above_max_offsets_per_trigger_is_refused_and_ending_timestamp_is_batch_only():
    with pytest.raises(OptionError, match="minOffsetsPerTrigger .500. is greater than "
                                          "maxOffsetsPerTrigger .100."):
        parse_reader_options({"subscribe": "a", "minOffsetsPerTrigger": "500",
                              "maxOffsetsPerTrigger": "100"}, streaming=True)
    assert parse_reader_options({"subscribe": "a", "endingTimestamp": "1700000000000"},
                                streaming=False).ending_timestamp == 1_700_000_000_000
    with pytest.raises(OptionError, match="endingTimestamp applies to batch reads only"):
        parse_reader_options({"subscribe": "a", "endingTimestamp": "1"}, streaming=True)


def test_min_offsets_per_trigger_waits_for_rows_or_the_delay():
    from rivven_spark.offsets import PartitionSnapshot, admit

    options = parse_reader_options({"subscribe": "a", "minOffsetsPerTrigger": "100",
                                    "maxTriggerDelay": "30s"}, streaming=True)
    assert (options.min_offsets_per_trigger, options.max_trigger_delay_ms) == (100, 30_000)
    assert parse_reader_options({"subscribe": "a"}, streaming=True).max_trigger_delay_ms == (
        15 * 60_000)
    start = {"a": {"0": 10}}
    snapshot = [PartitionSnapshot("a", 0, 0, 60)]  # 50 new offsets
    wait = dict(min_rows=100, max_delay_ms=30_000)
    assert admit(start, snapshot, waited_ms=1_000, **wait).end == {"a": {"0": 10}}  # not yet
    assert admit(start, snapshot, waited_ms=30_000, **wait).end == {"a": {"0": 60}}  # delay
    more = [PartitionSnapshot("a", 0, 0, 200)]
    assert admit(start, more, waited_ms=0, **wait).end == {"a": {"0": 200}}  # enough rows
    assert admit(start, snapshot, waited_ms=0, target={"a": {"0": 60}},
                 **wait).end == {"a": {"0": 60}}  # AvailableNow ignores it, as Spark
    for bad in ("soon", "5 parsecs", "-3s"):
        with pytest.raises(OptionError, match="duration"):
            parse_reader_options({"subscribe": "a", "maxTriggerDelay": bad}, streaming=True)
    with pytest.raises(OptionError, match="streaming reads only"):
        parse_reader_options({"subscribe": "a", "minOffsetsPerTrigger": "5"}, streaming=False)


def test_the_kafka_client_settings_spark_passes_through():
    """Spark's Kafka source and sink take the Kafka client's settings as kafka.*: those with
    a counterpart here mean it, the group id changes nothing, the rest are refused by name."""
    reader = parse_reader_options({
        "kafka.bootstrap.servers": "h:1", "subscribe": "a", "kafka.group.id": "job-7",
        "groupIdPrefix": "spark-kafka", "kafka.max.partition.fetch.bytes": "65536",
        "kafka.request.timeout.ms": "5000"}, streaming=False)
    assert (reader.bootstrap, reader.fetch_bytes_max, reader.request_timeout_ms) == \
        ("h:1", 65_536, 5_000)
    writer = parse_writer_options({"kafka.bootstrap.servers": "h:1", "topic": "t",
                                   "kafka.acks": "1", "kafka.compression.type": "lz4",
                                   "kafka.linger.ms": "20", "exactlyOnce": "false"})
    assert (writer.acks, writer.compression, writer.linger_ms) == ("1", "lz4", 20)
    with pytest.raises(OptionError, match="kafka.security.protocol: this source has no "
                                          "counterpart"):
        parse_reader_options({"subscribe": "a", "kafka.security.protocol": "SSL"},
                             streaming=False)
    with pytest.raises(OptionError, match="acks is given twice"):
        parse_writer_options({"topic": "t", "acks": "1", "kafka.acks": "all"})
