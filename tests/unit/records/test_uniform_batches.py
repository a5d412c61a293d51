"""Batches whose records all share one shape decode exactly as the careful path decodes them.

Goal: ``decode_records`` takes a batch-wide shortcut (one ``Struct.iter_unpack`` over the
section) when every record has the first record's key length, value length and no headers;
it must return what the record-by-record path returns, fall back whenever a single record
differs, and never be fooled by damaged framing. Method: differential. ``iter_records`` (which
checks every field of every record) is the reference; batches of one shape are built with
``BatchBuilder``, then one record is made different (Hypothesis draws which and how), or
bytes of the section are edited behind a recomputed CRC: both decoders must agree, or both
raise ``BatchError``.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rivven_broker.client.types import Record as ClientRecord
from rivven_broker.records import BatchBuilder, BatchError, decode_records, iter_records
from rivven_broker.records.header import HEADER_BYTES

from tests.unit.records._support import reframe

SHAPES = [(None, b""), (None, b"x" * 100), (b"", b"v"), (b"key", b"x" * 37), (b"k" * 9, b"")]


def build(records, compression: str = "none") -> bytes:
    builder = BatchBuilder(batch_bytes_max=1 << 20, compression=compression)
    for timestamp_ms, key, value, headers in records:
        assert builder.append(timestamp_ms, key, value, headers)
    return builder.build()


def reference(batch: bytes, **options) -> list:
    return list(iter_records(batch, **options))


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("key, value", SHAPES)
def test_a_batch_of_one_shape_decodes_to_its_records(key, value, compression):
    records = [(5_000 + 3 * i, key, value, ()) for i in range(50)]
    batch = build(records, compression)
    plain = decode_records(batch)
    assert plain == reference(batch)
    assert [(r.offset, r.timestamp_ms, r.key, r.value, r.headers) for r in plain] == [
        (i, 5_000 + 3 * i, key, value, ()) for i in range(50)
    ]
    client = decode_records(batch, record_type=ClientRecord, prefix=("t", 7))
    assert all(type(r) is ClientRecord for r in client)
    assert client == [ClientRecord("t", 7, *r) for r in plain]
    assert [r.topic for r in client] == ["t"] * 50


def test_a_batch_larger_than_the_plan_cache_bound_decodes_too():
    records = [(9, b"k", b"%04d" % (i % 10_000), ()) for i in range(5_000)]  # 5,000 > 4,096
    batch = build(records)
    got = decode_records(batch)
    assert got == reference(batch)
    assert [r.value for r in got] == [b"%04d" % i for i in range(5_000)]


def test_min_offset_and_several_uniform_batches_in_one_body():
    first = build([(1, None, b"a" * 10, ())] * 20)
    second = build([(2, b"k", b"b" * 10, ())] * 20)
    body = first + second
    got = decode_records(body, min_offset=0)
    assert [r.value for r in got] == [b"a" * 10] * 20 + [b"b" * 10] * 20
    assert [r.offset for r in decode_records(body, min_offset=5)][:3] == [5, 6, 7]


variants = st.sampled_from([
    (None, b"y" * 12, ()),           # a different value length
    (b"ab", b"xyz" * 3, ()),         # the same record length, another key length
    (None, None, ()),                # a null value
    (None, b"y" * 2, [("h", b"")]),  # the same record length with a header
    (b"", b"y" * 8, ()),             # an empty key instead of a null one
])


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 40), st.data(), variants, st.sampled_from(["none", "zstd"]))
def test_one_different_record_anywhere_forces_the_careful_path(count, data, odd, compression):
    records = [(100 + i, None, b"x" * 13, ()) for i in range(count)]
    where = data.draw(st.integers(0, count - 1))
    records[where] = (100 + where, *odd)
    batch = build(records, compression)
    got = decode_records(batch)
    assert got == reference(batch)
    assert [r.value for r in got] == [record[2] for record in records]
    assert got[where].headers == tuple(odd[2])


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(SHAPES),
    st.integers(2, 30),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), min_size=1, max_size=3),
    st.booleans(),
)
def test_edits_behind_a_good_crc_agree_with_the_careful_path(shape, count, edits, check_crc):
    key, value = shape
    batch = build([(7 + i, key, value, ()) for i in range(count)])
    section = bytearray(batch[HEADER_BYTES:])
    for position, mask in edits:
        section[position % len(section)] ^= mask
    damaged = reframe(batch, bytes(section))
    try:
        expected = reference(damaged, check_crc=check_crc)
    except BatchError:
        with pytest.raises(BatchError):
            decode_records(damaged, check_crc=check_crc)
        return
    assert decode_records(damaged, check_crc=check_crc) == expected
