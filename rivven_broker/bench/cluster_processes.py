"""Real ``rivven-broker`` processes forming a cluster on loopback, for the cluster benchmarks.

``LocalCluster`` picks ports (the cluster ports free for UDP and TCP alike), writes a fresh
key file, starts broker ``n`` with ``--peers`` naming the others (``--sync-policy none`` and
``--http off`` unless told otherwise) and waits for its ready line; ``kill`` is SIGKILL,
``start`` again reuses the node's data directory (a new process: a new boot id). Everything
lives in one temporary directory, removed by ``close``. ``cpus``: the CPUs every broker may
run on (default: those of the process that starts them, which a benchmark may have pinned to
its load's CPU).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

from rivven_broker.bench.servers import process_cpu_seconds
from rivven_broker.server.cluster.key_file import generate_key

__all__ = ["LocalCluster", "free_ports", "wait_for"]

POLL_S = 0.02


def free_ports(count: int, *, both: bool = False, taken: tuple[int, ...] = ()) -> list[int]:
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


def wait_for(predicate: Callable[[], Any], what: str, bound_s: float = 30.0) -> Any:
    """Poll ``predicate`` every 20 ms until it is truthy (returned); RuntimeError after
    ``bound_s``."""
    deadline = time.monotonic() + bound_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {bound_s} s: {what}")
        time.sleep(POLL_S)


class LocalCluster:
    def __init__(self, count: int, prefix: str, *, http: bool = False,
                 sync_policy: str = "none", cpus: frozenset[int] | None = None) -> None:
        self.root = tempfile.mkdtemp(prefix=prefix)
        self.count = count
        self.cluster_ports = free_ports(count, both=True)
        self.client_ports = free_ports(count, taken=tuple(self.cluster_ports))
        self.http_ports = free_ports(count, taken=tuple(self.cluster_ports + self.client_ports)) \
            if http else []
        self.key = os.path.join(self.root, "cluster.key")
        with open(self.key, "w") as handle:
            handle.write(generate_key(os.urandom(32)) + "\n")
        os.chmod(self.key, 0o600)
        self.processes: dict[int, subprocess.Popen] = {}
        self.sync_policy = sync_policy
        self.cpus = cpus

    def address(self, node: int) -> str:
        return f"127.0.0.1:{self.client_ports[node - 1]}"

    def start(self, node: int) -> subprocess.Popen:
        peers = ",".join(f"{i + 1}@127.0.0.1:{port}" for i, port in
                         enumerate(self.cluster_ports) if i + 1 != node)
        http = f"127.0.0.1:{self.http_ports[node - 1]}" if self.http_ports else "off"
        command = [
            sys.executable, "-m", "rivven_broker.cli.broker_main", "--node-id", str(node),
            "--data-dir", os.path.join(self.root, f"n{node}"), "--listen", self.address(node),
            "--http", http, "--peers", peers,
            "--cluster-listen", f"127.0.0.1:{self.cluster_ports[node - 1]}",
            "--cluster-key-file", self.key, "--sync-policy", self.sync_policy,
            "--log-level", "WARNING",
        ]
        log = open(os.path.join(self.root, f"n{node}.log"), "ab")
        cpus = self.cpus
        popen = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, preexec_fn=(
            None if cpus is None else lambda: os.sched_setaffinity(0, cpus)))
        log.close()
        assert popen.stdout is not None
        line = popen.stdout.readline()
        if not line.startswith(b"rivven-broker ready"):
            raise RuntimeError(f"broker {node} did not start: {line!r}")
        self.processes[node] = popen
        return popen

    def cpu_seconds(self) -> float:
        """User + system CPU seconds used so far by every broker process running now."""
        return sum(process_cpu_seconds(p.pid) for p in self.processes.values())

    def kill(self, node: int) -> None:
        popen = self.processes.pop(node)
        popen.kill()
        popen.wait()

    def close(self) -> None:
        for popen in self.processes.values():
            popen.kill()
            popen.wait()
        self.processes.clear()
        shutil.rmtree(self.root, ignore_errors=True)
