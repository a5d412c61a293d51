"""Transactions in one partition: open transactions, the last stable offset, markers, and the
aborted-transaction index a read_committed fetch uses.

Method: write interleaved transactional and plain batches of several producers through the
``Log`` helper of test_producer_state, end transactions with COMMIT/ABORT markers, feed the
aborted completions to an ``AbortedTxnIndex`` and compare what a read_committed reader would
see (records below the LSO, minus aborted ranges, minus markers) with a brute-force model over
the stored batches. The index's file form must survive a reopen, cut a torn tail, and truncate
both ends.
"""

from __future__ import annotations

import random

import pytest

from rivven_broker.storage.producer_state import ProducerStateManager
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.records.control import ControlType
from rivven_broker.storage.memory_store import MemoryFileStore
from rivven_broker.storage.txn_index import (
    ENTRY_BYTES,
    FILE_HEADER_BYTES,
    TXN_INDEX_FILE,
    AbortedTxn,
    AbortedTxnIndex,
    TxnIndexFile,
    decode_index,
)
from tests.unit.storage.test_producer_state import Log, header


def test_an_open_transaction_holds_back_the_last_stable_offset():
    log = Log()
    log.produce(header(pid=1, seq=0, count=2))  # 0-1 plain
    log.produce(header(pid=2, seq=0, txn=True))  # 2 opens pid 2's transaction
    log.produce(header(pid=1, seq=2))  # 3
    assert log.state.first_unstable_offset() == 2
    assert log.state.last_stable_offset(high_watermark=4) == 2
    assert log.state.last_stable_offset(high_watermark=1) == 1  # capped by the watermark
    completed = log.marker(ControlType.COMMIT, pid=2)  # 4
    assert completed.committed and (completed.first_offset, completed.last_offset) == (2, 4)
    assert completed.aborted_entry() is None
    assert log.state.last_stable_offset(high_watermark=5) == 5


def test_the_oldest_open_transaction_decides():
    log = Log()
    log.produce(header(pid=1, seq=0, txn=True))  # 0
    log.produce(header(pid=2, seq=0, txn=True))  # 1
    log.produce(header(pid=1, seq=1, txn=True))  # 2: same transaction, first stays 0
    assert log.state.ongoing_transactions() == {1: 0, 2: 1}
    completed = log.marker(ControlType.ABORT, pid=1)  # 3
    assert completed.last_stable_offset == 1  # producer 2 is still open
    assert completed.aborted_entry() == AbortedTxn(1, 0, 3, 1)
    assert log.state.last_stable_offset(high_watermark=4) == 1
    log.marker(ControlType.ABORT, pid=2)  # 4
    assert log.state.last_stable_offset(high_watermark=5) == 5


def test_writes_outside_the_open_transaction_are_refused():
    log = Log()
    log.produce(header(seq=0, txn=True))
    assert log.produce(header(seq=1)).error_code == ErrorCode.INVALID_TXN_STATE
    assert log.produce(header(seq=1, txn=True)).should_append
    log.marker(ControlType.COMMIT)
    assert log.produce(header(seq=2)).should_append  # the next write may be plain again


def test_a_marker_with_a_bumped_epoch_fences_the_old_producer():
    log = Log()
    log.produce(header(seq=0, txn=True))
    log.marker(ControlType.ABORT, epoch=1)  # the coordinator aborted and bumped the epoch
    assert log.produce(header(epoch=0, seq=1, txn=True)).error_code == ErrorCode.PRODUCER_FENCED
    assert log.state.check_marker(PID_OF_LOG, 0).error_code == ErrorCode.PRODUCER_FENCED
    assert log.state.first_unstable_offset() is None
    assert log.produce(header(epoch=2, seq=0, txn=True)).should_append


PID_OF_LOG = 7


def test_a_marker_without_data_here_closes_nothing_and_indexes_nothing():
    log = Log()
    completed = log.marker(ControlType.ABORT, pid=9)
    assert not completed.had_data and completed.aborted_entry() is None
    assert log.state.producers()[9].epoch == 0


# --- read_committed against a brute-force model ----------------------------------------------


def _committed_view(log: Log, index: AbortedTxnIndex, high_watermark: int) -> list[int]:
    """Offsets a read_committed consumer keeps, computed the way a consumer does it."""
    lso = log.state.last_stable_offset(high_watermark)
    aborted = sorted(index.aborted_in(0, lso), key=lambda item: item[1])
    dropping: set[int] = set()
    kept = []
    for h, kind in log.stored:
        if h.base_offset >= lso:
            break
        while aborted and aborted[0][1] <= h.base_offset:
            dropping.add(aborted.pop(0)[0])
        if kind is not None:
            dropping.discard(h.producer_id)
            continue
        if h.is_transactional and h.producer_id in dropping:
            continue
        kept.extend(range(h.base_offset, h.base_offset + h.last_offset_delta + 1))
    return kept


def _model_view(log: Log, decisions: dict[tuple[int, int], bool], high_watermark: int):
    """Brute force: a transactional batch is visible iff its transaction committed and the
    whole transaction ended below the LSO; plain batches are visible below the LSO."""
    lso = log.state.last_stable_offset(high_watermark)
    kept = []
    for h, kind in log.stored:
        if kind is not None or h.base_offset >= lso:
            continue
        if h.is_transactional and not decisions.get((h.producer_id, h.base_offset), False):
            continue
        kept.extend(range(h.base_offset, h.base_offset + h.last_offset_delta + 1))
    return kept


