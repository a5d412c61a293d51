"""Error mapping and retry decisions of the client core.

Method: ``error_for`` is checked against every ``ErrorCode`` (class, ``code`` name, retriable
flag, pickling); ``RetryPolicy`` is checked with a seeded ``random.Random`` for the exponential
growth and cap of its backoff (Hypothesis over attempts and seeds for the jitter bounds) and
for each reason a retry is refused.
"""

from __future__ import annotations

import pickle
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rivven_broker.client import errors as e
from rivven_broker.client.retry import RetryPolicy, needs_metadata_refresh
from rivven_broker.protocol.errors import ErrorCode

CODES = [code for code in ErrorCode if code != ErrorCode.NONE]


@pytest.mark.parametrize("code", CODES, ids=[c.name for c in CODES])
def test_every_code_maps_to_a_broker_error_with_its_name_and_flag(code):
    error = e.error_for(code, "detail")
    assert isinstance(error, e.BrokerError) and isinstance(error, e.RivvenError)
    assert error.code == code.name
    assert error.error_code is code
    assert error.retriable == code.retriable
    assert "detail" in str(error) and code.name in str(error)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and again.code == error.code and again.message == "detail"


@pytest.mark.parametrize(
    "code,cls",
    [
        (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, e.UnknownTopicOrPartitionError),
        (ErrorCode.NOT_LEADER, e.NotLeaderError),
        (ErrorCode.CORRUPT_MESSAGE, e.CorruptMessageError),
        (ErrorCode.MESSAGE_TOO_LARGE, e.MessageTooLargeError),
        (ErrorCode.OFFSET_OUT_OF_RANGE, e.OffsetOutOfRangeError),
        (ErrorCode.TOPIC_ALREADY_EXISTS, e.TopicAlreadyExistsError),
        (ErrorCode.INVALID_TOPIC_NAME, e.InvalidTopicNameError),
        (ErrorCode.INVALID_CONFIG, e.InvalidConfigError),
        (ErrorCode.REQUEST_TIMED_OUT, e.RequestTimedOutError),
    ],
)
def test_common_codes_have_their_own_class(code, cls):
    assert type(e.error_for(code)) is cls
    assert type(e.error_for(int(code))) is cls


def test_unknown_numbers_become_unknown_server_error():
    error = e.error_for(31337)
    assert error.code == "UNKNOWN_SERVER_ERROR" and not error.retriable


def test_local_errors_carry_client_side_codes():
    assert e.ConnectionFailedError("x").code == "NETWORK_EXCEPTION"
    assert e.ConnectionFailedError("x").retriable
    assert e.DeliveryTimeoutError("x").code == "DELIVERY_TIMEOUT"
    assert not e.DeliveryTimeoutError("x").retriable
    assert e.BufferExhaustedError("x").retriable
    assert e.ClosedError().code == "CLIENT_CLOSED" and e.ClosedError().error_code is None
    assert e.FeatureNotAvailableError().code == "FEATURE_NOT_AVAILABLE"


def test_backoff_doubles_up_to_the_cap_without_jitter():
    policy = RetryPolicy(retry_backoff_ms=100, retry_backoff_max_ms=1000, jitter=0.0)
    rng = random.Random(1)
    assert [policy.backoff_ms(n, rng) for n in range(1, 7)] == [100, 200, 400, 800, 1000, 1000]
    assert policy.backoff_ms(10_000, rng) == 1000


@given(attempt=st.integers(1, 100), seed=st.integers(0, 2**32))
def test_jitter_stays_within_its_band(attempt, seed):
    policy = RetryPolicy(retry_backoff_ms=100, retry_backoff_max_ms=1000, jitter=0.2)
    base = min(100 * 2 ** min(attempt - 1, 32), 1000)
    value = policy.backoff_ms(attempt, random.Random(seed))
    assert int(base * 0.8) <= value <= int(base * 1.2)


def decide(policy, **overrides):
    args = dict(retriable=True, error_code=ErrorCode.NOT_LEADER, attempts=1, now_ms=1000,
                deadline_ms=100_000, rng=random.Random(3))
    args.update(overrides)
    return policy.decide(**args)


def test_retriable_errors_retry_after_a_backoff_and_refresh_metadata_when_asked():
    policy = RetryPolicy(jitter=0.0)
    decision = decide(policy)
    assert decision.retry and decision.retry_at_ms == 1100 and decision.refresh_metadata
    decision = decide(policy, error_code=ErrorCode.REQUEST_TIMED_OUT)
    assert decision.retry and not decision.refresh_metadata


def test_retries_are_refused_for_non_retriable_errors_attempt_bound_and_deadline():
    policy = RetryPolicy(jitter=0.0, retries_max=3)
    assert not decide(policy, retriable=False).retry
    assert decide(policy, attempts=3).retry
    assert not decide(policy, attempts=4).retry
    assert not decide(policy, deadline_ms=1050).retry  # the backoff would end past it


def test_refresh_codes():
    assert needs_metadata_refresh(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    assert needs_metadata_refresh(ErrorCode.NETWORK_EXCEPTION)
    assert not needs_metadata_refresh(ErrorCode.CORRUPT_MESSAGE)
    assert not needs_metadata_refresh(None)


def test_policy_rejects_bad_bounds():
    with pytest.raises(ValueError):
        RetryPolicy(retry_backoff_ms=500, retry_backoff_max_ms=100)
    with pytest.raises(ValueError):
        RetryPolicy(jitter=1.5)
