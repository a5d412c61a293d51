"""StickyPartitioner: murmur2 for keys, one sticky partition per topic for keyless records.

Method: drive the partitioner with a seeded ``random.Random`` and check the KIP-480 rules one by
one (stickiness until a batch closes, rotation to a different partition, repeated
``on_new_batch`` calls for the same closed batch moving it once, one partition means 0, keyed
records ignore stickiness, ``available`` restricts keyless choices); Hypothesis then runs random
operation sequences, including partition counts that shrink, and checks that no answer is ever
out of range.
"""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from rivven_broker.records import StickyPartitioner, partition_for_key


def test_keyless_records_stick_until_a_batch_closes():
    partitioner = StickyPartitioner(random.Random(1))
    first = partitioner.partition("t", 6)
    assert all(partitioner.partition("t", 6) == first for _ in range(50))
    moved = partitioner.on_new_batch("t", 6, first)
    assert moved != first
    assert partitioner.partition("t", 6) == moved == partitioner.sticky_partition("t")


def test_rotation_visits_every_partition_and_never_repeats_in_a_row():
    partitioner = StickyPartitioner(random.Random(7))
    current = partitioner.partition("t", 4)
    seen = {current}
    for _ in range(200):
        nxt = partitioner.on_new_batch("t", 4, current)
        assert nxt != current
        seen.add(nxt)
        current = nxt
    assert seen == {0, 1, 2, 3}


def test_a_stale_batch_does_not_move_the_sticky_partition_again():
    partitioner = StickyPartitioner(random.Random(3))
    old = partitioner.partition("t", 8)
    new = partitioner.on_new_batch("t", 8, old)
    assert partitioner.on_new_batch("t", 8, old) == new  # second batch of the old partition


def test_one_partition_is_always_zero():
    partitioner = StickyPartitioner(random.Random(0))
    assert partitioner.partition("t", 1) == 0
    assert partitioner.on_new_batch("t", 1, 0) == 0
    assert partitioner.partition("t", 1) == 0


def test_keyed_records_ignore_stickiness():
    partitioner = StickyPartitioner(random.Random(5))
    partitioner.partition("t", 12)
    for i in range(50):
        key = b"key-%d" % i
        assert partitioner.partition("t", 12, key) == partition_for_key(key, 12)
        assert partitioner.partition("t", 12, key, available=[0]) == partition_for_key(key, 12)
    assert partitioner.partition("t", 12, b"") == partition_for_key(b"", 12)  # empty is a key


def test_topics_are_independent_and_forget_works():
    partitioner = StickyPartitioner(random.Random(11))
    a = partitioner.partition("a", 1000)
    b = partitioner.partition("b", 1000)
    partitioner.on_new_batch("b", 1000, b)
    assert partitioner.partition("a", 1000) == a
    partitioner.forget("a")
    assert partitioner.sticky_partition("a") is None


def test_available_partitions_restrict_keyless_choices():
    partitioner = StickyPartitioner(random.Random(2))
    current = partitioner.partition("t", 10, available=[3, 7])
    assert current in (3, 7)
    for _ in range(20):
        current = partitioner.on_new_batch("t", 10, current, available=[3, 7])
        assert current in (3, 7)
    assert partitioner.on_new_batch("t", 10, current, available=[current]) == current


def test_same_seed_same_choices():
    def run(seed: int) -> list[int]:
        partitioner = StickyPartitioner(random.Random(seed))
        out = [partitioner.partition("t", 9)]
        for _ in range(20):
            out.append(partitioner.on_new_batch("t", 9, out[-1]))
        return out

    assert run(42) == run(42)


operations = st.lists(
    st.tuples(
        st.sampled_from(["partition", "keyed", "new_batch"]),
        st.sampled_from(["a", "b"]),
        st.integers(1, 20),
        st.integers(0, 25),
        st.one_of(st.none(), st.lists(st.integers(-2, 25), max_size=5)),
    ),
    max_size=60,
)


@given(st.integers(0, 2**32), operations)
def test_answers_are_always_in_range(seed, ops):
    partitioner = StickyPartitioner(random.Random(seed))
    for op, topic, n, previous, available in ops:
        if op == "partition":
            result = partitioner.partition(topic, n, available=available)
        elif op == "keyed":
            result = partitioner.partition(topic, n, b"k%d" % previous, available=available)
        else:
            before = partitioner.sticky_partition(topic)
            result = partitioner.on_new_batch(topic, n, previous, available=available)
            if before is not None and before != previous and before < n:
                assert result == before  # not the closed partition's batch: no move
        assert 0 <= result < n
