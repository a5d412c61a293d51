"""The sink: ``df.writeStream.format("rivven")`` and ``df.write.format("rivven")``.

Theory of operation
-------------------
``sink_columns`` checks the input schema on the driver when the query starts: ``value``
(binary or string) is required; ``key`` (binary or string), ``headers`` (array of struct
``key`` string, ``value`` binary or string), ``partition`` (an integer type) and ``topic``
(string) are optional; any other column is an error (rather than silently dropped). Without
a ``topic`` column the ``topic`` option names the destination; with one, each row goes to the
topic it names (a null falls back to the option).

Each Spark task runs ``write_task`` in an executor: it receives Arrow record batches, turns
each column into a Python list once per batch, and sends every row with the blocking
``Producer``. Destinations are admitted by a ``TopicRouter``: a topic outside
``topicAllowlist`` or beyond ``maxTopics`` distinct topics (per task) fails the task with
``SinkTopicError`` naming the topic and the option. Delivery errors fail the task.

Exactly-once for streaming writes (``exactlyOnce``, default true) follows ``ledger.py``: the
task is identified by (query id, batch id, task partition) from Spark's task context, looks
its marker up in the query's ledger topic, writes nothing if this batch is already committed,
and otherwise writes its rows and then its marker, both inside one transaction when the
broker supports transactions (``Producer.init_transactions``), else rows, flush, marker. Batch
writes (``df.write``) have no ledger: a retried task writes again (at-least-once), as with
Spark's Kafka sink.

The driver-side ``commit``/``abort`` only log: each task's output is already final (committed
transaction or flushed records) when the task returns.
"""

from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import Future
from typing import Any, Iterable, Iterator

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from rivven_broker.client import FeatureNotAvailableError, Producer
from rivven_spark.broker_io import BrokerIO
from rivven_spark.ledger import Ledger, TaskIdentity, ledger_topic_for
from rivven_spark.options import OptionError, WriterOptions
from rivven_spark.worker_process import tune_worker_process

__all__ = [
    "SinkColumns",
    "SinkTopicError",
    "TopicRouter",
    "RivvenCommitMessage",
    "RivvenStreamWriter",
    "RivvenBatchWriter",
    "sink_columns",
    "write_task",
]

log = logging.getLogger("rivven_spark")

_INTEGER_TYPES = (ByteType, ShortType, IntegerType, LongType)
#: Spark's task-local properties naming the streaming query and micro-batch of a task.
_QUERY_ID_PROPERTY = "sql.streaming.queryId"
_BATCH_ID_PROPERTY = "streaming.sql.batchId"


class SinkTopicError(RuntimeError):
    """A row names a topic the sink may not write to (allowlist, cap, or none at all)."""


@dataclasses.dataclass(frozen=True)
class SinkColumns:
    """Which optional columns the input has, and whether text columns need encoding."""

    value_is_text: bool
    key: str | None = None  # None, "binary" or "text"
    topic: bool = False
    partition: bool = False
    headers: str | None = None  # None, "binary" or "text" (the header value's type)


def sink_columns(schema: StructType, options: WriterOptions) -> SinkColumns:
    """Check the input schema of a write (see the module docstring).

    Raises:
        OptionError: a missing or mistyped column, an unknown column, or no topic at all.
    """
    fields = {f.name.lower(): f.dataType for f in schema.fields}
    unknown = sorted(set(fields) - {"key", "value", "topic", "partition", "headers"})
    if unknown:
        raise OptionError(f"the rivven sink takes columns key, value, topic, partition, headers;"
                          f" drop or rename {unknown}")
    if "value" not in fields:
        raise OptionError("the rivven sink needs a value column (binary or string)")

    def text_or_binary(name: str) -> str:
        kind = fields[name]
        if isinstance(kind, BinaryType):
            return "binary"
        if isinstance(kind, StringType):
            return "text"
        raise OptionError(f"column {name} must be binary or string, not {kind.simpleString()}")

    columns = SinkColumns(value_is_text=text_or_binary("value") == "text")
    if "key" in fields:
        columns = dataclasses.replace(columns, key=text_or_binary("key"))
    if "topic" in fields:
        if not isinstance(fields["topic"], StringType):
            raise OptionError("column topic must be a string")
        columns = dataclasses.replace(columns, topic=True)
    elif options.topic is None:
        raise OptionError("the rivven sink needs the topic option or a topic column")
    if "partition" in fields:
        if not isinstance(fields["partition"], _INTEGER_TYPES):
            raise OptionError("column partition must be an integer type")
        columns = dataclasses.replace(columns, partition=True)
    if "headers" in fields:
        columns = dataclasses.replace(columns, headers=_header_kind(fields["headers"]))
    return columns


