"""The broker's HTTP side: ``/livez``, ``/readyz`` (and ``/health``), ``/metrics`` and a small
dashboard, with h11 on trio.

Theory of operation
-------------------
HTTP parsing is h11's job (a sans-I/O state machine, like our own protocol core); this module
is the thin trio driver around it. ``serve_http_connection`` reads bytes into an
``h11.Connection``, answers each complete request from a table of routes, and keeps the
connection alive while the client wants it. Every route is a plain function returning
``(status, content_type, body)`` and never blocks; the routes are built by the broker
(``HttpRoutes``), which knows its state, its metrics registry and its logs.

Bounds: a request head may be at most ``_HEAD_BYTES_MAX`` (h11 enforces it), a request body is
read and discarded up to ``_BODY_BYTES_MAX`` (the routes take none), a connection that sends
nothing for ``idle_timeout_ms`` is closed, and so is one whose request (head and body) is not
complete ``request_timeout_ms`` after its first byte. Only GET and HEAD of HTTP/1.0 and 1.1
are served; another version gets 505 (and the connection closes), another method 405, an
unknown path 404 (the path is not echoed), a malformed request 400. Every answer carries
``X-Content-Type-Options: nosniff``.
"""

from __future__ import annotations

import html
import json
import logging
import math
from typing import Callable, Mapping

import h11
import trio

from rivven_broker.protocol import limits

__all__ = ["Route", "serve_http_connection", "json_body", "render_dashboard"]

log = logging.getLogger(__name__)

#: ``() -> (status, content type, body)``; must not block.
Route = Callable[[], tuple[int, str, bytes]]

_HEAD_BYTES_MAX = 16 * 1024
_BODY_BYTES_MAX = 64 * 1024
_RECEIVE_BYTES = 16 * 1024
_SERVER = b"rivven-broker"
_HTTP_VERSIONS = (b"1.0", b"1.1")


def json_body(document: object) -> bytes:
    """``document`` as compact UTF-8 JSON with a trailing newline."""
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode() + b"\n"


async def _send(stream: trio.abc.Stream, connection: h11.Connection, *events: h11.Event) -> None:
    data = b"".join(connection.send(event) or b"" for event in events)
    await stream.send_all(data)


async def _respond(
    stream: trio.abc.Stream,
    connection: h11.Connection,
    status: int,
    content_type: str,
    body: bytes,
    *,
    head_only: bool = False,
) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
        (b"server", _SERVER),
        (b"x-content-type-options", b"nosniff"),
    ]
    response = h11.Response(status_code=status, headers=headers)
    if head_only:
        await _send(stream, connection, response, h11.EndOfMessage())
    else:
        await _send(stream, connection, response, h11.Data(data=body), h11.EndOfMessage())


