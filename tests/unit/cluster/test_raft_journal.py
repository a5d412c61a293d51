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
    st.tuples(st.just("add"), st.sampled_from([b"", b"a", b"b" * 40]), st.integers(0, 2)),
    st.tuples(st.just("delete_from"), st.integers(0, 8)),
    st.tuples(st.just("term"), st.integers(0, 3)),
    st.just(("sync",)),
    st.tuples(st.just("crash"), st.booleans()),
), max_size=40)


@settings(max_examples=200, deadline=None)
@given(OPS, st.randoms(use_true_random=False))
def test_after_any_crash_the_journal_is_what_was_last_synced(ops, rng):
    """The model: the file holds the entries in memory followed by those forgotten but kept
    (``deleteEntriesFrom``); an added entry equal to the first kept one takes it back, any other
    cuts the kept ones off (fsynced at once if the cut goes into synced bytes); a sync makes the
    whole file durable; a crash recovers exactly the durable file."""
    disk = MemoryFileStore()
    journal = RaftJournal(disk, DIRECTORY)
    memory: list[tuple[bytes, int, int]] = []
    kept: list[tuple[bytes, int, int]] = []
    synced: list[tuple[bytes, int, int]] = []
    term = [0, None]
    synced_term = list(term)
    for op in ops:
        if op[0] == "add":
            entry = (op[1], memory[-1][1] + 1 if memory else 1, op[2])
            journal.add(*entry)
            if kept and kept[0] == entry:
                kept.pop(0)
            elif kept:
                kept = []
                if len(memory) < len(synced):
                    synced = list(memory)
            memory.append(entry)
        elif op[0] == "delete_from":
            journal.deleteEntriesFrom(op[1])
            kept = memory[op[1]:] + kept
            del memory[op[1]:]
        elif op[0] == "term":
            term = [term[0] + op[1], 1]
            journal.setCurrentTerm(*term)
        elif op[0] == "sync":
            _sync(journal)
            synced, synced_term = memory + kept, list(term)
        else:
            disk.crash(rng, tear_last_write=op[1])
            journal = RaftJournal(disk, DIRECTORY)
            memory, kept, term = list(synced), [], list(synced_term)
            assert [journal.getCurrentTerm(), journal.getVotedForNodeId()] == term
        assert _entries(journal) == memory


def test_a_repeated_append_keeps_acknowledged_entries_on_disk():
    """PySyncObj truncates after an AppendEntries' previous index and appends the same entries
    again when a late answer rewound the leader; the synced entries must survive a crash in
    between, and a real conflict must replace them."""
    disk = MemoryFileStore()
    journal = RaftJournal(disk, DIRECTORY)
    for index in (1, 2, 3):
        journal.add(b"e%d" % index, index, 1)
    _sync(journal)
    journal.deleteEntriesFrom(1)  # as PySyncObj does for AppendEntries(prev=1, [2])
    journal.add(b"e2", 2, 1)
    assert _entries(journal) == [(b"e1", 1, 1), (b"e2", 2, 1)]
    disk.crash()
    assert len(RaftJournal(disk, DIRECTORY)) == 3  # entry 3 was acknowledged: still there
    journal = RaftJournal(disk, DIRECTORY)
    journal.deleteEntriesFrom(1)
    journal.add(b"other", 2, 2)  # a real conflict at index 2
    _sync(journal)
    disk.crash()
    assert _entries(RaftJournal(disk, DIRECTORY)) == [(b"e1", 1, 1), (b"other", 2, 2)]


def test_compaction_keeps_entries_kept_after_memory():
    disk = MemoryFileStore()
    journal = RaftJournal(disk, DIRECTORY)
    for index in range(1, 6):
        journal.add(b"e%d" % index, index, 1)
    _sync(journal)
    journal.deleteEntriesFrom(4)
    journal.deleteEntriesTo(2)
    assert [e[1] for e in _entries(journal)] == [3, 4]
    journal.add(b"e5", 5, 1)
    disk.crash()
    assert [e[1] for e in _entries(RaftJournal(disk, DIRECTORY))] == [3, 4, 5]
