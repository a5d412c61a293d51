"""``RpcConnection``: the workload's thin client, one pipelined connection over ``SimNet``.

Theory of operation
-------------------
The simulator's clients must say exactly what they sent and what came back, so they are a
thin layer over the protocol's sans-I/O ``ClientConnection`` rather than the full client
(which retries and batches on its own and would blur the history). ``open_rpc`` dials,
starts a reader task and yields the connection; ``call`` encodes a request and sends it under
a lock (so correlation order equals byte order on the wire) and waits for its response.

Anything that breaks the connection (a reset, an end of stream, a protocol violation, or a
response later than the caller's timeout: the stream cannot skip a response) fails it for
good: the waiting and every later ``call`` raise ``ConnectionLost`` (``RequestTimeout`` for
the one that timed out). The process then reconnects with a fresh connection; it never
resends on its own.
"""

from __future__ import annotations

from collections import deque
from contextlib import asynccontextmanager
from typing import AsyncIterator

import trio

from rivven_broker.protocol.connection import ClientConnection
from rivven_broker.protocol.errors import ProtocolError
from rivven_broker.protocol.message_base import Request, Response
from sim.net import SimNet

__all__ = ["ConnectionLost", "RequestTimeout", "RpcConnection", "open_rpc"]


class ConnectionLost(Exception):
    """The connection failed; the outcome of requests in flight is unknown."""


class RequestTimeout(ConnectionLost):
    """No response within the caller's timeout; the connection was abandoned."""


class _Slot:
    __slots__ = ("done", "response")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.response: Response | None = None


class RpcConnection:
    """One client connection. Use through ``open_rpc``."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self._core = ClientConnection()
        self._waiting: deque[_Slot] = deque()
        self._send_lock = trio.Lock()
        self.failure: ConnectionLost | None = None

    @property
    def failed(self) -> bool:
        return self.failure is not None

    def _fail(self, failure: ConnectionLost) -> None:
        if self.failure is None:
            self.failure = failure
        while self._waiting:
            self._waiting.popleft().done.set()

    async def read_loop(self) -> None:
        """Pair responses with waiting calls until the connection fails. Never raises."""
        try:
            while self.failure is None:
                data = await self.stream.receive_some()
                if not data:
                    raise ConnectionLost("closed by the peer")
                self._core.receive_data(data)
                while (event := self._core.next_event()) is not None:
                    slot = self._waiting.popleft()
                    slot.response = event.response
                    slot.done.set()
        except ConnectionLost as exc:
            self._fail(exc)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ProtocolError) as exc:
            self._fail(ConnectionLost(f"{type(exc).__name__}: {exc}"))

    async def call(self, request: Request, timeout_s: float) -> Response | None:
        """Send ``request``; return its response (``None`` when it expects none). Blocks.

        Raises:
            ConnectionLost: the connection failed before the response came.
            RequestTimeout: no response within ``timeout_s``; the connection is now failed.
        """
        if self.failure is not None:
            raise self.failure
        slot: _Slot | None = None
        async with self._send_lock:
            if self.failure is not None:
                raise self.failure
            _, data = self._core.send_request(request)
            if request.expects_response():
                slot = _Slot()
                self._waiting.append(slot)
            try:
                await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self._fail(ConnectionLost(f"send failed: {type(exc).__name__}"))
                raise self.failure from None  # type: ignore[misc]
        if slot is None:
            return None
        with trio.move_on_after(timeout_s):
            await slot.done.wait()
        if not slot.done.is_set():
            self._fail(RequestTimeout(f"no response in {timeout_s:.3f}s"))
            raise RequestTimeout(f"no response in {timeout_s:.3f}s")
        if slot.response is None:
            assert self.failure is not None
            raise self.failure
        return slot.response


@asynccontextmanager
async def open_rpc(net: SimNet, host: str, port: int) -> AsyncIterator[RpcConnection]:
    """Dial ``host:port`` and yield a connection with its reader running; close on exit.

    Raises ``OSError`` when the dial fails. An error of the body leaves as itself, not
    wrapped in the reader's nursery's exception group (callers catch ``ConnectionLost``).
    """
    stream = await net.open_tcp_stream(host, port)
    connection = RpcConnection(stream)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(connection.read_loop)
            try:
                yield connection
            finally:
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as errors:
        if len(errors.exceptions) == 1:
            raise errors.exceptions[0] from None
        raise
    finally:
        await trio.aclose_forcefully(stream)
