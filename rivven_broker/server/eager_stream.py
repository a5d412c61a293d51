"""A socket stream that sends and receives at once when the kernel can, skipping trio's layers.

Theory of operation
-------------------
``trio.SocketStream.send_all`` is always a full checkpoint: after the ``send`` system call it
yields to the scheduler, even when the kernel took every byte. The broker's connection writer
sends one coalesced run of answers per wake-up and then waits for more work (which is its
checkpoint), so that extra pass through the scheduler is pure cost: one task switch per
answer run, a visible share of the broker's CPU when clients send one request at a time.

``EagerStream`` wraps a connected ``SocketStream``. ``send_all`` first tries one
non-blocking ``os.write`` on the socket: if the kernel takes everything, it returns without
yielding; otherwise the rest goes through the inner stream's ``send_all`` (which waits for
room as usual).

``send_file`` sends a ``FileRegion`` (the record bytes of a fetch answer, in a segment file)
with ``os.sendfile``, the same way: at once when the kernel takes it all, else waiting for room.

``receive_some`` is the same idea on the other side. trio's goes through five layers per call
(a conflict detector, an error-translating context manager, the socket method wrapper, an
async ``_try_sync`` context that checkpoints before and after the system call, then the call)
and, when bytes are already there, yields to the scheduler anyway. Here it is one ``os.read``
on the socket's descriptor; when the kernel has nothing, one ``wait_readable`` (the real wait,
a checkpoint) and ``os.read`` again. A receive that finds bytes at once does not yield, except that
every ``_YIELD_EVERY``-th such receive in a row does (a cancel-shielded checkpoint), so a client
that floods one connection cannot keep the others from running.

Errors are translated as trio translates them (a closed socket is ``ClosedResourceError``,
any other ``OSError`` ``BrokenResourceError``); two concurrent senders, or receivers, get
``BusyResourceError``. Everything else delegates to the inner stream.

So ``send_all`` and ``receive_some`` here are not always checkpoints. Use the stream only
where the caller yields anyway: the connection's writer waits for answers between sends, and
its reader waits for bytes whenever a request has been handled and nothing more is buffered.
"""

from __future__ import annotations

import errno
import os

import trio

from rivven_broker.file_region import FileRegion

__all__ = ["EagerStream"]

_CLOSED = (errno.EBADF, errno.ENOTSOCK)
_DEFAULT_RECEIVE_BYTES = 64 * 1024
_YIELD_EVERY = 16  # receives in a row that found bytes at once, then one checkpoint


class EagerStream(trio.abc.HalfCloseableStream):
    """A ``SocketStream`` with an eager ``send_all`` and ``receive_some``. See the module
    docstring."""

    def __init__(self, inner: trio.SocketStream) -> None:
        self.inner = inner
        self.socket = inner.socket
        self._sending = False
        self._receiving = False
        self._eager_receives = 0  # receives in a row that did not yield

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Send every byte; returns at once (no checkpoint) when the kernel takes them all.

        Raises:
            trio.BusyResourceError: another task is sending on this stream.
            trio.ClosedResourceError: the stream was closed.
            trio.BrokenResourceError: the connection broke.
        """
        if self._sending:
            raise trio.BusyResourceError("another task is already sending on this stream")
        self._sending = True
        try:
            view = memoryview(data)
            try:
                sent = os.write(self.socket.fileno(), view) if len(view) else 0
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                if exc.errno in _CLOSED:
                    raise trio.ClosedResourceError("this socket was already closed") from None
                raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc
            if sent < len(view) or not len(view):
                await self.inner.send_all(view[sent:])
        finally:
            self._sending = False

    async def send_file(self, region: FileRegion) -> None:
        """Send a ``FileRegion``'s bytes with ``os.sendfile`` (the kernel moves them from the
        page cache; nothing is copied in the process), waiting for room as ``send_all`` does;
        like it, returns at once when the kernel takes every byte. Leaves ``region`` open.

        Raises:
            trio.BusyResourceError: another task is sending on this stream.
            trio.ClosedResourceError: the stream was closed.
            trio.BrokenResourceError: the connection broke, or the file ends before the region
                does (it was truncated since the read: the frame cannot be finished).
        """
        if self._sending:
            raise trio.BusyResourceError("another task is already sending on this stream")
        self._sending = True
        try:
            position, remaining = region.position, region.size
            while remaining:
                try:
                    sent = os.sendfile(self.socket.fileno(), region.fd, position, remaining)
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(self.socket)
                    continue
                except OSError as exc:
                    if exc.errno in _CLOSED and self.socket.fileno() < 0:
                        raise trio.ClosedResourceError("this socket was already closed") from None
                    raise trio.BrokenResourceError(f"sendfile failed: {exc}") from exc
                if sent == 0:
                    raise trio.BrokenResourceError(f"the file ends inside {region!r}")
                position += sent
                remaining -= sent
        finally:
            self._sending = False

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """Up to ``max_bytes`` bytes (b"" at end of stream); waits only when none are there.

        Raises:
            ValueError: ``max_bytes`` < 1.
            trio.BusyResourceError: another task is receiving on this stream.
            trio.ClosedResourceError: the stream was closed.
            trio.BrokenResourceError: the connection broke.
        """
        if max_bytes is None:
            max_bytes = _DEFAULT_RECEIVE_BYTES
        elif max_bytes < 1:
            raise ValueError("max_bytes must be >= 1")
        if self._receiving:
            raise trio.BusyResourceError("another task is already receiving on this stream")
        self._receiving = True
        try:
            waited = False
            while True:
                fd = self.socket.fileno()  # -1 once closed: EBADF, ClosedResourceError
                try:
                    data = os.read(fd, max_bytes)
                    break
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(fd)
                    waited = True
                except OSError as exc:
                    if exc.errno in _CLOSED:
                        raise trio.ClosedResourceError("this socket was already closed") from None
                    raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc
            if waited:
                self._eager_receives = 0
            else:
                self._eager_receives += 1
                if self._eager_receives >= _YIELD_EVERY:
                    self._eager_receives = 0
                    await trio.lowlevel.cancel_shielded_checkpoint()
            return data
        finally:
            self._receiving = False

    async def aclose(self) -> None:
        await self.inner.aclose()
