"""A socket stream whose ``send_all`` writes at once when the kernel has room.

Theory of operation
-------------------
``trio.SocketStream.send_all`` is always a full checkpoint: after the ``send`` system call it
yields to the scheduler, even when the kernel took every byte. The broker's connection writer
sends one coalesced run of answers per wake-up and then waits for more work (which is its
checkpoint), so that extra pass through the scheduler is pure cost: one task switch per
answer run, a visible share of the broker's CPU when clients send one request at a time.

``EagerSendStream`` wraps a connected ``SocketStream``. ``send_all`` first tries one
non-blocking ``os.write`` on the socket: if the kernel takes everything, it returns without
yielding; otherwise the rest goes through the inner stream's ``send_all`` (which waits for
room as usual). Errors are translated as trio translates them (a closed socket is
``ClosedResourceError``, any other ``OSError`` ``BrokenResourceError``). Everything else
delegates to the inner stream.

So ``send_all`` here is not a checkpoint when it completes at once. Use it only where the
caller yields anyway between sends: the connection writer does (it waits for answers).
"""

from __future__ import annotations

import errno
import os

import trio

__all__ = ["EagerSendStream"]

_CLOSED = (errno.EBADF, errno.ENOTSOCK)


class EagerSendStream(trio.abc.HalfCloseableStream):
    """A ``SocketStream`` with an eager ``send_all``. See the module docstring."""

    def __init__(self, inner: trio.SocketStream) -> None:
        self.inner = inner
        self.socket = inner.socket
        self._sending = False

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

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()
