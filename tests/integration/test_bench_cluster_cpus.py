"""The benchmark's cluster brokers run on the CPUs they are given, not on the one the bench
pinned itself to.

``run_line`` pins the bench process to the load's CPU before a line starts its servers; the
brokers of a ``--cluster`` line used to inherit that pin, so three brokers and the load shared
one core while the single broker had one of its own (docs/performance.md, "The cluster line's
brokers were pinned to one core"). Method: pin this test process to one CPU, start a
two-broker ``LocalCluster`` given every CPU of the machine, and read each broker's affinity.
"""

from __future__ import annotations

import os

import pytest

from rivven_broker.bench.cluster_processes import LocalCluster

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                       reason="needs CPU affinity and two CPUs"),
]


def test_cluster_brokers_run_on_the_cpus_they_are_given() -> None:
    machine = frozenset(os.sched_getaffinity(0))
    pinned = {min(machine)}
    os.sched_setaffinity(0, pinned)
    try:
        cluster = LocalCluster(2, "rivven-test-cpus-", cpus=machine)
        try:
            for node in (1, 2):
                cluster.start(node)
            for popen in cluster.processes.values():
                assert os.sched_getaffinity(popen.pid) == machine
        finally:
            cluster.close()
        inherited = LocalCluster(2, "rivven-test-cpus-")  # without: the starter's own
        try:
            inherited.start(1)
            assert os.sched_getaffinity(inherited.processes[1].pid) == pinned
        finally:
            inherited.close()
    finally:
        os.sched_setaffinity(0, machine)