class _Reader:
    """Reads h11 events off one connection, bounding two waits: ``idle_timeout_ms`` for a
    silent connection, and ``request_timeout_ms`` from a request's first byte to its end
    (head and body), so a request trickled a byte at a time cannot hold the connection."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        connection: h11.Connection,
        idle_timeout_ms: int,
        request_timeout_ms: int,
    ) -> None:
        self.stream = stream
        self.connection = connection
        self.idle_s = idle_timeout_ms / 1000
        self.request_s = request_timeout_ms / 1000
        self.request_deadline = math.inf  # set by the first byte of a request
        self.timed_out = False

    async def next_event(self) -> h11.Event | type[h11.PAUSED] | None:
        """The next h11 event, reading as needed; ``None`` on a timeout or a closed socket."""
        connection = self.connection
        while True:
            event = connection.next_event()
            if event is not h11.NEED_DATA:
                return event
            if self.request_deadline == math.inf and connection.trailing_data[0]:
                self.request_deadline = trio.current_time() + self.request_s
            deadline = min(trio.current_time() + self.idle_s, self.request_deadline)
            with trio.move_on_at(deadline):
                data = await self.stream.receive_some(_RECEIVE_BYTES)
                if data and self.request_deadline == math.inf:
                    self.request_deadline = trio.current_time() + self.request_s
                connection.receive_data(data)
                continue
            self.timed_out = deadline == self.request_deadline
            return None

    def request_done(self) -> None:
        self.request_deadline = math.inf


def _plain(text: str) -> bytes:
    return text.encode() + b"\n"


async def _handle_one(
    reader: _Reader, request: h11.Request, routes: Mapping[str, Route]
) -> bool:
    """Answer ``request``; return False when the connection must close."""
    stream, connection = reader.stream, reader.connection
    body_bytes = 0
    while True:  # drain the request body (the routes take none)
        event = await reader.next_event()
        if event is None or isinstance(event, h11.ConnectionClosed):
            return False
        if isinstance(event, h11.EndOfMessage):
            break
        if isinstance(event, h11.Data):
            body_bytes += len(event.data)
            if body_bytes > _BODY_BYTES_MAX:
                await _respond(stream, connection, 413, "text/plain", _plain("body too large"))
                return False
    reader.request_done()
    method = request.method.decode("ascii", "replace").upper()
    path = request.target.decode("ascii", "replace").split("?", 1)[0]
    route = routes.get(path)
    if request.http_version not in _HTTP_VERSIONS:
        status, content_type, body = 505, "text/plain", _plain("only HTTP/1.0 and HTTP/1.1")
    elif method not in ("GET", "HEAD"):
        status, content_type, body = 405, "text/plain", _plain("only GET and HEAD")
    elif route is None:
        status, content_type, body = 404, "text/plain", _plain("no such page")
    else:
        status, content_type, body = route()
    await _respond(stream, connection, status, content_type, body, head_only=method == "HEAD")
    return status != 505


async def serve_http_connection(
    stream: trio.abc.Stream,
    routes: Mapping[str, Route],
    *,
    idle_timeout_ms: int,
    request_timeout_ms: int = limits.request_timeout_ms_default,
    on_request_timeout: Callable[[], None] | None = None,
) -> None:
    """Serve HTTP/1.1 requests on ``stream`` until the client closes, errs or times out.

    Blocks for the life of the connection; closes ``stream`` before returning. Never raises
    for client misbehaviour or a broken connection (those close the connection). Calls
    ``on_request_timeout`` (before closing) when a request was not complete within
    ``request_timeout_ms`` of its first byte.
    """
    connection = h11.Connection(h11.SERVER, max_incomplete_event_size=_HEAD_BYTES_MAX)
    reader = _Reader(stream, connection, idle_timeout_ms, request_timeout_ms)
    try:
        while True:
            try:
                event = await reader.next_event()
                if not isinstance(event, h11.Request) or not await _handle_one(
                    reader, event, routes
                ):
                    if reader.timed_out and on_request_timeout is not None:
                        on_request_timeout()
                    return
            except h11.RemoteProtocolError as exc:
                if connection.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    status = exc.error_status_hint
                    await _respond(stream, connection, status, "text/plain", _plain(str(exc)))
                return
            if connection.our_state is h11.MUST_CLOSE or connection.their_state is h11.MUST_CLOSE:
                return
            try:
                connection.start_next_cycle()
            except h11.LocalProtocolError:
                return
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await trio.aclose_forcefully(stream)


def render_dashboard(
    *,
    node_id: int,
    state: str,
    connections: int,
    topics: list[tuple[str, list[tuple[int, int, int, int, int]]]],
    settings: Mapping[str, object],
) -> bytes:
    """A tiny self-contained HTML page: broker state, then one table row per partition.

    ``topics`` is ``[(name, [(partition, log_start, high_watermark, log_end, size_bytes)])]``.
    """
    esc = html.escape
    rows = []
    for name, partitions in topics:
        for partition, start, high_watermark, end, size_bytes in partitions:
            rows.append(
                f"<tr><td>{esc(name)}</td><td>{partition}</td><td>{start}</td>"
                f"<td>{high_watermark}</td><td>{end}</td><td>{size_bytes}</td></tr>"
            )
    settings_rows = "".join(
        f"<tr><td>{esc(str(key))}</td><td>{esc(str(value))}</td></tr>"
        for key, value in settings.items()
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Rivven broker {node_id}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}td:first-child{{text-align:left}}
</style></head><body>
<h1>Rivven broker {node_id}</h1>
<p>State: <b>{esc(state)}</b> &middot; connections: {connections} &middot; topics: {len(topics)}
&middot; <a href="/metrics">metrics</a> &middot; <a href="/readyz">ready</a></p>
<h2>Partitions</h2>
<table><tr><th>topic</th><th>partition</th><th>log start</th><th>high watermark</th>
<th>log end</th><th>bytes</th></tr>
{''.join(rows)}
</table>
<h2>Settings</h2>
<table>{settings_rows}</table>
</body></html>
"""
    return page.encode()