def _header_kind(kind: Any) -> str:
    element = kind.elementType if isinstance(kind, ArrayType) else None
    names = [f.name for f in element.fields] if isinstance(element, StructType) else []
    if names != ["key", "value"] or not isinstance(element.fields[0].dataType, StringType):
        raise OptionError("column headers must be array<struct<key: string, value: binary>>")
    value_type = element.fields[1].dataType
    if isinstance(value_type, BinaryType):
        return "binary"
    if isinstance(value_type, StringType):
        return "text"
    raise OptionError("column headers must be array<struct<key: string, value: binary>>")


class TopicRouter:
    """Admits destination topics: the allowlist, then the cap on distinct topics."""

    def __init__(self, options: WriterOptions) -> None:
        self._options = options
        self.admitted: set[str] = set()

    def admit(self, topic: str | None) -> str:
        """The topic to write to; raises ``SinkTopicError`` when it may not be used."""
        options = self._options
        if topic is None:
            topic = options.topic
            if topic is None:
                raise SinkTopicError("a row has a null topic and the topic option is not set")
        if topic in self.admitted:
            return topic
        if options.topic_allowlist is not None and topic not in options.topic_allowlist:
            raise SinkTopicError(f"a row names topic {topic!r}, which is not in the "
                                 f"topicAllowlist option {list(options.topic_allowlist)}")
        if len(self.admitted) >= options.topics_max:
            raise SinkTopicError(f"a row names topic {topic!r}, beyond the maxTopics option "
                                 f"({options.topics_max} distinct topics per task)")
        self.admitted.add(topic)
        return topic


@dataclasses.dataclass(frozen=True)
class RivvenCommitMessage(WriterCommitMessage):
    """What a task reports: rows sent, and whether the ledger said it was already done."""

    task: int
    rows: int
    skipped: bool
    transactional: bool


def _encode(values: list, text: bool) -> list:
    if not text:
        return values
    return [None if v is None else v.encode("utf-8") for v in values]


def _send_batch(producer: Producer, batch: pa.RecordBatch, columns: SinkColumns,
                router: TopicRouter, futures: list[Future]) -> int:
    """Send every row of one Arrow batch; returns the row count."""
    names = {name.lower(): i for i, name in enumerate(batch.schema.names)}
    rows = batch.num_rows
    values = _encode(batch.column(names["value"]).to_pylist(), columns.value_is_text)
    nones = [None] * rows
    keys = nones if columns.key is None else _encode(
        batch.column(names["key"]).to_pylist(), columns.key == "text")
    topics = nones if not columns.topic else batch.column(names["topic"]).to_pylist()
    partitions = nones if not columns.partition else batch.column(names["partition"]).to_pylist()
    headers = nones
    if columns.headers is not None:
        text = columns.headers == "text"
        headers = [
            None if h is None else [
                (e["key"], e["value"].encode("utf-8") if text and e["value"] is not None
                 else e["value"]) for e in h
            ]
            for h in batch.column(names["headers"]).to_pylist()
        ]
    send = producer.send
    append = futures.append
    admitted = router.admitted
    for value, key, topic, partition, header in zip(values, keys, topics, partitions, headers):
        if topic not in admitted:
            topic = router.admit(topic)
        append(send(topic, value=value, key=key, headers=header, partition=partition))
    return rows


def _check_delivered(futures: list[Future]) -> None:
    for future in futures:
        error = future.exception()
        if error is not None:
            raise error


def _open_producer(options: WriterOptions, transactional_id: str | None) -> tuple[Producer, bool]:
    """A producer, transactional when asked and the broker supports it."""
    settings = dict(acks=options.acks, linger_ms=options.linger_ms,
                    compression=options.compression,
                    request_timeout_ms=options.request_timeout_ms)
    if transactional_id is not None:
        producer = Producer(options.bootstrap, transactional_id=transactional_id, **settings)
        try:
            producer.init_transactions()
            return producer, True
        except FeatureNotAvailableError:
            producer.close()
            log.warning("the broker has no transactions: the rivven sink is exactly-once only "
                        "outside the window between a task's flush and its ledger marker")
    return Producer(options.bootstrap, **settings), False


