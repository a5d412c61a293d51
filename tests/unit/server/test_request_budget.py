"""``RequestBudget``: reservations granted while anything is left, waiters woken on release.

Method: trio tests on a MockClock (no sleeps): frames reserve, a reader waits when the budget
is spent, a release lets it in; a frame larger than the whole budget still gets in alone.
"""

from __future__ import annotations

import trio
import trio.testing

from rivven_broker.server.descriptors import connections_max_for
from rivven_broker.server.request_budget import RequestBudget


def test_reservations_overdraw_by_at_most_one_frame():
    budget = RequestBudget(100)
    assert budget.try_reserve(60)
    assert budget.try_reserve(60)  # 60 < 100 left something: granted, overdrawn to 120
    assert not budget.try_reserve(1)
    budget.release(60)
    assert budget.try_reserve(500)  # larger than the budget: granted once anything is left
    assert budget.reserved_bytes == 560


def test_zero_means_unbounded():
    budget = RequestBudget(0)
    for _ in range(100):
        assert budget.try_reserve(1 << 30)


async def test_a_waiting_reader_gets_in_when_a_reservation_is_released(autojump_clock):
    budget = RequestBudget(10)
    budget.try_reserve(10)
    order = []

    async def reader(name, size):
        await budget.reserve(size)
        order.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader, "a", 5)
        nursery.start_soon(reader, "b", 5)
        await trio.testing.wait_all_tasks_blocked()
        assert order == [] and budget.waits == 2
        budget.release(10)  # both fit in what is left (5 + 5 overdraws to 10, not beyond)
    assert sorted(order) == ["a", "b"]
    assert budget.reserved_bytes == 10


async def test_waiters_beyond_what_frees_keep_waiting(autojump_clock):
    budget = RequestBudget(10)
    budget.try_reserve(10)
    got = []

    async def reader(size):
        await budget.reserve(size)
        got.append(size)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader, 10)
        nursery.start_soon(reader, 10)
        await trio.testing.wait_all_tasks_blocked()
        budget.release(10)
        await trio.testing.wait_all_tasks_blocked()
        assert got == [10]  # one got in; the budget is spent again
        budget.release(10)
    assert got == [10, 10]


def test_connections_take_half_of_the_descriptors_left_after_the_reserve():
    assert connections_max_for(1024, 64) == (1024 - 64 - 64) // 2
    assert connections_max_for(1 << 20, 64) == 10_000  # at most limits.connections_max
    assert connections_max_for(100, 64) == 1  # never below one
