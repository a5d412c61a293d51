"""ProducerStateManager: the idempotence rules, rebuild from the log and snapshots.

Method: drive one manager with batch headers built by ``header()`` (the fields the manager
reads; a test with real batch bytes checks that parsed headers behave the same) and check each
verdict of the module docstring's table: in-sequence, duplicates within the last five batches
(answered with the original offsets), older duplicates, gaps, unknown producers, fencing, new
epochs, sequence wrap-around. Rebuilding by replaying the stamped headers, and restoring a
snapshot then replaying the rest, must give exactly the live state.
"""

from __future__ import annotations

import crc32c
import msgpack
import pytest

from rivven_broker.storage.producer_state import (
    SEQUENCE_MAX,
    CorruptSnapshotError,
    ProducerStateManager,
    increment_sequence,
)
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.records.builder import BatchBuilder
from rivven_broker.records.control import ControlType, build_control_batch, read_control_batch
from rivven_broker.records.header import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    BatchHeader,
    stamp,
    validate,
)

PID = 7


def header(
    *,
    pid: int = PID,
    epoch: int = 0,
    seq: int = 0,
    count: int = 1,
    base_offset: int = 0,
    txn: bool = False,
    control: bool = False,
    ts: int = 1_000,
) -> BatchHeader:
    """A batch header with the fields the producer state reads."""
    attributes = (ATTR_TRANSACTIONAL if txn or control else 0) | (ATTR_CONTROL if control else 0)
    return BatchHeader(
        base_offset=base_offset,
        batch_length=49 + 10 * count,
        partition_leader_epoch=-1,
        magic=2,
        crc=0,
        attributes=attributes,
        last_offset_delta=count - 1,
        first_timestamp=ts,
        max_timestamp=ts,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq if pid >= 0 else -1,
        record_count=count,
    )


class Log:
    """A manager plus the stamped headers it accepted (the partition log's view)."""

    def __init__(self) -> None:
        self.state = ProducerStateManager()
        self.stored: list[tuple[BatchHeader, ControlType | None]] = []

    def produce(self, h: BatchHeader):
        verdict = self.state.check(h)
        if verdict.should_append:
            base = self.state.end_offset
            self.state.update(h, base)
            self.stored.append((h._replace(base_offset=base), None))
        self.state.check_invariants()
        return verdict

    def marker(self, kind: ControlType, *, pid: int = PID, epoch: int = 0):
        h = header(pid=pid, epoch=epoch, control=True, seq=0)
        h = h._replace(base_sequence=-1)
        assert self.state.check_marker(pid, epoch).should_append
        base = self.state.end_offset
        completed = self.state.update(h, base, kind)
        self.stored.append((h._replace(base_offset=base), kind))
        self.state.check_invariants()
        return completed


def test_sequences_start_at_zero_and_advance():
    log = Log()
    assert log.produce(header(seq=0, count=3)).should_append
    assert log.produce(header(seq=3, count=2)).should_append
    info = log.state.producers()[PID]
    assert [(b.first_seq, b.last_seq, b.first_offset, b.last_offset) for b in info.batches] == [
        (0, 2, 0, 2),
        (3, 4, 3, 4),
    ]
    assert log.state.end_offset == 5


def test_a_duplicate_within_the_last_five_gets_its_original_offsets():
    log = Log()
    for i in range(6):
        log.produce(header(seq=2 * i, count=2))
    end = log.state.end_offset
    for i in range(1, 6):  # the last five batches
        verdict = log.produce(header(seq=2 * i, count=2))
        assert verdict.error_code == ErrorCode.NONE and not verdict.should_append
        assert (verdict.duplicate.first_offset, verdict.duplicate.last_offset) == (2 * i, 2 * i + 1)
    assert log.state.end_offset == end  # nothing written


def test_a_duplicate_older_than_five_batches_is_duplicate_sequence():
    log = Log()
    for i in range(6):
        log.produce(header(seq=i))
    verdict = log.produce(header(seq=0))
    assert verdict.error_code == ErrorCode.DUPLICATE_SEQUENCE and verdict.duplicate is None


