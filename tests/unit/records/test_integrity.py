"""Damaged batches are caught: CRC flips, truncation, bad framing, hostile zstd sections.

Method: build real batches, then damage them. Hypothesis flips every kind of single byte (any
position, any non-zero xor mask) in the CRC-covered region and in the CRC itself and expects
``CorruptBatchError``; flips in the uncovered prefix are checked field by field (batch_length
and magic are still checked; base_offset and partition_leader_epoch are the broker's to rewrite).
For deeper damage the CRC is recomputed after the edit, so only the reader's framing checks
stand between the bytes and the user: any edit must decode or raise ``BatchError``, never another
exception and never read past the batch.
"""

from __future__ import annotations

import struct

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from rivven_broker.records import (
    BatchBuilder,
    BatchError,
    CorruptBatchError,
    InvalidBatchError,
    decode_records,
    iter_records,
    validate,
)
from rivven_broker.records.batch import SECTION_BYTES_MAX
from rivven_broker.records.header import CRC_START, HEADER_BYTES, COMPRESSION_ZSTD

from tests.unit.records._support import recrc, reframe


def make_batch(compression: str = "none") -> bytes:
    builder = BatchBuilder(batch_bytes_max=1 << 20, compression=compression, producer_id=1)
    for i in range(6):
        builder.append(1000 + i, b"k%d" % i if i % 2 else None, b"value-%d" % i * (i + 1))
    builder.append(2000, b"hk", b"hv", [("h1", b"x"), ("h2", None)])
    builder.append(2001, None, None)
    return builder.build()


BATCHES = {"none": make_batch(), "zstd": make_batch("zstd")}


def flip(batch: bytes, position: int, mask: int) -> bytes:
    damaged = bytearray(batch)
    damaged[position] ^= mask
    return bytes(damaged)


def test_built_batches_validate():
    for batch in BATCHES.values():
        assert validate(batch).record_count == 8
    assert validate(BATCHES["zstd"]).compression == COMPRESSION_ZSTD


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["none", "zstd"]), st.data(), st.integers(1, 255))
def test_any_single_byte_flip_in_crc_and_covered_region_is_detected(compression, data, mask):
    batch = BATCHES[compression]
    position = data.draw(st.integers(CRC_START - 4, len(batch) - 1))  # the CRC field onwards
    damaged = flip(batch, position, mask)
    # Header fields after the CRC may fail a sanity check first (InvalidBatchError); the CRC
    # field and the records section can only fail the CRC.
    expected = BatchError if CRC_START <= position < HEADER_BYTES else CorruptBatchError
    with pytest.raises(expected):
        validate(damaged)
    with pytest.raises(expected):
        decode_records(damaged)
    with pytest.raises(expected):
        list(iter_records(damaged))


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_every_position_with_every_single_bit_flip_is_detected(compression):
    batch = BATCHES[compression]
    for position in range(CRC_START - 4, len(batch)):
        for mask in (1, 2, 4, 8, 16, 32, 64, 128, 255):
            damaged = flip(batch, position, mask)
            with pytest.raises(BatchError):
                validate(damaged)
            with pytest.raises(BatchError):
                decode_records(damaged)


@given(st.integers(0, 15), st.integers(1, 255))
def test_uncovered_prefix_is_still_checked(position, mask):
    batch = BATCHES["none"]
    damaged = flip(batch, position, mask)
    if 8 <= position < 12:  # batch_length no longer matches the bytes
        with pytest.raises(InvalidBatchError):
            validate(damaged)
    elif position == 16:  # magic
        with pytest.raises(InvalidBatchError):
            validate(damaged)
    else:  # base_offset (0-7) and partition_leader_epoch (12-15): the broker rewrites them
        header = validate(damaged)
        if position < 8:
            assert header.base_offset != 0
            offsets = [r.offset for r in iter_records(damaged)]
            assert offsets == list(range(header.base_offset, header.base_offset + 8))
        else:
            assert header.partition_leader_epoch != -1


@given(st.sampled_from(["none", "zstd"]), st.data())
def test_truncated_batch_raises(compression, data):
    batch = BATCHES[compression]
    cut = data.draw(st.integers(0, len(batch) - 1))
    with pytest.raises(InvalidBatchError):
        validate(batch[:cut])
    with pytest.raises(InvalidBatchError):
        list(iter_records(batch[:cut]))
    assert decode_records(batch[:cut]) == []  # a partial batch ends a fetch body


