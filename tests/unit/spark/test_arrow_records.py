"""Fetched record batches to Arrow: the executor's decoder, both paths, and read_committed.

Goal: every record of the asked range, and nothing else, lands in the Arrow batch with the
schema Spark checks, whether the fast column-wise path (uniform batches) or the generic path
(mixed shapes, headers) decodes it. Method: build real batches with ``BatchBuilder``, stamp
base offsets as the broker does, feed them to ``RangeDecoder`` and compare with the
independent ``records.decode_records``; a Hypothesis property does this for random records,
batch splits and ranges. Transactions are checked with real control batches.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")
pytest.importorskip("numpy")

from rivven_broker.records import (  # noqa: E402
    BatchBuilder,
    ControlType,
    CorruptBatchError,
    build_control_batch,
    decode_records,
)
from rivven_spark import arrow_records  # noqa: E402
from rivven_spark.arrow_records import ARROW_SCHEMA, AbortedTxn, RangeDecoder  # noqa: E402

T0 = 1_700_000_000_000


def batch(base: int, records, *, compression="none", pid=-1, transactional=False) -> bytes:
    """A stored batch: built, then stamped with ``base`` as its base offset."""
    builder = BatchBuilder(batch_bytes_max=1 << 20, compression=compression, producer_id=pid,
                           producer_epoch=0 if pid >= 0 else -1,
                           base_sequence=0 if pid >= 0 else -1, transactional=transactional)
    for i, (key, value, headers) in enumerate(records):
        assert builder.append(T0 + i, key, value, headers)
    return struct.pack(">q", base) + builder.build()[8:]


def control(base: int, pid: int, kind: ControlType) -> bytes:
    return struct.pack(">q", base) + build_control_batch(kind, pid, 0, T0)[8:]


def rows(table) -> list[tuple]:
    d = table.to_pydict()
    return [
        (d["offset"][i], d["key"][i], d["value"][i],
         tuple((h["key"], h["value"]) for h in d["headers"][i] or ()))
        for i in range(table.num_rows)
    ]


def decode(body: bytes, start: int, end: int, aborted=(), **kw):
    decoder = RangeDecoder("t", 3, start, end, **kw)
    decoder.feed(body, aborted)
    return decoder, decoder.take_batch()


def test_uniform_batch_takes_the_column_path(monkeypatch):
    def no_generic(*args):
        raise AssertionError("the generic path was used")

    monkeypatch.setattr(RangeDecoder, "_generic", no_generic)
    body = batch(100, [(b"k%02d" % i, b"v" * 10, ()) for i in range(50)])
    decoder, out = decode(body, 100, 150)
    assert out.schema == ARROW_SCHEMA
    assert rows(out) == [(100 + i, b"k%02d" % i, b"v" * 10, ()) for i in range(50)]
    d = out.to_pydict()
    assert set(d["topic"]) == {"t"} and set(d["partition"]) == {3}
    assert d["timestamp"][0].timestamp() * 1000 == T0
    assert decoder.done and decoder.position == 150


def test_null_keys_null_values_and_empty_values_on_the_column_path():
    for key, value in [(None, b"x" * 7), (b"", None), (None, None), (b"kk", b"")]:
        body = batch(0, [(key, value, ())] * 4)
        _, out = decode(body, 0, 4)
        assert rows(out) == [(i, key, value, ()) for i in range(4)]


def test_mixed_shapes_and_headers_take_the_generic_path():
    records = [(b"a", b"1", ()), (None, b"22", (("h", b"v"), ("n", None))), (b"ccc", None, ())]
    _, out = decode(batch(7, records), 7, 10)
    assert rows(out) == [(7, b"a", b"1", ()), (8, None, b"22", (("h", b"v"), ("n", None))),
                         (9, b"ccc", None, ())]
    assert out.schema == ARROW_SCHEMA
    # as in Spark's Kafka source: null, not an empty list, for a record without headers
    assert out.column("headers").to_pylist() == [
        None, [{"key": "h", "value": b"v"}, {"key": "n", "value": None}], None]


def test_records_without_headers_have_null_headers_in_every_column_shape():
    uniform = batch(0, [(None, b"u" * 8, ())] * 3)
    with_headers = batch(3, [(None, b"w", (("h", b"1"),)), (None, b"ww", ())])
    _, only_uniform = decode(uniform, 0, 3)
    assert only_uniform.column("headers").to_pylist() == [None] * 3
    _, mixed = decode(uniform + with_headers, 0, 5)  # one Arrow batch from both pieces
    mixed.validate(full=True)
    assert mixed.column("headers").to_pylist() == [
        None, None, None, [{"key": "h", "value": b"1"}], None]


def test_range_trims_straddling_batches_and_stops_at_end():
    body = b"".join(batch(b, [(None, b"%d" % (b + i), ()) for i in range(10)])
                    for b in (0, 10, 20))
    decoder, out = decode(body, 5, 23)
    assert [r[0] for r in rows(out)] == list(range(5, 23))
    assert decoder.done


def test_partial_trailing_batch_is_left_for_the_next_fetch():
    body = batch(0, [(None, b"a", ())] * 5) + batch(5, [(None, b"b", ())] * 5)[:-3]
    decoder, out = decode(body, 0, 10)
    assert out.num_rows == 5 and decoder.position == 5 and not decoder.done


def test_zstd_batches():
    body = batch(0, [(None, b"z" * 100, ())] * 20, compression="zstd")
    body += batch(20, [(b"k", b"y" * (i + 1), ()) for i in range(5)], compression="zstd")
    _, out = decode(body, 0, 25)
    assert [r[2] for r in rows(out)] == [b"z" * 100] * 20 + [b"y" * (i + 1) for i in range(5)]


def test_a_corrupt_batch_is_refused():
    body = bytearray(batch(0, [(None, b"abc", ())] * 3))
    body[-1] ^= 0xFF
    with pytest.raises(CorruptBatchError):
        decode(bytes(body), 0, 3)


def test_read_committed_skips_aborted_transactions_and_markers():
    body = b"".join([
        batch(0, [(None, b"plain", ())] * 2),
        batch(2, [(None, b"aborted", ())] * 3, pid=7, transactional=True),
        batch(5, [(None, b"committed", ())] * 2, pid=8, transactional=True),
        control(7, 7, ControlType.ABORT),
        control(8, 8, ControlType.COMMIT),
        batch(9, [(None, b"later", ())] * 2, pid=7, transactional=True),  # a new txn of pid 7
        control(11, 7, ControlType.COMMIT),
    ])
    aborted = [AbortedTxn(7, 2)]
    _, out = decode(body, 0, 12, read_committed=True, aborted=aborted)
    assert [(r[0], r[2]) for r in rows(out)] == [
        (0, b"plain"), (1, b"plain"), (5, b"committed"), (6, b"committed"),
        (9, b"later"), (10, b"later")]
    _, everything = decode(body, 0, 12, read_committed=False, aborted=aborted)
    assert everything.num_rows == 9  # aborted records too, but never the markers


def test_the_schema_is_what_spark_expects():
    pytest.importorskip("pyspark")
    from pyspark.sql.pandas.types import to_arrow_schema

    from rivven_spark.arrow_records import ARROW_SCHEMA_NO_HEADERS
    from rivven_spark.source import SCHEMA, SCHEMA_NO_HEADERS, RivvenDataSource

    assert to_arrow_schema(SCHEMA, timezone="UTC").equals(ARROW_SCHEMA)
    assert to_arrow_schema(SCHEMA_NO_HEADERS, timezone="UTC").equals(ARROW_SCHEMA_NO_HEADERS)
    assert RivvenDataSource({"subscribe": "t"}).schema() == SCHEMA_NO_HEADERS  # as Kafka's
    assert RivvenDataSource({"subscribe": "t", "includeHeaders": "TRUE"}).schema() == SCHEMA


record = st.tuples(
    st.none() | st.binary(max_size=6),
    st.none() | st.binary(max_size=12),
    st.lists(st.tuples(st.sampled_from(["a", "é"]), st.none() | st.binary(max_size=3)),
             max_size=2).map(tuple),
)


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(
        st.one_of(st.lists(record, min_size=1, max_size=12),
                  st.tuples(record, st.integers(1, 12)).map(lambda t: [t[0]] * t[1])),
        min_size=1, max_size=6),
    compression=st.sampled_from(["none", "zstd"]),
    cut=st.tuples(st.integers(0, 80), st.integers(0, 80)),
    take_every_feed=st.booleans(),
)
def test_decoder_agrees_with_decode_records(batches, compression, cut, take_every_feed):
    bodies, base = [], 0
    for records in batches:
        bodies.append(batch(base, records, compression=compression))
        base += len(records)
    start, end = min(cut), min(max(cut), base)
    start = min(start, end)
    expected = [(r.offset, r.key, r.value, r.headers)
                for r in decode_records(b"".join(bodies)) if start <= r.offset < end]
    decoder = RangeDecoder("t", 5, start, end)
    got = []
    for body in bodies:  # one fetch per batch, as a small fetchMaxBytes would give
        decoder.feed(body)
        if take_every_feed and (out := decoder.take_batch()) is not None:
            got += rows(out)
            assert_constant_columns(out)
    if (out := decoder.take_batch()) is not None:
        assert out.schema == ARROW_SCHEMA
        got += rows(out)
        assert_constant_columns(out)
    assert got == expected
    assert decoder.done


def assert_constant_columns(out) -> None:
    """Every row of a batch taken from ``RangeDecoder("t", 5, ...)`` names topic t, partition 5
    (the decoder reuses slices of its constant columns from batch to batch)."""
    assert out.column("topic").to_pylist() == ["t"] * out.num_rows
    assert out.column("partition").to_pylist() == [5] * out.num_rows


def test_constant_columns_follow_batches_that_grow_and_shrink():
    decoder = RangeDecoder("t", 5, 0, 1_000)
    base = 0
    for size in (3, 40, 7, 40, 90, 1):
        decoder.feed(batch(base, [(None, b"v", ())] * size))
        base += size
        out = decoder.take_batch()
        assert out.num_rows == size
        assert_constant_columns(out)


def test_module_docstring_names_its_theory():
    assert "Theory of operation" in arrow_records.__doc__


def test_without_headers_the_column_is_left_out_and_the_type_is_create_time():
    from rivven_spark.arrow_records import ARROW_SCHEMA_NO_HEADERS

    data = batch(0, [(b"k", b"v", [("h", b"x")]), (None, b"w", None)])
    decoder = RangeDecoder("t", 0, 0, 2, include_headers=False)
    decoder.feed(data)
    out = decoder.take_batch()
    assert out.schema == ARROW_SCHEMA_NO_HEADERS
    assert out.column("timestampType").to_pylist() == [0, 0]
