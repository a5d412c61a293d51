"""Readers, partitions and writers travel to executors by pickle: nothing live may ride along.

Goal: catch the "socket in a reader" class of bug in milliseconds. Method: build the objects
Spark builds, give the driver-side reader a real (unconnected) ``BrokerIO`` as it has after
planning, and round-trip everything through Spark's own cloudpickle; the copies must carry the
options and no connection.
"""

from __future__ import annotations

import pickle

import pytest

pytest.importorskip("pyspark")
from pyspark import cloudpickle  # noqa: E402

from rivven_spark.broker_io import BrokerIO  # noqa: E402
from rivven_spark.reader import RivvenInputPartition  # noqa: E402
from rivven_spark.source import SCHEMA_NO_HEADERS as SCHEMA  # noqa: E402
from rivven_spark.source import RivvenDataSource  # noqa: E402
from rivven_spark.writer import RivvenCommitMessage  # noqa: E402

from pyspark.sql.types import BinaryType, StringType, StructField, StructType  # noqa: E402


def round_trip(obj):
    return pickle.loads(cloudpickle.dumps(obj))


def test_stream_reader_pickles_without_its_connection():
    source = RivvenDataSource({"subscribe": "t", "maxOffsetsPerTrigger": "10"})
    reader = source.streamReader(SCHEMA)
    reader._io = BrokerIO("127.0.0.1:1")  # holds sockets (a wake-up socketpair)
    with pytest.raises(TypeError):
        pickle.dumps(reader._io)
    copy = round_trip(reader)
    assert copy._io is None and reader._io is not None
    assert copy._options == reader._options
    reader.stop()


def test_batch_reader_and_partitions_pickle():
    reader = RivvenDataSource({"subscribe": "t"}).reader(SCHEMA)
    assert round_trip(reader)._options == reader._options
    part = RivvenInputPartition("t", 3, 10, 20)
    assert round_trip(part) == part


def test_writers_and_commit_messages_pickle():
    schema = StructType([StructField("value", BinaryType()), StructField("topic", StringType())])
    source = RivvenDataSource({"topicAllowlist": "a,b"})
    for writer in (source.streamWriter(schema, False), source.writer(schema, False)):
        copy = round_trip(writer)
        assert copy._options == writer._options and copy._columns == writer._columns
    message = RivvenCommitMessage(task=1, rows=5, skipped=False, transactional=True)
    assert round_trip(message) == message
