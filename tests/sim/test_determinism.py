"""Determinism: one seed, one run — twice in a process, and across PYTHONHASHSEED values.

Method: the private trio switch the simulator relies on must exist (this test fails the day
trio drops or renames it, which is why trio is pinned). Then a short scenario with crashes,
partitions and disk faults runs twice in this process and must give the same trace digest
(and a different seed a different one); then ``python -m sim`` runs it in subprocesses under
two different ``PYTHONHASHSEED`` values, and with ``--check-determinism``, and the printed
digests must agree. Without the seeded scheduler the same run is expected to diverge, which
shows the digest is sensitive to scheduling at all.
"""

from __future__ import annotations

import os
import pathlib
import random
import re
import subprocess
import sys

import pytest
import trio

from sim.scenario import load, loads
from sim.world import World, run_scenario, seeded_trio_scheduler

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCENARIO_TOML = b"""
[run]
duration = "10s"
quiet_period = "4s"
[workload]
topics = [{ name = "t", partitions = 2 }]
producers = [{ count = 2, rate = 20, in_flight = 2 }]
consumers = [{ count = 1 }]
[[faults]]
at = "2s"
kind = "partition"
between = ["n1", "p1"]
for = "1s"
[nemesis]
interval = { min = "500ms", max = "1500ms" }
fault_for = { min = "100ms", max = "1s" }
weights = { crash = 2, reset = 1, disk = 1, pause = 1 }
[checks]
liveness_within = "3s"
"""


def test_the_private_trio_switch_still_exists() -> None:
    run_module = trio._core._run
    assert trio.__version__ == "0.35.0", "the simulator is verified against trio 0.35.0 only"
    assert hasattr(run_module, "_ALLOW_DETERMINISTIC_SCHEDULING")
    assert isinstance(run_module._r, random.Random)
    previous = run_module._ALLOW_DETERMINISTIC_SCHEDULING
    with seeded_trio_scheduler(5):
        assert run_module._ALLOW_DETERMINISTIC_SCHEDULING is True
    assert run_module._ALLOW_DETERMINISTIC_SCHEDULING == previous


def test_same_seed_same_trace_in_process() -> None:
    scenario = loads(SCENARIO_TOML, "determinism")
    first = run_scenario(scenario, 11)
    second = run_scenario(scenario, 11)
    assert first.ok, first.violations
    assert first.stats["faults"] >= 3 and first.stats.get("send.ok", 0) > 50
    assert first.trace_digest == second.trace_digest
    assert first.history.entries == second.history.entries
    assert run_scenario(scenario, 12).trace_digest != first.trace_digest


