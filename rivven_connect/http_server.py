"""The runtime's HTTP server: h11 on trio, serving ``http_api.respond``.

Theory of operation
-------------------
``serve_http(host, port, answer, task_status=...)`` listens on ``host:port`` (port 0: any;
``task_status.started`` gets the bound port) and serves each connection in its own task with
``serve_http_connection``: bytes go into an ``h11.Connection``, each complete request is
answered by ``answer(method, target)`` (a plain function that never blocks) and the connection
is kept alive while the client wants. The server holds no state beyond the connection count.

Bounds (one place, below): at most ``http_connections_max`` connections at once (one more is
closed at accept); a request head of at most ``request_head_bytes_max`` (h11 enforces it) and
a body of at most ``request_body_bytes_max`` (read and discarded: no route takes one; more is
413); a connection silent for ``idle_timeout_ms`` is closed, and so is one whose request is
not complete ``request_timeout_ms`` after its first byte (a trickled request cannot hold a
slot). HTTP/1.0 and 1.1 only (505 otherwise); a malformed request gets h11's 4xx hint.
"""

from __future__ import annotations

import math
from typing import Callable

import h11
import trio

from rivven_connect.http_api import Response

__all__ = ["http_connections_max", "idle_timeout_ms", "request_body_bytes_max",
           "request_head_bytes_max", "request_timeout_ms", "serve_http",
           "serve_http_connection"]

http_connections_max = 32
request_head_bytes_max = 16 * 1024
request_body_bytes_max = 16 * 1024
idle_timeout_ms = 30_000
request_timeout_ms = 10_000
_RECEIVE_BYTES = 16 * 1024
_SERVER = b"rivven-connect"

#: ``(method, target) -> (status, content type, body)``; must not block.
Answer = Callable[[str, str], Response]


async def serve_http(host: str, port: int, answer: Answer, *,
                     task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve until cancelled. Raises ``OSError`` if the address cannot be bound."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    connections = 0

    async def handler(stream: trio.SocketStream) -> None:
        nonlocal connections
        if connections >= http_connections_max:
            await trio.aclose_forcefully(stream)
            return
        connections += 1
        try:
            await serve_http_connection(stream, answer)
        finally:
            connections -= 1

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handler, listeners)
        task_status.started(bound)


async def _send(stream: trio.abc.Stream, connection: h11.Connection, *events: h11.Event) -> None:
    await stream.send_all(b"".join(connection.send(event) or b"" for event in events))


async def _respond(stream: trio.abc.Stream, connection: h11.Connection, response: Response,
                   *, head_only: bool = False) -> None:
    status, content_type, body = response
    headers = [(b"content-type", content_type.encode()),
               (b"content-length", str(len(body)).encode()),
               (b"cache-control", b"no-store"), (b"server", _SERVER),
               (b"x-content-type-options", b"nosniff")]
    events: list[h11.Event] = [h11.Response(status_code=status, headers=headers)]
    if not head_only:
        events.append(h11.Data(data=body))
    await _send(stream, connection, *events, h11.EndOfMessage())


class _Reader:
    """h11 events off one connection, with the idle and per-request deadlines."""

    def __init__(self, stream: trio.abc.Stream, connection: h11.Connection) -> None:
        self.stream, self.connection = stream, connection
        self.request_deadline = math.inf

    async def next_event(self) -> h11.Event | type[h11.PAUSED] | None:
        """The next event; None on a timeout."""
        connection = self.connection
        while True:
            event = connection.next_event()
            if event is not h11.NEED_DATA:
                return event
            deadline = min(trio.current_time() + idle_timeout_ms / 1000, self.request_deadline)
            with trio.move_on_at(deadline):
                data = await self.stream.receive_some(_RECEIVE_BYTES)
                if data and self.request_deadline == math.inf:
                    self.request_deadline = trio.current_time() + request_timeout_ms / 1000
                connection.receive_data(data)
                continue
            return None


def _plain(status: int, text: str) -> Response:
    return status, "text/plain; charset=utf-8", text.encode() + b"\n"


async def _answer_one(reader: _Reader, request: h11.Request, answer: Answer) -> bool:
    """Answer ``request``; False when the connection must close."""
    body_bytes = 0
    while True:  # drain the body: no route takes one
        event = await reader.next_event()
        if event is None or isinstance(event, h11.ConnectionClosed):
            return False
        if isinstance(event, h11.EndOfMessage):
            break
        if isinstance(event, h11.Data):
            body_bytes += len(event.data)
            if body_bytes > request_body_bytes_max:
                await _respond(reader.stream, reader.connection, _plain(413, "body too large"))
                return False
    reader.request_deadline = math.inf
    method = request.method.decode("ascii", "replace").upper()
    if request.http_version not in (b"1.0", b"1.1"):
        await _respond(reader.stream, reader.connection, _plain(505, "HTTP/1.0 and 1.1 only"))
        return False
    target = request.target.decode("ascii", "replace")
    await _respond(reader.stream, reader.connection, answer(method, target),
                   head_only=method == "HEAD")
    return True


async def serve_http_connection(stream: trio.abc.Stream, answer: Answer) -> None:
    """Serve requests on ``stream`` until the client closes, errs or times out. Closes
    ``stream``; never raises for client misbehaviour."""
    connection = h11.Connection(h11.SERVER, max_incomplete_event_size=request_head_bytes_max)
    reader = _Reader(stream, connection)
    try:
        while True:
            try:
                event = await reader.next_event()
                if not isinstance(event, h11.Request) or not await _answer_one(
                        reader, event, answer):
                    return
            except h11.RemoteProtocolError as error:
                if connection.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    await _respond(stream, connection,
                                   _plain(error.error_status_hint, "bad request"))
                return
            if h11.MUST_CLOSE in (connection.our_state, connection.their_state):
                return
            try:
                connection.start_next_cycle()
            except h11.LocalProtocolError:
                return
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await trio.aclose_forcefully(stream)
