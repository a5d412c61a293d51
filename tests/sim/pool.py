"""Simulator runs for the tests, two at a time in fresh worker processes.

A run is single-threaded CPU work and the machines have two cores, so the bite tests (a
planted bug must be caught within N seeds) keep two seeds running, judge the results in
seed order, and stop as soon as the question is settled: the runs still going are killed,
not waited for (a planted bug can make a seed that does not catch it slow).
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import os
from typing import Iterable, Iterator

from sim.scenario import Scenario
from sim.world import RunResult, run_in_worker

__all__ = ["first_caught", "first_seeds_reporting"]


def _results_in_order(scenario: Scenario, seeds: Iterable[int]) -> Iterator[tuple[int, RunResult]]:
    """Each seed's result in seed order, at most two runs at a time; closing the iterator
    kills the runs still going."""
    jobs = min(2, os.cpu_count() or 1)
    context = multiprocessing.get_context("spawn")  # fresh interpreters, no forked state
    pool = context.Pool(jobs)
    try:
        upcoming = iter(seeds)
        running: collections.deque = collections.deque()

        def submit() -> None:
            seed = next(upcoming, None)
            if seed is not None:
                running.append((seed, pool.apply_async(run_in_worker, (scenario, seed, None))))

        for _ in range(jobs):
            submit()
        while running:
            seed, pending = running.popleft()
            result = pending.get()
            submit()
            yield seed, result
    finally:
        pool.terminate()
        pool.join()


def first_caught(scenario: Scenario, seeds: Iterable[int]) -> tuple[int, set[str]] | None:
    """The first seed (in order) whose run reports violations, with their invariants; None
    when no seed does."""
    with contextlib.closing(_results_in_order(scenario, seeds)) as results:
        for seed, result in results:
            if result.violations:
                return seed, {v.invariant for v in result.violations}
    return None


def first_seeds_reporting(scenario: Scenario, seeds: Iterable[int],
                          invariants: set[str]) -> dict[str, int]:
    """For each of ``invariants``, the first seed (in order) whose run reports it; stops
    once every one was seen or the seeds run out."""
    found: dict[str, int] = {}
    with contextlib.closing(_results_in_order(scenario, seeds)) as results:
        for seed, result in results:
            for invariant in sorted({v.invariant for v in result.violations} & invariants):
                found.setdefault(invariant, seed)
            if set(found) == invariants:
                break
    return found
