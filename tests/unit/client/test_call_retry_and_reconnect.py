"""The core's call-with-retry (``CallRetry``) and reconnect backoff (``ReconnectBackoff``).

Goal: both client drivers follow these two objects, so their rules are checked here once,
without sockets or clocks: an unknown node is a retriable ``ConnectionFailedError`` that asks
for a metadata refresh; only real dial failures count towards ``connect_attempts_max``; no
wait runs past the call's deadline; a request timed out at the deadline is a
``ClientTimeoutError``; the reconnect backoff doubles with jitter up to its cap and starts
again after a handshake. Method: plain calls with hand-made times, and Hypothesis runs of
random failure sequences against the obvious bounds.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rivven_broker.client.call_retry import CallRetry
from rivven_broker.client.errors import (
    ClientTimeoutError,
    ConnectionFailedError,
    NotLeaderError,
    RequestTimedOutError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from rivven_broker.client.metadata import Address, MetadataCache
from rivven_broker.client.reconnect import ReconnectBackoff
from rivven_broker.client.retry import RetryPolicy
from rivven_broker.protocol import messages as m
from rivven_broker.protocol.errors import ErrorCode

BOOT = (Address("h1", 9092),)


def cache() -> MetadataCache:
    metadata = MetadataCache(BOOT, refresh_backoff_ms=0)
    metadata.on_update(m.MetadataResponse(
        brokers=(m.BrokerMetadata(node_id=1, host="h1", port=9092),),
        controller_id=1, cluster_id="c", topics=()), 0)
    return metadata


def call(metadata: MetadataCache | None = None, timeout_ms: int = 10_000,
         connect_attempts_max: int = 3, seed: int = 1) -> CallRetry:
    return CallRetry(now_ms=0, timeout_ms=timeout_ms, policy=RetryPolicy(),
                     rng=random.Random(seed), metadata=metadata or cache(),
                     connect_attempts_max=connect_attempts_max)


def test_a_node_the_metadata_does_not_list_fails_at_once_retriably_and_asks_for_a_refresh():
    metadata = cache()
    retry = call(metadata)
    assert not metadata.needs_update(0)
    retry.target_known(None)  # any broker: nothing to check
    retry.target_known(1)
    with pytest.raises(ConnectionFailedError) as failed:
        retry.target_known(99)
    assert failed.value.retriable and "not in the metadata" in str(failed.value)
    assert not isinstance(failed.value, UnknownTopicOrPartitionError)
    assert metadata.needs_update(0)


def test_only_real_dial_failures_count_towards_connect_attempts_max():
    retry = call(connect_attempts_max=2)
    # waiting for a backoff many times is not a failure
    for now in range(0, 50, 10):
        assert retry.no_connection(now, dial_failed=False, next_dial_ms=now + 5, error=None) == 6
    assert retry.no_connection(50, dial_failed=True, next_dial_ms=60, error=None) == 11
    with pytest.raises(ConnectionFailedError, match="nothing listening"):
        retry.no_connection(60, dial_failed=True, next_dial_ms=70,
                            error=ConnectionFailedError("nothing listening"))


def test_waits_for_a_dial_stop_at_the_deadline_and_then_the_call_fails():
    retry = call(timeout_ms=100)
    assert retry.no_connection(0, dial_failed=False, next_dial_ms=5_000, error=None) == 101
    with pytest.raises(ConnectionFailedError):
        retry.no_connection(100, dial_failed=False, next_dial_ms=5_000, error=None)


def test_an_error_response_is_its_typed_error_and_other_answers_pass():
    answer = m.Pong()
    assert CallRetry.answer(answer) is answer
    with pytest.raises(TopicAlreadyExistsError):
        CallRetry.answer(m.ErrorResponse(ErrorCode.TOPIC_ALREADY_EXISTS, "exists"))


def test_retriable_failures_back_off_and_refresh_when_the_view_is_stale():
    metadata = cache()
    retry = call(metadata, timeout_ms=60_000)
    assert retry.attempt(0) == 60_000
    wait = retry.failed(NotLeaderError("moved"), 10)
    assert 80 <= wait <= 120  # 100 ms +- 20 % jitter
    assert metadata.needs_update(10)
    assert retry.attempt(10 + wait) == 60_000 - 10 - wait
    assert 160 <= retry.failed(NotLeaderError("moved"), 200) <= 240


def test_a_non_retriable_failure_is_raised_as_it_is():
    retry = call()
    retry.attempt(0)
    error = TopicAlreadyExistsError("exists")
    with pytest.raises(TopicAlreadyExistsError) as raised:
        retry.failed(error, 1)
    assert raised.value is error


def test_a_request_timed_out_at_the_deadline_is_a_client_timeout():
    retry = call(timeout_ms=1_000)
    retry.attempt(0)
    with pytest.raises(ClientTimeoutError) as raised:
        retry.failed(RequestTimedOutError("no answer"), 1_000)
    assert isinstance(raised.value.__cause__, RequestTimedOutError)
    early = call(timeout_ms=1_000)
    early.attempt(0)
    assert early.failed(RequestTimedOutError("no answer"), 10) > 0  # retried before it


@given(events=st.lists(st.tuples(st.booleans(), st.integers(0, 500)), max_size=60),
       timeout_ms=st.integers(0, 5_000), seed=st.integers(0, 2**32))
def test_no_wait_runs_past_the_deadline_and_every_call_ends(events, timeout_ms, seed):
    """Whatever fails, each wait ends by the deadline (+1 ms), and time moving past the
    deadline ends the call with an error: a call is bounded."""
    retry = call(timeout_ms=timeout_ms, connect_attempts_max=3, seed=seed)
    now, ended = 0, False
    for dial_failed, step in events:
        now += step
        try:
            if dial_failed:
                wait = retry.no_connection(now, dial_failed=True, next_dial_ms=now + step,
                                           error=None)
            else:
                retry.attempt(now)
                wait = retry.failed(ConnectionFailedError("lost"), now)
        except (ConnectionFailedError, ClientTimeoutError):
            ended = True
            break
        assert now + wait <= retry.deadline_ms + 1
        assert now < retry.deadline_ms
    if not ended:
        assert retry.dial_failures < 3


def test_reconnect_backoff_doubles_with_jitter_up_to_the_cap_and_restarts_after_a_handshake():
    backoff = ReconnectBackoff(50, 1_000, random.Random(3))
    a, b = Address("a", 1), Address("b", 1)
    assert backoff.can_dial(a, 0) and backoff.next_dial_ms([a, b], 7) == 7
    waits = []
    for _ in range(8):
        retry_at = backoff.on_dial_failed(a, ConnectionFailedError("refused"), 0)
        waits.append(retry_at)
    assert [backoff.failures(a), backoff.failed_dials] == [8, 8]
    for n, wait in enumerate(waits[:5]):
        base = min(50 * 2**n, 1_000)
        assert 0.8 * base - 1 <= wait <= 1.2 * base
    assert all(800 - 1 <= w <= 1_200 for w in waits[5:])
    assert not backoff.can_dial(a, 0) and backoff.can_dial(a, backoff.retry_at_ms(a))
    assert backoff.can_dial(b, 0)
    assert backoff.next_dial_ms([a, b], 0) == 0  # b may be dialled now
    assert backoff.next_dial_ms([a], 0) == backoff.retry_at_ms(a)
    assert backoff.error_of(a) is backoff.last_error
    backoff.on_connected(a)
    assert backoff.failures(a) == 0 and backoff.error_of(a) is None
    first_again = backoff.on_dial_failed(a, ConnectionFailedError("lost"), 10_000)
    assert 10_000 + 40 - 1 <= first_again <= 10_000 + 60
    backoff.check_invariants()


@given(st.lists(st.tuples(st.sampled_from("abc"), st.booleans()), max_size=80),
       st.integers(0, 2**32))
def test_reconnect_backoff_against_a_plain_model(events, seed):
    backoff = ReconnectBackoff(10, 640, random.Random(seed))
    model: dict[str, int] = {}
    now = 0
    for name, failed in events:
        now += 7
        address = Address(name, 1)
        if failed:
            model[name] = model.get(name, 0) + 1
            retry_at = backoff.on_dial_failed(address, ConnectionFailedError(name), now)
            base = min(10 * 2 ** (model[name] - 1), 640)
            assert now + int(0.8 * base) - 1 <= retry_at <= now + 1.2 * base
        else:
            model.pop(name, None)
            backoff.on_connected(address)
        assert backoff.failures(address) == model.get(name, 0)
        backoff.check_invariants()
    assert backoff.failed_dials == sum(1 for _, failed in events if failed)
