"""The sparse time index of one segment: max timestamp so far -> the batch that first reached it.

Theory of operation
-------------------
Whenever the segment adds an offset index entry, it also adds a time index entry if the
segment's running maximum timestamp grew since the last one. An entry is 12 bytes, big-endian::

    offset size field
         0    8 timestamp        i64  the running max of batch max_timestamp, ms
         8    4 relative_offset  u32  base offset (minus the segment base) of the first batch
                                      whose max_timestamp reached ``timestamp``

Both columns strictly increase. So every batch before an entry's offset has a max timestamp
below the entry's timestamp. To find the first batch with ``max_timestamp >= t``, take the last
entry with ``timestamp < t`` (every batch before its offset is too old), turn its offset into a
position with the offset index, and scan batch headers forward. Without such an entry the scan
starts at the beginning of the segment.

At every offset index entry, the last time index entry carries the running maximum up to and
including the batch that entry points at; recovery uses that to restore the segment's max
timestamp by scanning only the batches after the last offset index entry. A time entry belongs
to the first offset entry at or after its offset (the one that created it), so truncating a
segment keeps exactly the time entries at or below the last remaining offset entry: the same
entries a rebuild from the remaining batches makes. Like the offset index,
the file is not fsynced with the data and is rebuilt by recovery when it cannot be trusted,
and ``append`` only adds to memory: ``write_pending`` writes the entries the file lacks (``written``
counts those it holds) in one ``pwrite`` when the segment rolls, truncates or closes.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_left

from rivven_broker.storage.file_store import FileStore
from rivven_broker.storage.index_file import IndexFile

__all__ = ["TimeIndex", "ENTRY_BYTES", "encode_entries", "decode_entries"]

ENTRY_BYTES = 12
_ENTRY = struct.Struct(">qI")


def encode_entries(timestamps: array, relative_offsets: array) -> bytes:
    """The file bytes of the given entries. Pure."""
    assert len(timestamps) == len(relative_offsets)
    return b"".join(_ENTRY.pack(t, r) for t, r in zip(timestamps, relative_offsets))


def decode_entries(data: bytes) -> tuple[array, array] | str:
    """``(timestamps, relative_offsets)`` from file bytes, or a string saying what is wrong.

    Checks the size and that both columns strictly increase. Pure.
    """
    if len(data) % ENTRY_BYTES:
        return f"time index size {len(data)} is not a multiple of {ENTRY_BYTES}"
    timestamps, relative_offsets = array("q"), array("I")
    previous_timestamp = previous_offset = None
    for timestamp, relative_offset in _ENTRY.iter_unpack(data):
        if previous_timestamp is not None and (
            timestamp <= previous_timestamp or relative_offset <= previous_offset
        ):
            return "time index entries do not strictly increase"
        timestamps.append(timestamp)
        relative_offsets.append(relative_offset)
        previous_timestamp, previous_offset = timestamp, relative_offset
    return timestamps, relative_offsets


class TimeIndex(IndexFile):
    """The in-memory time index of a segment, mirrored to its ``.timeindex`` file
    (``index_file.py``: the file's side)."""

    ENTRY_BYTES = ENTRY_BYTES

    def __init__(self, store: FileStore, handle: int, path: str) -> None:
        super().__init__(store, handle, path)
        self.timestamps = array("q")
        self.relative_offsets = array("I")

    def __len__(self) -> int:
        return len(self.timestamps)

    def _columns(self) -> tuple[array, array]:
        return self.timestamps, self.relative_offsets

    _encode = staticmethod(encode_entries)

    def load(self, timestamps: array, relative_offsets: array) -> None:
        """Replace the in-memory entries (the file is assumed to hold them). Never blocks."""
        self.timestamps = array("q", timestamps)
        self.relative_offsets = array("I", relative_offsets)
        self.written = len(self.timestamps)

    def append(self, timestamp: int, relative_offset: int) -> None:
        """Add an entry at the end, in memory only (``write_pending`` writes it). Never blocks."""
        assert not self.timestamps or (
            timestamp > self.timestamps[-1] and relative_offset > self.relative_offsets[-1]
        )
        self.timestamps.append(timestamp)
        self.relative_offsets.append(relative_offset)

    def lookup(self, timestamp: int) -> int | None:
        """Relative offset of the last entry with a timestamp below ``timestamp``, or None."""
        i = bisect_left(self.timestamps, timestamp) - 1
        return self.relative_offsets[i] if i >= 0 else None

    def last(self) -> tuple[int, int] | None:
        """``(timestamp, relative_offset)`` of the last entry, or None."""
        if not self.timestamps:
            return None
        return self.timestamps[-1], self.relative_offsets[-1]

    def truncate_at_offset(self, relative_offset: int) -> None:
        """Drop every entry at ``relative_offset`` or beyond. Blocks on a truncate.

        Raises:
            OSError: the store failed.
        """
        self._keep(bisect_left(self.relative_offsets, relative_offset))
