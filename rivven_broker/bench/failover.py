"""``rivven bench failover``: partition leaders killed under ``acks=all`` load; nothing lost.

Theory of operation
-------------------
Three ``rivven-broker`` processes with ``--peers`` on loopback, default settings
(``sync_policy=always``), and a topic with replication factor 3, ``min.insync.replicas=2``
and ``--partitions`` partitions. A producer thread (``acks=all``, idempotent, delivery timeout
60 s) sends numbered records round-robin over the partitions, at most ``--in-flight``
unacknowledged at a time, and notes each acknowledgement's time and partition.

Each of ``--rounds`` rounds waits until every partition's ISR is full, lets the load run
``--interval`` seconds, finds the leader of partition ``round mod partitions`` and SIGKILLs
it. The round's failover time runs from the kill until every partition that broker led has
a live leader *and* has acknowledged a record sent after the kill (led and producing again).
Then the killed broker restarts on its data directory.

At the end the producer flushes and a consumer reads every partition from the start: an
acknowledged record not read back is *lost*, a record read twice is *duplicated*. Exit 1 on
either (or when a round does not recover within ``--bound`` seconds).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from rivven_broker.bench.cluster_processes import LocalCluster, wait_for
from rivven_broker.client import Admin, Consumer, Producer, TopicPartition
from rivven_broker.client.errors import RivvenError

__all__ = ["HELP", "add_arguments", "main"]

HELP = "failover under acks=all load: SIGKILL of partition leaders; lost and duplicated records"
TOPIC = "bench-failover"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=20, help="leader kills (default 20)")
    parser.add_argument("--interval", type=float, default=2.0,
                        help="seconds of load before each kill (default 2)")
    parser.add_argument("--partitions", type=int, default=3, help="partitions (default 3)")
    parser.add_argument("--in-flight", type=int, default=200,
                        help="unacknowledged records at most (default 200)")
    parser.add_argument("--bound", type=float, default=60.0,
                        help="seconds a round may take to recover (default 60)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


class _Load:
    """Numbered records, sent round-robin, with every acknowledgement's time noted."""

    def __init__(self, bootstrap: str, partitions: int, in_flight: int) -> None:
        self._producer = Producer(bootstrap, acks="all", delivery_timeout_ms=60_000,
                                  linger_ms=2)
        self._partitions = partitions
        self._slots = threading.Semaphore(in_flight)
        self._lock = threading.Lock()
        self.acked: dict[int, tuple[int, int]] = {}  # value -> (partition, offset)
        #: Per partition: (send time, ack time) of the latest acknowledged record.
        self.last_ack: dict[int, tuple[float, float]] = {}
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="failover-load", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        value = 0
        while not self._stop.is_set():
            if not self._slots.acquire(timeout=0.1):
                continue
            partition = value % self._partitions
            sent = time.monotonic()

            def done(error: Exception | None, metadata: Any, value: int = value,
                     sent: float = sent) -> None:
                self._slots.release()
                with self._lock:
                    if error is not None:
                        self.failed += 1
                        return
                    self.acked[value] = (metadata.partition, metadata.offset)
                    previous = self.last_ack.get(metadata.partition)
                    if previous is None or previous[0] < sent:
                        self.last_ack[metadata.partition] = (sent, time.monotonic())

            try:
                self._producer.send(TOPIC, str(value).encode(), partition=partition,
                                    on_delivery=done)
            except RivvenError:
                self._slots.release()
                time.sleep(0.01)
                continue
            value += 1

    def producing_since(self, partition: int, moment: float) -> float | None:
        """When ``partition`` acknowledged a record sent after ``moment`` (None: not yet)."""
        with self._lock:
            last = self.last_ack.get(partition)
        return last[1] if last is not None and last[0] > moment else None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._producer.flush(timeout=120)
        self._producer.close()


def _healthy(cluster: LocalCluster, node: int) -> bool:
    try:
        url = f"http://127.0.0.1:{cluster.http_ports[node - 1]}/health"
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(json.loads(answer.read())["ready"])
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _partitions(cluster: LocalCluster, node: int) -> list[Any] | None:
    try:
        with Admin(cluster.address(node), request_timeout_ms=2_000) as admin:
            return list(admin.describe_topic(TOPIC).partition_info)
    except (RivvenError, OSError):
        return None


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values) or [0.0]

    def at(fraction: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))], 3)

    return {"p50": at(0.5), "p99": at(0.99), "max": round(ordered[-1], 3)}


