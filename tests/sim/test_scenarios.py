"""The shipped scenarios pass their CI sweep.

Method: every ``sim/scenarios/*.toml`` must parse, contain no test-only switch, and pass a
fixed sweep of seeds (the same seeds on every CI run, so a red build is reproducible with
``python -m sim sim/scenarios/NAME.toml --seeds 1..3``). Each run also has to have actually
exercised something (faults applied, sends acknowledged, polls made), so a scenario that
silently stopped injecting faults or producing fails here too.

The sweep's runs are single-threaded CPU work: they run two at a time in fresh worker
processes (``sim.world.run_in_worker``, as ``python -m sim --jobs 2``), all the selected ones
submitted when the first starts; each test then judges its own result.
"""

from __future__ import annotations

import multiprocessing
import os
import pathlib
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Iterator

import pytest

from sim.scenario import load
from sim.world import RunResult, run_in_worker

SCENARIOS = sorted((pathlib.Path(__file__).resolve().parents[2] / "sim" / "scenarios").glob("*.toml"))
SWEEP_SEEDS = (1, 2, 3)


def test_the_named_scenarios_are_shipped() -> None:
    names = {path.stem for path in SCENARIOS}
    assert {"single-node-crash", "disk-faults", "client-partitions", "client-blocking"} <= names
    assert {"cluster-leader-crash", "cluster-partitions", "cluster-rolling-restart",
            "cluster-disk-faults", "cluster-groups-txn"} <= names


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenarios_parse_without_test_switches(path: pathlib.Path) -> None:
    scenario = load(str(path))
    assert not scenario.test.any
    assert scenario.nodes.sync_policy == "always"


@pytest.fixture(scope="module")
def sweep(request: pytest.FixtureRequest) -> Iterator[dict[tuple[str, int], Future[RunResult]]]:
    """The selected sweep runs, submitted at once to a pool of worker processes."""
    selected = [item.callspec.params for item in request.session.items
                if item.originalname == "test_sweep" and hasattr(item, "callspec")]
    context = multiprocessing.get_context("spawn")  # fresh interpreters, no forked state
    with ProcessPoolExecutor(min(2, os.cpu_count() or 1), mp_context=context) as pool:
        yield {(str(p["path"]), p["seed"]): pool.submit(run_in_worker, load(str(p["path"])),
                                                          p["seed"], None)
               for p in selected}


@pytest.mark.slow
@pytest.mark.parametrize("seed", SWEEP_SEEDS)
@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_sweep(path: pathlib.Path, seed: int,
               sweep: dict[tuple[str, int], Future[RunResult]]) -> None:
    result = sweep[(str(path), seed)].result()
    assert result.ok, "\n".join(f"{v.invariant}: {v.message}" for v in result.violations)
    stats = result.stats
    assert stats["faults"] >= 3
    assert stats.get("send.ok", 0) > 200 and stats.get("poll.ok", 0) > 100
