"""Kafka's murmur2 hash, so a key lands in the partition Kafka's Java client would pick.

Theory of operation
-------------------
Kafka's default partitioner hashes a record key with its variant of MurmurHash2 (seed
``0x9747b28c``, multiplier ``0x5bd1e995``, shift 24) and takes
``(hash & 0x7fffffff) % num_partitions``. Java computes in signed 32-bit arithmetic; here every
step is masked to 32 bits and the result is converted back to a signed value at the end, so
``murmur2`` returns exactly what Java's ``Utils.murmur2`` returns. Words are read four bytes at a
time, little-endian, with one ``struct.unpack`` for the whole key.

Pure: no I/O, no state.
"""

from __future__ import annotations

import struct

__all__ = ["murmur2", "partition_for_key"]

_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24
_MASK = 0xFFFFFFFF


def murmur2(data: bytes | bytearray | memoryview) -> int:
    """Kafka's murmur2 of ``data``: a signed 32-bit int, equal to Java's ``Utils.murmur2``.

    Never blocks; raises nothing for any bytes-like input.
    """
    length = len(data)
    tail = length & 3
    body = length - tail
    h = _SEED ^ length
    if body:
        for k in struct.unpack(f"<{body >> 2}I", data[:body]):
            k = (k * _M) & _MASK
            k ^= k >> _R
            h = ((h * _M) & _MASK) ^ ((k * _M) & _MASK)
    if tail:
        if tail == 3:
            h ^= data[body + 2] << 16
        if tail >= 2:
            h ^= data[body + 1] << 8
        h = ((h ^ data[body]) * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - 0x1_0000_0000 if h & 0x8000_0000 else h


def partition_for_key(key: bytes | bytearray | memoryview, num_partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key``: in ``[0, num_partitions)``.

    Never blocks. ``num_partitions`` must be positive (asserted).
    """
    assert num_partitions > 0
    if num_partitions == 1:  # (every hash lands there: the hash is skipped)
        return 0
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions
