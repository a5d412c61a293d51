"""The controller in the simulator: real PySyncObj on simulated clock, disk and streams.

Method: the shipped controller scenarios run in ``test_scenarios``' sweep; here the run is
shown to have exercised Raft (several terms, commands acknowledged through crashes), the
controller checkers are shown to bite (a disk that lies about the Raft journal's fsyncs is
caught as lost or disagreeing commands), and a run is the same under another
``PYTHONHASHSEED`` by trace digest.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from sim.scenario import load, loads
from sim.world import run_scenario

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "sim" / "scenarios"
CONTROLLER_INVARIANTS = {"controller_one_leader_per_term", "controller_logs_agree",
                         "controller_nothing_lost", "controller_applied_once"}

LYING = """
[run]
duration = "30s"
quiet_period = "10s"
[nodes]
count = 3
cluster = true
[workload]
topics = [{ name = "t", partitions = 1 }]
producers = [{ count = 1, rate = 5 }]
consumers = [{ count = 1 }]
[nemesis]
enabled = true
interval = { min = "1s", max = "3s" }
weights = { crash = 1 }
[checks]
liveness_within = "10s"
disabled = ["membership_detects_crashes", "membership_no_false_dead"]
"""


def test_a_crash_run_elects_often_and_acknowledges_commands():
    result = run_scenario(load(str(SCENARIOS / "controller-crash.toml")), 2)
    assert result.ok, result.violations
    stats = result.stats
    assert stats["controller_terms"] >= 4
    assert stats["controller_acknowledged"] >= 50
    assert stats["controller_index"] >= stats["controller_acknowledged"]


def test_a_journal_whose_fsyncs_lie_is_caught():
    caught = set()
    for seed in range(1, 4):
        result = run_scenario(loads((LYING + "[test]\nraft_lying_fsync = 1.0\n").encode(),
                                    "lying"), seed)
        caught |= {v.invariant for v in result.violations} & CONTROLLER_INVARIANTS
        if caught:
            break
    assert caught, "no controller invariant caught a journal that never reached the disk"


def test_the_same_scenario_without_the_lie_passes():
    result = run_scenario(loads(LYING.encode(), "honest"), 1)
    assert result.ok, result.violations


def test_the_run_does_not_depend_on_the_hash_seed():
    digests = set()
    for hash_seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-m", "sim", str(SCENARIOS / "controller-partitions.toml"),
             "--seed", "1"],
            cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)},
            capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        digests.add(out.stdout.split("trace ")[1].split(",")[0])
    assert len(digests) == 1


def test_what_counts_as_lost_for_admin_commands():
    from types import SimpleNamespace

    from rivven_cluster.metadata import CreatePartitions, CreateTopic, DeleteTopic
    from sim.controller_check import _lost

    topics = {"a": SimpleNamespace(topic_id="A", partitions=[1, 2], config_version=0)}
    image = SimpleNamespace(topic=topics.get)
    assert _lost(image, DeleteTopic("a", "A"), set()) is not None  # acknowledged, still there
    assert _lost(image, DeleteTopic("b", "B"), set()) is None
    grown = CreatePartitions("a", "A", 2, ((1,),))
    assert _lost(image, grown, set()) is not None  # 3 acknowledged, 2 left
    assert _lost(image, grown, {"a"}) is None  # a deletion was proposed: anything goes
    assert _lost(image, CreateTopic("b", "B", ((1,),)), set()) is not None
    assert _lost(image, CreateTopic("b", "B", ((1,),)), {"b"}) is None
