"""Rivven topics as an Apache Spark Structured Streaming source and sink (``format("rivven")``).

Theory of operation
-------------------
A pure-Python data source on PySpark's Data Source API (4.2+ for admission control and
``Trigger.AvailableNow``; tested on 4.3): no JVM connector. The driver plans with pure
functions (``offsets``: canonical offset JSON, admission control, range planning) fed by two
round trips to the broker; executors read offset ranges with the blocking client and decode
record batches column-wise straight into Arrow (``arrow_records``); the sink writes rows with
the blocking ``Producer`` and records per-task markers in a ledger topic so a replayed
micro-batch writes nothing (``ledger``). docs/spark.md has the options, the offset format and
the guarantees.

Importing this package imports pyspark, pyarrow and numpy (the ``spark`` extra).
"""

from __future__ import annotations

from rivven_spark.arrow_records import ARROW_SCHEMA, SCHEMA_DDL
from rivven_spark.offsets import OffsetRange, Offsets, PartitionSnapshot
from rivven_spark.options import OptionError, ReaderOptions, WriterOptions
from rivven_spark.reader import (
    DataLossError,
    RivvenBatchReader,
    RivvenInputPartition,
    RivvenStreamReader,
)
from rivven_spark.source import RivvenDataSource, register
from rivven_spark.writer import (
    RivvenBatchWriter,
    RivvenCommitMessage,
    RivvenStreamWriter,
    SinkTopicError,
)

__all__ = [
    "RivvenDataSource",
    "register",
    "SCHEMA_DDL",
    "ARROW_SCHEMA",
    "Offsets",
    "OffsetRange",
    "PartitionSnapshot",
    "ReaderOptions",
    "WriterOptions",
    "OptionError",
    "DataLossError",
    "SinkTopicError",
    "RivvenStreamReader",
    "RivvenBatchReader",
    "RivvenInputPartition",
    "RivvenStreamWriter",
    "RivvenBatchWriter",
    "RivvenCommitMessage",
]
