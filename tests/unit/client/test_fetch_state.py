"""The consumer's fetch state: positions, prefetch bound, epochs, resets, errors.

Method: drive ``FetchState`` with batches built by ``BatchBuilder`` (stamped with real base
offsets) standing in for Fetch answers; check which partitions are fetchable, what
``take_completed`` hands out, what ``decode_completed`` yields, and how ``seek``,
``OFFSET_OUT_OF_RANGE`` and retriable errors change positions. A Hypothesis state machine
then interleaves appends, fetches, answers (some stale), seeks, pauses and consumption against
a model log and checks that records come out exactly in offset order from each position.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rivven_broker.client.errors import CorruptMessageError, OffsetOutOfRangeError
from rivven_broker.client.fetch_state import EARLIEST, LATEST, FetchState, decode_completed
from rivven_broker.client.types import TopicPartition
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.records.builder import BatchBuilder
from rivven_broker.records.header import stamp

TP = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)


def batch(base: int, count: int) -> bytes:
    builder = BatchBuilder(batch_bytes_max=1 << 20)
    for i in range(count):
        builder.append(1000 + i, None, b"v%d" % (base + i))
    data = builder.build()
    return stamp(base, len(data) - 12, 0) + data[16:]


def leader(topic, partition):
    return 1


def fetch_round(state, now=0):
    plans, unknown = state.plan_fetches(now, leader, lambda node: True)
    assert not unknown
    return plans


def test_positions_start_unknown_and_resets_follow_the_policy():
    state = FetchState(auto_offset_reset="earliest")
    state.assign([TP])
    assert state.position(TP) is None
    [(tp, epoch, timestamp)] = state.resets_needed(0)
    assert tp == TP and timestamp == EARLIEST
    state.on_reset(TP, epoch, 7)
    assert state.position(TP) == 7
    assert state.resets_needed(0) == []
    state.check_invariants()


def test_a_response_is_buffered_and_the_partition_waits_until_it_is_taken():
    state = FetchState()
    state.assign([TP])
    state.seek(TP, 0)
    [plan] = fetch_round(state)
    [(tp, epoch, offset)] = plan.partitions
    assert state.fetchable(0) == []  # in flight
    state.on_partition_data(tp, epoch, offset, 0, 10, batch(0, 5) + batch(5, 5), 0)
    assert state.fetchable(0) == []  # buffered: bounded prefetch
    state.check_invariants()
    completed = state.take_completed()
    assert completed.next_offset == 10
    assert state.fetchable(0) == [(TP, epoch, 10)]  # prefetch of the next chunk may start
    records, _ = decode_completed(completed)
    assert [r.offset for r in records] == list(range(10))
    assert records[0].topic == "t" and records[0].partition == 0 and records[0].value == b"v0"
    assert state.advance(TP, epoch, 10)
    assert state.position(TP) == 10
    state.check_invariants()


def test_records_below_the_fetch_offset_are_dropped():
    state = FetchState()
    state.assign([TP])
    state.seek(TP, 3)
    [plan] = fetch_round(state)
    tp, epoch, offset = plan.partitions[0]
    state.on_partition_data(tp, epoch, offset, 0, 5, batch(0, 5), 0)
    assert [r.offset for r in decode_completed(state.take_completed())[0]] == [3, 4]


def test_seek_drops_buffered_and_in_flight_data():
    state = FetchState()
    state.assign([TP, TP1])
    state.seek(TP, 0)
    state.seek(TP1, 0)
    [plan] = fetch_round(state)
    entries = {tp: (epoch, offset) for tp, epoch, offset in plan.partitions}
    epoch0, _ = entries[TP]
    state.on_partition_data(TP, epoch0, 0, 0, 5, batch(0, 5), 0)
    state.seek(TP, 2)  # drops the buffered answer
    assert state.take_completed() is None
    epoch1, _ = entries[TP1]
    state.seek(TP1, 4)  # the answer in flight becomes stale
    state.on_partition_data(TP1, epoch1, 0, 0, 5, batch(0, 5), 0)
    assert state.take_completed() is None
    assert sorted(e[2] for e in state.fetchable(0)) == [2, 4]
    state.check_invariants()


@pytest.mark.parametrize("policy,expected", [("earliest", EARLIEST), ("latest", LATEST)])
def test_out_of_range_resets_by_policy(policy, expected):
    state = FetchState(auto_offset_reset=policy)
    state.assign([TP])
    state.seek(TP, 100)
    [plan] = fetch_round(state)
    tp, epoch, offset = plan.partitions[0]
    out_of_range = int(ErrorCode.OFFSET_OUT_OF_RANGE)
    code = state.on_partition_data(tp, epoch, offset, out_of_range, -1, b"", 0)
    assert code is ErrorCode.OFFSET_OUT_OF_RANGE
    assert state.position(TP) is None
    [(_, _, timestamp)] = state.resets_needed(0)
    assert timestamp == expected
    state.check_invariants()


def test_out_of_range_with_policy_none_is_an_error_until_seek():
    state = FetchState(auto_offset_reset="none")
    state.assign([TP])
    state.seek(TP, 100)
    [plan] = fetch_round(state)
    tp, epoch, offset = plan.partitions[0]
    state.on_partition_data(tp, epoch, offset, int(ErrorCode.OFFSET_OUT_OF_RANGE), -1, b"", 0)
    assert isinstance(state.take_error(), OffsetOutOfRangeError)
    assert isinstance(state.take_error(), OffsetOutOfRangeError)  # sticky
    state.seek(TP, 0)
    assert state.take_error() is None


def test_policy_none_without_position_is_an_error():
    state = FetchState(auto_offset_reset="none")
    state.assign([TP])
    assert state.resets_needed(0) == []
    assert state.take_error().code == "NO_OFFSET"


def test_retriable_partition_errors_back_off():
    state = FetchState(retry_backoff_ms=100)
    state.assign([TP])
    state.seek(TP, 0)
    [plan] = fetch_round(state, now=0)
    tp, epoch, offset = plan.partitions[0]
    state.on_partition_data(tp, epoch, offset, int(ErrorCode.NOT_LEADER), -1, b"", 1000)
    assert state.fetchable(1050) == []
    assert state.next_retry_ms(1050) == 1100
    assert state.fetchable(1100) == [(TP, epoch, 0)]


def test_paused_partitions_are_neither_fetched_nor_returned():
    state = FetchState()
    state.assign([TP])
    state.seek(TP, 0)
    [plan] = fetch_round(state)
    tp, epoch, offset = plan.partitions[0]
    state.on_partition_data(tp, epoch, offset, 0, 5, batch(0, 5), 0)
    state.pause([TP])
    assert state.take_completed() is None and state.fetchable(0) == []
    state.resume([TP])
    assert state.take_completed() is not None


def test_unknown_leaders_and_unready_nodes_are_skipped():
    state = FetchState()
    state.assign([TP])
    state.seek(TP, 0)
    plans, unknown = state.plan_fetches(0, lambda t, p: None, lambda n: True)
    assert plans == [] and unknown
    plans, unknown = state.plan_fetches(0, leader, lambda n: False)
    assert plans == [] and not unknown
    assert state.fetchable(0)  # not marked in flight


def test_a_corrupt_batch_stops_the_partition_there_after_the_records_before_it():
    """Found by probing (issue 16): a damaged batch was skipped with every record around it.
    Now the records before it are handed out, the partition stops at its offset, and every
    later poll raises CorruptMessageError naming the offset until the user seeks past it."""
    state = FetchState()
    state.assign([TP])
    state.seek(TP, 0)
    [plan] = fetch_round(state)
    tp, epoch, offset = plan.partitions[0]
    damaged = bytearray(batch(3, 3))
    damaged[-1] ^= 0xFF
    state.on_partition_data(tp, epoch, offset, 0, 9, batch(0, 3) + bytes(damaged) + batch(6, 3), 0)
    completed = state.take_completed()
    records, corruption = decode_completed(completed)
    assert [r.offset for r in records] == [0, 1, 2] and corruption.offset == 3
    completed = state.corrupted(completed, corruption)
    assert completed.next_offset == 3
    assert state.advance(completed.tp, completed.epoch, completed.next_offset)
    assert state.position(TP) == 3
    error = state.take_error()
    assert isinstance(error, CorruptMessageError) and "offset 3" in str(error)
    [plan] = fetch_round(state)
    assert plan.partitions[0][2] == 3  # fetched again from the damage, not past it
    state.on_partition_data(*plan.partitions[0], 0, 9, bytes(damaged) + batch(6, 3), 0)
    records, corruption = decode_completed(state.take_completed())
    assert records == [] and corruption.offset == 3  # and so on, until a seek


def test_a_partial_trailing_batch_is_fetched_again():
    state = FetchState()
    state.assign([TP])
    state.seek(TP, 0)
    [plan] = fetch_round(state)
    tp, epoch, offset = plan.partitions[0]
    state.on_partition_data(tp, epoch, offset, 0, 10, batch(0, 5) + batch(5, 5)[:30], 0)
    completed = state.take_completed()
    assert completed.next_offset == 5
    assert state.fetchable(0) == [(TP, epoch, 5)]


# --- a state machine against a trivially simple model ---------------------------------------

class FetchMachine(RuleBasedStateMachine):
    """Model: each partition's log is a list of batches of known offsets; the consumer must
    hand out exactly log offsets position, position+1, ... in order, whatever the interleaving
    of fetches, answers, seeks and pauses (stale answers dropped by epoch)."""

    def __init__(self) -> None:
        super().__init__()
        self.state = FetchState(auto_offset_reset="earliest", retry_backoff_ms=0)
        self.tps = [TP, TP1]
        self.state.assign(self.tps)
        self.logs = {tp: [] for tp in self.tps}  # list of (base, count)
        self.expected = {tp: None for tp in self.tps}  # the model's next offset (None: reset)
        self.in_flight = []
        self.leftover = None  # (completed fetch, records not yet handed out)

    def end(self, tp):
        return sum(count for _, count in self.logs[tp])

    @rule(index=st.integers(0, 1), count=st.integers(1, 4))
    def append(self, index, count):
        tp = self.tps[index]
        self.logs[tp].append((self.end(tp), count))

    @rule()
    def resolve_resets(self):
        for tp, epoch, timestamp in self.state.resets_needed(0):
            offset = 0 if timestamp == EARLIEST else self.end(tp)
            self.state.on_reset(tp, epoch, offset)
            self.expected[tp] = offset

    @rule()
    def send_fetch(self):
        plans, _ = self.state.plan_fetches(0, leader, lambda node: True)
        self.in_flight += [entry for plan in plans for entry in plan.partitions]

    @precondition(lambda self: self.in_flight)
    @rule(pick=st.integers(0, 10), batches_max=st.integers(0, 3))
    def answer(self, pick, batches_max):
        tp, epoch, offset = self.in_flight.pop(pick % len(self.in_flight))
        if offset > self.end(tp):
            code = int(ErrorCode.OFFSET_OUT_OF_RANGE)
            self.state.on_partition_data(tp, epoch, offset, code, -1, b"", 0)
            if self.state.position(tp) is None:  # it was current: a reset is due
                self.expected[tp] = None
            return
        chosen = [(b, c) for b, c in self.logs[tp] if b + c > offset][:batches_max]
        data = b"".join(batch(b, c) for b, c in chosen)
        self.state.on_partition_data(tp, epoch, offset, 0, self.end(tp), data, 0)

    @rule(index=st.integers(0, 1), offset=st.integers(0, 12))
    def seek(self, index, offset):
        tp = self.tps[index]
        self.state.seek(tp, offset)
        self.expected[tp] = offset
        if self.leftover is not None and self.leftover[0].tp == tp:
            self.leftover = None

    @rule(index=st.integers(0, 1))
    def toggle_pause(self, index):
        tp = self.tps[index]
        (self.state.resume if tp in self.state.paused() else self.state.pause)([tp])

    @rule(limit=st.integers(1, 5))
    def consume(self, limit):
        # As the blocking driver does: records of a completed fetch that one poll did not
        # hand out stay buffered (``leftover``) and come first in the next poll; a seek drops
        # them.
        if self.leftover is not None:
            completed, records = self.leftover
        else:
            completed = self.state.take_completed()
            if completed is None:
                return
            records, _ = decode_completed(completed)
        taken, rest = records[:limit], records[limit:]
        tp = completed.tp
        for record in taken:
            assert record.offset == self.expected[tp], (record, self.expected[tp])
            self.expected[tp] += 1
        if rest:
            self.leftover = (completed, rest)
            position = taken[-1].offset + 1
        else:
            self.leftover = None
            position = completed.next_offset
        assert self.state.advance(tp, completed.epoch, position)
        self.expected[tp] = position

    @invariant()
    def consistent(self):
        self.state.check_invariants()
        for tp in self.tps:
            assert self.state.position(tp) == self.expected[tp]


TestFetchMachine = FetchMachine.TestCase
TestFetchMachine.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
