"""``SegmentList`` against a plain Python list of segments.

Method: a Hypothesis ``RuleBasedStateMachine`` applies every change a log makes to its run of
segments (roll, pop the oldest, cut after one, replace a sealed one, reset) both to a
``SegmentList`` and to a plain list, and after each step compares every lookup (by offset,
by index, the bases, the sealed part, the active segment) with the answer computed from the
plain list by brute force. The segments are stand-ins: only their offsets matter here.
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