def test_a_batch_overlapping_the_last_sequence_is_out_of_order():
    log = Log()
    log.produce(header(seq=0, count=3))
    assert log.produce(header(seq=1, count=5)).error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE
    assert log.produce(header(seq=0, count=2)).error_code == ErrorCode.DUPLICATE_SEQUENCE


def test_a_gap_is_out_of_order_and_writes_nothing():
    log = Log()
    log.produce(header(seq=0))
    verdict = log.produce(header(seq=2))
    assert verdict.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE
    assert "expected sequence 1" in verdict.message
    assert log.state.end_offset == 1


def test_an_unknown_producer_must_start_at_zero():
    log = Log()
    assert log.produce(header(seq=4)).error_code == ErrorCode.UNKNOWN_PRODUCER_ID
    assert log.produce(header(seq=0)).should_append


def test_an_older_epoch_is_fenced_and_a_newer_one_starts_at_zero():
    log = Log()
    log.produce(header(epoch=1, seq=0))
    assert log.produce(header(epoch=0, seq=1)).error_code == ErrorCode.PRODUCER_FENCED
    assert log.produce(header(epoch=2, seq=1)).error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE
    assert log.produce(header(epoch=2, seq=0)).should_append
    info = log.state.producers()[PID]
    assert info.epoch == 2 and len(info.batches) == 1  # the old epoch's batches are gone
    assert log.produce(header(epoch=1, seq=1)).error_code == ErrorCode.PRODUCER_FENCED


def test_sequences_wrap_like_kafka():
    assert increment_sequence(SEQUENCE_MAX, 1) == 0
    assert increment_sequence(SEQUENCE_MAX - 2, 5) == 2
    log = Log()
    log.state.load_batch(header(seq=SEQUENCE_MAX - 9, count=5, base_offset=0))
    assert log.produce(header(seq=SEQUENCE_MAX - 4, count=7)).should_append  # last seq 1
    assert log.produce(header(seq=2)).should_append
    dup = log.produce(header(seq=SEQUENCE_MAX - 4, count=7))
    assert dup.duplicate is not None and dup.duplicate.first_offset == 5
    assert log.produce(header(seq=SEQUENCE_MAX - 9, count=5)).duplicate is not None
    assert log.produce(header(seq=4)).error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE


def test_plain_batches_pass_and_bad_ones_are_refused():
    log = Log()
    assert log.produce(header(pid=-1, epoch=-1)).should_append
    assert log.state.producers() == {}
    bad = [
        header(pid=-1, epoch=-1, txn=True),
        header(control=True),
        header(epoch=-1),
        header()._replace(base_sequence=-1),
    ]
    for h in bad:
        assert log.produce(h).error_code == ErrorCode.INVALID_REQUEST


def test_producers_are_independent():
    log = Log()
    log.produce(header(pid=1, seq=0))
    log.produce(header(pid=2, seq=0))
    assert log.produce(header(pid=1, seq=1)).should_append
    assert log.produce(header(pid=2, seq=2)).error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE


def _workload(log: Log) -> None:
    for i in range(8):
        log.produce(header(pid=1, seq=i, ts=100 + i))
    log.produce(header(pid=2, seq=0, count=4, txn=True))
    log.produce(header(pid=3, seq=0, txn=True))
    log.marker(ControlType.ABORT, pid=2)
    log.produce(header(pid=2, seq=4, count=2, txn=True))
    log.produce(header(pid=4, epoch=3, seq=0))
    log.marker(ControlType.COMMIT, pid=3, epoch=1)  # a bumped epoch from the coordinator
    log.produce(header(pid=-1, epoch=-1))


def test_rebuilding_from_the_log_gives_the_live_state():
    log = Log()
    _workload(log)
    rebuilt = ProducerStateManager()
    for h, kind in log.stored:
        rebuilt.load_batch(h, kind)
    rebuilt.check_invariants()
    assert rebuilt.producers() == log.state.producers()
    assert rebuilt.ongoing_transactions() == log.state.ongoing_transactions() == {2: 14}
    assert rebuilt.end_offset == log.state.end_offset


