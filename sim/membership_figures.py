"""``python -m sim.membership_figures``: the membership figures of docs/performance.md.

Theory of operation
-------------------
Three measurements of the SWIM core (``rivven_cluster.membership``) on its deterministic
harness (``SwimHarness``: real frames, seeded loss, jitter and duplication), each from seeds
so a figure can be reproduced exactly:

- ``detection``: 5 members, 1 % loss, 0-10 ms jitter; a random member crashes at a random
  moment after the cluster settled; the time until *every* live member declared it dead.
  Reported as p50/p99/max over ``--seeds`` runs (the target: p99 under 3 s).
- ``accuracy``: 5 members at 2 % loss and 10 ms jitter, nobody crashes; live members ever
  declared dead (and suspicions raised and refuted), over ``--node-minutes``, with Lifeguard
  and with plain SWIM (``MembershipConfig(lifeguard=False)``).
- ``cost``: datagrams and bytes sent per member per second at 5, 10, 20 and 50 members.

The broker's own driver on the simulator's network is exercised by the scenarios
(``sim/scenarios/membership-*.toml``); these figures isolate the protocol.
"""

from __future__ import annotations

import argparse
import json
import sys

import attrs

from rivven_cluster.membership import MemberChanged, MembershipConfig, MemberState
from rivven_cluster.membership.harness import SwimHarness

__all__ = ["detection_ms", "false_positives", "cost_per_member", "main"]

_SETTLE_MS = 3_000


def detection_ms(seed: int, *, members: int = 5, loss: float = 0.01, jitter_ms: int = 10,
                 config: MembershipConfig | None = None) -> int | None:
    """Crash one member; ms until every other member declared it dead (None: not in 20 s)."""
    declared: dict[int, int] = {}
    victim = [0]

    def on_change(node: int, change: MemberChanged, now_ms: int) -> None:
        if change.member.node_id == victim[0] and change.member.state is MemberState.DEAD:
            declared.setdefault(node, now_ms)

    harness = SwimHarness(members, seed=seed, loss=loss, jitter_ms=jitter_ms, config=config,
                          on_change=on_change)
    harness.run_until(_SETTLE_MS + harness.rng.randrange(2_000))
    victim[0] = 1 + harness.rng.randrange(members)
    harness.crash(victim[0])
    crashed_at = harness.now_ms
    harness.run_until(crashed_at + 20_000)
    live = [node for node in range(1, members + 1) if node != victim[0]]
    if any(node not in declared for node in live):
        return None
    return max(declared[node] for node in live) - crashed_at


def false_positives(seed: int, minutes: float, *, members: int = 5, loss: float = 0.02,
                    jitter_ms: int = 10, lifeguard: bool = True) -> dict[str, int]:
    """Run ``minutes`` with nobody crashing; count live members declared dead."""
    wrongly_dead = [0]

    def on_change(node: int, change: MemberChanged, now_ms: int) -> None:
        if change.member.state is MemberState.DEAD:
            wrongly_dead[0] += 1

    config = MembershipConfig(lifeguard=lifeguard)
    harness = SwimHarness(members, seed=seed, loss=loss, jitter_ms=jitter_ms, config=config,
                          on_change=on_change)
    harness.run_until(int(minutes * 60_000))
    stats = [harness.cores[node].statistics() for node in range(1, members + 1)]
    return {"declared_dead": wrongly_dead[0],
            "suspicions": sum(s.suspicions for s in stats),
            "refutations": sum(s.refutations for s in stats)}


def cost_per_member(members: int, seed: int = 1, seconds: int = 60) -> dict[str, float]:
    harness = SwimHarness(members, seed=seed, loss=0.0, jitter_ms=2)
    harness.run_until(10_000)
    datagrams, sent_bytes = harness.datagrams, harness.bytes
    harness.run_until(10_000 + seconds * 1000)
    per = members * seconds
    return {"datagrams": round((harness.datagrams - datagrams) / per, 2),
            "bytes": round((harness.bytes - sent_bytes) / per, 1)}


def _percentile(values: list[int], fraction: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.membership_figures")
    parser.add_argument("--seeds", type=int, default=1000, help="detection runs (default 1000)")
    parser.add_argument("--node-minutes", type=float, default=10_000,
                        help="accuracy: simulated node-minutes per mode (default 10000)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    report: dict[str, object] = {}
    for name, config in (("lifeguard", MembershipConfig()),
                         ("swim", MembershipConfig(lifeguard=False))):
        runs = [detection_ms(seed, config=config) for seed in range(args.seeds)]
        found = [ms for ms in runs if ms is not None]
        report[f"detection_{name}"] = {
            "seeds": args.seeds, "undetected": len(runs) - len(found),
            "p50_ms": _percentile(found, 0.5), "p99_ms": _percentile(found, 0.99),
            "max_ms": max(found),
        }
    for name, lifeguard in (("lifeguard", True), ("swim", False)):
        runs_minutes = args.node_minutes / 5
        per_run = 60.0
        totals = {"declared_dead": 0, "suspicions": 0, "refutations": 0}
        seed = 0
        while runs_minutes > 0:
            minutes = min(per_run, runs_minutes)
            for key, value in false_positives(seed, minutes, lifeguard=lifeguard).items():
                totals[key] += value
            runs_minutes -= minutes
            seed += 1
        report[f"accuracy_{name}"] = {"node_minutes": args.node_minutes, **totals}
    report["cost"] = {str(n): cost_per_member(n) for n in (5, 10, 20, 50)}
    report["config"] = attrs.asdict(MembershipConfig())
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for key, value in report.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
