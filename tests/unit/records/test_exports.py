"""The records package's public surface is deliberate.

Method: every name in ``rivven_broker.records.__all__`` resolves, the list has no duplicates,
and it equals the agreed set, so adding or dropping a public name is a visible change.
"""

from __future__ import annotations

import rivven_broker.records as records

EXPECTED = {
    "BatchBuilder", "Compression", "Record", "RecordHeaders", "EncodedHeaders",
    "RecordTooLargeError",
    "InvalidRecordError", "HEADER_BYTES", "BatchHeader", "BatchError", "InvalidBatchError",
    "CorruptBatchError", "parse_header", "validate", "stamp", "iter_batches", "BatchFilter",
    "batch_headers", "decode_records", "iter_records", "ControlType", "ControlRecord",
    "build_control_batch", "parse_control_record", "read_control_batch", "murmur2",
    "partition_for_key", "StickyPartitioner",
}


def test_all_is_the_agreed_surface():
    assert len(records.__all__) == len(set(records.__all__))
    assert set(records.__all__) == EXPECTED
    for name in records.__all__:
        assert getattr(records, name) is not None


def test_batch_headers_yields_headers_only():
    builder = records.BatchBuilder(batch_bytes_max=4096)
    builder.append(1, None, b"v")
    batch = builder.build()
    headers = list(records.batch_headers(batch * 2 + batch[:10]))
    assert headers == [records.validate(batch)] * 2