def test_record_running_past_its_section_is_corrupt():
    batch = BATCHES["none"]
    # Grow the first record's length field by 1000: it now claims bytes beyond the batch.
    (length,) = struct.unpack_from(">i", batch, HEADER_BYTES)
    damaged = bytearray(batch)
    struct.pack_into(">i", damaged, HEADER_BYTES, length + 1000)
    damaged = recrc(damaged)
    validate(damaged)  # the CRC matches again: only the framing check can see it
    with pytest.raises(CorruptBatchError):
        decode_records(damaged + BATCHES["none"])  # the next batch must not be read into it
    with pytest.raises(CorruptBatchError):
        list(iter_records(damaged))


def test_record_count_must_match_the_header():
    batch = BATCHES["none"]
    fewer = reframe(batch, record_count=7, last_offset_delta=6)
    with pytest.raises(CorruptBatchError):
        decode_records(fewer)
    with pytest.raises(CorruptBatchError):
        list(iter_records(fewer))


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["none", "zstd"]),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), min_size=1, max_size=4),
    st.booleans(),
)
def test_any_edit_behind_a_good_crc_decodes_or_raises_batch_error(compression, edits, check_crc):
    batch = BATCHES["none"]
    section = bytearray(batch[HEADER_BYTES:])
    for position, mask in edits:
        section[position % len(section)] ^= mask
    if compression == "zstd":  # damage the decompressed bytes, or the frame itself
        packed = zstandard.ZstdCompressor().compress(bytes(section))
        damaged = reframe(batch, packed, attributes=COMPRESSION_ZSTD)
        if edits[0][0] % 2:
            frame = bytearray(packed)
            frame[edits[0][0] % len(frame)] ^= edits[0][1]
            damaged = reframe(batch, bytes(frame), attributes=COMPRESSION_ZSTD)
    else:
        damaged = reframe(batch, bytes(section))
    for decode in (
        lambda: decode_records(damaged, check_crc=check_crc),
        lambda: list(iter_records(damaged, check_crc=check_crc)),
    ):
        try:
            records = decode()
        except BatchError:
            continue
        assert len(records) == 8


def test_hostile_zstd_sections():
    batch = BATCHES["none"]
    section = batch[HEADER_BYTES:]
    # A frame that claims more than any batch can hold is refused before decompressing.
    bomb = zstandard.ZstdCompressor().compress(bytes(SECTION_BYTES_MAX + 1))
    with pytest.raises(CorruptBatchError, match="claims"):
        decode_records(reframe(batch, bomb, attributes=COMPRESSION_ZSTD))
    # Trailing bytes after the one frame are refused.
    frame = zstandard.ZstdCompressor().compress(section)
    with pytest.raises(CorruptBatchError):
        decode_records(reframe(batch, frame + b"\x00", attributes=COMPRESSION_ZSTD))
    # Not zstd at all.
    with pytest.raises(CorruptBatchError):
        decode_records(reframe(batch, b"definitely not zstd", attributes=COMPRESSION_ZSTD))
    # A frame without a content size (other producers write those) still decodes.
    sizeless = zstandard.ZstdCompressor(write_content_size=False).compress(section)
    assert zstandard.frame_content_size(sizeless) == -1
    records = decode_records(reframe(batch, sizeless, attributes=COMPRESSION_ZSTD))
    assert records == decode_records(batch)


def test_unknown_compression_and_magic_are_invalid():
    batch = BATCHES["none"]
    for check_crc in (True, False):
        with pytest.raises(InvalidBatchError):
            decode_records(reframe(batch, attributes=5), check_crc=check_crc)  # no codec 5
        with pytest.raises(CorruptBatchError, match="gzip"):  # a plain section called gzip
            decode_records(reframe(batch, attributes=1), check_crc=check_crc)
        with pytest.raises(InvalidBatchError):
            decode_records(reframe(batch, magic=1), check_crc=check_crc)


def test_bad_utf8_header_key_is_corrupt():
    builder = BatchBuilder(batch_bytes_max=1 << 20)
    builder.append(1, None, b"v", [("ab", b"v")])
    batch = builder.build()
    position = batch.index(b"ab")
    damaged = recrc(batch[:position] + b"\xff\xfe" + batch[position + 2 :])
    with pytest.raises(CorruptBatchError, match="utf-8"):
        decode_records(damaged)


def test_check_crc_false_skips_only_the_crc():
    batch = BATCHES["none"]
    damaged = flip(batch, batch.index(b"value-5"), 0x01)  # inside a value
    with pytest.raises(CorruptBatchError):
        decode_records(damaged)
    assert len(decode_records(damaged, check_crc=False)) == 8
