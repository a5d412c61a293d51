"""gzip, snappy and lz4 record batches (Kafka's codec ids 1-3) through cramjam.

Goal: every codec round-trips through the builder and the reader, a section that does not
shrink is stored plain, and decompression is bounded before any buffer is made: a section
stating more than a batch may hold, or lying about its size, is refused, never allocated.
"""

from __future__ import annotations

import random
import struct

import pytest

from rivven_broker.records import BatchBuilder, CorruptBatchError, decode_records
from rivven_broker.records import codecs
from rivven_broker.records.header import COMPRESSION_MASK, parse_header


@pytest.mark.parametrize("name", ["gzip", "snappy", "lz4", "zstd"])
def test_every_codec_round_trips_and_shrinks(name: str) -> None:
    builder = BatchBuilder(batch_bytes_max=1 << 20, compression=name)
    for i in range(300):
        builder.append(1_000 + i, b"key-%d" % (i % 7), b"a fairly repetitive value %d" % i,
                       [("h", b"x")])
    batch = builder.build()
    plain = BatchBuilder(batch_bytes_max=1 << 20)
    for i in range(300):
        plain.append(1_000 + i, b"key-%d" % (i % 7), b"a fairly repetitive value %d" % i,
                     [("h", b"x")])
    assert len(batch) < len(plain.build()) // 2
    expected = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}[name]
    assert parse_header(batch).attributes & COMPRESSION_MASK == expected
    assert decode_records(batch) == decode_records(plain.build())


def test_a_section_that_does_not_shrink_is_stored_plain() -> None:
    noise = random.Random(7).randbytes(4096)  # incompressible: gzip and lz4 would grow it
    for name in ("gzip", "lz4"):
        builder = BatchBuilder(batch_bytes_max=1 << 20, compression=name)
        builder.append(1, None, noise)
        batch = builder.build()
        assert parse_header(batch).attributes & COMPRESSION_MASK == 0
        assert decode_records(batch)[0][-2] == noise


@pytest.mark.parametrize("code", [codecs.GZIP, codecs.SNAPPY, codecs.LZ4])
def test_decompression_is_bounded_before_any_buffer(code: int) -> None:
    big = b"\x00" * 5_000_000  # a bomb: tiny compressed, large plain
    bomb = codecs.compress(code, big)
    assert len(bomb) < 300_000
    with pytest.raises(codecs.CodecError, match="more than 1000000"):
        codecs.decompress(code, bomb, 1_000_000)
    assert codecs.decompress(code, bomb, 5_000_000) == big


def test_a_section_lying_about_its_size_is_refused() -> None:
    section = codecs.compress(codecs.LZ4, b"hello" * 100)
    lying = struct.pack("<I", 10) + section[4:]  # says 10 bytes, holds 500
    with pytest.raises(codecs.CodecError):
        codecs.decompress(codecs.LZ4, lying, 1 << 20)
    gzip = codecs.compress(codecs.GZIP, b"hello" * 100)
    with pytest.raises(codecs.CodecError):
        codecs.decompress(codecs.GZIP, gzip[:-4] + struct.pack("<I", 499), 1 << 20)
    with pytest.raises(codecs.CodecError):
        codecs.decompress(codecs.GZIP, b"short", 1 << 20)


def test_a_damaged_compressed_batch_is_corrupt_not_a_crash() -> None:
    builder = BatchBuilder(batch_bytes_max=1 << 20, compression="gzip")
    for i in range(50):
        builder.append(i, None, b"value %d" % i)
    batch = bytearray(builder.build())
    batch[-10] ^= 0xFF
    with pytest.raises(CorruptBatchError):  # the CRC says so first
        decode_records(bytes(batch))
    with pytest.raises(CorruptBatchError, match="gzip"):  # and without it, the codec
        decode_records(bytes(batch), check_crc=False)
