"""``rivven bench controller``: the Raft controller's commit latency, throughput and failover.

Theory of operation
-------------------
Two parts, both on loopback with real sockets and real fsyncs:

1. *Commits* (``--commits``): three ``ControllerHost``\\ s in this process (each its own data
   directory, ``RealEnv``, the HMAC links over TCP), the way every broker runs them. After an
   election, ``--commits`` compare-and-set config changes are proposed one after another on
   the leader and then on a follower (forwarded to the leader): the time from ``propose`` to
   the local apply is the commit latency (p50/p99). Then ``--proposers`` tasks propose topic
   creations concurrently for ``--duration`` seconds: commands per second. One process holds
   all three, so this is a lower bound of what three machines do.
2. *Failover* (``--rounds``): three ``rivven-broker`` processes with ``--peers``. Each round
   finds the controller (Metadata's controller id), SIGKILLs it, and measures until a
   surviving broker names another controller and until an admin call (create topic) succeeds
   through a survivor; then restarts the victim on its data directory and measures until its
   ``/health`` says ready (caught up with the controller's log).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

import trio

from rivven_broker.bench.cluster_processes import LocalCluster, free_ports, wait_for
from rivven_broker.client import Admin
from rivven_broker.server.cluster.controller_host import ControllerHost
from rivven_broker.server.env import RealEnv
from rivven_cluster.membership import KeyRing, generate_key
from rivven_cluster.metadata import AlterTopicConfigs, CreateTopic, RegisterBroker

__all__ = ["HELP", "add_arguments", "main"]

HELP = "the Raft controller: commit latency, commands/s, failover after SIGKILL, time to ready"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--commits", type=int, default=300,
                        help="sequential commits on the leader and on a follower (default 300)")
    parser.add_argument("--proposers", type=int, default=32,
                        help="concurrent proposers for commands/s (default 32)")
    parser.add_argument("--duration", type=float, default=3.0,
                        help="seconds of concurrent proposing (default 3)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="SIGKILLs of the controller leader (default 5; 0 skips)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {}

    def at(fraction: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] * 1000, 3)

    return {"p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": round(ordered[-1] * 1000, 3)}


async def _commits(args: argparse.Namespace, root: str) -> dict[str, Any]:
    ports = free_ports(3)
    voters = {node: ("127.0.0.1", ports[node - 1]) for node in (1, 2, 3)}
    ring = KeyRing((generate_key(os.urandom(32)).encode(),))
    hosts = {}
    async with trio.open_nursery() as nursery:
        for node in voters:
            directory = os.path.join(root, f"c{node}")
            os.makedirs(directory)
            hosts[node] = ControllerHost(RealEnv(directory), node_id=node, boot_id=node,
                                         voters=voters, ring=lambda: ring, directory="raft")
            await nursery.start(hosts[node].run)
        with trio.fail_after(30):
            while True:
                leaders = {h.status().leader for h in hosts.values()}
                if len(leaders) == 1 and None not in leaders:
                    break
                await trio.sleep(0.02)
        leader = leaders.pop()
        follower = next(n for n in hosts if n != leader)
        await hosts[leader].propose(RegisterBroker(1, 1, "127.0.0.1", 9092))
        await hosts[leader].propose(CreateTopic("bench", "bench-id", ((1,),)))
        latency: dict[str, list[float]] = {"leader": [], "follower": []}
        for where, node in (("leader", leader), ("follower", follower)):
            host = hosts[node]
            for _ in range(args.commits):
                topic = host.image().topic("bench")
                command = AlterTopicConfigs("bench", "bench-id", topic.config_version,
                                            {"retention.ms": str(topic.config_version)})
                started = time.perf_counter()
                await host.propose(command)
                latency[where].append(time.perf_counter() - started)
        done = 0
        stop_at = trio.current_time() + args.duration

        async def proposer(number: int) -> None:
            nonlocal done
            sequence = 0
            while trio.current_time() < stop_at:
                sequence += 1
                name = f"t{number}-{sequence}"
                await hosts[leader].propose(CreateTopic(name, name, ((1,),)))
                done += 1

        started = trio.current_time()
        async with trio.open_nursery() as proposers:
            for number in range(args.proposers):
                proposers.start_soon(proposer, number)
        elapsed = trio.current_time() - started
        nursery.cancel_scope.cancel()
    return {"commit_on_leader": _percentiles(latency["leader"]),
            "commit_via_follower": _percentiles(latency["follower"]),
            "commands_per_s": round(done / elapsed), "proposers": args.proposers}


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
            return bool(json.loads(answer.read())["ready"])
    except (OSError, urllib.error.URLError, ValueError):
        return False


def _controller(cluster: LocalCluster, node: int) -> int | None:
    try:
        with Admin(cluster.address(node), request_timeout_ms=1_000) as admin:
            return admin.cluster_status().controller_id
    except Exception:  # a broker without an answer yet  # noqa: BLE001
        return None


def _create(cluster: LocalCluster, node: int, name: str) -> bool:
    try:
        with Admin(cluster.address(node), request_timeout_ms=5_000) as admin:
            admin.create_topic(name, partitions=1, replication_factor=1)
        return True
    except Exception:  # no controller yet: try again  # noqa: BLE001
        return False


def _failover(rounds: int) -> dict[str, Any]:
    cluster = LocalCluster(3, "rivven-bench-controller-", http=True)
    elected: list[float] = []
    admin_ok: list[float] = []
    ready: list[float] = []
    try:
        for node in (1, 2, 3):
            cluster.start(node)
        for node in (1, 2, 3):
            wait_for(lambda n=node: _ready(cluster.http_ports[n - 1]), "every broker ready")
        for round_number in range(rounds):
            victim = wait_for(lambda: _controller(cluster, 1 + round_number % 3), "a controller")
            survivor = next(n for n in (1, 2, 3) if n != victim)
            killed_at = time.monotonic()
            cluster.kill(victim)
            wait_for(lambda: _controller(cluster, survivor) not in (None, victim),
                     "a new controller")
            elected.append(time.monotonic() - killed_at)
            wait_for(lambda: _create(cluster, survivor, f"after-kill-{round_number}"),
                     "an admin call through a survivor")
            admin_ok.append(time.monotonic() - killed_at)
            started = time.monotonic()
            cluster.start(victim)
            wait_for(lambda: _ready(cluster.http_ports[victim - 1]), "the victim ready again")
            ready.append(time.monotonic() - started)
    finally:
        cluster.close()

    def seconds(values: list[float]) -> dict[str, float]:
        ordered = sorted(values)
        return {"p50_s": round(ordered[len(ordered) // 2], 3), "max_s": round(ordered[-1], 3),
                "all_s": [round(v, 3) for v in values]}

    return {"rounds": rounds, "new_controller": seconds(elected),
            "admin_call_succeeds": seconds(admin_ok), "restarted_broker_ready": seconds(ready)}


def main(args: argparse.Namespace) -> int:
    root = tempfile.mkdtemp(prefix="rivven-bench-controller-")
    try:
        result: dict[str, Any] = {"commits": trio.run(_commits, args, root)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.rounds:
        result["failover"] = _failover(args.rounds)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    commits = result["commits"]
    print(f"controller commits (3 voters in one process, loopback, fsync): on the leader "
          f"p50 {commits['commit_on_leader']['p50_ms']} ms, p99 "
          f"{commits['commit_on_leader']['p99_ms']} ms; via a follower p50 "
          f"{commits['commit_via_follower']['p50_ms']} ms, p99 "
          f"{commits['commit_via_follower']['p99_ms']} ms; {commits['commands_per_s']} "
          f"commands/s with {commits['proposers']} proposers")
    if "failover" in result:
        failover = result["failover"]
        print(f"failover ({failover['rounds']} SIGKILLs of the leader, 3 broker processes): new "
              f"controller p50 {failover['new_controller']['p50_s']} s, max "
              f"{failover['new_controller']['max_s']} s; admin call succeeds p50 "
              f"{failover['admin_call_succeeds']['p50_s']} s; restarted broker ready p50 "
              f"{failover['restarted_broker_ready']['p50_s']} s, max "
              f"{failover['restarted_broker_ready']['max_s']} s")
    return 0
