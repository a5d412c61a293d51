"""Coordinators in the simulator: groups and transactions across broker crashes.

Method: ``cluster-groups-txn`` (shipped, so ``test_scenarios``' sweep runs it on seeds 1-3)
kills the coordinators' brokers and others at random while group members commit and restart
and a transactional producer commits and aborts; here one seed must also have exercised
commits, transactions of both outcomes and reassignments. Then the planted bug
``coordinator_skips_load`` (a new group coordinator that does not load its groups from the
log) must be reported within 20 seeds as ``group_commits_durable`` (commits lost) and as
``group_once_per_generation`` (the forgetful coordinator numbers generations from the start
again, so two members own one partition "in the same generation"); caught at seeds 1 and 2
today. A scenario asking for a transactional thin-client producer or a group without
the real client is refused.
"""

from __future__ import annotations

import pathlib

import pytest

from sim.history import OK
from sim.scenario import ScenarioError, loads
from sim.world import run_scenario
from tests.sim.pool import first_seeds_reporting

SCENARIO = pathlib.Path(__file__).resolve().parents[2] / "sim" / "scenarios" / \
    "cluster-groups-txn.toml"


@pytest.mark.slow
def test_groups_and_transactions_are_exercised_across_the_crashes() -> None:
    result = run_scenario(loads(SCENARIO.read_bytes(), name="coordinators"), 4)
    assert result.ok, [f"{v.invariant}: {v.message}" for v in result.violations]
    done = {(e.f, e.type) for e in result.history}
    assert {("commit_offsets", OK), ("commit", OK), ("abort", OK)} <= done
    assert any(e.f == "poll" and e.value.get("assigned") for e in result.history)


@pytest.mark.slow
def test_a_coordinator_that_forgets_its_groups_is_caught() -> None:
    text = SCENARIO.read_text().replace(
        "[checks]", '[test]\nreplication_bug = "coordinator_skips_load"\n\n[checks]')
    wanted = {"group_commits_durable", "group_once_per_generation"}
    found = first_seeds_reporting(loads(text.encode(), name="bite-coordinator"), range(1, 21),
                                  wanted)
    assert set(found) == wanted, f"caught within 20 seeds: {found}"


@pytest.mark.parametrize("table", [
    '[[workload.producers]]\ntransactional = true\n',
    '[[workload.producers]]\nclient = "rivven"\nacks = 1\ntransactional = true\n',
    '[[workload.consumers]]\ngroup = "g"\n',
    '[[workload.consumers]]\nclient = "rivven"\ngroup = "g"\npartitions = [0]\n',
])
def test_workloads_the_real_client_must_run_are_refused_otherwise(table: str) -> None:
    text = f'[workload]\ntopics = [{{ name = "t", partitions = 2 }}]\n\n{table}'
    with pytest.raises(ScenarioError):
        loads(text.encode())
