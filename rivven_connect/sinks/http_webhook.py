"""``http-webhook``: consumed records POSTed as JSON arrays (``record_json`` objects).

Theory of operation
-------------------
``write(records)`` cuts the batch into chunks of ``batch_size`` and POSTs each as one JSON
array to ``url`` (HTTP/1.1 over a fresh connection per request, ``h11`` on trio streams;
``https`` with the system's default TLS context). A chunk is delivered on a 2xx answer.

- 5xx, 408, 429, a connection failure or no answer within ``timeout_ms``: retriable. The
  chunk is retried up to ``max_retries`` times, waiting ``retry_backoff_ms`` · 2^(n-1)
  (capped at ``retry_backoff_max_ms``), the upper half jittered by the injected
  ``jitter()``; then ``write`` raises a retriable ``SinkError`` (the runner backs off and
  writes the whole batch again: chunks already delivered are POSTed again — at-least-once).
- Any other 4xx (and 1xx/3xx: no redirects are followed): a permanent ``SinkError`` (the
  request is wrong; repeating it cannot help); the sink stops in ``error``.

Limits: one answer's head and body are read up to ``response_bytes_max``; a request body is
whatever ``batch_size`` records make.

Options: ``url`` (``http://`` or ``https://``, required), ``batch_size`` (100; 1 .. 10 000),
``timeout_ms`` (10 000; 100 .. 300 000), ``max_retries`` (5; 0 .. 100),
``retry_backoff_ms`` (200; 1 .. 60 000), ``retry_backoff_max_ms`` (10 000), ``headers``
(a mapping of extra request headers, e.g. ``Authorization``).
"""

from __future__ import annotations

import json
import random
import ssl
from typing import Any, Callable, Mapping, Sequence
from urllib.parse import urlsplit

import h11
import trio

from rivven_connect.core.config import ConnectConfigError
from rivven_connect.sinks import SinkError, record_json

__all__ = ["WebhookSink", "post_json"]

#: The most bytes of an answer read (head and body).
response_bytes_max = 1 << 20
_RETRIABLE_4XX = frozenset({408, 429})


class _Retriable(Exception):
    pass


class WebhookSink:
    def __init__(self, url: str, *, batch_size: int = 100, timeout_ms: int = 10_000,
                 max_retries: int = 5, retry_backoff_ms: int = 200,
                 retry_backoff_max_ms: int = 10_000, headers: Mapping[str, str] | None = None,
                 jitter: Callable[[], float] | None = None) -> None:
        parts = urlsplit(url)
        assert parts.scheme in ("http", "https") and parts.hostname
        self.url = url
        self.batch_size, self.timeout_ms, self.max_retries = batch_size, timeout_ms, max_retries
        self.retry_backoff_ms, self.retry_backoff_max_ms = retry_backoff_ms, retry_backoff_max_ms
        self.headers = dict(headers or {})
        self.jitter = jitter if jitter is not None else random.Random().random
        self.requests_sent = 0

    @classmethod
    def from_config(cls, raw: Mapping[str, Any], path: str) -> WebhookSink:
        from rivven_connect.sources import Options

        options = Options(raw, path, ("url", "batch_size", "timeout_ms", "max_retries",
                                      "retry_backoff_ms", "retry_backoff_max_ms", "headers"))
        url = options.string("url")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConnectConfigError(f"{path}.url", f"must be an http:// or https:// URL, "
                                                    f"not {url!r}")
        headers = raw.get("headers") or {}
        if not isinstance(headers, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
            raise ConnectConfigError(f"{path}.headers", "must be a mapping of text to text")
        ints = {name: options.int(name, default, low, high) for name, default, low, high in (
            ("batch_size", 100, 1, 10_000), ("timeout_ms", 10_000, 100, 300_000),
            ("max_retries", 5, 0, 100), ("retry_backoff_ms", 200, 1, 60_000),
            ("retry_backoff_max_ms", 10_000, 1, 600_000))}
        return cls(url, headers=headers, **ints)  # type: ignore[arg-type]

    async def write(self, records: Sequence[Any]) -> None:
        """POST the records in chunks. Raises ``SinkError`` (see the module docstring)."""
        for start in range(0, len(records), self.batch_size):
            chunk = records[start:start + self.batch_size]
            body = json.dumps([record_json(r) for r in chunk], separators=(",", ":"),
                              ensure_ascii=False).encode()
            await self._deliver(body)

    async def _deliver(self, body: bytes) -> None:
        attempt = 0
        while True:
            try:
                status = await post_json(self.url, body, self.headers, self.timeout_ms)
            except (OSError, trio.TooSlowError, h11.ProtocolError, _Retriable,
                    trio.BrokenResourceError) as error:
                problem = f"POST {self.url}: {type(error).__name__}: {error}"
            else:
                self.requests_sent += 1
                if 200 <= status < 300:
                    return
                problem = f"POST {self.url}: HTTP {status}"
                if status < 500 and status not in _RETRIABLE_4XX:
                    raise SinkError(problem, retriable=False)
            attempt += 1
            if attempt > self.max_retries:
                raise SinkError(f"{problem} (after {attempt} attempts)", retriable=True)
            ceiling_ms = min(self.retry_backoff_max_ms,
                             self.retry_backoff_ms << min(attempt - 1, 20))
            jitter = self.jitter()
            assert 0.0 <= jitter < 1.0
            await trio.sleep((ceiling_ms // 2 + jitter * (ceiling_ms - ceiling_ms // 2)) / 1000)

    async def flush(self) -> None:
        await trio.lowlevel.checkpoint()

    def close(self) -> None:
        pass


async def post_json(url: str, body: bytes, headers: Mapping[str, str], timeout_ms: int) -> int:
    """POST ``body`` (``application/json``) to ``url`` on a fresh connection; the answer's
    status code. Raises ``OSError``, ``trio.TooSlowError`` (after ``timeout_ms``),
    ``h11.ProtocolError`` or ``trio.BrokenResourceError``; an answer over
    ``response_bytes_max`` is a retriable failure too."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host = parts.netloc.rsplit("@", 1)[-1]
    with trio.fail_after(timeout_ms / 1000):
        if parts.scheme == "https":
            stream: trio.abc.Stream = await trio.open_ssl_over_tcp_stream(
                parts.hostname, port, ssl_context=ssl.create_default_context())
        else:
            stream = await trio.open_tcp_stream(parts.hostname, port)
        async with stream:
            connection = h11.Connection(h11.CLIENT, max_incomplete_event_size=response_bytes_max)
            request_headers = [("Host", host), ("Content-Type", "application/json"),
                               ("Content-Length", str(len(body))), ("Connection", "close"),
                               *headers.items()]
            out = connection.send(h11.Request(method="POST", target=target,
                                              headers=request_headers))
            out += connection.send(h11.Data(data=body))
            out += connection.send(h11.EndOfMessage())
            await stream.send_all(out)
            status = None
            received = 0
            while True:
                event = connection.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(1 << 16)
                    received += len(data)
                    if received > response_bytes_max:
                        raise _Retriable(f"answer over {response_bytes_max} bytes")
                    connection.receive_data(data)
                    continue
                if isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    break
            if status is None:
                raise _Retriable("connection closed before an answer")
            return status
