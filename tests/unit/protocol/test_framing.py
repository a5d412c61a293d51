"""Framing: the byte layout, incremental decoding under any split, and the size limit.

Method: exact bytes for a known frame; Hypothesis streams of many frames cut at arbitrary
points (and fed one byte at a time) must decode to the same frames; the size limit is checked
on the 4-byte prefix before any body byte is kept (a 2 GiB announcement leaves nothing
buffered), poisons the decoder and still delivers the frames before it. Large bodies received
straight into the decoder's buffer (``receive_buffer``/``received``), in any split and mixed
with ``feed``, must give the same frames too. Large and many-frame inputs are checked for
correctness only; no timing assertions.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rivven_broker.file_region import FileRegion
from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from rivven_broker.protocol.framing import (
    DIRECT_BODY_BYTES_MIN,
    FORMAT_MSGPACK,
    FORMAT_POSTCARD,
    FORMAT_PROTOBUF,
    Frame,
    FrameDecoder,
    describe_format,
    encode_frame,
    encode_frame_parts,
    encode_small_msgpack_frame,
)


def _drain(decoder: FrameDecoder) -> list[Frame]:
    frames = []
    while (frame := decoder.next_frame()) is not None:
        frames.append(frame)
    return frames


def test_frame_layout():
    data = encode_frame(FORMAT_MSGPACK, 0x01020304, b"abc")
    assert data == bytes.fromhex("00000008 02 01020304") + b"abc"
    assert encode_frame(7, 0xFFFFFFFF, b"") == bytes.fromhex("00000005 07 ffffffff")
    parts = [b"a", bytearray(b"b"), memoryview(b"cd")]
    assert encode_frame_parts(2, 1, parts) == encode_frame(2, 1, b"abcd")


@given(correlation_id=st.integers(0, 2**32 - 1), payload=st.binary(max_size=300))
def test_a_small_msgpack_frame_is_encode_frames(correlation_id: int, payload: bytes) -> None:
    assert encode_small_msgpack_frame(correlation_id, payload) == \
        encode_frame(FORMAT_MSGPACK, correlation_id, payload)


def test_encode_refuses_bad_headers_and_oversize():
    for format, correlation_id in ((256, 0), (-1, 0), (2, -1), (2, 2**32), (True, 0)):
        with pytest.raises(LocalProtocolError):
            encode_frame(format, correlation_id, b"")
    with pytest.raises(LocalProtocolError) as info:
        encode_frame(2, 0, b"x" * 96, frame_bytes_max=100)
    assert info.value.code == ErrorCode.MESSAGE_TOO_LARGE
    assert len(encode_frame(2, 0, b"x" * 95, frame_bytes_max=100)) == 104


def test_decode_one_frame_and_empty_payload():
    decoder = FrameDecoder()
    decoder.feed(encode_frame(2, 9, b"hello") + encode_frame(0, 10, b""))
    assert _drain(decoder) == [Frame(2, 9, b"hello"), Frame(0, 10, b"")]
    assert decoder.buffered_bytes == 0
    assert decoder.next_frame() is None


_FRAMES = st.lists(
    st.tuples(st.integers(0, 255), st.integers(0, 2**32 - 1), st.binary(max_size=40)),
    min_size=1,
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(frames=_FRAMES, cuts=st.lists(st.integers(0, 2000), max_size=40), drain_early=st.booleans())
def test_any_split_of_a_stream_gives_the_same_frames(frames, cuts, drain_early):
    stream = b"".join(encode_frame(f, c, p) for f, c, p in frames)
    points = sorted({0, len(stream), *(c % (len(stream) + 1) for c in cuts)})
    decoder = FrameDecoder()
    got: list[Frame] = []
    for start, end in zip(points, points[1:]):
        decoder.feed(stream[start:end])
        if drain_early:
            got.extend(_drain(decoder))
    got.extend(_drain(decoder))
    assert got == [Frame(*frame) for frame in frames]
    assert decoder.buffered_bytes == 0


def test_one_byte_at_a_time():
    frames = [Frame(2, i, bytes([i]) * i) for i in range(20)]
    stream = b"".join(encode_frame(*f) for f in frames)
    decoder = FrameDecoder()
    got = []
    fed = 0
    for byte in stream:
        decoder.feed(bytes([byte]))
        fed += 1
        got.extend(_drain(decoder))
        assert decoder.buffered_bytes == fed - sum(9 + len(f.payload) for f in got)
    assert got == frames


def test_buffered_bytes_counts_partial_and_ready_frames():
    decoder = FrameDecoder()
    frame = encode_frame(2, 1, b"x" * 100)
    decoder.feed(frame + frame[:50])
    assert decoder.buffered_bytes == len(frame) + 50
    assert decoder.next_frame() == Frame(2, 1, b"x" * 100)
    assert decoder.buffered_bytes == 50
    decoder.feed(frame[50:])
    assert decoder.next_frame() == Frame(2, 1, b"x" * 100)
    assert decoder.buffered_bytes == 0


def test_a_2_gib_prefix_is_refused_before_any_body_byte_is_kept():
    decoder = FrameDecoder()
    announcement = (2**31).to_bytes(4, "big")
    decoder.feed(announcement[:3])
    assert decoder.buffered_bytes == 3
    assert decoder.next_frame() is None
    decoder.feed(announcement[3:] + b"\x02\x00\x00\x00\x01" + b"B" * 65536)
    assert decoder.buffered_bytes == 0
    assert decoder.poisoned
    for _ in range(2):  # poisoned: raised again, further data ignored
        with pytest.raises(RemoteProtocolError) as info:
            decoder.next_frame()
        assert info.value.code == ErrorCode.MESSAGE_TOO_LARGE
        decoder.feed(encode_frame(2, 1, b"after"))
        assert decoder.buffered_bytes == 0


def test_the_limit_is_exact_and_configurable():
    decoder = FrameDecoder(frame_bytes_max=100)
    decoder.feed(encode_frame(2, 1, b"x" * 95))
    assert decoder.next_frame() == Frame(2, 1, b"x" * 95)
    decoder.feed((101).to_bytes(4, "big"))
    with pytest.raises(RemoteProtocolError) as info:
        decoder.next_frame()
    assert info.value.code == ErrorCode.MESSAGE_TOO_LARGE


def test_frames_before_a_bad_prefix_are_still_delivered():
    decoder = FrameDecoder(frame_bytes_max=1000)
    too_large = (5000).to_bytes(4, "big") + b"junk"
    decoder.feed(encode_frame(2, 1, b"a") + encode_frame(2, 2, b"b") + too_large)
    assert decoder.next_frame() == Frame(2, 1, b"a")
    assert decoder.next_frame() == Frame(2, 2, b"b")
    with pytest.raises(RemoteProtocolError):
        decoder.next_frame()


@pytest.mark.parametrize("length", [0, 1, 4])
def test_lengths_shorter_than_the_header_are_invalid(length):
    decoder = FrameDecoder()
    decoder.feed(length.to_bytes(4, "big") + b"\x02\x00\x00\x00\x01")
    with pytest.raises(RemoteProtocolError) as info:
        decoder.next_frame()
    assert info.value.code == ErrorCode.INVALID_REQUEST
    assert decoder.buffered_bytes == 0


def test_many_tiny_frames_in_one_feed():
    count = 20_000
    stream = b"".join(encode_frame(2, i, i.to_bytes(3, "big")) for i in range(count))
    decoder = FrameDecoder()
    decoder.feed(stream)
    frames = _drain(decoder)
    assert len(frames) == count
    assert frames[-1] == Frame(2, count - 1, (count - 1).to_bytes(3, "big"))


def test_a_large_frame_in_64_kib_pieces():
    payload = bytes(range(256)) * (8 * 4096)  # 8 MiB
    stream = encode_frame(2, 1, payload) + encode_frame(2, 2, b"next")
    decoder = FrameDecoder()
    for start in range(0, len(stream), 65536):
        decoder.feed(stream[start : start + 65536])
    assert decoder.next_frame() == Frame(2, 1, payload)
    assert decoder.next_frame() == Frame(2, 2, b"next")


def test_fed_buffers_may_be_reused_by_the_caller():
    decoder = FrameDecoder()
    frame = encode_frame(2, 1, b"x" * 40)
    buffer = bytearray(frame[:20])
    decoder.feed(buffer)
    buffer[:] = b"\xff" * 20  # the socket driver reuses its receive buffer
    decoder.feed(memoryview(frame)[20:])
    assert decoder.next_frame() == Frame(2, 1, b"x" * 40)


def _receive(decoder: FrameDecoder, data: bytes) -> None:
    """What a socket driver does with ``data``: into the body's buffer when offered, else feed."""
    pos = 0
    while pos < len(data):
        view = decoder.receive_buffer()
        if view is None:
            decoder.feed(data[pos:])
            return
        count = min(len(view), len(data) - pos)
        view[:count] = data[pos : pos + count]
        decoder.received(count)
        pos += count


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.sampled_from([0, 3, DIRECT_BODY_BYTES_MIN - 1, DIRECT_BODY_BYTES_MIN,
                                    DIRECT_BODY_BYTES_MIN + 9, 3 * DIRECT_BODY_BYTES_MIN]),
                   min_size=1, max_size=6),
    cuts=st.lists(st.integers(0, 4 * DIRECT_BODY_BYTES_MIN), max_size=30),
    use_buffer=st.lists(st.booleans(), min_size=1, max_size=30),
)
def test_large_bodies_received_into_the_buffer_give_the_same_frames(sizes, cuts, use_buffer):
    frames = [Frame(2, i, bytes([i + 1]) * size) for i, size in enumerate(sizes)]
    stream = b"".join(encode_frame(*frame) for frame in frames)
    points = sorted({0, len(stream), *(c % (len(stream) + 1) for c in cuts)})
    decoder = FrameDecoder()
    got: list[Frame] = []
    for index, (start, end) in enumerate(zip(points, points[1:])):
        if use_buffer[index % len(use_buffer)]:
            _receive(decoder, stream[start:end])
        else:
            decoder.feed(stream[start:end])
        got.extend(_drain(decoder))
        assert decoder.buffered_bytes == end - sum(9 + len(f.payload) for f in got)
    assert got == frames
    assert decoder.body_missing == 0 and decoder.receive_buffer() is None


