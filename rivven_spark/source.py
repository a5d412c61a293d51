"""``RivvenDataSource``: the ``format("rivven")`` entry point Spark instantiates.

Theory of operation
-------------------
Spark creates a ``DataSource`` with the user's options and asks it for a schema and for
readers or writers. This class only validates options (``options.py``) and hands them to the
reader (``reader.py``) or writer (``writer.py``) it builds; it keeps nothing else. The schema
is fixed and mirrors Spark's Kafka source; a user-supplied schema must equal it.

Spark finds the class by the name ``rivven`` in two ways: ``rivven_spark.register(spark)``
(``spark.dataSource.register``), or automatically, because the top-level module
``pyspark_rivven`` exports it as ``DefaultSource`` (Spark imports every ``pyspark_*`` module
on its first data-source lookup).
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from rivven_spark.arrow_records import SCHEMA_DDL, SCHEMA_DDL_NO_HEADERS
from rivven_spark.options import OptionError, parse_reader_options, parse_writer_options
from rivven_spark.reader import RivvenBatchReader, RivvenStreamReader
from rivven_spark.writer import RivvenBatchWriter, RivvenStreamWriter, sink_columns

__all__ = ["RivvenDataSource", "register", "SCHEMA", "SCHEMA_NO_HEADERS"]

#: The source's schema with ``includeHeaders=true`` (``SCHEMA_DDL`` as a ``StructType``;
#: parsing DDL would need the JVM); ``SCHEMA_NO_HEADERS`` without it, the default.
SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField("headers", ArrayType(StructType(
            [StructField("key", StringType()), StructField("value", BinaryType())]
        ))),
    ]
)
SCHEMA_NO_HEADERS = StructType(SCHEMA.fields[:-1])


class RivvenDataSource(DataSource):
    """Rivven topics as a Spark source and sink (docs/spark.md). Never blocks here; errors in
    options raise ``OptionError`` when the query is defined or started."""

    @classmethod
    def name(cls) -> str:
        return "rivven"

    def schema(self) -> StructType:
        return SCHEMA if self._include_headers() else SCHEMA_NO_HEADERS

    def _include_headers(self) -> bool:
        value = {str(k).lower(): str(v) for k, v in self.options.items()}.get("includeheaders")
        return value is not None and value.strip().lower() == "true"

    def _check_schema(self, schema: StructType) -> None:
        if [(f.name, f.dataType) for f in schema.fields] != [
            (f.name, f.dataType) for f in self.schema().fields
        ]:
            ddl = SCHEMA_DDL if self._include_headers() else SCHEMA_DDL_NO_HEADERS
            raise OptionError(f"the rivven source has a fixed schema ({ddl}); "
                              "do not pass another one to load()")

    def reader(self, schema: StructType) -> RivvenBatchReader:
        self._check_schema(schema)
        return RivvenBatchReader(parse_reader_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> RivvenStreamReader:
        self._check_schema(schema)
        return RivvenStreamReader(parse_reader_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> RivvenBatchWriter:
        if overwrite:
            raise OptionError('the rivven sink appends to topics; use mode("append")')
        options = parse_writer_options(self.options)
        return RivvenBatchWriter(options, sink_columns(schema, options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> RivvenStreamWriter:
        options = parse_writer_options(self.options)
        return RivvenStreamWriter(options, sink_columns(schema, options))


def register(spark: object) -> None:
    """Register ``format("rivven")`` with a SparkSession (not needed when ``pyspark_rivven``
    is installed, which Spark finds by itself). Does not block."""
    spark.dataSource.register(RivvenDataSource)  # type: ignore[attr-defined]
