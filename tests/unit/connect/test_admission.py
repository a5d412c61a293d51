"""Admission: patterns against a regex model, the cap, the breaker against a timing model."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rivven_connect.core.admission import (
    Admission,
    AdmissionConfig,
    AdmissionMode,
    BreakerState,
    RejectReason,
    SendOutcome,
    TopicPattern,
    breaker_cool_down_ms,
    breaker_failure_threshold,
)
from rivven_connect.core.records import Destination

segments = st.sampled_from(["a", "b", "orders", "x-1"])
topics = st.lists(segments, min_size=1, max_size=4).map(".".join)
pattern_texts = st.lists(st.one_of(segments, st.just("*")), min_size=1, max_size=4).filter(
    lambda parts: any(p != "*" for p in parts)).map(".".join)


def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(r"\.".join("[^.]+" if p == "*" else re.escape(p)
                                 for p in pattern.split(".")))


@given(pattern_texts, topics)
def test_a_pattern_matches_like_its_regex(text, topic):
    assert TopicPattern.parse(text).matches(topic) == (_regex(text).fullmatch(topic) is not None)


@pytest.mark.parametrize("text", ["*", "*.*", "a..b", "a.b*", "", "a.", ".a", "a/b"])
def test_malformed_patterns_are_refused(text):
    with pytest.raises(ValueError):
        TopicPattern.parse(text)


@given(st.lists(pattern_texts, min_size=1, max_size=3), st.lists(topics, max_size=30),
       st.sampled_from([AdmissionMode.ALLOWLIST, AdmissionMode.DENYLIST]))
def test_allow_and_deny_follow_the_patterns(texts, asked, mode):
    patterns = tuple(TopicPattern.parse(t) for t in texts)
    admission = Admission(AdmissionConfig(mode, patterns, max_destinations=1000))
    for topic in asked:
        matched = any(_regex(t).fullmatch(topic) for t in texts)
        reason = admission.admit(Destination(topic), 1, 0)
        if mode is AdmissionMode.ALLOWLIST:
            assert reason is (None if matched else RejectReason.NOT_ALLOWED)
        else:
            assert reason is (RejectReason.DENIED if matched else None)
    admission.check_invariants()


@given(st.lists(topics, max_size=60), st.integers(1, 6))
def test_the_cap_is_never_exceeded_and_first_comers_keep_their_slots(asked, cap):
    admission = Admission(AdmissionConfig(max_destinations=cap))
    admitted: list[str] = []  # the model: the first `cap` distinct topics
    for topic in asked:
        reason = admission.admit(Destination(topic), 1, 0)
        if topic in admitted:
            assert reason is None
        elif len(admitted) < cap:
            assert reason is None
            admitted.append(topic)
        else:
            assert reason is RejectReason.MAX_DESTINATIONS
        assert admission.destinations_active == len(admitted) <= cap
    assert admission.counters.rejected[RejectReason.MAX_DESTINATIONS] == sum(
        1 for t in asked if t not in admitted)


def test_invalid_topics_and_partitions_are_rejected_without_taking_a_slot():
    admission = Admission(AdmissionConfig(max_destinations=1))
    assert admission.admit(Destination("a/b"), 1, 0) is RejectReason.INVALID_TOPIC
    assert admission.admit(Destination("t", partition=-1), 1, 0) is (
        RejectReason.PARTITION_OUT_OF_RANGE)
    assert admission.destinations_active == 0
    assert admission.admit(Destination("t", partition=7), 1, 0) is None  # count unknown yet
    admission.set_partition_count("t", 3)
    assert admission.admit(Destination("t", partition=3), 1, 0) is (
        RejectReason.PARTITION_OUT_OF_RANGE)
    assert admission.admit(Destination("t", partition=2), 1, 0) is None
    # out-of-range partitions do not feed the breaker
    assert admission.destinations["t"].consecutive_failures == 0


def test_a_partition_count_learned_before_admission_holds_from_the_first_record():
    admission = Admission(AdmissionConfig(max_destinations=2))
    admission.set_partition_count("u", 2)  # a pre-created topic, not admitted yet
    assert admission.destinations_active == 0
    assert admission.admit(Destination("u", partition=2), 1, 0) is (
        RejectReason.PARTITION_OUT_OF_RANGE)
    assert admission.destinations_active == 0  # the rejection took no slot
    assert admission.admit(Destination("u", partition=1), 1, 0) is None
    assert admission.destinations["u"].partitions == 2
    admission.set_partition_count("u", 4)  # partitions were added: refreshed
    assert admission.admit(Destination("u", partition=3), 2, 0) is None


# The breaker against a model: steps are (ms to advance, batch attempt's outcome). Each batch
# asks admission once for topic "t"; an admitted batch reports one outcome.
outcomes = st.sampled_from(list(SendOutcome))
steps = st.lists(st.tuples(st.sampled_from([0, 1, 10_000, 29_999, 30_000, 45_000]), outcomes),
                 max_size=60)


@settings(max_examples=300)
@given(steps)
def test_the_breaker_follows_its_timing_model(plan):
    admission = Admission(AdmissionConfig())
    now_ms = 0
    in_row = 0
    open_since: int | None = None  # the model
    for batch_id, (advance_ms, outcome) in enumerate(plan, start=1):
        now_ms += advance_ms
        rejects = open_since is not None and now_ms < open_since + breaker_cool_down_ms
        reason = admission.admit(Destination("t"), batch_id, now_ms)
        assert reason is (RejectReason.CIRCUIT_OPEN if rejects else None)
        if reason is not None:
            assert admission.circuits_open(now_ms) == 1
            continue
        probing = open_since is not None
        if probing:  # half-open: exactly this batch is the probe
            assert admission.admit(Destination("t"), batch_id + 10_000, now_ms) is (
                RejectReason.CIRCUIT_OPEN)
            assert admission.admit(Destination("t"), batch_id, now_ms) is None
        admission.record_outcome("t", outcome, now_ms, records=1, error="e")
        if outcome is SendOutcome.DELIVERED:
            in_row, open_since = 0, None
        elif outcome is SendOutcome.PERMANENT_FAILURE:
            in_row += 1
            if probing or in_row >= breaker_failure_threshold:
                open_since = now_ms
        state = admission.destinations["t"]
        assert (state.breaker is BreakerState.CLOSED) == (open_since is None)
        admission.check_invariants()


def test_transient_failures_never_open_the_breaker():
    admission = Admission(AdmissionConfig())
    for batch_id in range(1, 100):
        assert admission.admit(Destination("t"), batch_id, 0) is None
        admission.record_outcome("t", SendOutcome.TRANSIENT_FAILURE, 0, error="connection lost")
    for batch_id in range(100, 100 + breaker_failure_threshold):
        assert admission.admit(Destination("t"), batch_id, 0) is None
        admission.record_outcome("t", SendOutcome.PERMANENT_FAILURE, 0, error="not authorized")
    assert admission.admit(Destination("t"), 200, 0) is RejectReason.CIRCUIT_OPEN
    assert admission.admit(Destination("other"), 200, 0) is None  # others unaffected
