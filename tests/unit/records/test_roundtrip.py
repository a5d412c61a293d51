"""Building and decoding record batches: what goes in comes out, and the builder keeps its limits.

Method: Hypothesis draws lists of records (null and empty keys and values, unicode header
keys, null header values, sizes drawn so that runs of one shape alternate with odd ones, which
exercises the reader's learned-shape, inline and careful paths) and builds them with and without
zstd; every batch must pass ``validate`` (dense) and decode, by both ``decode_records`` and
``iter_records``, to exactly the records appended, with offsets and timestamps restored. Other
tests pin the fetch-body handling (several batches, partial tail, ``min_offset``, filters, a
broker-stamped base offset) and the builder's byte, count and type limits.
"""

from __future__ import annotations

import zstandard
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rivven_broker.protocol import limits
from rivven_broker.records.batch import encode_headers
from rivven_broker.records import (
    BatchBuilder,
    BatchHeader,
    EncodedHeaders,
    InvalidRecordError,
    Record,
    RecordTooLargeError,
    decode_records,
    iter_records,
    stamp,
    validate,
)
from rivven_broker.records.batch import RECORD_OVERHEAD_BYTES
from rivven_broker.records.header import (
    ATTR_TRANSACTIONAL,
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    HEADER_BYTES,
)

BIG = limits.batch_bytes_max

blobs = st.one_of(
    st.none(),
    st.sampled_from([b"", b"a", b"abc", b"x" * 100]),  # repeated shapes
    st.binary(max_size=300),
)
header_lists = st.lists(
    st.tuples(st.text(max_size=12), st.one_of(st.none(), st.binary(max_size=20))), max_size=4
)
records_strategy = st.lists(
    st.tuples(st.integers(-(2**40), 2**40), blobs, blobs, st.one_of(st.just(()), header_lists)),
    min_size=1,
    max_size=60,
)


def build(records, compression="none", **kwargs) -> bytes:
    builder = BatchBuilder(batch_bytes_max=BIG, compression=compression, **kwargs)
    for timestamp_ms, key, value, headers in records:
        assert builder.append(timestamp_ms, key, value, headers)
    assert builder.record_count == len(records)
    return builder.build()


def expected(records, base_offset: int = 0) -> list[Record]:
    return [
        Record(base_offset + i, ts, key, value, tuple(headers))
        for i, (ts, key, value, headers) in enumerate(records)
    ]


@settings(max_examples=150, deadline=None)
@given(records_strategy, st.sampled_from(["none", "zstd"]))
def test_round_trip(records, compression):
    batch = build(records, compression)
    header = validate(batch)  # dense: producer batches have one record per offset
    assert header.record_count == len(records)
    assert header.last_offset_delta == len(records) - 1
    assert header.first_timestamp == records[0][0]
    assert header.max_timestamp == max(r[0] for r in records)
    assert decode_records(batch) == expected(records)
    assert list(iter_records(batch)) == expected(records)
    assert list(iter_records(memoryview(b"junk" + batch), 4)) == expected(records)


def test_many_records_of_one_shape_then_others():
    # Long runs of one shape take the learned-shape path; the changes force the fallbacks.
    records = [(1000 + i, None, b"v" * 100, ()) for i in range(500)]
    records += [(2000 + i, b"key%d" % i, b"w" * (i % 7), ()) for i in range(300)]
    records += [(3000, b"k", None, [("trace", b"1")])] + [(3001, None, None, ())] * 50
    for compression in ("none", "zstd"):
        assert decode_records(build(records, compression)) == expected(records)


def test_shape_guess_with_equal_length_but_headers_is_not_fooled():
    # B has the same record length as A (25 + 2 + 8 == 25 + 10) but a header: the learned
    # shape of A must not swallow it.
    a = (1, None, b"0123456789", ())
    b = (2, None, b"zz", [("", b"")])
    records = [a, a, a, b, a, b, b, a, a]
    assert decode_records(build(records)) == expected(records)


def test_dict_headers_and_unicode_keys():
    headers = {"trace-id": b"abc", "ключ": None, "🔑": b""}
    batch = build([(5, b"k", b"v", headers)])
    (record,) = decode_records(batch)
    assert record.headers == (("trace-id", b"abc"), ("ключ", None), ("🔑", b""))