def test_receive_buffer_is_offered_only_for_the_rest_of_a_large_body():
    payload = bytes(range(256)) * (DIRECT_BODY_BYTES_MIN // 64)  # 4 x the threshold
    frame = encode_frame(2, 7, payload)
    decoder = FrameDecoder()
    assert decoder.receive_buffer() is None and decoder.body_missing == 0
    decoder.feed(frame[:5])  # half a header: no body yet
    assert decoder.receive_buffer() is None and decoder.body_missing == 0
    decoder.feed(frame[5:100])
    assert decoder.body_missing == len(frame) - 100
    view = decoder.receive_buffer()
    assert view is not None and len(view) == len(frame) - 100  # the pieces fed were kept
    tail = len(frame) - DIRECT_BODY_BYTES_MIN + 1
    view[: tail - 100] = frame[100:tail]
    decoder.received(tail - 100)
    assert decoder.body_missing == DIRECT_BODY_BYTES_MIN - 1
    assert decoder.receive_buffer() is None  # too little left: feed it
    decoder.feed(frame[tail:])
    got = decoder.next_frame()
    assert got == Frame(2, 7, payload) and type(got.payload) is bytearray
    assert decoder.body_missing == 0 and decoder.buffered_bytes == 0


def test_no_receive_buffer_after_a_framing_error():
    decoder = FrameDecoder(frame_bytes_max=DIRECT_BODY_BYTES_MIN * 2)
    decoder.feed((DIRECT_BODY_BYTES_MIN * 3).to_bytes(4, "big"))
    assert decoder.poisoned and decoder.receive_buffer() is None and decoder.body_missing == 0


def test_format_descriptions_tell_known_from_unknown():
    assert "known but not implemented" in describe_format(FORMAT_POSTCARD)
    assert "protobuf" in describe_format(FORMAT_PROTOBUF)
    assert describe_format(FORMAT_MSGPACK) == "msgpack"
    assert describe_format(0x07) == "unknown format 0x07"


def test_the_default_limit_is_the_shared_one():
    decoder = FrameDecoder()
    decoder.feed((limits.frame_bytes_max + 1).to_bytes(4, "big"))
    with pytest.raises(RemoteProtocolError):
        decoder.next_frame()


def test_a_frame_with_a_file_region_comes_in_pieces_that_join_to_the_same_bytes(tmp_path):
    path = tmp_path / "segment"
    path.write_bytes(b"0123456789" * 1000)
    handle = os.open(path, os.O_RDONLY)
    first, second = FileRegion.of(handle, 10, 5000), FileRegion.of(handle, 0, 3)
    os.close(handle)
    parts = [b"ab", first, b"cd", memoryview(b"ef"), second]
    pieces = encode_frame_parts(FORMAT_MSGPACK, 7, parts)
    assert [type(p) for p in pieces] == [bytes, FileRegion, bytes, FileRegion]
    assert pieces[1] is first and pieces[3] is second
    as_bytes = [b"ab", first.read(), b"cd", b"ef", second.read()]
    assert b"".join(p.read() if type(p) is FileRegion else p for p in pieces) == \
        encode_frame_parts(FORMAT_MSGPACK, 7, as_bytes)
    with pytest.raises(LocalProtocolError):  # a region counts towards the frame limit
        encode_frame_parts(FORMAT_MSGPACK, 7, parts, frame_bytes_max=5000)
    first.close()
    second.close()


def test_large_pieces_are_kept_by_reference_when_asked():
    records = bytes(range(256)) * 256  # 64 KiB: at the threshold
    small = b"x" * 100
    parts = [b"head", records, b"mid", memoryview(small), memoryview(records)[1:], b"tail"]
    plain = encode_frame_parts(FORMAT_MSGPACK, 9, parts)
    assert type(plain) is bytes  # without the option every piece is joined, as before
    pieces = encode_frame_parts(FORMAT_MSGPACK, 9, parts, reference_bytes_min=len(records))
    assert [type(p) for p in pieces] == [bytes, memoryview, bytes]  # 64 KiB - 1 is joined
    assert pieces[1].obj is records  # the record bytes themselves: not copied
    assert b"".join(pieces) == plain
    kept = encode_frame_parts(FORMAT_MSGPACK, 9, [small], reference_bytes_min=64)
    assert [type(p) for p in kept] == [bytes, memoryview]  # the header, then the piece
    assert b"".join(kept) == encode_frame_parts(FORMAT_MSGPACK, 9, [small])
    with pytest.raises(LocalProtocolError):  # a kept piece counts towards the frame limit
        encode_frame_parts(FORMAT_MSGPACK, 9, parts, frame_bytes_max=len(records),
                           reference_bytes_min=len(records))
