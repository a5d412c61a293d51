"""The deterministic simulator: real broker code on a virtual clock, network and disk.

``python -m sim SCENARIO.toml`` (``sim/__main__.py``) runs a scenario from a seed; in code,
``run_scenario(load(path), seed)`` returns a ``RunResult`` with the violations found. The
parts: ``SimClock`` (per-node skew over trio's virtual time), ``SimNetwork``/``SimNet``
(in-memory TCP with latency, partitions, pauses, resets), ``SimDisk`` (a crashable
``MemoryFileStore`` with injected EIO/ENOSPC), ``SimEnv`` (the broker's ``Env``), the workload
and its ``History``, the checkers, the nemesis and the shrinker. ``docs/simulation.md`` is
the manual.
"""

from sim.checkers import Violation
from sim.clock import SimClock
from sim.disk import DiskConfig, SimDisk
from sim.env import SimEnv
from sim.history import Entry, History
from sim.net import NetworkConfig, SimNet, SimNetwork
from sim.scenario import Fault, Scenario, ScenarioError, load, loads
from sim.shrink import shrink
from sim.trace import Trace
from sim.world import RunResult, World, run_scenario, seeded_trio_scheduler

__all__ = [
    "run_scenario",
    "RunResult",
    "World",
    "seeded_trio_scheduler",
    "load",
    "loads",
    "Scenario",
    "ScenarioError",
    "Fault",
    "Violation",
    "History",
    "Entry",
    "Trace",
    "SimEnv",
    "SimClock",
    "SimNetwork",
    "SimNet",
    "NetworkConfig",
    "SimDisk",
    "DiskConfig",
    "shrink",
]