def test_unseeded_scheduling_is_visible_in_the_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trace must be able to see a scheduling difference, or the test above proves little."""
    scenario = loads(SCENARIO_TOML, "determinism")

    class UnseededWorld(World):
        def run(self):  # type: ignore[no-untyped-def]
            run_module = trio._core._run
            previous = run_module._ALLOW_DETERMINISTIC_SCHEDULING
            run_module._ALLOW_DETERMINISTIC_SCHEDULING = False
            run_module._r.seed()  # fresh entropy: trio's own default behaviour
            try:
                return trio.run(self._main, clock=trio.testing.MockClock(autojump_threshold=0))
            finally:
                run_module._ALLOW_DETERMINISTIC_SCHEDULING = previous

    digests = {UnseededWorld(scenario, 11).run().trace_digest for _ in range(3)}
    assert len(digests) > 1


def _cli(args: list[str], hash_seed: str, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "sim", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_same_trace_under_different_hash_seeds(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "determinism.toml"
    path.write_bytes(SCENARIO_TOML)
    digests = []
    for hash_seed in ("1", "2"):
        done = _cli([str(path), "--seed", "11"], hash_seed, tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"PYTHONHASHSEED={hash_seed}" in done.stdout
        digests.append(re.search(r"seed 11 ok \(trace ([0-9a-f]{16})", done.stdout).group(1))
    assert digests[0] == digests[1]
    assert digests[0] == run_scenario(loads(SCENARIO_TOML, "determinism"), 11).trace_digest[:16]
    checked = _cli([str(path), "--seed", "11", "--check-determinism"], "3", tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"deterministic: both runs traced {digests[0]}" in checked.stdout


@pytest.mark.slow
def test_the_blocking_client_scenario_is_deterministic(tmp_path: pathlib.Path) -> None:
    """The blocking clients run on program threads that alternate with the loop
    (``sim/program_thread.py``): one seed of ``client-blocking`` gives one trace (which holds
    every history entry) twice in a process (``--check-determinism``, under another
    ``PYTHONHASHSEED``, in a subprocess running meanwhile) and the same in this process."""
    path = ROOT / "sim" / "scenarios" / "client-blocking.toml"
    env = {**os.environ, "PYTHONHASHSEED": "5", "PYTHONPATH": str(ROOT)}
    checked = subprocess.Popen([sys.executable, "-m", "sim", str(path), "--seed", "2",
                                "--check-determinism"], cwd=tmp_path, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        scenario = load(str(path))
        here = run_scenario(scenario, 2)
        output, _ = checked.communicate(timeout=300)
    finally:
        checked.kill()
    assert here.ok, here.violations
    assert here.stats["faults"] >= 3 and here.stats.get("send.ok", 0) > 200
    assert {e.process for e in here.history if e.f == "poll" and e.type == "ok"} >= {"c1", "c4"}
    assert checked.returncode == 0, output
    assert f"deterministic: both runs traced {here.trace_digest[:16]}" in output


def test_jobs_run_seeds_in_workers_with_the_same_traces(tmp_path: pathlib.Path) -> None:
    """``--jobs 2``: the seeds run in worker processes, are printed in seed order, and trace
    exactly what they trace in this process."""
    path = tmp_path / "determinism.toml"
    path.write_bytes(SCENARIO_TOML)
    done = _cli([str(path), "--seeds", "11..13", "--jobs", "2"], "4", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    printed = re.findall(r"seed (\d+) ok \(trace ([0-9a-f]{16})", done.stdout)
    assert [int(seed) for seed, _ in printed] == [11, 12, 13]
    scenario = loads(SCENARIO_TOML, "determinism")
    assert [digest for _, digest in printed] == [
        run_scenario(scenario, seed).trace_digest[:16] for seed in (11, 12, 13)]
    refused = _cli([str(path), "--seeds", "1..2", "--jobs", "2", "--check-determinism"], "4",
                   tmp_path)
    assert refused.returncode == 2


CLUSTER_TOML = b"""
[run]
duration = "14s"
quiet_period = "6s"
[nodes]
count = 3
cluster = true
sync_policy = "always"
[workload]
topics = [{ name = "t", partitions = 2, replication_factor = 3, min_insync_replicas = 2 }]
producers = [{ count = 1, client = "rivven", rate = 20, acks = "all" }]
consumers = [{ count = 1, client = "rivven", max_wait = "300ms" },
             { count = 1, client = "rivven", group = "g", restart_every = "4s", max_wait = "300ms" }]
[[faults]]
at = "3s"
kind = "crash"
node = "leader:t/0"
restart_after = "1s"
[nemesis]
interval = { min = "1s", max = "3s" }
fault_for = { min = "200ms", max = "1s" }
weights = { crash = 1, partition = 1, reset = 1 }
[checks]
liveness_within = "6s"
disabled = ["membership_detects_crashes", "membership_no_false_dead"]
"""


@pytest.mark.slow
def test_a_cluster_run_is_the_same_under_hash_seeds_and_jobs(tmp_path: pathlib.Path) -> None:
    """A replicating cluster (membership, controller, replication, the replication monitor,
    role-resolved faults, a restarting group member): the same digests under two
    ``PYTHONHASHSEED`` values, with ``--jobs 1`` and ``--jobs 2``. (The group member found a
    group assignment fetched in the order of a set of partitions, which string hashing
    decides.)"""
    path = tmp_path / "cluster.toml"
    path.write_bytes(CLUSTER_TOML)
    runs = [(["--seeds", "1..2"], "1"), (["--seeds", "1..2", "--jobs", "2"], "2")]
    printed = []
    for args, hash_seed in runs:
        done = _cli([str(path), *args], hash_seed, tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        printed.append(re.findall(r"seed (\d+) ok \(trace ([0-9a-f]{16})", done.stdout))
    assert printed[0] == printed[1] and len(printed[0]) == 2
    assert printed[0][0][1] != printed[0][1][1]
