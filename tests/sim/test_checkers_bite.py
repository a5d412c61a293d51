"""The checkers bite: with a deliberate bug switched on, the simulator names the right
invariant within a few seeds, and the replay command it prints reproduces the failure.

Method: a short crash-heavy scenario runs with each test-only switch of ``[test]`` in turn:
``ack_before_fsync`` (the broker acknowledges before its group commit: run with an interval
sync policy while the checkers hold it to ``sync=always``), ``lane_answer_early`` (the produce
lane answers a produce at its append, before the group commit), ``lying_fsync`` (the disk reports
segment fsyncs it never did: a disk that loses synced writes) and ``fetch_skip_offset`` (a
consumer's fetch silently loses one record). Seeds 1..SEEDS_MAX are tried until the expected
invariant is reported. Then ``python -m sim`` runs that seed in a subprocess: it must exit 1,
print the invariant and a replay command; running the printed command must exit 1 with the
same invariant and say the replay reproduced the original trace exactly. The same scenario
without any switch passes, so what bites is the bug, not the scenario.
"""

from __future__ import annotations

import os
import pathlib
import shlex
import subprocess
import sys

import pytest

from sim.scenario import load
from sim.world import run_scenario

ROOT = pathlib.Path(__file__).resolve().parents[2]
SEEDS_MAX = 5
BASE = """
[run]
duration = "14s"
quiet_period = "6s"
[workload]
topics = [{ name = "t", partitions = 2 }]
producers = [{ count = 2, rate = 25, in_flight = 2 }]
consumers = [{ count = 1 }]
[nemesis]
interval = { min = "700ms", max = "2s" }
fault_for = { min = "100ms", max = "1s" }
weights = { crash = 3, reset = 1 }
[checks]
liveness_within = "5s"
"""


#: An answer given at the append is lost only by a crash before the group commit: give the
#: lane's switch a slow disk, so that window is wide enough to be hit within a few seeds.
SLOW_DISK = '[disk]\nfsync_latency = { min = "10ms", max = "40ms" }\n'


def _scenario(tmp_path: pathlib.Path, switch: str, *, slow_disk: bool = False) -> pathlib.Path:
    path = tmp_path / "bite.toml"
    disk = SLOW_DISK if slow_disk or switch.startswith("lane_answer_early") else ""
    path.write_text(BASE + disk + (f"[test]\n{switch}\n" if switch else ""))
    return path


def _cli(argv: list[str], cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("slow_disk", [False, True])
def test_without_a_bug_the_scenario_passes(tmp_path: pathlib.Path, slow_disk: bool) -> None:
    result = run_scenario(load(str(_scenario(tmp_path, "", slow_disk=slow_disk))), 1)
    assert result.ok, [v.message for v in result.violations]
    assert result.stats.get("crash.info", 0) >= 3


@pytest.mark.slow
@pytest.mark.parametrize("switch,invariant", [
    ("ack_before_fsync = true", "no_lost_acked_writes"),
    ("lane_answer_early = true", "no_lost_acked_writes"),  # (on a slow disk: SLOW_DISK)
    ("lying_fsync = 0.3", "no_lost_acked_writes"),
    ("fetch_skip_offset = 0.05", "monotonic_gapless"),
])
def test_the_checkers_bite(tmp_path: pathlib.Path, switch: str, invariant: str) -> None:
    path = _scenario(tmp_path, switch)
    scenario = load(str(path))
    for seed in range(1, SEEDS_MAX + 1):
        if invariant in {v.invariant for v in run_scenario(scenario, seed).violations}:
            break
    else:
        pytest.fail(f"{invariant} not reported within {SEEDS_MAX} seeds with {switch}")

    first = _cli([sys.executable, "-m", "sim", str(path), "--seed", str(seed)], tmp_path)
    assert first.returncode == 1, first.stdout + first.stderr
    assert f"VIOLATED {invariant}" in first.stdout
    replay_lines = [line for line in first.stdout.splitlines() if line.strip().startswith("replay: ")]
    assert len(replay_lines) == 1, first.stdout
    command = shlex.split(replay_lines[0].split("replay: ", 1)[1])
    assert command[:3] == ["python", "-m", "sim"] and "--replay" in command

    again = _cli([sys.executable, *command[1:]], tmp_path)
    assert again.returncode == 1, again.stdout + again.stderr
    assert f"VIOLATED {invariant}" in again.stdout
    assert "replay reproduced the original run exactly" in again.stdout


def test_the_simulated_brokers_take_repeated_produces_by_their_shape(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lane's undecoded way for a client's repeated produce (``protocol/produce_shape.py``)
    runs in the simulator too, not only in production: the scenario above takes some of its
    produces that way, and passes."""
    from rivven_broker.protocol.connection import ServerConnection

    taken = [0]
    next_plain_produce = ServerConnection.next_plain_produce

    def counting(core: ServerConnection) -> object:
        plain = next_plain_produce(core)
        taken[0] += plain is not None
        return plain

    monkeypatch.setattr(ServerConnection, "next_plain_produce", counting)
    result = run_scenario(load(str(_scenario(tmp_path, ""))), 1)
    assert result.ok, [v.message for v in result.violations]
    assert taken[0] > 0
