"""The producer accumulator: linger, batch size, partitioning, buffer accounting, draining.

Method: drive ``RecordAccumulator`` directly with a fake clock value (``now_ms`` arguments), a
seeded ``random.Random`` and leader/readiness callbacks, and check what ``drain`` hands out;
a Hypothesis state machine then mixes appends, drains, acknowledgements, retries and expiry
against a simple model (every token ends exactly once; the byte count matches what is
pending) with ``check_invariants`` after every step.
"""

from __future__ import annotations

import random

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rivven_broker.client.accumulator import RECORD_ESTIMATE_OVERHEAD_BYTES, RecordAccumulator
from rivven_broker.records import murmur2
from rivven_broker.records.partitioner import StickyPartitioner
from rivven_broker.records.reader import decode_records

LEADER = 1


def make(**overrides) -> RecordAccumulator:
    options = dict(
        batch_size_bytes=4096,
        linger_ms=5,
        compression="none",
        buffer_memory_bytes=1 << 20,
        request_bytes_max=1 << 20,
        delivery_timeout_ms=1000,
    )
    options.update(overrides)
    return RecordAccumulator(StickyPartitioner(random.Random(7)), **options)


def drain(acc: RecordAccumulator, now_ms: int, ready=lambda node: True):
    return acc.drain(now_ms, lambda topic, partition: LEADER, ready)


def test_a_batch_waits_for_linger_then_drains():
    acc = make(linger_ms=5)
    assert acc.append("t", 0, 1, None, b"v", (), "a", now_ms=100, num_partitions=1)
    early = drain(acc, 104)
    assert early.plans == [] and early.next_ready_ms == 105
    late = drain(acc, 105)
    [plan] = late.plans
    assert plan.node_id == LEADER and [b.tokens for b in plan.batches] == [["a"]]
    acc.check_invariants()


def test_sealing_on_overflow_drains_the_full_batch_only():
    acc = make(batch_size_bytes=1024, linger_ms=10_000)
    count = 0
    while True:
        acc.append("t", 0, 0, None, b"x" * 100, (), count, now_ms=0, num_partitions=1)
        count += 1
        result = drain(acc, 0)
        if result.plans:
            break
    [plan] = result.plans
    [batch] = plan.batches
    assert batch.record_count == count - 1  # the record that overflowed opened the next batch
    data = batch.seal()
    assert len(data) <= 1024
    assert [r.value for r in decode_records(data)] == [b"x" * 100] * (count - 1)
    assert drain(acc, 0).plans == []  # the new batch lingers
    acc.check_invariants()


def test_keys_go_to_their_murmur2_partition():
    acc = make(linger_ms=0)
    keys = [b"key-%d" % i for i in range(50)]
    for key in keys:
        acc.append("t", None, 0, key, b"v", (), key, now_ms=0, num_partitions=7)
    placed = {}
    for plan in drain(acc, 0).plans:
        for batch in plan.batches:
            for token in batch.tokens:
                placed[token] = batch.partition
    assert placed == {k: (murmur2(k) & 0x7FFFFFFF) % 7 for k in keys}


def test_keyless_records_stick_to_one_partition_until_its_batch_leaves():
    acc = make(linger_ms=5)
    for i in range(20):
        acc.append("t", None, 0, None, b"v", (), i, now_ms=0, num_partitions=4)
    [plan] = drain(acc, 5).plans
    [batch] = plan.batches
    first = batch.partition
    assert batch.tokens == list(range(20))
    acc.append("t", None, 0, None, b"v", (), "next", now_ms=6, num_partitions=4)
    [plan] = drain(acc, 11).plans
    assert plan.batches[0].partition != first  # the drained batch moved the sticky partition


def test_keyless_records_move_on_when_the_sticky_batch_fills():
    acc = make(batch_size_bytes=1024, linger_ms=10_000)
    partitions_seen = []
    for i in range(40):
        acc.append("t", None, 0, None, b"x" * 100, (), i, now_ms=0, num_partitions=3)
    while plans := drain(acc, 10_000).plans:  # one batch per partition per request
        for plan in plans:
            for batch in plan.batches:
                partitions_seen.append((batch.partition, batch.record_count))
    assert len({p for p, _ in partitions_seen}) >= 2
    assert sum(n for _, n in partitions_seen) == 40
    acc.check_invariants()


