"""``stdout``: consumed records as JSON lines on standard output (``record_json`` per line).

``write`` returns after the lines are written and the stream flushed. A failing stream (a
closed pipe) is a permanent ``SinkError``: nobody is reading. No options.
"""

from __future__ import annotations

import sys
from typing import Any, BinaryIO, Mapping, Sequence

import trio

from rivven_connect.core.config import ConnectConfigError
from rivven_connect.sinks import SinkError, json_line

__all__ = ["StdoutSink"]


class StdoutSink:
    def __init__(self, stream: BinaryIO | None = None) -> None:
        self.stream = stream

    @classmethod
    def from_config(cls, raw: Mapping[str, Any], path: str) -> StdoutSink:
        for key in raw:
            raise ConnectConfigError(f"{path}.{key}", "unknown option; stdout takes none")
        return cls()

    async def write(self, records: Sequence[Any]) -> None:
        """Write and flush the lines. Raises a permanent ``SinkError`` if stdout fails."""
        stream = self.stream if self.stream is not None else sys.stdout.buffer
        data = b"".join(json_line(record) for record in records)
        await trio.lowlevel.checkpoint()
        try:
            stream.write(data)
            stream.flush()
        except (OSError, ValueError) as error:  # ValueError: the stream was closed
            raise SinkError(f"stdout: {error}", retriable=False) from error

    async def flush(self) -> None:
        await trio.lowlevel.checkpoint()

    def close(self) -> None:
        pass
