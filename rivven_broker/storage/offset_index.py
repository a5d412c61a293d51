"""The sparse offset index of one segment: relative offset -> byte position in the ``.log``.

Theory of operation
-------------------
Every ``index_interval_bytes`` of appended batches, the segment records one entry pointing at
the start of a batch. An entry is 8 bytes, big-endian::

    offset size field
         0    4 relative_offset  u32  batch base offset minus the segment's base offset
         4    4 position         u32  byte position of that batch in the segment's .log

Entries are strictly increasing in both fields. There is no entry for position 0: a lookup that
finds no entry at or below its target starts at the beginning of the segment. To find the batch
holding offset ``o``, take the last entry with ``relative_offset <= o - base`` and scan batch
headers forward from its position (at most about one interval of bytes).

The whole index lives in memory as two ``array('I')`` columns (8 bytes per entry, about 2 MiB per
GiB of log at the default interval) and is mirrored to the ``.index`` file. ``append`` only adds
to memory; ``write_pending`` (``index_file.py``, shared with the time index) writes every
entry the file lacks in one ``pwrite`` (the segment calls it when it rolls, truncates or
closes, before the index is fsynced). ``written`` counts
the entries the file holds; lookups always use the in-memory entries, buffered ones included.
The file is not fsynced with the data: recovery rebuilds it from the log whenever it cannot be
trusted (see ``recovery.py``).
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left, bisect_right

from rivven_broker.storage.file_store import FileStore
from rivven_broker.storage.index_file import IndexFile

__all__ = ["OffsetIndex", "ENTRY_BYTES", "encode_entries", "decode_entries"]

ENTRY_BYTES = 8
U32_MAX = 0xFFFFFFFF


def encode_entries(relative_offsets: array, positions: array) -> bytes:
    """The file bytes of the given entries. Pure."""
    assert len(relative_offsets) == len(positions)
    interleaved = array("I", bytes(4 * 2 * len(positions)))
    interleaved[0::2] = relative_offsets
    interleaved[1::2] = positions
    if sys.byteorder == "little":
        interleaved.byteswap()
    return interleaved.tobytes()


def decode_entries(data: bytes) -> tuple[array, array] | str:
    """``(relative_offsets, positions)`` from file bytes, or a string saying what is wrong.

    Checks the size and that both columns strictly increase. Pure.
    """
    if len(data) % ENTRY_BYTES:
        return f"index size {len(data)} is not a multiple of {ENTRY_BYTES}"
    interleaved = array("I")
    assert interleaved.itemsize == 4
    interleaved.frombytes(data)
    if sys.byteorder == "little":
        interleaved.byteswap()
    relative_offsets, positions = interleaved[0::2], interleaved[1::2]
    for column, name in ((relative_offsets, "relative offsets"), (positions, "positions")):
        if any(a >= b for a, b in zip(column, column[1:])):
            return f"index {name} do not strictly increase"
    return relative_offsets, positions


class OffsetIndex(IndexFile):
    """The in-memory offset index of a segment, mirrored to its ``.index`` file
    (``index_file.py``: the file's side)."""

    ENTRY_BYTES = ENTRY_BYTES

    def __init__(self, store: FileStore, handle: int, path: str) -> None:
        super().__init__(store, handle, path)
        self.relative_offsets = array("I")
        self.positions = array("I")

    def __len__(self) -> int:
        return len(self.positions)

    def _columns(self) -> tuple[array, array]:
        return self.relative_offsets, self.positions

    _encode = staticmethod(encode_entries)

    def load(self, relative_offsets: array, positions: array) -> None:
        """Replace the in-memory entries (the file is assumed to hold them). Never blocks."""
        self.relative_offsets = array("I", relative_offsets)
        self.positions = array("I", positions)
        self.written = len(self.positions)

    def append(self, relative_offset: int, position: int) -> None:
        """Add an entry at the end, in memory only (``write_pending`` writes it). Never blocks."""
        assert 0 <= relative_offset <= U32_MAX and 0 < position <= U32_MAX
        assert not self.positions or (
            relative_offset > self.relative_offsets[-1] and position > self.positions[-1]
        )
        self.relative_offsets.append(relative_offset)
        self.positions.append(position)

    def lookup(self, relative_offset: int) -> int:
        """Position of the last entry at or below ``relative_offset`` (0 if none). Pure."""
        i = bisect_right(self.relative_offsets, relative_offset) - 1
        return self.positions[i] if i >= 0 else 0

    def last(self) -> tuple[int, int]:
        """``(relative_offset, position)`` of the last entry, ``(0, 0)`` if there is none."""
        if not self.positions:
            return 0, 0
        return self.relative_offsets[-1], self.positions[-1]

    def truncate_at_position(self, position: int) -> None:
        """Drop every entry pointing at ``position`` or beyond. Blocks on a truncate.

        Raises:
            OSError: the store failed.
        """
        self._keep(bisect_left(self.positions, position))
