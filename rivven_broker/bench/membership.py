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
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from rivven_broker.client import Admin
from rivven_broker.server.cluster.key_file import generate_key

__all__ = ["HELP", "add_arguments", "main"]

HELP = "crash detection by SWIM membership with real broker processes (SIGKILL, loopback)"
_POLL_S = 0.02
_WAIT_S = 30.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--brokers", type=int, default=5, help="broker processes (default 5)")
    parser.add_argument("--rounds", type=int, default=10, help="kills (default 10)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def _free_ports(count: int, *, both: bool = False, taken: tuple[int, ...] = ()) -> list[int]:
    """Ports free for TCP now (and for UDP too with ``both``: the cluster port carries SWIM
    over UDP and the Raft links over TCP), none of ``taken``."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            tcp.bind(("127.0.0.1", 0))
            port = tcp.getsockname()[1]
            if both:
                try:
                    udp.bind(("127.0.0.1", port))
                except OSError:
                    continue
        if port not in ports and port not in taken:
            ports.append(port)
    return ports


def _start(node: int, udp: list[int], tcp: list[int], key: str, root: str) -> subprocess.Popen:
    peers = ",".join(f"{i + 1}@127.0.0.1:{port}" for i, port in enumerate(udp) if i + 1 != node)
    command = [
        sys.executable, "-m", "rivven_broker.cli.broker_main", "--node-id", str(node),
        "--data-dir", os.path.join(root, f"n{node}"), "--listen", f"127.0.0.1:{tcp[node - 1]}",
        "--http", "off", "--peers", peers, "--cluster-listen", f"127.0.0.1:{udp[node - 1]}",
        "--cluster-key-file", key, "--sync-policy", "none", "--log-level", "WARNING",
    ]
    log = open(os.path.join(root, f"n{node}.log"), "ab")
    popen = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log)
    log.close()
    assert popen.stdout is not None
    line = popen.stdout.readline()
    if not line.startswith(b"rivven-broker ready"):
        raise RuntimeError(f"broker {node} did not start: {line!r}")
    return popen


def _view(port: int) -> dict[int, str]:
    try:
        with Admin(f"127.0.0.1:{port}", request_timeout_ms=2_000) as admin:
            return {m.node_id: m.state for m in admin.cluster_status().members}
    except Exception:  # a broker between restarts: no view yet  # noqa: BLE001
        return {}


def _wait(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + _WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {_WAIT_S} s: {what}")
        time.sleep(_POLL_S)


def main(args: argparse.Namespace) -> int:
    root = tempfile.mkdtemp(prefix="rivven-bench-membership-")
    count = args.brokers
    udp = _free_ports(count, both=True)
    tcp = _free_ports(count, taken=tuple(udp))
    key = os.path.join(root, "cluster.key")
    with open(key, "w") as handle:
        handle.write(generate_key(os.urandom(32)) + "\n")
    os.chmod(key, 0o600)
    processes = {node: _start(node, udp, tcp, key, root) for node in range(1, count + 1)}
    whole = {node: "alive" for node in processes}
    detections: list[float] = []
    try:
        _wait(lambda: all(_view(tcp[n - 1]) == whole for n in processes), "one view")
        for round_number in range(args.rounds):
            victim = round_number % count + 1
            others = [n for n in processes if n != victim]
            processes[victim].kill()
            killed_at = time.monotonic()
            processes[victim].wait()
            seen: dict[int, float] = {}
            while len(seen) < len(others):
                for node in others:
                    if node not in seen and _view(tcp[node - 1]).get(victim) == "dead":
                        seen[node] = time.monotonic() - killed_at
                if time.monotonic() - killed_at > _WAIT_S:
                    raise RuntimeError(f"broker {victim} not seen dead by all in {_WAIT_S} s")
                time.sleep(_POLL_S)
            detections.append(max(seen.values()))
            processes[victim] = _start(victim, udp, tcp, key, root)
            _wait(lambda: all(_view(tcp[n - 1]) == whole for n in processes), "whole again")
    finally:
        for popen in processes.values():
            popen.kill()
            popen.wait()
        shutil.rmtree(root, ignore_errors=True)
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
