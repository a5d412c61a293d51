"""A run of bytes in a file, sent to a socket by the kernel without entering the process.

Theory of operation
-------------------
A fetch answer is mostly stored record batches, byte for byte as they lie in a segment file.
Reading them into a ``bytes`` object (``pread``), joining that into the answer's frame and
writing the frame to the socket copies every byte twice in user space before the kernel copies
it once more. A ``FileRegion`` instead names the bytes (a file, a position, a size); the
connection's writer hands it to ``os.sendfile``, which moves page-cache pages to the socket
with no user-space copy at all.

The storage layer makes regions (``FileStore.region``; stores without real files return the
bytes instead), the codec packs a region like any other large bin (by reference), and the
writer sends it in its place within the frame (``server/eager_stream.py``; any other stream
gets ``read()``'s bytes).

A region holds its own duplicate of the file descriptor: closing or deleting the segment
while an answer waits for its turn on the socket leaves the bytes readable. If the file
shrinks under the region (a truncation between the read and the send), ``read`` raises and
``os.sendfile`` comes up short; the frame can then only be abandoned, and the connection with
it. ``close`` releases the descriptor; a region never closed is released when collected.
"""

from __future__ import annotations

import errno
import os
import weakref

__all__ = ["FileRegion"]


class FileRegion:
    """``size`` bytes of an open file from ``position``; owns ``fd`` (see the module
    docstring). ``len(region)`` is ``size``."""

    __slots__ = ("fd", "position", "size", "_release", "__weakref__")

    def __init__(self, fd: int, position: int, size: int) -> None:
        assert fd >= 0 and position >= 0 and size >= 0
        self.fd = fd
        self.position = position
        self.size = size
        self._release = weakref.finalize(self, os.close, fd)

    @classmethod
    def of(cls, handle: int, position: int, size: int) -> FileRegion:
        """A region of the file open as ``handle`` (duplicated: the caller keeps ``handle``)."""
        return cls(os.dup(handle), position, size)

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"FileRegion(fd={self.fd}, position={self.position}, size={self.size})"

    @property
    def closed(self) -> bool:
        return not self._release.alive

    def read(self) -> bytes:
        """The bytes, read into memory (for a stream that cannot send a file). Blocks.

        Raises:
            OSError: the read failed, or the file no longer holds the whole region.
        """
        data = os.pread(self.fd, self.size, self.position)
        if len(data) != self.size:
            raise OSError(errno.EIO, f"the file ends inside {self!r}")
        return data

    def read_into(self, buffer: memoryview) -> None:
        """The bytes into ``buffer`` (``size`` long), as ``read`` does without a new object.
        Blocks.

        Raises:
            OSError: the read failed, or the file no longer holds the whole region.
        """
        assert len(buffer) == self.size
        if os.preadv(self.fd, [buffer], self.position) != self.size:
            raise OSError(errno.EIO, f"the file ends inside {self!r}")

    def close(self) -> None:
        """Release the descriptor. Idempotent."""
        self._release()
