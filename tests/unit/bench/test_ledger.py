"""The loss and duplicate check: every acknowledged (producer, sequence) read exactly once.

Method: register producers with what they sent and had acknowledged, feed observations the way
a verification read does (including through marked record values), and check the verdict for
each case the benchmark must catch: nothing wrong, a lost unit, a duplicate, a failed (not
acknowledged) unit that is absent, unanswered units present or absent, and marks of unknown
producers. A Hypothesis test compares the verdict with a brute-force model.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rivven_broker.bench.ledger import MARK_BYTES, Ledger, mark_value


def test_every_unit_once_is_ok():
    ledger = Ledger()
    ledger.add_producer(1, sent=3, acked=3)
    for sequence in range(3):
        ledger.observe(1, sequence)
    verdict = ledger.verdict()
    assert verdict.ok and verdict.acked == 3 and verdict.observed == 3


def test_a_missing_acknowledged_unit_is_lost():
    ledger = Ledger()
    ledger.add_producer(7, sent=4, acked=4)
    for sequence in (0, 1, 3):
        ledger.observe(7, sequence)
    verdict = ledger.verdict()
    assert verdict.lost == 1 and verdict.lost_examples == ((7, 2),)
    assert not verdict.ok


def test_a_unit_read_twice_is_duplicated():
    ledger = Ledger()
    ledger.add_producer(1, sent=2, acked=2)
    for sequence in (0, 1, 1, 1):
        ledger.observe(1, sequence)
    assert ledger.verdict().duplicated == 2


def test_failed_and_unanswered_units_may_be_absent():
    ledger = Ledger()
    ledger.add_producer(1, sent=5, acked=3, failed=[1])
    ledger.observe(1, 0)
    ledger.observe(1, 2)
    ledger.observe(1, 4)  # sent, unanswered, yet written: fine
    verdict = ledger.verdict()
    assert verdict.ok and verdict.acked == 2


def test_unknown_producers_and_sequences_are_counted():
    ledger = Ledger()
    ledger.add_producer(1, sent=1, acked=1)
    ledger.observe(1, 0)
    ledger.observe(2, 0)
    ledger.observe(1, 5)
    assert ledger.verdict().unknown == 2


def test_observe_value_reads_the_mark():
    ledger = Ledger()
    ledger.add_producer(3, sent=2, acked=2)
    value = mark_value(3, 1, 123, 100)
    assert len(value) == 100 and len(mark_value(3, 1, 123, MARK_BYTES)) == MARK_BYTES
    ledger.observe_value(value)
    ledger.observe_value(b"xx" + mark_value(3, 0, 0, 30), 2)
    assert ledger.verdict().ok


@given(
    st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), max_size=8),
    st.lists(st.tuples(st.integers(0, 9), st.integers(0, 25)), max_size=60),
)
def test_verdict_matches_a_brute_force_model(producers, observations):
    ledger = Ledger()
    registered = {}
    for number, (sent, acked) in enumerate(producers):
        acked = min(acked, sent)
        ledger.add_producer(number, sent, acked)
        registered[number] = (sent, acked)
    for producer, sequence in observations:
        ledger.observe(producer, sequence)
    counts: dict[tuple[int, int], int] = {}
    unknown = 0
    for producer, sequence in observations:
        if producer in registered and sequence < registered[producer][0]:
            counts[(producer, sequence)] = counts.get((producer, sequence), 0) + 1
        else:
            unknown += 1
    lost = sum(1 for p, (_, acked) in registered.items() for s in range(acked) if (p, s) not in counts)
    duplicated = sum(c - 1 for c in counts.values())
    verdict = ledger.verdict()
    assert (verdict.lost, verdict.duplicated, verdict.unknown) == (lost, duplicated, unknown)