def test_encoded_headers_are_written_as_the_pairs_they_encode():
    pairs = (("rivven.cdc.id", b"0/16B3748:0"), ("ключ", None), ("v", b""))
    encoded = EncodedHeaders(*encode_headers(pairs))
    assert encode_headers(encoded) == encode_headers(pairs)
    assert build([(5, b"k", b"v", encoded)]) == build([(5, b"k", b"v", pairs)])
    (record,) = decode_records(build([(5, b"k", b"v", encoded), (6, b"k", b"v", ())]))[:1]
    assert record.headers == pairs
    builder = BatchBuilder(batch_bytes_max=BIG)
    with pytest.raises(InvalidRecordError):  # the count is checked against the limit
        builder.append(1, None, b"v", EncodedHeaders(b"", limits.headers_per_record_max + 1))
    assert builder.is_empty


def test_large_value_round_trips_with_and_without_zstd():
    value = bytes(range(256)) * 4096  # 1 MiB
    for compression in ("none", "zstd"):
        batch = build([(1, b"big", value, ()), (2, None, b"small", ())], compression)
        assert decode_records(batch) == expected([(1, b"big", value, ()), (2, None, b"small", ())])


def test_zstd_is_used_when_it_helps_and_dropped_when_it_does_not():
    compressible = build([(1, None, b"a" * 10_000, ())], "zstd")
    assert validate(compressible).compression == COMPRESSION_ZSTD
    assert len(compressible) < 1000
    incompressible = build([(1, None, bytes(range(7)), ())], "zstd")
    assert validate(incompressible).compression == COMPRESSION_NONE
    assert decode_records(incompressible)[0].value == bytes(range(7))


def test_injected_compressor_is_used():
    compressor = zstandard.ZstdCompressor(level=3)
    builder = BatchBuilder(batch_bytes_max=BIG, compression="zstd", compressor=compressor)
    builder.append(1, None, b"b" * 5000)
    assert validate(builder.build()).compression == COMPRESSION_ZSTD


def test_header_fields_of_an_idempotent_transactional_batch():
    batch = build(
        [(10, None, b"x", ()), (7, None, b"y", ())],
        producer_id=42,
        producer_epoch=3,
        base_sequence=17,
        transactional=True,
    )
    header = validate(batch)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, 17)
    assert header.attributes & ATTR_TRANSACTIONAL
    assert (header.base_offset, header.partition_leader_epoch) == (0, -1)
    assert (header.first_timestamp, header.max_timestamp) == (10, 10)


def test_fetch_body_with_several_batches_and_a_partial_tail():
    first = build([(1, None, b"a", ()), (2, None, b"b", ())])
    second = build([(3, None, b"c", ())], "zstd")
    body = stamp(100, len(first) - 12, 4) + first[16:]
    body += stamp(102, len(second) - 12, 4) + second[16:]
    records = decode_records(body + second[: len(second) - 1])
    assert [(r.offset, r.value) for r in records] == [(100, b"a"), (101, b"b"), (102, b"c")]
    assert [(r.offset, r.value) for r in decode_records(body, min_offset=101)] == [
        (101, b"b"),
        (102, b"c"),
    ]
    assert [r.offset for r in decode_records(body, min_offset=102)] == [102]
    assert decode_records(body, min_offset=103) == []
    assert decode_records(b"") == [] and decode_records(body[:60]) == []


def test_batch_filter_sees_every_header_and_can_skip_batches():
    first = build([(1, None, b"a", ())])
    second = build([(2, None, b"b", ())], producer_id=9, producer_epoch=0)
    seen: list[BatchHeader] = []

    def keep(header: BatchHeader) -> bool:
        seen.append(header)
        return header.producer_id != 9

    assert [r.value for r in decode_records(bytearray(first + second), batch_filter=keep)] == [b"a"]
    assert [h.producer_id for h in seen] == [-1, 9]


def test_builder_honours_its_byte_limit():
    record_bytes = RECORD_OVERHEAD_BYTES + 100
    limit = HEADER_BYTES + 3 * record_bytes + record_bytes // 2
    builder = BatchBuilder(batch_bytes_max=limit)
    assert builder.is_empty and builder.size_bytes == HEADER_BYTES
    accepted = [builder.append(i, None, b"v" * 100) for i in range(5)]
    assert accepted == [True, True, True, False, False]
    assert builder.record_count == 3
    assert builder.size_bytes == HEADER_BYTES + 3 * record_bytes <= limit
    assert builder.append(9, None, b"") is True  # a smaller record still fits
    assert len(builder.build()) == builder.size_bytes


