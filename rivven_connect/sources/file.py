"""``file``: JSON lines from a file, one record per line.

A record's value is the line's JSON value; its position is the byte offset just past the
line (so positions are increasing integers, and resuming means seeking there). Blank lines
are skipped (their bytes still advance the position). A line that is not JSON, or longer
than ``line_bytes_max``, stops the source (``SourceError`` naming the file and offset): the
data is wrong, and skipping it silently would lose it.

At the end of the file the source is exhausted (``poll`` returns ``None``) unless ``follow``
is set; then it waits ``poll_interval_ms`` and looks again (a line without its ``\\n`` is
not taken until it is complete). The optional side effect writes the committed offset to
``PATH.done`` (atomically, by rename) so an outside tool can tell what is safely delivered.

Options: ``path`` (required), ``follow`` (false), ``poll_interval_ms`` (500),
``done_marker`` (false), ``batch_size`` (500).
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import trio

from rivven_connect.core.records import Record

__all__ = ["FileSource"]

#: The longest line taken (bytes); longer is an error.
line_bytes_max = 1 << 20
#: The most bytes one poll reads ahead.
read_bytes_max = 4 << 20


class FileSource:
    def __init__(self, path: str, *, follow: bool = False, poll_interval_ms: int = 500,
                 done_marker: bool = False, batch_size: int = 500) -> None:
        self.path = path
        self.follow, self.poll_interval_ms = follow, poll_interval_ms
        self.done_marker, self.batch_size = done_marker, batch_size
        self.offset = 0

    @classmethod
    def from_config(cls, raw: Mapping[str, Any], path: str) -> FileSource:
        from rivven_connect.sources import Options

        options = Options(raw, path, ("path", "follow", "poll_interval_ms", "done_marker",
                                      "batch_size"))
        interval = options.int("poll_interval_ms", 500, 1, 60_000)
        assert interval is not None
        return cls(options.string("path"), follow=options.bool("follow", False),
                   poll_interval_ms=interval, done_marker=options.bool("done_marker", False),
                   batch_size=options.batch_size())

    @property
    def done_path(self) -> str:
        return self.path + ".done"

    def resume(self, position: Any) -> None:
        self.offset = 0 if position is None else int(position)

    async def poll(self, max_records: int) -> list[Record] | None:
        """Up to ``min(max_records, batch_size)`` records from the current offset. Raises
        ``SourceError``. Waits only with ``follow``."""
        while True:
            records = await self.poll_ready(max_records)
            if records:
                return records
            if not self.follow:
                return None
            await trio.sleep(self.poll_interval_ms / 1000)

    async def poll_ready(self, max_records: int) -> list[Record]:
        """What the file holds now past the offset, up to ``min(max_records, batch_size)``
        records; never waits (at the end: nothing). Raises ``SourceError``."""
        from rivven_connect.sources import SourceError

        wanted = min(max_records, self.batch_size)
        while True:
            try:
                records, consumed, at_end = await trio.to_thread.run_sync(self._read, wanted)
            except OSError as error:
                raise SourceError(f"{self.path}: cannot read: {error}") from error
            self.offset += consumed
            if records or at_end:
                return records
            # only blank lines: go on

    def _read(self, wanted: int) -> tuple[list[Record], int, bool]:
        """(records, bytes consumed, reached the end). In a worker thread; changes nothing."""
        from rivven_connect.sources import SourceError

        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            data = handle.read(read_bytes_max)
        records: list[Record] = []
        start = 0
        incomplete = False
        while len(records) < wanted and start < len(data):
            end = data.find(b"\n", start)
            if end < 0:
                if len(data) - start > line_bytes_max:
                    raise SourceError(f"{self.path}: the line at byte {self.offset + start} is "
                                      f"longer than {line_bytes_max} bytes")
                if self.follow or len(data) == read_bytes_max:
                    incomplete = True
                    break  # incomplete, or cut by the read: wait for / read the rest
                end = len(data)  # the last line of a finished file may lack its newline
            line = data[start:end]
            start = end + 1
            if len(line) > line_bytes_max:
                raise SourceError(f"{self.path}: the line at byte {self.offset + start} is "
                                  f"longer than {line_bytes_max} bytes")
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError as error:
                raise SourceError(f"{self.path}: the line at byte {self.offset + end - len(line)}"
                                  f" is not JSON: {error}") from error
            records.append(Record(value=value, position=self.offset + min(start, len(data))))
        consumed = min(start, len(data))
        at_end = (incomplete or consumed >= len(data)) and len(data) < read_bytes_max
        return records, consumed, at_end

    async def side_effect(self, position: Any) -> None:
        if not self.done_marker:
            await trio.lowlevel.checkpoint()
            return
        await trio.to_thread.run_sync(self._write_marker, int(position))

    def _write_marker(self, position: int) -> None:
        temporary = self.done_path + ".tmp"
        with open(temporary, "w") as handle:
            handle.write(f"{position}\n")
        os.replace(temporary, self.done_path)

    def position_key(self, position: Any) -> Any:
        return position

    def close(self) -> None:
        pass
