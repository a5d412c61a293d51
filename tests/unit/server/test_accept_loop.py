"""The accept loop's spare descriptor: closed once, never a descriptor someone else now owns."""

from __future__ import annotations

import errno
import os

import trio

from rivven_broker.server.env import _accept_loop


class _FloodedListener(trio.abc.AsyncResource):
    """First accept: out of descriptors. Second (the refusal of the waiting connection): the
    freed descriptor number is taken by someone else, then the broker is stopped mid-accept."""

    def __init__(self, stolen: list[int], waiting: trio.Event) -> None:
        self._accepts = 0
        self._stolen = stolen
        self._waiting = waiting

    async def accept(self) -> trio.SocketStream:
        self._accepts += 1
        if self._accepts == 1:
            raise OSError(errno.EMFILE, "Too many open files")
        self._stolen.append(os.open(os.devnull, os.O_RDONLY))  # the lowest free number: the spare's
        self._waiting.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        pass


async def _never_called(stream: trio.SocketStream) -> None:
    raise AssertionError("no connection was accepted")


async def test_a_stop_while_refusing_does_not_close_a_descriptor_it_no_longer_owns() -> None:
    """Found by CI (the broker exited 1 with EBADF at shutdown after a descriptor flood): the
    spare was closed to refuse a connection, the broker stopped during that refusal, and the
    loop's cleanup closed the spare's number again, by then another file's."""
    stolen: list[int] = []
    waiting = trio.Event()
    failures: list[str] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            _accept_loop, _FloodedListener(stolen, waiting), _never_called, nursery, failures.append
        )
        await waiting.wait()
        nursery.cancel_scope.cancel()
    try:
        os.fstat(stolen[0])  # still open: the loop closed only what it owned
    finally:
        os.close(stolen[0])
    assert failures == ["EMFILE"]