def _read_back(bootstrap: str, partitions: int, expected: int) -> list[int]:
    values: list[int] = []
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        assigned = [TopicPartition(TOPIC, p) for p in range(partitions)]
        consumer.assign(assigned)

        def ends_now() -> dict[TopicPartition, int] | None:
            try:
                return consumer.end_offsets(assigned)
            except RivvenError:  # a leader not known yet (a broker just restarted)
                return None
        ends = wait_for(ends_now, "every partition led for the read-back", 60)
        total = sum(ends.values())
        deadline = time.monotonic() + 120
        while len(values) < max(total, expected) and time.monotonic() < deadline:
            values.extend(int(r.value) for r in consumer.poll(timeout_ms=500))
            if len(values) >= total:
                break
    return values


def run(args: argparse.Namespace) -> dict[str, Any]:
    cluster = LocalCluster(3, "rivven-bench-failover-", http=True, sync_policy="always")
    try:
        for node in (1, 2, 3):
            cluster.start(node)
        for node in (1, 2, 3):
            wait_for(lambda n=node: _healthy(cluster, n), f"broker {node} ready")
        bootstrap = ",".join(cluster.address(n) for n in (1, 2, 3))
        with Admin(cluster.address(1)) as admin:
            wait_for(lambda: len(admin.cluster_status().brokers) == 3, "three live brokers")
            admin.create_topic(TOPIC, partitions=args.partitions, replication_factor=3,
                               config={"min.insync.replicas": "2"})
        load = _Load(bootstrap, args.partitions, args.in_flight)
        load.start()
        failovers: list[float] = []
        epochs_grew = True
        for round_number in range(args.rounds):
            def full_isr() -> list[Any] | None:
                infos = _partitions(cluster, next(iter(cluster.processes)))
                if infos and all(len(i.isr) == 3 and i.leader for i in infos):
                    return infos
                return None
            wait_for(full_isr, "every ISR full", args.bound)
            time.sleep(args.interval)
            before = wait_for(full_isr, f"every ISR full ({_partitions(cluster, 1)})", args.bound)
            victim = before[round_number % args.partitions].leader
            led = [i.partition for i in before if i.leader == victim]
            epochs = {i.partition: i.leader_epoch for i in before}
            cluster.kill(victim)
            killed = time.monotonic()
            survivor = next(iter(cluster.processes))

            def recovered() -> float | None:
                infos = _partitions(cluster, survivor)
                if not infos or any(i.leader in (None, -1, victim) for i in infos):
                    return None
                times = [load.producing_since(p, killed) for p in led]
                if any(t is None for t in times):
                    return None
                nonlocal epochs_grew
                epochs_grew = epochs_grew and all(
                    i.leader_epoch > epochs[i.partition] for i in infos if i.partition in led)
                return max(times)  # type: ignore[type-var]

            done = wait_for(recovered, f"round {round_number + 1}: led and producing again",
                            args.bound)
            failovers.append(done - killed)
            print(f"round {round_number + 1}: killed broker {victim} (leader of "
                  f"{len(led)} partitions): led and producing again after "
                  f"{done - killed:.2f} s", file=sys.stderr)
            cluster.start(victim)
        load.stop()
        acked = load.acked
        values = _read_back(bootstrap, args.partitions, len(acked))
        seen = set(values)
        lost = sorted(v for v in acked if v not in seen)
        duplicated = len(values) - len(seen)
        return {
            "rounds": len(failovers),
            "failover_s": _percentiles(failovers),
            "failover_each_s": [round(f, 3) for f in failovers],
            "acked": len(acked),
            "failed_sends": load.failed,
            "read_back": len(values),
            "lost": len(lost),
            "lost_examples": lost[:10],
            "duplicated": duplicated,
            "leader_epochs_grew": epochs_grew,
            "partitions": args.partitions,
        }
    finally:
        cluster.close()


def main(args: argparse.Namespace) -> int:
    result = run(args)
    if args.json:
        print(json.dumps(result))
    else:
        f = result["failover_s"]
        print(f"failover over {result['rounds']} leader kills (3 brokers, RF 3, "
              f"min.insync.replicas 2, acks=all): p50 {f['p50']} s, p99 {f['p99']} s, "
              f"max {f['max']} s")
        print(f"records: {result['acked']} acknowledged, {result['lost']} lost, "
              f"{result['duplicated']} duplicated, {result['failed_sends']} failed sends")
    return 1 if result["lost"] or result["duplicated"] else 0
