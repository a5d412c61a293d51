"""Every kept failure of the simulator stays fixed.

Method: each ``sim/scenarios/regressions/*.toml`` is a fault schedule of a run that once
failed (``sim/schedule.py``: ``[replay]`` names the scenario and seed, ``about`` what was
wrong, ``fixed_in`` the fixing commit). It is replayed against its scenario — the same
seed, exactly those faults, the nemesis off, as ``python -m sim
sim/scenarios/<scenario>.toml --replay <file>`` does — and must pass; its runs go two at a
time to worker processes, as the scenario sweep's do.
"""

from __future__ import annotations

import multiprocessing
import os
import pathlib
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Iterator

import pytest

from sim.scenario import load
from sim.schedule import load_schedule
from sim.world import RunResult, run_in_worker

SCENARIOS = pathlib.Path(__file__).resolve().parents[2] / "sim" / "scenarios"
REGRESSIONS = sorted((SCENARIOS / "regressions").glob("*.toml"))


@pytest.mark.parametrize("path", REGRESSIONS, ids=[p.stem for p in REGRESSIONS])
def test_a_regression_says_what_it_keeps(path: pathlib.Path) -> None:
    schedule = load_schedule(path.read_bytes())
    assert schedule.about and schedule.fixed_in and schedule.invariants
    assert (SCENARIOS / f"{schedule.scenario}.toml").exists()


@pytest.fixture(scope="module")
def replays() -> Iterator[dict[str, Future[RunResult]]]:
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(min(2, os.cpu_count() or 1), mp_context=context) as pool:
        futures = {}
        for path in REGRESSIONS:
            schedule = load_schedule(path.read_bytes())
            scenario = load(str(SCENARIOS / f"{schedule.scenario}.toml"))
            futures[path.stem] = pool.submit(run_in_worker, scenario, schedule.seed,
                                             list(schedule.faults))
        yield futures


@pytest.mark.slow
@pytest.mark.parametrize("path", REGRESSIONS, ids=[p.stem for p in REGRESSIONS])
def test_the_regression_passes(path: pathlib.Path,
                               replays: dict[str, Future[RunResult]]) -> None:
    result = replays[path.stem].result()
    assert result.ok, "\n".join(f"{v.invariant}: {v.message}" for v in result.violations)
