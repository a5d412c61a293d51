"""Record futures: standard ``concurrent.futures`` behaviour with a shared condition.

Method: build ``RecordFuture``s on one condition, resolve them a batch at a time with
``resolve_futures`` from another thread, and check ``result``/``exception`` with and without
timeouts, done-callbacks, ``concurrent.futures.wait`` and ``as_completed`` — including a
waiter woken by a *different* future's completion, which must keep waiting.
"""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from rivven_broker.client._producer import RecordFuture, resolve_futures
from rivven_broker.client.errors import NotLeaderError


def make(count: int):
    condition = threading.Condition()
    return condition, [RecordFuture(condition) for _ in range(count)]


def test_results_errors_and_callbacks():
    condition, futures = make(3)
    seen = []
    futures[0].add_done_callback(lambda f: seen.append(f.result()))
    resolve_futures(condition, futures[:2], ["a", "b"], None)
    assert [f.result() for f in futures[:2]] == ["a", "b"] and seen == ["a"]
    assert not futures[2].done() and futures[2].cancel() is False
    with pytest.raises(TimeoutError):
        futures[2].result(timeout=0.01)
    error = NotLeaderError("moved")
    resolve_futures(condition, futures[2:], None, error)
    assert futures[2].exception() is error
    with pytest.raises(NotLeaderError):
        futures[2].result()
    late = []
    futures[1].add_done_callback(lambda f: late.append(True))  # already done: runs at once
    assert late == [True]


def test_a_wakeup_for_another_future_does_not_end_a_wait():
    condition, futures = make(2)
    outcome = []

    def waiter():
        outcome.append(futures[1].result(timeout=30))

    thread = threading.Thread(target=waiter)
    thread.start()
    resolve_futures(condition, futures[:1], ["first"], None)  # notifies the shared condition
    resolve_futures(condition, futures[1:], ["second"], None)
    thread.join(30)
    assert outcome == ["second"]


def test_wait_and_as_completed():
    condition, futures = make(4)
    thread = threading.Thread(
        target=lambda: resolve_futures(condition, futures, [1, 2, 3, 4], None)
    )
    thread.start()
    done, pending = concurrent.futures.wait(futures, timeout=30)
    assert len(done) == 4 and not pending
    assert sorted(f.result() for f in concurrent.futures.as_completed(futures, timeout=30)) == [
        1, 2, 3, 4]
    thread.join()
