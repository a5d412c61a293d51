"""Ports for a cluster address: free for UDP (SWIM) and TCP (the Raft links) alike.

They are drawn below the kernel's ephemeral range (``ip_local_port_range``), not by binding
port 0: a port the kernel handed out for a probe goes back to that range when the probe
closes, and every ``--listen 127.0.0.1:0`` of a broker in the other test process may get it
before our broker binds it ("Address already in use", seen once in a full run). Below the
range only another explicit choice can take it: random draws, each checked free.
"""

from __future__ import annotations

import random
import socket

_LOWEST = 10_000


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
            return int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _free(port: int) -> bool:
    with socket.socket() as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        try:
            tcp.bind(("127.0.0.1", port))
            udp.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_cluster_ports(count: int) -> list[int]:
    high = _ephemeral_start() - 1
    assert high - _LOWEST > 100 * count, "no room below the ephemeral port range"
    draw = random.Random()  # (seeded from the OS: the two test processes draw apart)
    ports: list[int] = []
    for _ in range(1000 * count):  # bounded: almost every draw is free
        port = draw.randint(_LOWEST, high)
        if port not in ports and _free(port):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise RuntimeError(f"no {count} free ports between {_LOWEST} and {high}")
