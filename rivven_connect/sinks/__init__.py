"""Sinks: where a sink connector's consumed records go (docs/connect.md "Sinks").

A sink is an object the trio sink runner owns, one per configured sink. It knows nothing of
the consumer group or of offsets; it only

- ``await write(records)`` — take a batch of consumed records (``rivven_broker.client``
  ``Record``: topic, partition, offset, timestamp_ms, key, value, headers) and return only
  once it *has* them (flushed; a file fsynced, a webhook answered 2xx). The runner commits
  the batch's offsets after that and not before. Raises ``SinkError``: ``retriable`` (the
  runner backs off and writes the same batch again) or permanent (the sink stops in
  ``error``). A retried batch may be partly written already: sinks are at-least-once;
- ``await flush()`` — anything buffered out (``write`` already flushes; for symmetry);
- ``close()`` — release files and connections. Never raises for an unflushed sink: there is
  nothing unflushed after ``write`` returned.

``build_sink(config)`` checks the connector's own ``config`` block and raises
``ConnectConfigError`` naming ``sinks.NAME.config.OPTION``; it does no I/O.

``record_json(record)`` is the one JSON shape every sink writes (JSON lines, the webhook's
array): ``key`` and ``value`` are decoded as JSON when the bytes are JSON, else as UTF-8
text, else base64, and ``key_format`` / ``value_format`` say which (``json``, ``text``,
``base64``, ``null``); header values are text or base64 (``format``).
"""

from __future__ import annotations

import base64
import json
from typing import Any, Protocol, Sequence

from rivven_connect.core.config import ConnectConfigError, SinkConfig

__all__ = ["CONNECTORS", "Sink", "SinkError", "build_sink", "decode_bytes", "record_json"]

CONNECTORS = ("file", "stdout", "http-webhook")


class SinkError(Exception):
    """A write did not reach the sink. ``retriable``: the same batch may succeed later."""

    def __init__(self, message: str, *, retriable: bool) -> None:
        super().__init__(message)
        self.retriable = retriable


class Sink(Protocol):
    async def write(self, records: Sequence[Any]) -> None: ...

    async def flush(self) -> None: ...

    def close(self) -> None: ...


def decode_bytes(data: bytes | None, *, try_json: bool = True) -> tuple[Any, str]:
    """``(decoded, format)``: JSON if it parses (and ``try_json``), else UTF-8 text, else
    base64; ``(None, "null")`` for no bytes."""
    if data is None:
        return None, "null"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"
    if try_json:
        try:
            return json.loads(text), "json"
        except ValueError:
            pass
    return text, "text"


def record_json(record: Any) -> dict[str, Any]:
    """The JSON object of one consumed record (see the module docstring)."""
    key, key_format = decode_bytes(record.key)
    value, value_format = decode_bytes(record.value)
    headers = []
    for name, raw in record.headers:
        header_value, header_format = decode_bytes(raw, try_json=False)
        headers.append({"name": name, "value": header_value, "format": header_format})
    return {"topic": record.topic, "partition": record.partition, "offset": record.offset,
            "timestamp": record.timestamp_ms, "key": key, "key_format": key_format,
            "value": value, "value_format": value_format, "headers": headers}


def json_line(record: Any) -> bytes:
    """``record_json`` as one line of compact JSON, newline included."""
    return json.dumps(record_json(record), separators=(",", ":"),
                      ensure_ascii=False).encode() + b"\n"


def build_sink(config: SinkConfig) -> Sink:
    """The sink of ``config``. Raises ``ConnectConfigError``; does no I/O."""
    from rivven_connect.sinks.file import FileSink
    from rivven_connect.sinks.http_webhook import WebhookSink
    from rivven_connect.sinks.stdout import StdoutSink

    path = f"sinks.{config.name}.config"
    if config.connector == "file":
        return FileSink.from_config(config.config, path)
    if config.connector == "stdout":
        return StdoutSink.from_config(config.config, path)
    if config.connector == "http-webhook":
        return WebhookSink.from_config(config.config, path)
    raise ConnectConfigError(f"sinks.{config.name}.connector",
                             f"connector {config.connector!r} is not available in this build; "
                             f"available: {', '.join(CONNECTORS)}")
