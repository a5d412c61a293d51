"""The sink cycle: at-least-once (offsets never committed before the sink has the records),
degraded iff 16 failures in a row, stop semantics. No trio, no sleeps.

The state machine drives ``SinkCycle`` against a model: partitioned logs, a group's committed
offsets, a sink that keeps what it accepted, and crashes (a new cycle resumes from the
committed offsets, as a restarted consumer in the group does).
"""

from __future__ import annotations

from typing import NamedTuple

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rivven_connect.core import sink_cycle as sc


class Rec(NamedTuple):
    topic: str
    partition: int
    offset: int


def records(*pairs: tuple[int, int]) -> tuple[Rec, ...]:
    return tuple(Rec("t", p, o) for p, o in pairs)


def polled(*pairs: tuple[int, int]) -> sc.Polled:
    return sc.Polled(records(*pairs), 0)


def written_cycle() -> tuple[sc.SinkCycle, int]:
    cycle = sc.SinkCycle(lambda: 0.5)
    assert cycle.start() == [sc.Poll()]
    [write] = cycle.handle(polled((0, 0), (1, 0), (0, 1)))
    assert isinstance(write, sc.Write)
    return cycle, write.batch_id


def test_commit_follows_the_write_and_names_the_next_offsets():
    cycle, batch_id = written_cycle()
    [commit] = cycle.handle(sc.WriteCompleted(batch_id, 1))
    assert commit == sc.Commit(batch_id, ((("t", 0), 2), (("t", 1), 1)))
    assert cycle.handle(sc.CommitCompleted(batch_id, 2)) == [sc.Poll()]
    status = cycle.status()
    assert status.position == {"t/0": 2, "t/1": 1} and status.records == 3


def test_an_empty_poll_polls_again():
    cycle = sc.SinkCycle(lambda: 0.0)
    cycle.start()
    assert cycle.handle(sc.Polled((), 0)) == [sc.Poll()]


def test_a_failed_commit_retries_the_commit_not_the_write():
    cycle, batch_id = written_cycle()
    cycle.handle(sc.WriteCompleted(batch_id, 0))
    [wake] = cycle.handle(sc.CommitFailed(batch_id, "timeout", True, 1000))
    assert isinstance(wake, sc.WakeAt) and 1050 <= wake.at_ms <= 1100
    [again] = cycle.handle(sc.TimerFired(wake.at_ms))
    assert isinstance(again, sc.Commit)


def test_a_failed_write_retries_the_write():
    cycle, batch_id = written_cycle()
    [wake] = cycle.handle(sc.WriteFailed(batch_id, "503", True, 0))
    [again] = cycle.handle(sc.TimerFired(wake.at_ms))
    assert again == sc.Write(batch_id, records((0, 0), (1, 0), (0, 1)))


def test_a_permanent_write_failure_is_error_and_commits_nothing():
    cycle, batch_id = written_cycle()
    assert cycle.handle(sc.WriteFailed(batch_id, "400", False, 0)) == [sc.Halt(sc.Status.ERROR)]
    assert cycle.status().position == {} and "400" in cycle.status().last_error


def test_a_reassigned_commit_abandons_the_batch_and_polls():
    cycle, batch_id = written_cycle()
    cycle.handle(sc.WriteCompleted(batch_id, 0))
    assert cycle.handle(sc.CommitFailed(batch_id, "gen", False, 0, reassigned=True)) == [
        sc.Poll()]
    assert cycle.status().abandoned == 1 and cycle.status().position == {}


def test_degraded_after_exactly_16_failures_and_running_after_one_success():
    cycle, batch_id = written_cycle()
    cycle.handle(sc.WriteCompleted(batch_id, 0))
    now = 0
    for failure in range(1, 17):
        assert cycle.status().state is sc.Status.RUNNING
        [wake] = cycle.handle(sc.CommitFailed(batch_id, "down", True, now))
        assert wake.at_ms - now <= sc.backoff_max_ms
        now = wake.at_ms
        cycle.handle(sc.TimerFired(now))
        assert cycle.status().consecutive_failures == failure
    assert cycle.status().state is sc.Status.DEGRADED
    cycle.handle(sc.CommitCompleted(batch_id, now))
    assert cycle.status().state is sc.Status.RUNNING
    assert cycle.status().consecutive_failures == 0


def test_stop_during_the_write_still_commits_then_halts():
    cycle, batch_id = written_cycle()
    assert cycle.handle(sc.StopRequested(0)) == []
    [commit] = cycle.handle(sc.WriteCompleted(batch_id, 0))
    assert isinstance(commit, sc.Commit)
    assert cycle.handle(sc.CommitCompleted(batch_id, 0)) == [sc.Halt(sc.Status.STOPPED)]


def test_stop_while_polling_or_backing_off_halts_at_once():
    cycle = sc.SinkCycle(lambda: 0.0)
    cycle.start()
    assert cycle.handle(sc.StopRequested(0)) == [sc.Halt(sc.Status.STOPPED)]
    cycle, batch_id = written_cycle()
    cycle.handle(sc.WriteFailed(batch_id, "x", True, 0))
    assert cycle.handle(sc.StopRequested(0)) == [sc.Halt(sc.Status.STOPPED)]
    assert cycle.handle(sc.TimerFired(0)) == []


def test_events_out_of_turn_are_programmer_errors():
    cycle, batch_id = written_cycle()
    with pytest.raises(AssertionError):
        cycle.handle(sc.CommitCompleted(batch_id, 0))
    with pytest.raises(AssertionError):
        cycle.handle(sc.WriteCompleted(batch_id + 1, 0))


# --- the model-based state machine --------------------------------------------------------------

PARTITIONS = 3


