"""``rivven bench membership``: crash detection by SWIM with real broker processes.

Theory of operation
-------------------
Starts ``--brokers`` (default 5) ``rivven-broker`` processes on loopback with ``--peers``
(free UDP ports, a fresh key file), waits until every broker sees every other alive, then for
``--rounds`` rounds: SIGKILL a broker (round-robin), poll every other broker's view
(``DescribeCluster``) every 20 ms until all of them see it dead, record the time from the kill,
restart the victim on its data directory (a new process: a new boot id) and wait until every
view is whole again. Prints p50/p99/max of the detection time (``--json``: one document).
Loopback has no loss: this measures the protocol's timing with real processes, real sockets
and real event loops; ``python -m sim.membership_figures`` measures it under loss and jitter.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from rivven_broker.bench.cluster_processes import LocalCluster, wait_for
from rivven_broker.client import Admin

__all__ = ["HELP", "add_arguments", "main"]

HELP = "crash detection by SWIM membership with real broker processes (SIGKILL, loopback)"
_POLL_S = 0.02
_WAIT_S = 30.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--brokers", type=int, default=5, help="broker processes (default 5)")
    parser.add_argument("--rounds", type=int, default=10, help="kills (default 10)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def _view(port: int) -> dict[int, str]:
    try:
        with Admin(f"127.0.0.1:{port}", request_timeout_ms=2_000) as admin:
            return {m.node_id: m.state for m in admin.cluster_status().members}
    except Exception:  # a broker between restarts: no view yet  # noqa: BLE001
        return {}


def main(args: argparse.Namespace) -> int:
    count = args.brokers
    cluster = LocalCluster(count, "rivven-bench-membership-")
    port = cluster.client_ports
    whole = {node: "alive" for node in range(1, count + 1)}

    def wait(predicate: Any, what: str) -> None:
        wait_for(predicate, what, _WAIT_S)

    detections: list[float] = []
    try:
        for node in range(1, count + 1):
            cluster.start(node)
        wait(lambda: all(_view(port[n - 1]) == whole for n in whole), "one view")
        for round_number in range(args.rounds):
            victim = round_number % count + 1
            others = [n for n in whole if n != victim]
            killed_at = time.monotonic()
            cluster.kill(victim)
            seen: dict[int, float] = {}
            while len(seen) < len(others):
                for node in others:
                    if node not in seen and _view(port[node - 1]).get(victim) == "dead":
                        seen[node] = time.monotonic() - killed_at
                if time.monotonic() - killed_at > _WAIT_S:
                    raise RuntimeError(f"broker {victim} not seen dead by all in {_WAIT_S} s")
                time.sleep(_POLL_S)
            detections.append(max(seen.values()))
            cluster.start(victim)
            wait(lambda: all(_view(port[n - 1]) == whole for n in whole), "whole again")
    finally:
        cluster.close()
    ordered = sorted(detections)

    def at(fraction: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))], 3)

    result = {"brokers": count, "rounds": len(ordered), "detection_s": {
        "p50": at(0.5), "p99": at(0.99), "max": round(ordered[-1], 3)}, "all_s": [
        round(value, 3) for value in detections]}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{count} brokers, {len(ordered)} SIGKILLs: every live broker saw the victim dead "
              f"after p50 {at(0.5)} s, p99 {at(0.99)} s, max {ordered[-1]:.3f} s")
    return 0
