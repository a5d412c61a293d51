"""``file``: consumed records as JSON lines in a directory of rotated files.

Theory of operation
-------------------
Records go to ``PATH/PREFIX-NNNNNNNN.jsonl`` (``NNNNNNNN`` counts up from 1), one
``record_json`` object per line. Before a line would take the current file past
``max_bytes`` (and the file is not empty) the file is fsynced and closed, the next one is
created (the directory is fsynced so the new name survives a crash) and the oldest files
beyond ``max_files`` are deleted. ``write`` returns only after the batch's bytes are written
and the file fsynced, so the offsets the runner commits next are on disk.

The file is opened at the first write (building the sink does no I/O). On open the newest
file is taken up again; if it ends in a partial line (a crash inside a write, which was
therefore never acknowledged nor committed) the partial line is cut off, so every line in
the files is one whole record. Blocking file calls run in a worker thread
(``trio.to_thread``); a failure is a retriable ``SinkError`` naming the file (the handle is
dropped and reopened, with the same repair, at the next write).

Options: ``path`` (a directory, required), ``prefix`` (``records``), ``max_bytes``
(64 MiB; 1 KiB .. 1 GiB), ``max_files`` (10; 1 .. 100 000).
"""

from __future__ import annotations

import os
import re
from typing import Any, BinaryIO, Callable, Mapping, Sequence

import trio

from rivven_connect.sinks import SinkError, json_line

__all__ = ["FileSink"]

max_bytes_default = 64 << 20
max_files_default = 10


class FileSink:
    def __init__(self, directory: str, *, prefix: str = "records",
                 max_bytes: int = max_bytes_default, max_files: int = max_files_default,
                 fsync: Callable[[int], None] = os.fsync) -> None:
        assert max_bytes > 0 and max_files > 0
        self.directory, self.prefix = directory, prefix
        self.max_bytes, self.max_files = max_bytes, max_files
        self.fsync = fsync
        self._pattern = re.compile(re.escape(prefix) + r"-([0-9]{8})\.jsonl")
        self._handle: BinaryIO | None = None
        self._sequence = 0
        self._size = 0

    @classmethod
    def from_config(cls, raw: Mapping[str, Any], path: str) -> FileSink:
        from rivven_connect.sources import Options

        options = Options(raw, path, ("path", "prefix", "max_bytes", "max_files"))
        prefix = raw.get("prefix", "records")
        if not isinstance(prefix, str) or re.fullmatch(r"[A-Za-z0-9._-]{1,64}", prefix) is None:
            from rivven_connect.core.config import ConnectConfigError
            raise ConnectConfigError(f"{path}.prefix",
                                     "must be 1-64 of letters, digits, '.', '_' or '-'")
        max_bytes = options.int("max_bytes", max_bytes_default, 1 << 10, 1 << 30)
        max_files = options.int("max_files", max_files_default, 1, 100_000)
        assert max_bytes is not None and max_files is not None
        return cls(options.string("path"), prefix=prefix, max_bytes=max_bytes,
                   max_files=max_files)

    def file_name(self, sequence: int) -> str:
        return os.path.join(self.directory, f"{self.prefix}-{sequence:08d}.jsonl")

    def files(self) -> list[str]:
        """The sink's files, oldest first (full paths)."""
        return [self.file_name(n) for n in self._sequences()]

    async def write(self, records: Sequence[Any]) -> None:
        """Append the records and fsync. Raises a retriable ``SinkError`` on an I/O error."""
        lines = [json_line(record) for record in records]
        await trio.to_thread.run_sync(self._write_sync, lines)

    async def flush(self) -> None:
        await trio.lowlevel.checkpoint()  # ``write`` leaves nothing buffered

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    # --- the blocking part (a worker thread) ------------------------------------------------
    def _write_sync(self, lines: list[bytes]) -> None:
        try:
            if self._handle is None:
                self._open()
            created = False
            for line in lines:
                if self._size > 0 and self._size + len(line) > self.max_bytes:
                    self._roll()
                    created = True
                assert self._handle is not None
                self._handle.write(line)
                self._size += len(line)
            assert self._handle is not None
            self._handle.flush()
            self.fsync(self._handle.fileno())
            if created:
                self._fsync_directory()
        except OSError as error:
            self.close()
            raise SinkError(f"{self.file_name(self._sequence)}: {error}", retriable=True) from error

    def _sequences(self) -> list[int]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        found = (self._pattern.fullmatch(name) for name in names)
        return sorted(int(match.group(1)) for match in found if match is not None)

    def _open(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        sequences = self._sequences()
        self._sequence = sequences[-1] if sequences else 1
        name = self.file_name(self._sequence)
        handle = open(name, "ab")
        try:
            self._size = self._cut_partial_line(handle)
        except OSError:
            handle.close()
            raise
        self._handle = handle
        if not sequences:
            self._fsync_directory()

    def _cut_partial_line(self, handle: BinaryIO) -> int:
        """The file's size after cutting an unfinished last line (a crash mid-write)."""
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            return 0
        with open(handle.name, "rb") as reader:
            reader.seek(size - 1)
            if reader.read(1) == b"\n":
                return size
            keep = size
            step = 1 << 16
            while keep > 0:
                start = max(0, keep - step)
                reader.seek(start)
                chunk = reader.read(keep - start)
                newline = chunk.rfind(b"\n")
                if newline >= 0:
                    keep = start + newline + 1
                    break
                keep = start
        handle.truncate(keep)
        self.fsync(handle.fileno())
        return keep

    def _roll(self) -> None:
        assert self._handle is not None
        self._handle.flush()
        self.fsync(self._handle.fileno())
        self._handle.close()
        self._handle = None
        self._sequence += 1
        self._handle = open(self.file_name(self._sequence), "ab")
        self._size = 0
        for old in self._sequences()[:-self.max_files]:
            os.remove(self.file_name(old))

    def _fsync_directory(self) -> None:
        descriptor = os.open(self.directory, os.O_RDONLY)
        try:
            self.fsync(descriptor)
        finally:
            os.close(descriptor)