class SinkCycleMachine(RuleBasedStateMachine):
    """Logs → consumer (from the group's commit) → cycle → sink; crashes restart the cycle."""

    def __init__(self) -> None:
        super().__init__()
        self.logs: list[int] = [0] * PARTITIONS  # records appended per partition
        self.group: dict[tuple[str, int], int] = {}  # committed next offsets
        self.accepted: list[Rec] = []  # what the sink has (duplicates included)
        self.failures_in_a_row = 0
        self.now = 0
        self._restart()

    def _restart(self) -> None:
        self.cycle = sc.SinkCycle(lambda: 0.25)
        self.positions = [self.group.get(("t", p), 0) for p in range(PARTITIONS)]
        self.pending = self.cycle.start()
        self.failures_in_a_row = 0

    @property
    def instruction(self) -> sc.Instruction | None:
        return self.pending[-1] if self.pending else None

    def _feed(self, event: sc.Event) -> None:
        self.now += 1
        self.pending = self.cycle.handle(event)

    @rule(partition=st.integers(0, PARTITIONS - 1), count=st.integers(1, 4))
    def append(self, partition: int, count: int) -> None:
        self.logs[partition] += count

    @precondition(lambda self: isinstance(self.instruction, sc.Poll))
    @rule(limit=st.integers(0, 5))
    def poll(self, limit: int) -> None:
        out: list[Rec] = []
        for p in range(PARTITIONS):
            while self.positions[p] < self.logs[p] and len(out) < limit:
                out.append(Rec("t", p, self.positions[p]))
                self.positions[p] += 1
        self._feed(sc.Polled(tuple(out), self.now))

    @precondition(lambda self: isinstance(self.instruction, sc.Write))
    @rule(outcome=st.sampled_from(["ok", "ok", "retriable"]))
    def write(self, outcome: str) -> None:
        write = self.instruction
        assert isinstance(write, sc.Write)
        if outcome == "ok":
            self.accepted.extend(write.records)
            self._feed(sc.WriteCompleted(write.batch_id, self.now))
        else:
            self.failures_in_a_row += 1
            self._feed(sc.WriteFailed(write.batch_id, "503", True, self.now))

    @precondition(lambda self: isinstance(self.instruction, sc.Commit))
    @rule(outcome=st.sampled_from(["ok", "ok", "retriable", "retriable", "reassigned"]))
    def commit(self, outcome: str) -> None:
        commit = self.instruction
        assert isinstance(commit, sc.Commit)
        accepted = {(r.topic, r.partition, r.offset) for r in self.accepted}
        for (topic, partition), offset in commit.offsets:  # the property under test
            assert all((topic, partition, o) in accepted for o in range(offset)), (
                "an offset committed before the sink had every record below it")
        if outcome == "ok":
            self.group.update(dict(commit.offsets))
            self.failures_in_a_row = 0
            self._feed(sc.CommitCompleted(commit.batch_id, self.now))
        elif outcome == "retriable":
            self.failures_in_a_row += 1
            self._feed(sc.CommitFailed(commit.batch_id, "timeout", True, self.now))
        else:  # the group moved on: the new owner reads from the last commit
            self.failures_in_a_row += 1
            self._feed(sc.CommitFailed(commit.batch_id, "gen", False, self.now, reassigned=True))
            self.positions = [self.group.get(("t", p), 0) for p in range(PARTITIONS)]

    @precondition(lambda self: isinstance(self.instruction, sc.WakeAt))
    @rule()
    def timer(self) -> None:
        wake = self.instruction
        assert isinstance(wake, sc.WakeAt) and wake.at_ms > self.now
        self.now = wake.at_ms
        self._feed(sc.TimerFired(self.now))

    @precondition(lambda self: isinstance(self.instruction, (sc.Write, sc.Commit)))
    @rule(count=st.integers(10, 20))
    def outage(self, count: int) -> None:
        """``count`` failed attempts in a row (the sink or the group coordinator is down)."""
        for _ in range(count):
            step = self.instruction
            if isinstance(step, sc.Write):
                self._feed(sc.WriteFailed(step.batch_id, "down", True, self.now))
            elif isinstance(step, sc.Commit):
                self._feed(sc.CommitFailed(step.batch_id, "down", True, self.now))
            else:
                return
            self.failures_in_a_row += 1
            if not isinstance(self.instruction, sc.WakeAt):
                return  # halted: a stop was pending
            self.timer()

    @rule()
    def crash(self) -> None:
        self._restart()

    @precondition(lambda self: self.cycle.phase is not sc.SinkPhase.DONE)
    @rule()
    def stop(self) -> None:
        phase = self.cycle.phase
        out = self.cycle.handle(sc.StopRequested(self.now))
        if phase in (sc.SinkPhase.WRITING, sc.SinkPhase.COMMITTING):
            assert out == []  # the in-flight instruction stays pending
        else:
            assert out == [sc.Halt(sc.Status.STOPPED)]
            self.pending = out

    @invariant()
    def degraded_iff_16_failures_in_a_row(self) -> None:
        state = self.cycle.status().state
        if state in (sc.Status.RUNNING, sc.Status.DEGRADED):
            assert (state is sc.Status.DEGRADED) == (
                self.failures_in_a_row >= sc.commit_failure_threshold)

    @invariant()
    def committed_records_are_in_the_sink_in_partition_order(self) -> None:
        self.cycle.check_invariants()
        for (topic, partition), offset in self.group.items():
            seen = [r.offset for r in self.accepted if r.partition == partition]
            assert set(range(offset)) <= set(seen)
            # the first delivery of each offset comes in order
            firsts = list(dict.fromkeys(seen))
            assert firsts == sorted(firsts)


SinkCycleMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=120,
                                              deadline=None)
TestSinkCycleMachine = SinkCycleMachine.TestCase
