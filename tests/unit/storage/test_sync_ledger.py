"""``SyncLedger`` against a brute-force model of the same bookkeeping.

Method: a Hypothesis ``RuleBasedStateMachine`` issues and settles tickets (some carrying a
staged recovery point), truncates (``clamp``, ``cancel_staged``), records directory changes
and directory fsyncs, and defers segment closes, on a ``SyncLedger`` and on a model made of
plain dicts and lists where each answer is recomputed from scratch: the durable floor is the
least floor of every change newer than the newest directory fsync, the held bases are the
union over the tickets out, and doomed segments come back all at once when no ticket is out.
``check_invariants`` runs after every step.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rivven_broker.storage.sync_ledger import NO_FLOOR, StagedCheckpoint, SyncLedger

BASES = st.frozensets(st.integers(0, 8).map(lambda i: i * 100), max_size=4)


class SyncLedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ledger = SyncLedger()
        self.log_end_offset = 0
        self.tickets: dict[int, tuple[int, frozenset[int]]] = {}  # id -> (end, bases)
        self.staged: dict[int, StagedCheckpoint] = {}
        self.changes: list[tuple[int, int | None]] = []  # every change ever
        self.covered = 0  # the newest generation a directory fsync covered
        self.doomed: list[object] = []
        self.ids: set[int] = set()

    @rule(records=st.integers(0, 50))
    def append(self, records: int) -> None:
        self.log_end_offset += records

    @rule(bases=BASES, with_checkpoint=st.booleans(), value=st.integers(0, 1000))
    def issue(self, bases: frozenset[int], with_checkpoint: bool, value: int) -> None:
        ticket_id = self.ledger.next_ticket_id()
        assert ticket_id not in self.ids
        self.ids.add(ticket_id)
        if with_checkpoint and not self.ledger.staging:
            self.ledger.recovery_point_due = True
            staged = StagedCheckpoint(ticket_id, f"tmp-{ticket_id}", value)
            self.ledger.stage(ticket_id, staged)
            assert not self.ledger.recovery_point_due
            self.staged[ticket_id] = staged
        self.ledger.issue(ticket_id, self.log_end_offset, bases)
        self.tickets[ticket_id] = (self.log_end_offset, bases)

    @precondition(lambda self: self.tickets)
    @rule(data=st.data())
    def settle(self, data: st.DataObject) -> None:
        ticket_id = data.draw(st.sampled_from(sorted(self.tickets)))
        end, _ = self.tickets.pop(ticket_id)
        assert self.ledger.settle(ticket_id) == (end, self.staged.pop(ticket_id, None))

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        cut = data.draw(st.integers(0, self.log_end_offset))
        self.ledger.cancel_staged()
        self.ledger.clamp(cut)
        self.log_end_offset = cut
        self.tickets = {i: (min(end, cut), bases) for i, (end, bases) in self.tickets.items()}
        assert all(staged.cancelled for staged in self.staged.values())

    @rule(floor=st.none() | st.integers(0, 1000))
    def directory_changed(self, floor: int | None) -> None:
        self.ledger.directory_changed(floor)
        self.changes.append((self.ledger.directory_generation, floor))
        assert self.ledger.directory_generation == len(self.changes)

    @rule(data=st.data())
    def directory_synced(self, data: st.DataObject) -> None:
        generation = data.draw(st.integers(0, len(self.changes)))
        self.ledger.directory_synced(generation)
        self.covered = max(self.covered, generation)

    @precondition(lambda self: self.tickets)
    @rule()
    def defer_close(self) -> None:
        segment = object()
        self.ledger.defer_close(segment)  # type: ignore[arg-type]
        self.doomed.append(segment)

    @rule()
    def release_doomed(self) -> None:
        released = self.ledger.release_doomed()
        if self.tickets:
            assert released == []
        else:
            assert released == self.doomed
            self.doomed = []

    @invariant()
    def same_as_the_model(self) -> None:
        self.ledger.check_invariants(self.log_end_offset)
        assert self.ledger.outstanding == len(self.tickets)
        assert self.ledger.doomed == len(self.doomed)
        pending = [floor for generation, floor in self.changes if generation > self.covered]
        assert self.ledger.directory_dirty == bool(pending)
        floors = [floor for floor in pending if floor is not None]
        assert self.ledger.durable_floor() == min(floors, default=NO_FLOOR)
        assert self.ledger.held_bases() == frozenset().union(
            *(bases for _, bases in self.tickets.values()))
        assert self.ledger.staging == bool(self.staged)


SyncLedgerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40,
                                               deadline=None)
TestSyncLedger = SyncLedgerMachine.TestCase


def test_abandon_hands_back_what_the_log_must_close() -> None:
    ledger = SyncLedger()
    ticket_id = ledger.next_ticket_id()
    staged = StagedCheckpoint(7, "tmp", 10)
    ledger.recovery_point_due = True
    ledger.stage(ticket_id, staged)
    ledger.issue(ticket_id, 10, frozenset({0}))
    segment = object()
    ledger.defer_close(segment)  # type: ignore[arg-type]
    assert ledger.release_doomed() == []  # a ticket is out
    assert ledger.abandon() == ([segment], [staged])
    assert ledger.abandon() == ([], [])
