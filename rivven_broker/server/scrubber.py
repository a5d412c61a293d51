"""``Scrubber``: checks the CRCs of sealed segments in the background, at a bounded rate.

Theory of operation
-------------------
Sealed segments are trusted after a clean stop, so damage on disk (a flipped bit, a bad
sector) is otherwise found only when a consumer reads it. The scrubber finds it first: one
trio task walks every partition's sealed segments, round-robin by partition and oldest segment
first, and asks ``PartitionLog.scrub`` to check the next ``scrub_chunk_bytes`` (framing and
CRC32C of every batch); then it sleeps long enough to stay under ``scrub_bytes_per_second``.
The checks run on the event loop in small chunks, as the log cleaner's reads do (a 256 KiB
chunk costs well under a millisecond), so segments cannot be deleted or swapped under them.

``ScrubPlan`` (pure) holds the cursor: which partition and segment, at which byte. It copes
with the logs changing between steps: a partition or segment that is gone is skipped, a new
one is picked up on the next pass. Damage is counted in
``rivven_corrupt_batches_total{source="scrub"}`` and logged once per place; the scrub then
moves on to the next segment.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import trio

from rivven_broker.protocol import limits
from rivven_broker.storage.errors import CorruptRecordsError, StorageError, SyncFailedError

if TYPE_CHECKING:
    from rivven_broker.server.context import ServerContext

__all__ = ["Scrubber", "ScrubPlan"]

log = logging.getLogger(__name__)

_IDLE_MS = 10_000  # nothing sealed to check: look again after this
_PLACES_MAX = 1024


class ScrubPlan:
    """Where the scrub stands. Pure: given the partitions and their sealed segments, says
    what to check next."""

    def __init__(self) -> None:
        self.partition: tuple[str, int] | None = None
        self.segment: int | None = None  # base offset
        self.position = 0
        self.passes = 0

    def next(self, partitions: list[tuple[str, int]], sealed: dict[tuple[str, int], list[int]]
             ) -> tuple[tuple[str, int], int, int] | None:
        """``(partition, segment base, position)`` to check next, or None when nothing is
        sealed anywhere. ``partitions`` sorted; ``sealed`` their sealed segment bases."""
        if not any(sealed.get(p) for p in partitions):
            return None
        if self.partition is not None and self.segment is not None:
            bases = sealed.get(self.partition, [])
            if self.segment in bases:
                return self.partition, self.segment, self.position
            later = [base for base in bases if base > self.segment]
            if later:  # the segment went (retention, compaction): the next one
                return self._at(self.partition, later[0])
        return self._next_partition(partitions, sealed)

    def done(self, position: int | None, partitions: list[tuple[str, int]],
             sealed: dict[tuple[str, int], list[int]]) -> None:
        """The last check ended at ``position`` (None: its segment is finished)."""
        if position is not None:
            self.position = position
            return
        bases = sealed.get(self.partition, []) if self.partition is not None else []
        later = [base for base in bases if self.segment is not None and base > self.segment]
        if later:
            self._at(self.partition, later[0])  # type: ignore[arg-type]
        else:
            self.segment = None  # the partition is done: next() moves on

    def _at(self, partition: tuple[str, int], base: int) -> tuple[tuple[str, int], int, int]:
        self.partition, self.segment, self.position = partition, base, 0
        return partition, base, 0

    def _next_partition(self, partitions: list[tuple[str, int]],
                        sealed: dict[tuple[str, int], list[int]]
                        ) -> tuple[tuple[str, int], int, int]:
        """The first partition with sealed segments after the current one, wrapping around
        (a wrap-around completes a pass)."""
        current = self.partition
        later = [p for p in partitions if current is None or p > current]
        wrapped = [p for p in partitions if current is not None and p <= current]
        for candidate in later + wrapped:
            bases = sealed.get(candidate)
            if bases:
                if candidate in wrapped:
                    self.passes += 1
                return self._at(candidate, bases[0])
        raise AssertionError("next() checked that something is sealed")


class Scrubber:
    """The scrub task of one broker (see the module docstring)."""

    def __init__(self, context: ServerContext, bytes_per_second: int) -> None:
        assert bytes_per_second > 0
        self._context = context
        self._rate = bytes_per_second
        self.plan = ScrubPlan()
        self.bytes_checked = 0
        self._reported: set[tuple[str, int]] = set()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Scrub until cancelled. Blocks."""
        task_status.started()
        clock = self._context.env.clock
        while True:
            checked = self.step()
            if checked is None:
                await clock.sleep_ms(_IDLE_MS)
            else:
                await clock.sleep_ms(max(1, checked * 1000 // self._rate))

    def step(self) -> int | None:
        """Check the next chunk; the bytes checked, or None when nothing is sealed. Never
        blocks for longer than one chunk's read."""
        logs = self._context.logs
        partitions = sorted(key for key, _ in logs.logs())
        sealed = {key: plog.sealed_segment_bases() for key, plog in logs.logs()}
        where = self.plan.next(partitions, sealed)
        if where is None:
            return None
        key, base, position = where
        plog = dict(logs.logs()).get(key)
        chunk = min(limits.scrub_chunk_bytes, self._rate)
        try:
            after = None if plog is None else plog.scrub(base, position, chunk)
        except CorruptRecordsError as exc:
            self._report(key, exc)
            after = None
        except SyncFailedError:
            raise
        except (StorageError, OSError) as exc:  # a failing disk: the fetches will say so too
            log.warning("scrub of %s-%d stopped at segment %d: %s", key[0], key[1], base, exc)
            after = None
        checked = chunk if after is None else after - position
        self.bytes_checked += checked
        self.plan.done(after, partitions, sealed)
        return checked

    def _report(self, key: tuple[str, int], exc: CorruptRecordsError) -> None:
        place = (exc.file, exc.position)
        if place in self._reported:
            return
        if len(self._reported) >= _PLACES_MAX:
            self._reported.clear()
        self._reported.add(place)
        self._context.metrics.corrupt_batch(key[0], key[1], "scrub")
        log.error("scrub: %s-%d holds a damaged batch: %s (fetches of offset %d will answer "
                  "CORRUPT_MESSAGE)", key[0], key[1], exc, exc.offset)