def write_task(
    options: WriterOptions,
    columns: SinkColumns,
    batches: Iterable[pa.RecordBatch],
    identity: TaskIdentity | None,
) -> RivvenCommitMessage:
    """Write one task's rows (see the module docstring). Blocks until they are delivered.

    Raises:
        SinkTopicError: a row's topic is not admitted.
        RivvenError: delivery failed (after the client's retries), or a transaction failed.
    """
    io: BrokerIO | None = None
    producer: Producer | None = None
    try:
        ledger = None
        if identity is not None and options.exactly_once:
            io = BrokerIO(options.bootstrap, request_timeout_ms=options.request_timeout_ms)
            ledger = Ledger(io, options.bootstrap,
                            ledger_topic_for(identity.query_id, options.ledger_topic))
            ledger.ensure_topic()
        producer, transactional = _open_producer(
            options, identity.transactional_id if ledger is not None else None)
        return _write_rows(options, columns, batches, identity, ledger, producer, transactional)
    finally:
        if producer is not None:
            producer.close()
        if io is not None:
            io.close()


def _write_rows(
    options: WriterOptions,
    columns: SinkColumns,
    batches: Iterable[pa.RecordBatch],
    identity: TaskIdentity | None,
    ledger: Ledger | None,
    producer: Producer,
    transactional: bool,
) -> RivvenCommitMessage:
    task = identity.task if identity is not None else -1
    try:
        if ledger is not None and identity is not None and ledger.committed(identity) is not None:
            log.info("batch %s task %s of query %s is already in the ledger: nothing written",
                     identity.batch_id, identity.task, identity.query_id)
            for _ in batches:  # let Spark's input stream finish normally
                pass
            return RivvenCommitMessage(task, 0, True, transactional)
        if transactional:
            producer.begin_transaction()
        router = TopicRouter(options)
        futures: list[Future] = []
        rows = sum(_send_batch(producer, b, columns, router, futures) for b in batches)
        if ledger is not None and identity is not None:
            if not transactional:
                producer.flush()
                _check_delivered(futures)
            key, value = Ledger.marker(identity, rows)
            futures.append(producer.send(ledger.topic, value=value, key=key, partition=0))
        if transactional:
            producer.commit_transaction()
        else:
            producer.flush()
        _check_delivered(futures)
        return RivvenCommitMessage(task, rows, False, transactional)
    except BaseException:
        if transactional:
            _abort_quietly(producer)
        raise


def _abort_quietly(producer: Producer) -> None:
    try:
        producer.abort_transaction()
    except Exception as error:  # the task is failing anyway; fencing will clean up
        log.warning("aborting the sink transaction failed: %r", error)


def _identity() -> TaskIdentity:
    context = TaskContext.get()
    assert context is not None, "write() runs inside a Spark task"
    query_id = context.getLocalProperty(_QUERY_ID_PROPERTY)
    batch_id = context.getLocalProperty(_BATCH_ID_PROPERTY)
    if query_id is None or batch_id is None:
        raise RuntimeError("the rivven stream sink found no streaming query id / batch id in "
                           "the task context")
    return TaskIdentity(query_id, int(batch_id), context.partitionId())


def _summary(messages: list[Any]) -> tuple[int, int]:
    done = [m for m in messages if isinstance(m, RivvenCommitMessage)]
    return sum(m.rows for m in done), sum(1 for m in done if m.skipped)


class RivvenStreamWriter(DataSourceStreamArrowWriter):
    """The streaming sink; one instance is pickled to every task of every micro-batch."""

    def __init__(self, options: WriterOptions, columns: SinkColumns) -> None:
        self._options = options
        self._columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> RivvenCommitMessage:
        tune_worker_process()
        return write_task(self._options, self._columns, iterator, _identity())

    def commit(self, messages: list[Any], batchId: int) -> None:
        rows, skipped = _summary(messages)
        log.info("micro-batch %s: %s rows written, %s tasks already in the ledger",
                 batchId, rows, skipped)

    def abort(self, messages: list[Any], batchId: int) -> None:
        log.warning("micro-batch %s aborted; a replay writes only what is not in the ledger",
                    batchId)


class RivvenBatchWriter(DataSourceArrowWriter):
    """The batch sink (``df.write``): at-least-once under task retries."""

    def __init__(self, options: WriterOptions, columns: SinkColumns) -> None:
        self._options = options
        self._columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> RivvenCommitMessage:
        tune_worker_process()
        return write_task(self._options, self._columns, iterator, None)

    def commit(self, messages: list[Any]) -> None:
        rows, _ = _summary(messages)
        log.info("batch write: %s rows written", rows)

    def abort(self, messages: list[Any]) -> None:
        log.warning("batch write aborted; rows already sent stay written")