def test_a_full_buffer_ignores_linger():
    acc = make(linger_ms=10_000, buffer_memory_bytes=1000)
    acc.append("t", 0, 0, None, b"v" * 500, (), "a", now_ms=0, num_partitions=1)
    assert drain(acc, 1).plans == []  # room left: it lingers
    acc.append("t", 1, 0, None, b"v" * 500, (), "b", now_ms=0, num_partitions=2)
    assert not acc.has_room()
    [plan] = drain(acc, 1).plans  # a sender waiting for room must not wait out the linger
    assert sorted(b.tokens[0] for b in plan.batches) == ["a", "b"]
    acc.check_invariants()


def test_a_lingering_partition_is_asked_for_before_it_is_ready():
    """A transaction's AddPartitionsToTxn overlaps the linger: partition_ready is asked for a
    batch still lingering (and holds it back all the same)."""
    acc = make(linger_ms=5)
    acc.append("t", 0, 1, None, b"v", (), "a", now_ms=100, num_partitions=1)
    asked: list = []

    def ready(tp):
        asked.append(tp)
        return False

    early = acc.drain(101, lambda topic, partition: LEADER, lambda node: True, ready)
    assert early.plans == [] and asked == [("t", 0)] and early.next_ready_ms == 105
    late = acc.drain(105, lambda topic, partition: LEADER, lambda node: True, lambda tp: True)
    assert [b.tokens for b in late.plans[0].batches] == [["a"]]
    acc.check_invariants()


def test_buffered_bytes_follow_records_and_completion():
    acc = make(buffer_memory_bytes=1000, linger_ms=0)
    acc.append("t", 0, 0, b"kk", b"v" * 500, (), "a", now_ms=0, num_partitions=1)
    assert acc.buffered_bytes == 502 + RECORD_ESTIMATE_OVERHEAD_BYTES
    assert acc.has_room()
    acc.append("t", 0, 0, None, b"v" * 500, (), "b", now_ms=0, num_partitions=1)
    assert not acc.has_room()
    [plan] = drain(acc, 0).plans
    for batch in plan.batches:
        acc.complete(batch)
    assert acc.buffered_bytes == 0 and acc.has_room()
    acc.check_invariants()


def test_requests_are_bounded_but_carry_at_least_one_batch():
    acc = make(batch_size_bytes=2048, linger_ms=0, request_bytes_max=3000)
    for partition in range(3):
        acc.append("t", partition, 0, None, b"x" * 1500, (), partition, now_ms=0, num_partitions=3)
    first = drain(acc, 0)
    assert len(first.plans) == 1 and len(first.plans[0].batches) == 1
    assert first.next_ready_ms == 0  # more is ready at once
    second = drain(acc, 0)
    third = drain(acc, 0)
    assert len(second.plans[0].batches) == 1 and len(third.plans[0].batches) == 1
    assert drain(acc, 0).plans == []


def test_one_batch_per_partition_per_request_and_unready_nodes_wait():
    acc = make(batch_size_bytes=1024, linger_ms=0)
    for i in range(30):
        acc.append("t", 0, 0, None, b"x" * 100, (), i, now_ms=0, num_partitions=1)
    assert drain(acc, 0, ready=lambda node: False).plans == []
    first = drain(acc, 0)
    [plan] = first.plans
    assert len(plan.batches) == 1
    assert first.next_ready_ms == 0  # the partition's next full batch: the next request, now


def test_a_partitions_open_batch_behind_a_drained_one_waits_its_linger():
    acc = make(batch_size_bytes=1024, linger_ms=5)
    for i in range(12):  # one full batch, then an open one
        acc.append("t", 0, 0, None, b"x" * 100, (), i, now_ms=0, num_partitions=1)
    first = drain(acc, 0)
    assert len(first.plans) == 1 and first.next_ready_ms is None  # asked again when woken
    assert drain(acc, 0).plans == [] and drain(acc, 5).plans != []