@pytest.mark.parametrize("seed", range(30))
def test_read_committed_sees_exactly_the_committed_records(seed):
    rng = random.Random(seed)
    log, index = Log(), AbortedTxnIndex()
    sequences = {pid: 0 for pid in range(1, 5)}
    open_batches: dict[int, list[int]] = {}
    decisions: dict[tuple[int, int], bool] = {}
    for _ in range(60):
        pid = rng.randrange(1, 5)
        action = rng.random()
        if pid in open_batches and action < 0.3:
            committed = rng.random() < 0.5
            completed = log.marker(ControlType.COMMIT if committed else ControlType.ABORT, pid=pid)
            for base in open_batches.pop(pid):
                decisions[(pid, base)] = committed
            entry = completed.aborted_entry()
            if entry is not None:
                index.append(entry)
        else:
            txn = pid <= 2 or pid in open_batches  # producers 1, 2 transactional; 3, 4 plain
            count = rng.randrange(1, 4)
            verdict = log.produce(header(pid=pid, seq=sequences[pid], count=count, txn=txn))
            assert verdict.should_append
            sequences[pid] += count
            if txn:
                open_batches.setdefault(pid, []).append(log.stored[-1][0].base_offset)
        index.check_invariants()
        high_watermark = rng.randrange(0, log.state.end_offset + 1)
        assert _committed_view(log, index, high_watermark) == _model_view(
            log, decisions, high_watermark
        )
    # read_uncommitted sees every data record, open transactions included
    uncommitted = [h for h, kind in log.stored if kind is None]
    assert sum(h.last_offset_delta + 1 for h in uncommitted) == sum(sequences.values())


# --- the index itself ------------------------------------------------------------------------


def _index() -> AbortedTxnIndex:
    return AbortedTxnIndex(
        [
            AbortedTxn(1, 0, 5, 3),  # producer 2's transaction was open from 3
            AbortedTxn(2, 3, 9, 10),
            AbortedTxn(1, 12, 14, 15),
        ]
    )


def test_aborted_in_reports_overlapping_ranges():
    index = _index()
    assert index.aborted_in(0, 1) == [(1, 0)]
    assert index.aborted_in(4, 6) == [(1, 0), (2, 3)]
    assert index.aborted_in(6, 12) == [(2, 3)]
    assert index.aborted_in(10, 12) == []
    assert index.aborted_in(10, 100) == [(1, 12)]
    assert index.aborted_in(5, 5) == []
    index.check_invariants()


def test_truncation_at_both_ends():
    index = _index()
    assert index.truncate_to(9) == 2  # the second marker is gone with the log's tail
    assert index.entries() == [AbortedTxn(1, 0, 5, 3)]
    index = _index()
    assert index.truncate_head(6) == 1
    assert [e.last_offset for e in index.entries()] == [9, 14]


def test_the_file_survives_a_reopen_and_a_crash_after_fsync():
    store = MemoryFileStore()
    store.makedirs("t-0")
    store.fsync_dir("")  # the partition directory is durable (the log's job)
    path = f"t-0/{TXN_INDEX_FILE}"
    file = TxnIndexFile(store, path)
    for entry in _index().entries():
        file.append(entry)
    file.fsync()
    file.append(AbortedTxn(3, 15, 20, 21))  # not synced
    file.close()
    store.crash()
    reopened = TxnIndexFile(store, path)
    assert reopened.repair is None
    assert reopened.index.entries() == _index().entries()
    assert reopened.truncate_to(9) == 2
    assert reopened.truncate_head(0) == 0
    reopened.close()
    again = TxnIndexFile(store, path)
    assert again.index.entries() == [AbortedTxn(1, 0, 5, 3)]
    assert again.truncate_head(6) == 1
    assert len(again.index) == 0 and store.exists(path)
    again.close()


def test_a_torn_or_damaged_tail_is_cut_and_reported():
    store = MemoryFileStore()
    file = TxnIndexFile(store, TXN_INDEX_FILE)
    for entry in _index().entries():
        file.append(entry)
    file.close()
    handle = store.open(TXN_INDEX_FILE)
    size = store.size(handle)
    store.truncate(handle, size - 5)  # a torn last entry
    store.close(handle)
    reopened = TxnIndexFile(store, TXN_INDEX_FILE)
    assert "torn" in reopened.repair and len(reopened.index) == 2
    reopened.close()
    handle = store.open(TXN_INDEX_FILE)
    assert store.size(handle) == FILE_HEADER_BYTES + 2 * ENTRY_BYTES
    store.pwrite(handle, b"\xff", FILE_HEADER_BYTES + ENTRY_BYTES + 3)
    data = store.pread(handle, store.size(handle), 0)
    store.close(handle)
    entries, valid, problem = decode_index(data)
    assert len(entries) == 1 and valid == FILE_HEADER_BYTES + ENTRY_BYTES
    assert "CRC" in problem
    assert decode_index(b"nope" + data[4:])[2].startswith("bad header")


def test_out_of_order_entries_are_programmer_errors():
    index = _index()
    with pytest.raises(AssertionError):
        index.append(AbortedTxn(1, 0, 14, 15))  # last offset does not increase


def test_rebuilt_index_equals_the_live_one():
    log, index = Log(), AbortedTxnIndex()
    log.produce(header(pid=1, seq=0, txn=True))
    log.produce(header(pid=2, seq=0, txn=True))
    index.append(log.marker(ControlType.ABORT, pid=1).aborted_entry())
    log.produce(header(pid=1, seq=1, txn=True))
    index.append(log.marker(ControlType.ABORT, pid=2).aborted_entry())
    index.append(log.marker(ControlType.ABORT, pid=1).aborted_entry())
    rebuilt_state, rebuilt = ProducerStateManager(), AbortedTxnIndex()
    for h, kind in log.stored:
        completed = rebuilt_state.load_batch(h, kind)
        entry = completed and completed.aborted_entry()
        if entry:
            rebuilt.append(entry)
    assert rebuilt.entries() == index.entries()
    assert rebuilt.encode() == index.encode()
