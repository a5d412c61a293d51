"""Simulator runs for the tests, two at a time in fresh worker processes.

A run is single-threaded CPU work and the machines have two cores, so the bite tests (a
planted bug must be caught within N seeds) run seeds in pairs, in order, and stop at the
first pair that finds something - as ``python -m sim --jobs 2`` would.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Iterable

from sim.scenario import Scenario
from sim.world import run_in_worker

__all__ = ["first_caught", "first_seeds_reporting"]


def first_caught(scenario: Scenario, seeds: Iterable[int]) -> tuple[int, set[str]] | None:
    """The first seed (in order) whose run reports violations, with their invariants; None
    when no seed does."""
    seeds = list(seeds)
    jobs = min(2, os.cpu_count() or 1)
    context = multiprocessing.get_context("spawn")  # fresh interpreters, no forked state
    with ProcessPoolExecutor(jobs, mp_context=context) as pool:
        for start in range(0, len(seeds), jobs):
            batch = seeds[start:start + jobs]
            results = pool.map(run_in_worker, [scenario] * len(batch), batch, [None] * len(batch))
            for seed, result in zip(batch, results):
                if result.violations:
                    return seed, {v.invariant for v in result.violations}
    return None


def first_seeds_reporting(scenario: Scenario, seeds: Iterable[int],
                          invariants: set[str]) -> dict[str, int]:
    """For each of ``invariants``, the first seed (in order) whose run reports it; runs
    seeds in pairs until every one was seen or the seeds run out."""
    seeds = list(seeds)
    found: dict[str, int] = {}
    jobs = min(2, os.cpu_count() or 1)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=context) as pool:
        for start in range(0, len(seeds), jobs):
            batch = seeds[start:start + jobs]
            results = pool.map(run_in_worker, [scenario] * len(batch), batch, [None] * len(batch))
            for seed, result in zip(batch, results):
                for invariant in sorted({v.invariant for v in result.violations} & invariants):
                    found.setdefault(invariant, seed)
            if set(found) == invariants:
                break
    return found

