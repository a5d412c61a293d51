"""``ReconnectBudget``: the waits are the runtime's shared backoff, and the budget ends at
``attempts_max`` attempts or ``timeout_ms`` after the loss, whichever comes first."""

from __future__ import annotations

from hypothesis import given, strategies as st

import psycopg2
import psycopg2.errors
import pytest

from rivven_connect.core.batch_cycle import backoff_delay_ms, backoff_max_ms
from rivven_connect.pg.reconnect import ReconnectBudget
from rivven_connect.pg.slot import (
    SlotActiveError, SlotConnectionError, SlotError, slot_error,
)


def _spend(budget: ReconnectBudget, now_ms: int, jitter: float) -> list[int]:
    """Every wait the budget grants when each attempt fails at once."""
    delays = []
    while (delay := budget.next_delay_ms(now_ms, jitter)) is not None:
        delays.append(delay)
        now_ms += delay
    return delays


def test_the_waits_are_the_shared_backoff_until_the_attempts_run_out():
    budget = ReconnectBudget(attempts_max=5, timeout_ms=10_000_000, lost_at_ms=1000)
    assert _spend(budget, 1000, 0.5) == [backoff_delay_ms(n, 0.5) for n in range(1, 6)]
    assert budget.attempts == 5
    assert budget.next_delay_ms(10**9, 0.5) is None  # spent for good


def test_the_deadline_cuts_the_last_wait_and_then_gives_up():
    budget = ReconnectBudget(attempts_max=1000, timeout_ms=1000, lost_at_ms=0)
    delays = _spend(budget, 0, 0.99)
    assert sum(delays) == 1000  # the last attempt at the deadline, never after it
    assert delays[:-1] == [backoff_delay_ms(n, 0.99) for n in range(1, len(delays))]
    assert delays[-1] <= backoff_delay_ms(len(delays), 0.99)
    late = ReconnectBudget(attempts_max=1000, timeout_ms=1000, lost_at_ms=0)
    assert late.next_delay_ms(1000, 0.0) is None and late.attempts == 0


def test_zero_attempts_never_reconnects():
    budget = ReconnectBudget(attempts_max=0, timeout_ms=60_000, lost_at_ms=0)
    assert budget.next_delay_ms(0, 0.0) is None
    assert "0 attempt(s) in 2.5 s" in budget.describe(2500)


@given(st.integers(0, 40), st.integers(1000, 600_000), st.integers(0, 10**12),
       st.lists(st.floats(0.0, 0.999), min_size=1, max_size=50))
def test_never_more_than_the_limits(attempts_max, timeout_ms, lost_at_ms, jitters):
    budget = ReconnectBudget(attempts_max, timeout_ms, lost_at_ms)
    now_ms, granted = lost_at_ms, 0
    for jitter in jitters:
        delay = budget.next_delay_ms(now_ms, jitter)
        if delay is None:
            assert granted == attempts_max or now_ms >= lost_at_ms + timeout_ms
            break
        assert 0 < delay <= backoff_max_ms
        granted += 1
        now_ms += delay
        assert now_ms <= lost_at_ms + timeout_ms
        budget.check_invariants()
    assert budget.attempts == granted <= attempts_max


@pytest.mark.parametrize("error,kind", [
    (psycopg2.errors.AdminShutdown("terminating connection due to administrator command"),
     SlotConnectionError),
    (psycopg2.OperationalError("server closed the connection unexpectedly"),
     SlotConnectionError),
    (psycopg2.InterfaceError("connection already closed"), SlotConnectionError),
    (psycopg2.errors.ObjectInUse("replication slot is active"), SlotActiveError),
    # OperationalErrors to psycopg2 that say nothing about the connection: not retried
    (psycopg2.errors.QueryCanceled("canceling statement due to statement timeout"), SlotError),
    (psycopg2.errors.SerializationFailure("could not serialize access"), SlotError),
    (psycopg2.errors.UndefinedTable("relation does not exist"), SlotError),
])
def test_which_errors_are_a_lost_connection(error, kind):
    """Only a lost connection is worth a reconnect: a statement timeout retried as one would
    loop (an incremental chunk read timing out again after every reconnect)."""
    classified = slot_error("reading", error)
    assert type(classified) is kind and str(classified) == f"reading: {error}"
