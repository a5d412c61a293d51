"""The aborted-transaction index of one partition: which offset ranges ``read_committed`` skips.

Theory of operation
-------------------
When an ABORT marker lands in a partition, the aborted transaction's range in that partition,
from its first data batch to the marker, goes into this index (``producer_state.py`` computes
the entry; transactions that wrote no data here need none). A ``read_committed`` fetch of
``[start, end)`` asks ``aborted_in(start, end)`` for the ``(producer_id, first_offset)`` of
every aborted transaction overlapping it and sends them with the batches; the consumer drops
that producer's batches from ``first_offset`` up to its ABORT marker. One index per partition
(Rivven keeps one for the whole broker and forgets it on restart).

Entry, 36 bytes, big-endian::

    offset size field
         0    8 producer_id          i64
         8    8 first_offset         i64  the transaction's first batch in this partition
        16    8 last_offset          i64  the ABORT marker's offset
        24    8 last_stable_offset   i64  min(first offset of the transactions still open,
                                          last_offset + 1) right after the abort
        32    4 crc                  u32  CRC32C of bytes [0, 32) of the entry

File ``aborted-txns.index`` in the partition directory: an 8-byte header (``b"RVTX"``, u16
version 1, u16 entry size 36) followed by entries in marker order, so ``last_offset`` strictly
increases. Every later entry has ``first_offset >=`` an earlier entry's
``last_stable_offset`` (a transaction still open at an abort was counted in that entry's
stable offset; one begun later starts past its marker), which lets a lookup stop early.

Durability. Entries are appended with the marker (page cache) and fsynced by the driver
before it writes the producer-state snapshot that covers them. Recovery: open the file
(a torn or damaged tail is cut and reported in ``TxnIndexFile.repair``), ``truncate_to`` the
snapshot's end offset, then replay the log from there through the producer state, appending
what it reports. When ``repair`` is set, or there is no snapshot, rebuild from scratch:
``truncate_to(0)`` and replay the whole log. The index is derived data: the log wins.

``AbortedTxnIndex`` is the pure in-memory index with its byte encoding; ``TxnIndexFile`` keeps
one mirrored to a file through a ``FileStore``.
"""

from __future__ import annotations

import posixpath
import struct
from bisect import bisect_left
from typing import NamedTuple

import crc32c as _crc32c

from rivven_broker.storage.file_store import FileStore

__all__ = [
    "TXN_INDEX_FILE",
    "ENTRY_BYTES",
    "FILE_HEADER_BYTES",
    "AbortedTxn",
    "AbortedTxnIndex",
    "TxnIndexFile",
    "encode_entry",
    "decode_index",
]

TXN_INDEX_FILE = "aborted-txns.index"
_MAGIC = b"RVTX"
_VERSION = 1
_FILE_HEADER = struct.Struct(">4sHH")
_BODY = struct.Struct(">qqqq")
_CRC = struct.Struct(">I")
ENTRY_BYTES = _BODY.size + _CRC.size
FILE_HEADER_BYTES = _FILE_HEADER.size
_TMP_SUFFIX = ".tmp"

assert ENTRY_BYTES == 36 and FILE_HEADER_BYTES == 8


