"""``SegmentList`` against a plain Python list of segments.

Method: a Hypothesis ``RuleBasedStateMachine`` applies every change a log makes to its run of
segments (roll, pop the oldest, cut after one, replace a sealed one, reset) both to a
``SegmentList`` and to a plain list, and after each step compares every lookup (by offset,
by index, the bases, the sealed part, the active segment, the sealed segments not synced)
with the answer computed from the plain list by brute force. The segments are stand-ins: only
their offsets and their ``synced`` flag matter here; the flag changes as a log changes it (a
roll marks the active segment unsynced before sealing it, a group commit marks sealed ones
synced, the cleaner's replacements arrive synced, a truncation makes a sealed one active).
"""

from __future__ import annotations

import attrs
import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rivven_broker.storage.segment_list import SegmentList


@attrs.define(eq=False)
class FakeSegment:
    base_offset: int
    next_offset: int
    synced: bool = True


def holding(model: list[FakeSegment], offset: int) -> int:
    """Brute force: the last segment based at or below ``offset`` (-1 if none)."""
    found = -1
    for index, segment in enumerate(model):
        if segment.base_offset <= offset:
            found = index
    return found


class SegmentListMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        first = FakeSegment(0, 0)
        self.model: list[FakeSegment] = [first]
        self.segments = SegmentList([first])  # type: ignore[list-item]

    @rule(records=st.integers(1, 50))
    def roll(self, records: int) -> None:
        active = self.model[-1]
        active.next_offset += records  # the active segment grew, then rolls
        active.synced = False
        new = FakeSegment(active.next_offset, active.next_offset)
        self.model.append(new)
        self.segments.append(new)  # type: ignore[arg-type]

    @precondition(lambda self: len(self.model) > 1)
    @rule()
    def pop_first(self) -> None:
        assert self.segments.pop_first() is self.model.pop(0)

    @rule(data=st.data())
    def cut_after(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.model) - 1))
        later = self.model[index + 1 :]
        del self.model[index + 1 :]
        assert self.segments.cut_after(index) == later

    @rule(data=st.data())
    def replace_sealed(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.model) - 1))
        old = self.model[index]
        new = FakeSegment(old.base_offset, old.next_offset)
        replaced = self.segments.replace_sealed(old, new)  # type: ignore[arg-type]
        assert replaced == (index < len(self.model) - 1)
        if replaced:
            self.model[index] = new

    @rule(data=st.data())
    def sync(self, data: st.DataObject) -> None:
        """A group commit: some sealed segments (any of them) are synced now."""
        for segment in self.model[:-1]:
            if data.draw(st.booleans()):
                segment.synced = True

    @rule()
    def replace_a_stranger(self) -> None:
        stranger = FakeSegment(self.model[0].base_offset, self.model[0].next_offset)
        assert not self.segments.replace_sealed(stranger, stranger)  # type: ignore[arg-type]

    @rule(start=st.integers(0, 10_000))
    def reset(self, start: int) -> None:
        old, self.model = self.model, [FakeSegment(start, start)]
        assert self.segments.reset(self.model[0]) == old  # type: ignore[arg-type]

    @rule(delta=st.integers(-3, 60))
    def look_up(self, delta: int) -> None:
        offset = max(self.model[0].base_offset + delta, 0)
        index = holding(self.model, offset)
        assert self.segments.index_of(offset) == index
        if index >= 0:
            assert self.segments.holding(offset) is self.model[index]
            assert self.segments.from_index(index) == self.model[index:]

    @invariant()
    def same_as_the_list(self) -> None:
        self.segments.check_invariants()
        assert list(self.segments) == self.model
        assert len(self.segments) == len(self.model)
        assert self.segments.active is self.model[-1]
        assert self.segments.sealed() == self.model[:-1]
        assert self.segments.unsynced_sealed() == [s for s in self.model[:-1] if not s.synced]
        assert self.segments.bases == tuple(s.base_offset for s in self.model)
        assert all(self.segments[i] is s for i, s in enumerate(self.model))


SegmentListMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40,
                                                deadline=None)
TestSegmentList = SegmentListMachine.TestCase


def test_the_active_segment_is_never_popped() -> None:
    only = FakeSegment(0, 0)
    segments = SegmentList([only])  # type: ignore[list-item]
    with pytest.raises(AssertionError):
        segments.pop_first()
    assert segments.active is only


def test_bases_must_increase() -> None:
    segments = SegmentList([FakeSegment(10, 20)])  # type: ignore[list-item]
    with pytest.raises(AssertionError):
        segments.append(FakeSegment(10, 10))  # type: ignore[arg-type]


def test_a_sealed_segment_unsynced_at_the_start_is_tracked() -> None:
    """Recovery hands over sealed segments it may not have synced: the list starts with them."""
    sealed = [FakeSegment(0, 10, synced=False), FakeSegment(10, 20), FakeSegment(20, 30, False)]
    segments = SegmentList([*sealed, FakeSegment(30, 30)])  # type: ignore[list-item]
    segments.check_invariants()
    assert segments.unsynced_sealed() == [sealed[0], sealed[2]]
    sealed[0].synced = True
    assert segments.unsynced_sealed() == [sealed[2]]
    assert segments.pop_first() is sealed[0]
    segments.check_invariants()


def test_a_group_commit_does_not_walk_the_synced_segments() -> None:
    """What a commit asks costs what is unsynced, not what the log holds: with a thousand
    sealed segments synced, the ``synced`` flags read after a roll are the new one's only."""
    reads = [0]

    @attrs.define(eq=False)
    class CountedSegment:
        base_offset: int
        next_offset: int
        _synced: bool = True

        @property
        def synced(self) -> bool:
            reads[0] += 1
            return self._synced

        @synced.setter
        def synced(self, value: bool) -> None:
            self._synced = value

    run = [CountedSegment(i * 10, i * 10 + 10) for i in range(1001)]
    segments = SegmentList(run)  # type: ignore[arg-type]
    reads[0] = 0
    for _ in range(3):
        assert segments.unsynced_sealed() == []
    sealed = run[-1]
    sealed.synced = False  # a roll: the active segment is marked, then sealed
    segments.append(CountedSegment(10_010, 10_010))  # type: ignore[arg-type]
    assert segments.unsynced_sealed() == [sealed]
    sealed.synced = True  # its group commit
    assert segments.unsynced_sealed() == []
    assert segments.unsynced_sealed() == []
    assert reads[0] <= 3, reads[0]