@pytest.mark.parametrize("cut", range(0, 14))
def test_a_snapshot_plus_replay_gives_the_live_state(cut):
    log = Log()
    _workload(log)
    partial = ProducerStateManager()
    for h, kind in log.stored[:cut]:
        partial.load_batch(h, kind)
    restored = ProducerStateManager.restore(partial.snapshot())
    assert restored.producers() == partial.producers()
    for h, kind in log.stored[cut:]:
        restored.load_batch(h, kind)
    restored.check_invariants()
    assert restored.producers() == log.state.producers()
    assert restored.ongoing_transactions() == log.state.ongoing_transactions()
    assert restored.snapshot() == log.state.snapshot()


def test_a_restored_state_still_detects_duplicates():
    log = Log()
    for i in range(3):
        log.produce(header(seq=i))
    restored = ProducerStateManager.restore(log.state.snapshot())
    assert restored.check(header(seq=1)).duplicate.first_offset == 1
    assert restored.check(header(seq=3)).should_append


def _with_body(good: bytes, body: object) -> bytes:
    packed = msgpack.packb(body)
    return good[:6] + crc32c.crc32c(packed).to_bytes(4, "big") + packed


@pytest.mark.parametrize(
    "damage",
    [
        lambda good: good[:5],
        lambda good: b"XXXX" + good[4:],
        lambda good: good[:4] + b"\x00\x09" + good[6:],
        lambda good: good[:-1] + bytes([good[-1] ^ 1]),
        lambda good: _with_body(good, [5, [[1, 0, -1, 99, 0, []]]]),  # last offset past end
        lambda good: _with_body(good, [5, [[1, "x"]]]),
        lambda good: _with_body(good, [5, [[1, 0, -1, 1, 0, [[0, 0, 0]]]]]),
        lambda good: _with_body(good, [-1, []]),
    ],
    ids=["short", "magic", "version", "crc", "invariant", "shape", "batch", "end"],
)
def test_damaged_snapshots_are_refused(damage):
    log = Log()
    _workload(log)
    with pytest.raises(CorruptSnapshotError):
        ProducerStateManager.restore(damage(log.state.snapshot()))


def test_expired_and_truncated_producers_are_forgotten_unless_in_a_transaction():
    log = Log()
    log.produce(header(pid=1, seq=0, ts=1_000))
    log.produce(header(pid=2, seq=0, ts=5_000))
    log.produce(header(pid=3, seq=0, ts=1_000, txn=True))
    assert log.state.remove_expired(now_ms=6_000, expiration_ms=4_000) == [1]
    assert sorted(log.state.producers()) == [2, 3]
    assert log.state.truncate_head(log_start_offset=3) == [2]
    assert sorted(log.state.producers()) == [3]
    log.state.check_invariants()
    # forgotten: the next batch of producer 2 is refused as unknown, as the issue asks
    assert log.produce(header(pid=2, seq=1)).error_code == ErrorCode.UNKNOWN_PRODUCER_ID


def test_real_batches_and_control_batches_go_through_the_same_rules():
    state = ProducerStateManager()
    offset = 0
    for seq in (0, 2):
        builder = BatchBuilder(
            batch_bytes_max=4096, producer_id=11, producer_epoch=0, base_sequence=seq,
            transactional=True,
        )
        for i in range(2):
            builder.append(1_000 + i, b"k", b"v")
        batch = builder.build()
        h = validate(batch)
        assert state.check(h).should_append
        state.update(h, offset)
        stored = stamp(offset, h.batch_length, 0) + batch[16:]
        assert validate(stored).base_offset == offset
        offset = h.last_offset_delta + 1 + offset
    assert state.check(validate(batch)).duplicate.first_offset == 2
    control = build_control_batch(ControlType.ABORT, 11, 0, 2_000)
    control_header, record = read_control_batch(control)
    assert state.check(control_header).error_code == ErrorCode.INVALID_REQUEST
    completed = state.update(control_header, offset, record.kind)
    assert completed.aborted_entry() == (11, 0, 4, 5)
    assert state.first_unstable_offset() is None
