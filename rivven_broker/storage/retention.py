"""Retention: which of a log's oldest segments go, and the removal of their files.

Theory of operation
-------------------
Retention is split into deciding (pure), taking out (on the log owner's thread, cheap) and
removing (off the event loop). ``segments_past_retention`` decides: the oldest sealed
segments (never the active one) that are past ``retention.ms`` by their max timestamp, or not
needed to keep ``retention.bytes``. ``PartitionLog.plan_retention`` then takes them out: they
leave the segment list, the log start moves up to the first remaining one, and their files
become ``*.deleted``. A ``SegmentRemoval`` carries what is left to do; its ``run`` (off the
loop) unlinks those names and fsyncs the directory, and ``PartitionLog.finish_removal``
records on the loop what that fsync covered.

No log-start checkpoint is needed: recovery deletes a ``*.deleted`` file and every segment at
or below its base, and starts the log at its first segment, so any subset of the renames on
disk reads as "deleted"; none of them is the log as it was. A deleted segment whose data was
never synced would come back damaged and be cut along with every later segment, so then the
removal is a directory change with the new start as its floor: nothing later counts as
durable before a directory fsync covers the renames. If the first remaining segment's own
name is not durable yet (a fresh roll), planning fsyncs the directory inline first.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Sequence

import attrs

from rivven_broker.storage.file_store import FileStore

if TYPE_CHECKING:
    from rivven_broker.storage.segment import Segment

__all__ = ["SegmentRemoval", "segments_past_retention"]


def segments_past_retention(
    sealed: Sequence[Segment], size_bytes: int, retention_ms: int, retention_bytes: int,
    now_ms: int,
) -> int:
    """How many of the oldest ``sealed`` segments (oldest first) retention deletes: each is
    past ``retention_ms`` by its max timestamp, or the log (``size_bytes`` in all) still holds
    at least ``retention_bytes`` without it. A negative limit is no limit. Never blocks."""
    doomed, remaining_bytes = 0, size_bytes
    for oldest in sealed:
        assert oldest.max_timestamp is not None
        expired = retention_ms >= 0 and now_ms - oldest.max_timestamp > retention_ms
        too_big = retention_bytes >= 0 and remaining_bytes - oldest.size >= retention_bytes
        if not (expired or too_big):
            break
        doomed += 1
        remaining_bytes -= oldest.size
    return doomed


@attrs.define(eq=False)
class SegmentRemoval:
    """Segments retention took out of a log, whose files still have to go: ``run`` (off the
    event loop) unlinks their ``*.deleted`` names and fsyncs the directory; then the log's
    owner calls ``PartitionLog.finish_removal`` on the loop, whether ``run`` ran or not."""

    store: FileStore
    directory: str
    paths: tuple[str, ...]  # the renamed files to unlink
    segments: int  # how many segments retention deleted
    generation: int  # the log's directory changes up to this one are covered by ``run``
    done: bool = False

    def run(self) -> None:
        """Unlink the files and fsync the directory. Blocks on file I/O and one fsync; touches
        no handle, so it may run on another thread while the log is used.

        A file or the directory already gone is no error: a truncation or the topic's
        deletion removed it meanwhile.

        Raises:
            OSError: the store failed.
        """
        for path in self.paths:
            with contextlib.suppress(FileNotFoundError):
                self.store.remove(path)
        with contextlib.suppress(FileNotFoundError):
            self.store.fsync_dir(self.directory)
        self.done = True
