"""gzip, snappy and lz4 for record-batch sections, through one library (cramjam).

Theory of operation
-------------------
A batch's records section may be compressed; the codec is in the low three bits of the
batch's attributes, with Kafka's ids: 1 gzip, 2 snappy, 3 lz4 (and 4 zstd, kept on
``zstandard`` in ``builder.py`` and ``reader.py``: its tuned, measured path). This module
compresses and decompresses the other three with cramjam, a single well-kept binding of the
Rust implementations, instead of one library per codec.

Decompression is bounded before any large buffer is made, so a small section can never claim
more memory than a batch may hold (``limit``): each format states the uncompressed size up
front or at the end, and the output buffer is exactly that size, checked against ``limit``
first — gzip's ISIZE trailer (one member, as ``compress`` writes), snappy's raw-format length
varint, and for lz4 the block format with its 4-byte size prefix (Kafka itself uses the lz4
frame format; our protocol is our own). A stated size that lies makes the decompression fail.

Pure: no I/O. Raises ``CodecError`` (a ``ValueError``) for a malformed or oversized section.
"""

from __future__ import annotations

import struct

import cramjam

__all__ = ["CodecError", "GZIP", "SNAPPY", "LZ4", "CODES", "compress", "decompress"]

GZIP = 1
SNAPPY = 2
LZ4 = 3
#: Names of the codecs this module handles, by id.
CODES = {GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4"}
_GZIP_LEVEL = 6
_U32 = struct.Struct("<I")


class CodecError(ValueError):
    """A compressed section that cannot be (or may not be) decompressed."""


def compress(code: int, data: bytes) -> bytes:
    """``data`` compressed with codec ``code`` (1, 2 or 3). Never blocks on I/O."""
    if code == GZIP:
        return bytes(cramjam.gzip.compress(data, level=_GZIP_LEVEL))
    if code == SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if code == LZ4:
        return bytes(cramjam.lz4.compress_block(data, store_size=True))
    raise AssertionError(f"no codec {code}")


def decompress(code: int, data: bytes | memoryview, limit: int) -> bytes:
    """The section ``data`` decompressed, at most ``limit`` bytes.

    Raises:
        CodecError: malformed, or stating more than ``limit`` bytes.
    """
    try:
        if code == GZIP:
            if len(data) < 18:
                raise CodecError("a gzip section shorter than its header and trailer")
            size = _U32.unpack_from(data, len(data) - 4)[0]
            _check(size, limit, "gzip")
            out = bytearray(size)
            written = cramjam.gzip.decompress_into(bytes(data), out)
        elif code == SNAPPY:
            size = cramjam.snappy.decompress_raw_len(bytes(data))
            _check(size, limit, "snappy")
            out = bytearray(size)
            written = cramjam.snappy.decompress_raw_into(bytes(data), out)
        elif code == LZ4:
            if len(data) < 4:
                raise CodecError("an lz4 section shorter than its size prefix")
            size = _U32.unpack_from(data, 0)[0]
            _check(size, limit, "lz4")
            out = bytearray(size)
            written = cramjam.lz4.decompress_block_into(bytes(data), out)
        else:
            raise CodecError(f"unsupported compression {code}")
    except cramjam.DecompressionError as error:
        raise CodecError(f"{CODES.get(code, code)} section: {error}") from None
    if written != size:
        raise CodecError(f"{CODES[code]} section states {size} bytes, holds {written}")
    return bytes(out)


def _check(size: int, limit: int, name: str) -> None:
    if size > limit:
        raise CodecError(f"{name} section claims {size} bytes, more than {limit}")