class AbortedTxn(NamedTuple):
    """One aborted transaction's range in a partition."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def encode_entry(entry: AbortedTxn) -> bytes:
    """The 36 bytes of one entry. Pure."""
    body = _BODY.pack(*entry)
    return body + _CRC.pack(_crc32c.crc32c(body))


def _entry_problem(entry: AbortedTxn, previous_last_offset: int) -> str | None:
    producer_id, first, last, stable = entry
    if producer_id < 0 or first < 0:
        return "negative producer id or offset"
    if not first <= last or not 0 <= stable <= last + 1:
        return f"offsets out of order ({first}, {last}, {stable})"
    if last <= previous_last_offset:
        return f"last offset {last} does not increase"
    return None


def decode_index(data: bytes) -> tuple[list[AbortedTxn], int, str | None]:
    """``(entries, valid_bytes, problem)`` of a file's bytes. Stops at the first entry that is
    short, fails its CRC or breaks the ordering; ``problem`` says what (None: all good). An
    empty file is valid; a bad header gives no entries and ``valid_bytes`` 0. Pure."""
    if not data:
        return [], 0, None
    if len(data) < FILE_HEADER_BYTES:
        return [], 0, "short header"
    magic, version, entry_bytes = _FILE_HEADER.unpack_from(data)
    if magic != _MAGIC or version != _VERSION or entry_bytes != ENTRY_BYTES:
        return [], 0, f"bad header {bytes(data[:FILE_HEADER_BYTES])!r}"
    entries: list[AbortedTxn] = []
    position, previous = FILE_HEADER_BYTES, -1
    while position < len(data):
        if position + ENTRY_BYTES > len(data):
            return entries, position, f"torn entry at byte {position}"
        body = data[position : position + _BODY.size]
        (crc,) = _CRC.unpack_from(data, position + _BODY.size)
        if _crc32c.crc32c(body) != crc:
            return entries, position, f"CRC mismatch at byte {position}"
        entry = AbortedTxn(*_BODY.unpack(body))
        problem = _entry_problem(entry, previous)
        if problem is not None:
            return entries, position, f"{problem} at byte {position}"
        entries.append(entry)
        previous = entry.last_offset
        position += ENTRY_BYTES
    return entries, position, None


class AbortedTxnIndex:
    """The aborted transactions of one partition, in marker order. Pure, in memory."""

    def __init__(self, entries: list[AbortedTxn] | None = None) -> None:
        self._entries: list[AbortedTxn] = []
        self._last_offsets: list[int] = []
        for entry in entries or ():
            self.append(entry)

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[AbortedTxn]:
        """Every entry, oldest first."""
        return list(self._entries)

    def append(self, entry: AbortedTxn) -> None:
        """Add the entry of an abort marker just appended. Never blocks."""
        previous = self._last_offsets[-1] if self._last_offsets else -1
        problem = _entry_problem(entry, previous)
        assert problem is None, problem
        self._entries.append(entry)
        self._last_offsets.append(entry.last_offset)

    def aborted_in(self, start_offset: int, end_offset: int) -> list[tuple[int, int]]:
        """``(producer_id, first_offset)`` of every aborted transaction overlapping
        ``[start_offset, end_offset)``, oldest marker first. Never blocks."""
        result: list[tuple[int, int]] = []
        if end_offset <= start_offset:
            return result
        for index in range(bisect_left(self._last_offsets, start_offset), len(self._entries)):
            entry = self._entries[index]
            if entry.first_offset < end_offset:
                result.append((entry.producer_id, entry.first_offset))
            if entry.last_stable_offset >= end_offset:
                break  # every later entry starts at or past end_offset
        return result

    def truncate_to(self, offset: int) -> int:
        """Drop entries whose marker is at or past ``offset`` (the log now ends there);
        return how many. Never blocks."""
        keep = bisect_left(self._last_offsets, offset)
        dropped = len(self._entries) - keep
        del self._entries[keep:], self._last_offsets[keep:]
        return dropped

    def truncate_head(self, log_start_offset: int) -> int:
        """Drop entries wholly below ``log_start_offset``; return how many. Never blocks."""
        cut = bisect_left(self._last_offsets, log_start_offset)
        del self._entries[:cut], self._last_offsets[:cut]
        return cut

    def encode(self) -> bytes:
        """The whole file's bytes. Pure."""
        header = _FILE_HEADER.pack(_MAGIC, _VERSION, ENTRY_BYTES)
        return header + b"".join(encode_entry(entry) for entry in self._entries)

    def check_invariants(self) -> None:
        """Assert the ordering rules of the module docstring."""
        assert self._last_offsets == [e.last_offset for e in self._entries]
        previous = -1
        for i, entry in enumerate(self._entries):
            problem = _entry_problem(entry, previous)
            assert problem is None, problem
            later = self._entries[i + 1 :]
            assert all(e.first_offset >= entry.last_stable_offset for e in later), entry
            previous = entry.last_offset


class TxnIndexFile:
    """An ``AbortedTxnIndex`` mirrored to ``path`` through ``store``.

    Opening never raises for damaged content: it keeps the valid prefix, cuts the rest from
    the file and says what it cut in ``repair`` (then rebuild, see the module docstring).
    ``OSError`` from the store propagates from every method.
    """

    def __init__(self, store: FileStore, path: str) -> None:
        self.store = store
        self.path = path
        self.handle = store.open(path)
        data = store.pread(self.handle, store.size(self.handle), 0)
        entries, valid_bytes, self.repair = decode_index(data)
        self.index = AbortedTxnIndex(entries)
        if valid_bytes < FILE_HEADER_BYTES:
            self._rewrite()
        elif valid_bytes < len(data):
            store.truncate(self.handle, valid_bytes)

    def _end(self) -> int:
        return FILE_HEADER_BYTES + ENTRY_BYTES * len(self.index)

    def append(self, entry: AbortedTxn) -> None:
        """Add an entry (to the page cache; ``fsync`` makes it durable). Never blocks long."""
        self.index.append(entry)
        self.store.pwrite(self.handle, encode_entry(entry), self._end() - ENTRY_BYTES)

    def truncate_to(self, offset: int) -> int:
        """Drop entries whose marker is at or past ``offset``, in memory and on file."""
        dropped = self.index.truncate_to(offset)
        if dropped:
            self.store.truncate(self.handle, self._end())
        return dropped

    def truncate_head(self, log_start_offset: int) -> int:
        """Drop entries below ``log_start_offset``; the file is replaced atomically."""
        dropped = self.index.truncate_head(log_start_offset)
        if dropped:
            self._rewrite()
        return dropped

    def _rewrite(self) -> None:
        tmp = self.path + _TMP_SUFFIX
        handle = self.store.open(tmp)
        self.store.truncate(handle, 0)
        self.store.pwrite(handle, self.index.encode(), 0)
        self.store.fsync(handle)
        self.store.close(handle)
        self.store.close(self.handle)
        self.store.rename(tmp, self.path)
        self.store.fsync_dir(posixpath.dirname(self.path))
        self.handle = self.store.open(self.path)

    def fsync(self) -> None:
        """Make every appended entry durable. Blocks on the disk (call it off the event loop)."""
        self.store.fsync(self.handle)

    def close(self) -> None:
        """Release the file handle."""
        self.store.close(self.handle)
