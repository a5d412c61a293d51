"""The Raft journal on a crashing in-memory disk: what was synced survives, nothing else does."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rivven_broker.server.cluster.raft_journal import JournalCorruption, RaftJournal, SnapshotStore
from rivven_broker.storage.memory_store import MemoryFileStore

DIRECTORY = "raft/journal"


def _sync(journal: RaftJournal) -> None:
    plan = journal.sync_plan()
    if plan is not None:
        plan()


def _entries(journal: RaftJournal) -> list[tuple[bytes, int, int]]:
    return [journal[i] for i in range(len(journal))]


def test_synced_entries_term_vote_and_commit_survive_a_crash():
    disk = MemoryFileStore()
    journal = RaftJournal(disk, DIRECTORY)
    for index in range(1, 6):
        journal.add(b"c%d" % index, index, 1)
    journal.setCurrentTerm(3, 2)
    journal.setRaftCommitIndex(4)
    _sync(journal)
    journal.add(b"lost", 6, 3)  # never synced
    journal.setCurrentTerm(4, None)
    disk.crash()
    again = RaftJournal(disk, DIRECTORY)
    assert _entries(again) == [(b"c%d" % i, i, 1) for i in range(1, 6)]
    assert (again.getCurrentTerm(), again.getVotedForNodeId(), again.getRaftCommitIndex()) == (3, 2, 4)


def test_a_torn_tail_is_cut_at_the_last_whole_entry():
    disk = MemoryFileStore()
    journal = RaftJournal(disk, DIRECTORY)
    journal.add(b"kept", 1, 1)
    _sync(journal)
    journal.add(b"x" * 500, 2, 1)
    disk.crash(random.Random(1), tear_last_write=True)
    again = RaftJournal(disk, DIRECTORY)
    assert _entries(again) == [(b"kept", 1, 1)]
    assert again.torn_bytes > 0
    again.add(b"next", 2, 2)  # appends right after the cut
    _sync(again)
    disk.crash()
    assert _entries(RaftJournal(disk, DIRECTORY)) == [(b"kept", 1, 1), (b"next", 2, 2)]


def test_the_commit_index_is_clamped_to_the_journal():
    disk = MemoryFileStore()
    journal = RaftJournal(disk, DIRECTORY)
    journal.add(b"a", 1, 1)
    journal.setRaftCommitIndex(5)  # as after a crash that kept meta but not the entries
    _sync(journal)
    disk.crash()
    assert RaftJournal(disk, DIRECTORY).getRaftCommitIndex() == 1


def test_compaction_keeps_the_suffix_across_a_crash():
    disk = MemoryFileStore()
    journal = RaftJournal(disk, DIRECTORY)
    for index in range(1, 11):
        journal.add(b"e%d" % index, index, 1)
    _sync(journal)
    journal.deleteEntriesTo(7)
    disk.crash()
    assert [e[1] for e in _entries(RaftJournal(disk, DIRECTORY))] == [8, 9, 10]


def test_both_meta_slots_damaged_is_refused():
    disk = MemoryFileStore()
    journal = RaftJournal(disk, DIRECTORY)
    for term in (1, 2):
        journal.setCurrentTerm(term, 1)
        _sync(journal)
    disk.corrupt(f"{DIRECTORY}/meta", 10, b"\xff")
    disk.corrupt(f"{DIRECTORY}/meta", 74, b"\xff")
    disk.crash()
    with pytest.raises(JournalCorruption):
        RaftJournal(disk, DIRECTORY)


def test_one_damaged_meta_slot_falls_back_to_the_other():
    disk = MemoryFileStore()
    journal = RaftJournal(disk, DIRECTORY)
    journal.setCurrentTerm(1, 1)
    _sync(journal)  # slot 1
    journal.setCurrentTerm(2, 3)
    _sync(journal)  # slot 0
    disk.corrupt(f"{DIRECTORY}/meta", 10, b"\xff")
    disk.crash()
    again = RaftJournal(disk, DIRECTORY)
    assert (again.getCurrentTerm(), again.getVotedForNodeId()) == (1, 1)


def test_snapshots_are_replaced_whole():
    disk = MemoryFileStore()
    store = SnapshotStore(disk, "raft/snapshot")
    assert not store.exists()
    store.write(b"first")
    store.write(b"second")
    disk.crash()
    assert SnapshotStore(disk, "raft/snapshot").read() == b"second"
    disk.corrupt("raft/snapshot/snapshot", 9, b"X")
    with pytest.raises(JournalCorruption):
        SnapshotStore(disk, "raft/snapshot").read()


OPS = st.lists(st.one_of(
    st.tuples(st.just("add"), st.binary(max_size=40)),
    st.tuples(st.just("delete_from"), st.integers(0, 8)),
    st.tuples(st.just("term"), st.integers(0, 3)),
    st.just(("sync",)),
    st.tuples(st.just("crash"), st.booleans()),
), max_size=40)


@settings(max_examples=200, deadline=None)
@given(OPS, st.randoms(use_true_random=False))
def test_after_any_crash_the_journal_is_what_was_last_synced(ops, rng):
    disk = MemoryFileStore()
    journal = RaftJournal(disk, DIRECTORY)
    live: list[tuple[bytes, int, int]] = []
    term = [0, None]
    durable = (list(live), list(term))
    for op in ops:
        if op[0] == "add":
            entry = (op[1], live[-1][1] + 1 if live else 1, term[0])
            journal.add(*entry)
            live.append(entry)
        elif op[0] == "delete_from":  # a cut into synced entries is durable at once
            journal.deleteEntriesFrom(op[1])
            del live[op[1]:]
            del durable[0][op[1]:]
        elif op[0] == "term":
            term = [term[0] + op[1], 1]
            journal.setCurrentTerm(*term)
        elif op[0] == "sync":
            _sync(journal)
            durable = (list(live), list(term))
        else:
            disk.crash(rng, tear_last_write=op[1])
            journal = RaftJournal(disk, DIRECTORY)
            live, term = durable[0], durable[1]
            live = list(live)
            term = list(term)
        assert _entries(journal) == live
        if op[0] == "crash":
            assert [journal.getCurrentTerm(), journal.getVotedForNodeId()] == term
