"""The background log cleaner: compacts the partitions of ``cleanup.policy=compact`` topics.

Theory of operation
-------------------
One trio task (``LogCleaner.run``) wakes every ``interval_ms`` (and once at start) and visits
every partition whose topic compacts (``compact`` or ``compact,delete``) and has at least one
sealed segment. It skips a partition whose sealed segments are exactly those of its last run,
unless ``delete.retention.ms`` has passed since (tombstones may have expired). A visit runs
the cleaner's two steps (``storage/cleaner.py``):

1. ``prepare_steps`` cooperatively on the event loop: at every pause point the task
   checkpoints, and every fsync it asks for runs through ``env.run_sync`` (off the loop). The
   produce and fetch paths keep running meanwhile. After each step the task checks that the
   partition's log is still the one it started with (a deleted topic, or one deleted and
   created again, abandons the run: closing the generator removes its ``.cleaned`` files).
2. ``commit_clean`` inline (renames and directory fsyncs, on the loop), which swaps the
   rewritten segments in through ``PartitionLog.replace_sealed_segment``.

Only sealed segments are ever read or rewritten; the active segment is untouched. A storage
error is logged and the partition is skipped until the next round (a crash mid-swap is
completed or rolled back by recovery). A failed fsync (``SyncFailedError``) is not expected
here (the cleaner's own fsyncs raise ``OSError``) and would propagate like everywhere else.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import attrs
import trio

from rivven_broker.records.header import BatchError
from rivven_broker.storage.cleaner import (
    CleanResult,
    PreparedClean,
    commit_clean,
    discard_clean,
    prepare_steps,
)
from rivven_broker.storage.errors import StorageError, UnknownTopicOrPartitionError

if TYPE_CHECKING:
    from rivven_broker.server.context import ServerContext
    from rivven_broker.storage.partition_log import PartitionLog

__all__ = ["LogCleaner", "CleanerStatistics"]

log = logging.getLogger(__name__)


@attrs.define
class CleanerStatistics:
    """Counters of one broker's cleaner."""

    runs: int = 0
    partitions_cleaned: int = 0
    records_removed: int = 0
    bytes_reclaimed: int = 0
    failures: int = 0


class LogCleaner:
    """Compacts the compacted topics of one broker in the background. See the module docstring."""

    def __init__(self, context: ServerContext, interval_ms: int) -> None:
        assert interval_ms > 0
        self._context = context
        self.interval_ms = interval_ms
        self.stats = CleanerStatistics()
        #: (topic, partition) -> (identities and sizes of the sealed segments, wall ms) of the
        #: last run.
        self._last: dict[tuple[str, int], tuple[tuple[tuple[int, int], ...], int]] = {}
        self._wakeup = trio.Event()

    def wake(self) -> None:
        """Start a round now (tests, operators). Never blocks."""
        self._wakeup.set()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Clean in rounds until cancelled. Blocks."""
        task_status.started()
        while True:
            await self.clean_round()
            self._wakeup = trio.Event()
            with trio.move_on_after(self.interval_ms / 1000):
                await self._wakeup.wait()

    async def clean_round(self) -> list[tuple[str, int, CleanResult]]:
        """Visit every compacted partition once; returns what each cleaning did. Blocks."""
        context = self._context
        self.stats.runs += 1
        done = []
        for (topic, partition), plog in list(context.logs.logs()):
            info = context.logs.topics().get(topic)
            if info is None or not info.config.compacts or plog.failed:
                continue
            sealed = plog.sealed_segments()
            if not sealed:
                continue
            now_ms = context.env.clock.wall_ms()
            signature = tuple((id(s), s.size) for s in sealed)
            last = self._last.get((topic, partition))
            retention_ms = info.config.delete_retention_ms
            if last is not None and last[0] == signature and now_ms - last[1] < retention_ms:
                continue
            result = await self._clean(topic, partition, plog, now_ms, retention_ms)
            if result is not None:
                sealed = plog.sealed_segments()
                self._last[(topic, partition)] = (tuple((id(s), s.size) for s in sealed), now_ms)
                done.append((topic, partition, result))
        return done

    def _alive(self, topic: str, partition: int, plog: PartitionLog) -> bool:
        try:
            return self._context.logs.get_log(topic, partition) is plog and not plog.failed
        except UnknownTopicOrPartitionError:
            return False

    async def _clean(
        self, topic: str, partition: int, plog: PartitionLog, now_ms: int, retention_ms: int
    ) -> CleanResult | None:
        env = self._context.env
        steps = prepare_steps(plog, now_ms, retention_ms)
        prepared: PreparedClean | None = None
        try:
            while True:
                try:
                    step = next(steps)
                except StopIteration as stop:
                    prepared = stop.value
                    break
                if step is None:
                    await trio.lowlevel.checkpoint()
                else:
                    await env.run_sync(step)
                if not self._alive(topic, partition, plog):
                    steps.close()
                    return None
            assert prepared is not None
            if not self._alive(topic, partition, plog):
                discard_clean(plog, prepared)
                return None
            result = commit_clean(plog, prepared)
        except (StorageError, OSError, BatchError) as exc:
            steps.close()
            self.stats.failures += 1
            log.error("cleaning %s-%d failed: %s", topic, partition, exc)
            return None
        if result.segments_cleaned:
            self.stats.partitions_cleaned += 1
            self.stats.records_removed += result.records_removed
            self.stats.bytes_reclaimed += result.bytes_before - result.bytes_after
            log.info("cleaned %s-%d: %d segments, %d records removed, %d -> %d bytes",
                     topic, partition, result.segments_cleaned, result.records_removed,
                     result.bytes_before, result.bytes_after)
        return result
