"""``SegmentList``: a partition log's segments, oldest first, with their base offsets.

Theory of operation
-------------------
A partition log (``partition_log.py``) is a run of segments whose offset ranges meet end to
start; only the last one, the *active* segment, grows. Lookups bisect the base offsets, kept
in step with the segments here and nowhere else: every change to the run (a roll appends,
retention and ``delete_records`` pop the oldest, a truncation cuts the newest, the cleaner
replaces a sealed one, a full truncation starts over with one) is one method of this type.
``active`` and ``bases`` (a tuple, rebuilt at each change: changes are rare, and the partition
reads the active base after every append) are plain attributes, so the append path pays one
attribute access for either. The type does no I/O: opening, closing and removing segment
files stays with the log.

Every group commit asks which sealed segments are not synced yet (``unsynced_sealed``), so
that answer costs what is unsynced, not what the log holds: a log of thousands of segments
(a terabyte in 1 GiB segments, or small ``segment.bytes``) used to walk them all two or three
times per commit. A segment can only become sealed unsynced by a roll (the log marks the
active segment unsynced, then appends the new one); a sealed segment never goes back to
unsynced (its bytes never change; the cleaner's replacements arrive synced). So the list
keeps every segment a roll sealed, oldest first, and drops those found synced when asked.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from rivven_broker.storage.segment import Segment

__all__ = ["SegmentList"]


class SegmentList:
    """The segments of one log, oldest first; the last is ``active``. Never empty."""

    __slots__ = ("_segments", "bases", "active", "_unsynced")

    def __init__(self, segments: list[Segment]) -> None:
        assert segments, "a log always has an active segment"
        self._segments = list(segments)
        #: Every segment's base offset, oldest first (read only: the type replaces it).
        self.bases: tuple[int, ...] = tuple(segment.base_offset for segment in segments)
        #: The last segment, the one appends go to.
        self.active: Segment = segments[-1]
        #: Every sealed segment not synced (and some synced since), oldest first.
        self._unsynced = [segment for segment in segments[:-1] if not segment.synced]

    def __len__(self) -> int:
        return len(self._segments)

    def __iter__(self) -> Iterator[Segment]:
        return iter(self._segments)

    def __getitem__(self, index: int) -> Segment:
        return self._segments[index]

    def sealed(self) -> list[Segment]:
        """The segments below the active one, oldest first (a copy)."""
        return self._segments[:-1]

    def unsynced_sealed(self) -> list[Segment]:
        """The sealed segments not synced, oldest first: usually none, one after a roll.
        The list itself (read it; the type changes it). Costs what is unsynced, not what the
        log holds (module docstring). Never blocks."""
        unsynced = self._unsynced
        if unsynced and any(segment.synced for segment in unsynced):
            unsynced = self._unsynced = [s for s in unsynced if not s.synced]
        return unsynced

    def index_of(self, offset: int) -> int:
        """The index of the segment whose range would hold ``offset``: the last one based at
        or below it (-1 when ``offset`` is below the first base)."""
        return bisect_right(self.bases, offset) - 1

    def holding(self, offset: int) -> Segment:
        """The segment holding ``offset``, which must be at or above the first base."""
        index = bisect_right(self.bases, offset) - 1
        assert index >= 0
        return self._segments[index]

    def from_index(self, index: int) -> list[Segment]:
        """The segments from ``index`` on (a copy)."""
        return self._segments[index:]

    def append(self, segment: Segment) -> None:
        """Add ``segment`` as the new active one (a roll); the active one before it is sealed
        now, and counted unsynced until it is found synced."""
        assert segment.base_offset > self.bases[-1], "bases strictly increase"
        self._unsynced.append(self.active)
        self._segments.append(segment)
        self.bases = (*self.bases, segment.base_offset)
        self.active = segment

    def pop_first(self) -> Segment:
        """Take out the oldest segment, which must not be the active one."""
        assert len(self._segments) > 1, "the active segment is never popped"
        self.bases = self.bases[1:]
        first = self._segments.pop(0)
        unsynced = self._unsynced
        if unsynced and unsynced[0] is first:  # (oldest first: if there, it is the first)
            del unsynced[0]
        return first

    def cut_after(self, index: int) -> list[Segment]:
        """Take out every segment after ``index``; the one at ``index`` becomes active.
        Returns the segments taken out, oldest first."""
        assert 0 <= index < len(self._segments)
        later = self._segments[index + 1 :]
        del self._segments[index + 1 :]
        self.bases = self.bases[: index + 1]
        self.active = active = self._segments[-1]
        self._unsynced = [s for s in self._unsynced if s.base_offset < active.base_offset]
        return later

    def replace_sealed(self, old: Segment, new: Segment) -> bool:
        """Put ``new`` (same base offset) in the place of the sealed segment ``old``; False,
        changing nothing, when ``old`` is not a sealed segment here (compared by identity)."""
        for index in range(len(self._segments) - 1):
            if self._segments[index] is old:
                assert new.base_offset == old.base_offset
                self._segments[index] = new
                # (rare: the list of sealed segments is walked, not the unsynced ones)
                self._unsynced = [s for s in self._segments[:-1] if not s.synced]
                return True
        return False

    def reset(self, segment: Segment) -> list[Segment]:
        """Make ``segment`` the only one; returns the segments it replaces, oldest first."""
        old = self._segments
        self._segments = [segment]
        self.bases = (segment.base_offset,)
        self.active = segment
        self._unsynced = []
        return old

    def check_invariants(self) -> None:
        """Assert that the bases are the segments' own, strictly increasing, and that
        ``active`` is the last segment. Never blocks."""
        segments = self._segments
        assert segments and self.active is segments[-1]
        assert self.bases == tuple(segment.base_offset for segment in segments)
        assert all(a < b for a, b in zip(self.bases, self.bases[1:])), "bases increase"
        tracked = {id(segment) for segment in self._unsynced}
        sealed = segments[:-1]
        assert all(segment.synced or id(segment) in tracked for segment in sealed), \
            "every unsynced sealed segment is tracked"
        positions = {id(segment): index for index, segment in enumerate(sealed)}
        at = [positions.get(id(segment), -1) for segment in self._unsynced]
        assert all(index >= 0 for index in at), "only sealed segments are tracked"
        assert at == sorted(set(at)), "tracked oldest first, once each"