def test_unknown_leader_is_reported():
    acc = make(linger_ms=0)
    acc.append("t", 0, 0, None, b"v", (), "a", now_ms=0, num_partitions=1)
    result = acc.drain(0, lambda topic, partition: None, lambda node: True)
    assert result.plans == [] and result.unknown_leader


def test_flush_ignores_linger():
    acc = make(linger_ms=10_000)
    acc.append("t", 0, 0, None, b"v", (), "a", now_ms=0, num_partitions=1)
    assert drain(acc, 1).plans == []
    acc.flushes_in_progress += 1
    assert len(drain(acc, 1).plans) == 1


def test_a_retried_batch_goes_back_in_order_and_waits_its_backoff():
    acc = make(batch_size_bytes=1024, linger_ms=0)
    for i in range(30):
        acc.append("t", 0, 0, None, b"x" * 100, (), i, now_ms=0, num_partitions=1)
    [plan] = drain(acc, 0).plans
    [failed] = plan.batches
    failed.seal()
    acc.reenqueue(failed, retry_at_ms=50)
    result = drain(acc, 10)
    assert result.plans == [] and result.next_ready_ms == 50  # later batches wait behind it
    [plan] = drain(acc, 50).plans
    assert plan.batches == [failed]
    acc.check_invariants()


def test_expired_batches_leave_the_queue():
    acc = make(linger_ms=0, delivery_timeout_ms=100)
    acc.append("t", 0, 0, None, b"v", (), "a", now_ms=0, num_partitions=1)
    assert acc.expired(99) == []
    [batch] = acc.expired(100)
    assert batch.tokens == ["a"]
    acc.complete(batch)
    assert drain(acc, 100).plans == [] and acc.buffered_bytes == 0
    acc.check_invariants()


def test_a_refused_first_record_leaves_nothing_behind():
    acc = make()
    try:
        acc.append("t", 0, 0, None, "not bytes", (), "a", now_ms=0, num_partitions=1)
    except TypeError:
        pass
    else:  # pragma: no cover
        raise AssertionError("a str value must be refused")
    assert acc.incomplete() == [] and not acc.has_queued()
    acc.check_invariants()


class AccumulatorMachine(RuleBasedStateMachine):
    """Model: a dict token -> state ("pending" | "done"); bytes = sum of pending records."""

    def __init__(self) -> None:
        super().__init__()
        self.acc = make(batch_size_bytes=1024, linger_ms=3, delivery_timeout_ms=40)
        self.now = 0
        self.next_token = 0
        self.tokens: dict[int, str] = {}
        self.in_flight = []

    @rule(partition=st.none() | st.integers(0, 2), key=st.none() | st.binary(max_size=4),
          size=st.integers(0, 300))
    def append(self, partition, key, size):
        token = self.next_token
        self.next_token += 1
        self.acc.append("t", partition, self.now, key, b"x" * size, (), token, self.now, 3)
        self.tokens[token] = "pending"

    @rule(ms=st.integers(0, 10))
    def tick(self, ms):
        self.now += ms

    @rule()
    def drain(self):
        for plan in drain(self.acc, self.now).plans:
            for batch in plan.batches:
                batch.seal()
                self.in_flight.append(batch)

    @precondition(lambda self: self.in_flight)
    @rule(index=st.integers(0, 100), succeed=st.booleans())
    def answer(self, index, succeed):
        batch = self.in_flight.pop(index % len(self.in_flight))
        if succeed or batch.deadline_ms <= self.now:
            self.acc.complete(batch)
            for token in batch.tokens:
                assert self.tokens[token] == "pending"
                self.tokens[token] = "done"
        else:
            self.acc.reenqueue(batch, self.now + 2)

    @rule()
    def expire(self):
        for batch in self.acc.expired(self.now):
            self.acc.complete(batch)
            for token in batch.tokens:
                assert self.tokens[token] == "pending"
                self.tokens[token] = "done"

    @invariant()
    def consistent(self):
        self.acc.check_invariants()
        pending = {t for t, s in self.tokens.items() if s == "pending"}
        held = {t for b in self.acc.incomplete() for t in b.tokens}
        assert pending == held
        if not pending:
            assert self.acc.buffered_bytes == 0


TestAccumulatorMachine = AccumulatorMachine.TestCase
TestAccumulatorMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