@settings(max_examples=60, deadline=None)
@given(
    st.integers(HEADER_BYTES + RECORD_OVERHEAD_BYTES, 4000),
    st.lists(st.integers(0, 900), min_size=1, max_size=40),
    st.sampled_from(["none", "zstd"]),
)
def test_byte_limit_property(limit, sizes, compression):
    builder = BatchBuilder(batch_bytes_max=limit, compression=compression)
    appended = []
    for i, size in enumerate(sizes):
        before = builder.size_bytes
        if builder.append(i, None, b"q" * size):
            appended.append(size)
        else:
            assert not builder.is_empty
            assert before + RECORD_OVERHEAD_BYTES + size > limit
            assert builder.size_bytes == before
    assert appended and appended[0] == sizes[0]  # the first record is always taken
    if len(appended) > 1:
        assert builder.size_bytes <= limit
    batch = builder.build()
    assert len(batch) <= builder.size_bytes
    assert [len(r.value) for r in decode_records(batch)] == appended


def test_first_record_larger_than_the_batch_size_travels_alone():
    builder = BatchBuilder(batch_bytes_max=200)
    assert builder.append(1, None, b"x" * 1000)
    assert not builder.append(2, None, b"y")
    assert decode_records(builder.build())[0].value == b"x" * 1000


def test_record_larger_than_any_batch_is_refused():
    largest_value_bytes = limits.batch_bytes_max - HEADER_BYTES - RECORD_OVERHEAD_BYTES
    builder = BatchBuilder(batch_bytes_max=1000)
    with pytest.raises(RecordTooLargeError):
        builder.append(1, None, bytes(largest_value_bytes + 1))
    assert isinstance(RecordTooLargeError("x"), ValueError)
    assert builder.is_empty
    assert builder.append(1, None, bytes(largest_value_bytes))
    assert len(builder.build()) == limits.batch_bytes_max


def test_record_count_limit(monkeypatch):
    monkeypatch.setattr(limits, "batch_records_max", 3)
    builder = BatchBuilder(batch_bytes_max=BIG)
    assert [builder.append(i, None, b"") for i in range(4)] == [True, True, True, False]


def test_too_many_headers_and_bad_types_are_refused():
    builder = BatchBuilder(batch_bytes_max=BIG)
    too_many = [("h", None)] * (limits.headers_per_record_max + 1)
    with pytest.raises(InvalidRecordError):
        builder.append(1, None, b"v", too_many)
    with pytest.raises(TypeError):
        builder.append(1, "key", b"v")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        builder.append(1, None, memoryview(b"v"))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        builder.append(1, None, b"v", [(b"not-str", b"v")])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        builder.append(1, None, b"v", [("k", "not-bytes")])  # type: ignore[list-item]
    assert builder.is_empty
    # A learned shape must not let a wrong type through either.
    for _ in range(3):
        builder.append(1, b"ab", b"cd")
    with pytest.raises(TypeError):
        builder.append(1, "ab", b"cd")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        builder.append(2**63, b"ab", b"cd")
    assert builder.record_count == 3
    assert [r.key for r in decode_records(builder.build())] == [b"ab"] * 3


def test_bytearray_input_is_copied_at_append():
    value = bytearray(b"before")
    builder = BatchBuilder(batch_bytes_max=BIG)
    builder.append(1, bytearray(b"k"), value)
    value[:] = b"after!"
    assert decode_records(builder.build())[0].value == b"before"


def test_build_twice_returns_the_same_bytes():
    builder = BatchBuilder(batch_bytes_max=BIG)
    builder.append(1, None, b"v")
    assert builder.build() is builder.build()


def test_bad_builder_settings_are_refused():
    for bad in (10, limits.batch_bytes_max + 1):
        with pytest.raises(ValueError):
            BatchBuilder(batch_bytes_max=bad)
    with pytest.raises(ValueError):
        BatchBuilder(batch_bytes_max=BIG, compression="brotli")  # type: ignore[arg-type]
