"""``IndexFile``: a segment index held in memory as two columns and mirrored to its file.

Theory of operation
-------------------
The offset index (``offset_index.py``) and the time index (``time_index.py``) are the same
thing with different columns: two ``array`` columns that strictly increase together, in
memory for every lookup, and a file of fixed-width entries that mirrors them. What they
share lives here, once:

- ``written`` counts the entries the file holds, always a prefix of the in-memory ones:
  ``append`` (the subclass's) only adds to memory, and ``write_pending`` writes the entries
  the file lacks in one ``pwrite`` (the segment calls it when it rolls, truncates or closes,
  before the index is fsynced);
- ``_keep(count)`` drops every entry from ``count`` on, in memory and, where the file holds
  them, by truncating the file;
- ``rewrite`` replaces file and memory; ``to_bytes`` is what the file should hold.

A subclass names its columns (``_columns``), says how entries are encoded (``_encode``,
its module's ``encode_entries``) and how wide one is (``ENTRY_BYTES``), and keeps its own
lookups, which are what differ. The file is never fsynced with the data: recovery rebuilds
an index from the log whenever it cannot be trusted (``recovery.py``).
"""

from __future__ import annotations

from array import array
from typing import ClassVar

from rivven_broker.storage.file_store import FileStore

__all__ = ["IndexFile"]


class IndexFile:
    """Two in-memory columns mirrored to an index file. See the module docstring."""

    ENTRY_BYTES: ClassVar[int]

    def __init__(self, store: FileStore, handle: int, path: str) -> None:
        self.store = store
        self.handle = handle
        self.path = path
        self.written = 0  # entries the file holds: a prefix of the in-memory ones

    def _columns(self) -> tuple[array, array]:
        """The two columns, in file order."""
        raise NotImplementedError

    @staticmethod
    def _encode(first: array, second: array) -> bytes:
        """The file bytes of entries given as columns. Pure."""
        raise NotImplementedError

    def load(self, first: array, second: array) -> None:
        """Replace the in-memory entries (the file is assumed to hold them). Never blocks."""
        raise NotImplementedError

    def write_pending(self) -> None:
        """Write the entries the file lacks, in one write. Blocks on it (if there are any).

        Raises:
            OSError: the store failed (they stay pending).
        """
        first, second = self._columns()
        count = len(first)
        if self.written == count:
            return
        start = self.written
        self.store.pwrite(self.handle, self._encode(first[start:], second[start:]),
                          start * self.ENTRY_BYTES)
        self.written = count

    def _keep(self, count: int) -> None:
        """Drop every entry from the ``count``-th on. Blocks on a truncate of the file when it
        holds some of them.

        Raises:
            OSError: the store failed.
        """
        first, second = self._columns()
        if count == len(first):
            return
        if count < self.written:
            self.store.truncate(self.handle, count * self.ENTRY_BYTES)
            self.written = count
        del first[count:]
        del second[count:]

    def rewrite(self, first: array, second: array) -> None:
        """Replace file and memory with these entries. Blocks on file I/O.

        Raises:
            OSError: the store failed.
        """
        data = self._encode(first, second)
        self.store.truncate(self.handle, 0)
        if data:
            self.store.pwrite(self.handle, data, 0)
        self.load(first, second)

    def to_bytes(self) -> bytes:
        """What the file should hold once pending entries are written. Pure."""
        return self._encode(*self._columns())
