"""Record batches: the byte format every layer shares, murmur2 and the partitioners.

The producer builds batches (``BatchBuilder``), the broker checks headers and CRCs
(``validate``, ``iter_batches``) and stores bytes, the consumer decodes (``decode_records``,
``iter_records``). Transaction markers are control batches (``build_control_batch``). Keys map
to partitions with Kafka's murmur2 (``partition_for_key``), keyless records with
``StickyPartitioner``. Everything here is pure and never blocks. The byte layout is in
``docs/storage-format.md``.
"""

from rivven_broker.records.batch import (
    EncodedHeaders,
    InvalidRecordError,
    Record,
    RecordHeaders,
    RecordTooLargeError,
)
from rivven_broker.records.builder import BatchBuilder, Compression
from rivven_broker.records.control import (
    ControlRecord,
    ControlType,
    build_control_batch,
    parse_control_record,
    read_control_batch,
)
from rivven_broker.records.header import (
    HEADER_BYTES,
    BatchError,
    BatchHeader,
    CorruptBatchError,
    InvalidBatchError,
    iter_batches,
    parse_header,
    stamp,
    validate,
)
from rivven_broker.records.murmur2 import murmur2, partition_for_key
from rivven_broker.records.partitioner import StickyPartitioner
from rivven_broker.records.reader import (
    BatchFilter,
    batch_headers,
    decode_records,
    iter_records,
)

__all__ = [
    # building
    "BatchBuilder",
    "Compression",
    "Record",
    "RecordHeaders",
    "EncodedHeaders",
    "RecordTooLargeError",
    "InvalidRecordError",
    # the header (header.py)
    "HEADER_BYTES",
    "BatchHeader",
    "BatchError",
    "InvalidBatchError",
    "CorruptBatchError",
    "parse_header",
    "validate",
    "stamp",
    "iter_batches",
    # reading
    "BatchFilter",
    "batch_headers",
    "decode_records",
    "iter_records",
    # control batches
    "ControlType",
    "ControlRecord",
    "build_control_batch",
    "parse_control_record",
    "read_control_batch",
    # partitioning
    "murmur2",
    "partition_for_key",
    "StickyPartitioner",
]
