"""Control batches: COMMIT/ABORT markers build, validate, parse, and stay out of data reads.

Method: build markers for both kinds with various producer ids, epochs and coordinator epochs;
check the header bits and fields, the exact key/value bytes (Kafka's shape), the parse round
trip, that ``decode_records`` skips them inside a fetch body while ``iter_records`` shows them,
and that malformed control records are rejected.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rivven_broker.records import (
    BatchBuilder,
    ControlRecord,
    ControlType,
    InvalidBatchError,
    build_control_batch,
    decode_records,
    iter_records,
    parse_control_record,
    read_control_batch,
    validate,
)
from rivven_broker.records.header import ATTR_CONTROL, ATTR_TRANSACTIONAL, COMPRESSION_NONE


@given(
    st.sampled_from(list(ControlType)),
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**15 - 1),
    st.integers(-(2**40), 2**40),
    st.integers(-(2**31), 2**31 - 1),
)
def test_round_trip(kind, producer_id, producer_epoch, timestamp_ms, coordinator_epoch):
    batch = build_control_batch(kind, producer_id, producer_epoch, timestamp_ms, coordinator_epoch)
    header = validate(batch)
    assert header.attributes == ATTR_CONTROL | ATTR_TRANSACTIONAL | COMPRESSION_NONE
    assert header.is_control and header.is_transactional
    assert (header.producer_id, header.producer_epoch) == (producer_id, producer_epoch)
    assert header.record_count == 1 and header.first_timestamp == timestamp_ms
    got_header, record = read_control_batch(batch)
    assert got_header == header
    assert record == ControlRecord(kind, coordinator_epoch)


def test_key_and_value_bytes_have_kafkas_shape():
    batch = build_control_batch(ControlType.COMMIT, 5, 1, 100, coordinator_epoch=7)
    (record,) = iter_records(batch)
    assert record.key == struct.pack(">hh", 0, 1)
    assert record.value == struct.pack(">hi", 0, 7)
    assert record.offset == 0 and record.timestamp_ms == 100
    abort = build_control_batch(ControlType.ABORT, 5, 1, 100)
    assert next(iter_records(abort)).key == b"\x00\x00\x00\x00"


def test_data_reads_skip_control_batches():
    data = BatchBuilder(batch_bytes_max=4096, producer_id=5, producer_epoch=1, transactional=True)
    data.append(1, None, b"in-txn")
    body = data.build() + build_control_batch(ControlType.COMMIT, 5, 1, 2) + data.build()
    assert [r.value for r in decode_records(body)] == [b"in-txn", b"in-txn"]


def test_malformed_control_records_are_rejected():
    good_value = struct.pack(">hi", 0, 0)
    with pytest.raises(InvalidBatchError):
        parse_control_record(None, good_value)
    with pytest.raises(InvalidBatchError):
        parse_control_record(b"\x00", good_value)
    with pytest.raises(InvalidBatchError):
        parse_control_record(struct.pack(">hh", 1, 0), good_value)  # unknown version
    with pytest.raises(InvalidBatchError):
        parse_control_record(struct.pack(">hh", 0, 2), good_value)  # unknown type
    with pytest.raises(InvalidBatchError):
        parse_control_record(struct.pack(">hh", 0, 0), b"\x00")
    assert parse_control_record(struct.pack(">hh", 0, 0), good_value).kind is ControlType.ABORT


def test_read_control_batch_refuses_data_batches():
    data = BatchBuilder(batch_bytes_max=4096)
    data.append(1, None, b"v")
    with pytest.raises(InvalidBatchError):
        read_control_batch(data.build())
    with pytest.raises(InvalidBatchError):
        read_control_batch(b"short")
