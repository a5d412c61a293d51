"""``rivven bench connect``: the connector runtime, ``datagen`` → N routed topics, exactly-once.

Theory of operation
-------------------
Starts a ``rivven-broker`` process (fresh data directory, ``--sync``), creates
``--destinations`` topics (``--partitions`` each) and runs ``python -m rivven_connect`` as a
subprocess with one ``datagen`` source: unlimited count, no rate limit, ``--batch-size``
records per poll and one poll per transaction (with ``--interval-ms N``: the transaction
boundary ``interval``, polls gathered for up to N ms per transaction), values of about ``--record-bytes`` bytes (JSON ``{"seq", "payload",
"topic"}``), record ``n`` routed by ``topic_column`` to topic ``n mod N``. The one-topic
case routes the same way to a list of one, so the two differ only in the number of
destinations (one transaction touches N topics, plus the offsets topic).

This process reads every topic with a blocking ``read_committed`` consumer. After the first
record arrives it waits ``--warmup`` seconds, then counts for ``--duration`` seconds:

- ``records_per_s``: records received by the consumer in the window / its length;
- ``latency_ms``: end to end, per record, from its timestamp (``CreateTime``, stamped by the
  runtime's producer when the driver queues it, a routing step after ``datagen`` made it) to
  its receipt by the ``read_committed`` consumer (wall clock, one machine). It includes the
  wait for the batch's commit, since uncommitted records are invisible to the reader.

Then the runtime gets SIGTERM (its batch in flight commits), the consumer reads to the end,
and every ``seq`` up to the runtime's final position must have been read exactly once
(``lost`` / ``duplicated``; exit 1 otherwise). CPU seconds per million records of the
runtime and the broker (``/proc``) and of the reader (this process) say where the time goes.
No CPU pinning: the broker, the runtime and the reader share the machine. The layering
keeps ``rivven_broker`` from importing ``rivven_connect``: the runtime is only ever a
subprocess here.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
from typing import Any

from rivven_broker.bench.servers import start_rivven
from rivven_broker.bench.stats import Latency
from rivven_broker.bench.storage import machine_description
from rivven_broker.client import Admin, Consumer, TopicPartition

__all__ = ["HELP", "add_arguments", "main", "run_connect_bench"]

HELP = ("the connector runtime: datagen -> N routed topics, exactly-once; records/s and p99 "
        "end-to-end to a read_committed reader")
TOPIC_PREFIX = "bench.connect."
_ROOT = pathlib.Path(__file__).resolve().parents[2]
_STOP_TIMEOUT_S = 60.0
_DRAIN_TIMEOUT_S = 120.0
_FINAL = re.compile(rb"source gen: (\w+) at position (\d+|None), (\d+) records committed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=20.0,
                        help="seconds measured (default 20)")
    parser.add_argument("--warmup", type=float, default=3.0,
                        help="seconds after the first record before measuring (default 3)")
    parser.add_argument("--destinations", type=int, default=1,
                        help="topics the records are routed over (default 1)")
    parser.add_argument("--partitions", type=int, default=1,
                        help="partitions per topic (default 1)")
    parser.add_argument("--record-bytes", type=int, default=100,
                        help="record value size, about (default 100)")
    parser.add_argument("--batch-size", type=int, default=500,
                        help="datagen batch size: records per transaction (default 500)")
    parser.add_argument("--interval-ms", type=int, default=0,
                        help="the source's transaction boundary: 0 (default) one poll per "
                             "transaction (boundary: poll); N gathers polls for up to N ms "
                             "(boundary: interval, records_max 100,000)")
    parser.add_argument("--sync", choices=("always", "none"), default="always",
                        help="the broker's sync policy (default always, its default)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def _topics(count: int) -> list[str]:
    return [f"{TOPIC_PREFIX}{index:03d}" for index in range(count)]


def _payload_bytes(record_bytes: int, topic: str) -> int:
    """The datagen payload that makes a value of about ``record_bytes`` bytes."""
    shell = len(json.dumps({"seq": 1_000_000, "payload": "", "topic": topic},
                           separators=(",", ":")))
    return max(0, record_bytes - shell)


def _write_config(path: pathlib.Path, topics: list[str], args: argparse.Namespace) -> None:
    payload = _payload_bytes(args.record_bytes, topics[0])
    path.write_text(json.dumps({  # JSON is YAML
        "version": "1.0", "http": "off",
        "sources": {"gen": {
            "connector": "datagen", "topic": topics[0],
            "config": {"count": None, "rate": None, "record_size_bytes": payload,
                       "batch_size": args.batch_size, "topics": topics},
            "routing": {"topic_column": "topic", "default_topic": topics[0],
                        "admission": {"max_destinations": max(256, len(topics))}},
            "transaction": ({"boundary": "interval", "interval_ms": args.interval_ms,
                             "records_max": 100_000} if args.interval_ms
                            else {"boundary": "poll"}),
        }},
    }))


def _process_cpu_s(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Reader:
    """The ``read_committed`` consumer: counts the window, the latencies, each seq."""

    def __init__(self, bootstrap: str, topics: list[str], partitions: int) -> None:
        self.consumer = Consumer(bootstrap=bootstrap, isolation_level="read_committed",
                                 enable_auto_commit=False, auto_offset_reset="earliest")
        self.partitions = [TopicPartition(t, p) for t in topics for p in range(partitions)]
        self.consumer.assign(self.partitions)
        for tp in self.partitions:
            self.consumer.seek(tp, 0)
        self.seen = bytearray()
        self.latency = Latency()
        self.value_bytes = 0
        self.received = 0

    def poll(self, window: tuple[float, float] | None) -> int:
        """Read one poll's records; count those received inside ``window`` (wall seconds).
        Returns how many were counted."""
        records = self.consumer.poll(timeout_ms=100)
        now_s = time.time()
        counted = window is not None and window[0] <= now_s < window[1]
        now_ms = now_s * 1000
        seen = self.seen
        for record in records:
            seq = int(record.key)
            if seq >= len(seen):
                seen.extend(bytes(seq + 1 - len(seen) + 65_536))
            if seen[seq] < 255:
                seen[seq] += 1
            if counted:
                self.latency.record_us((now_ms - record.timestamp_ms) * 1000)
                self.value_bytes += len(record.value)
        self.received += len(records)
        return len(records) if counted else 0

    def drain(self) -> None:
        ends = self.consumer.end_offsets(self.partitions)
        deadline = time.monotonic() + _DRAIN_TIMEOUT_S
        while any(self.consumer.position(tp) < ends[tp] for tp in self.partitions):
            if time.monotonic() > deadline:
                raise RuntimeError("the reader did not reach the end offsets")
            self.poll(None)

    def close(self) -> None:
        self.consumer.close()


def run_connect_bench(args: argparse.Namespace) -> dict[str, Any]:
    """One run (see the module docstring). Blocks for about warmup + duration seconds."""
    topics = _topics(args.destinations)
    broker = start_rivven(args.sync, None, None)
    runtime: subprocess.Popen[bytes] | None = None
    try:
        with Admin(broker.bootstrap) as admin:
            for topic in topics:
                admin.create_topic(topic, partitions=args.partitions, replication_factor=1)
        config = pathlib.Path(broker.directory) / "connect.yaml"
        _write_config(config, topics, args)
        reader = _Reader(broker.bootstrap, topics, args.partitions)
        runtime = subprocess.Popen(
            [sys.executable, "-m", "rivven_connect", "--config", str(config),
             "--bootstrap", broker.bootstrap],
            env={**os.environ, "PYTHONPATH": str(_ROOT)}, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while not reader.received:
            if runtime.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no record arrived: {runtime.stderr.read().decode()[-2000:]}")
            reader.poll(None)
        start_s = time.time() + args.warmup
        window = (start_s, start_s + args.duration)
        counted = 0
        cpu_runtime = [0.0, 0.0]
        cpu_broker = [0.0, 0.0]
        cpu_reader = [0.0, 0.0]
        while time.time() < window[1]:
            if not cpu_runtime[0] and time.time() >= start_s:
                cpu_runtime[0] = _process_cpu_s(runtime.pid) or 0.0
                cpu_broker[0] = broker.cpu_seconds()
                cpu_reader[0] = time.process_time()
            counted += reader.poll(window)
        cpu_runtime[1] = _process_cpu_s(runtime.pid) or 0.0
        cpu_broker[1] = broker.cpu_seconds()
        cpu_reader[1] = time.process_time()
        runtime.send_signal(signal.SIGTERM)
        _, stderr = runtime.communicate(timeout=_STOP_TIMEOUT_S)
        final = _FINAL.search(stderr)
        if runtime.returncode != 0 or final is None or final.group(1) != b"stopped":
            raise RuntimeError(f"the runtime ended with {runtime.returncode}: "
                               f"{stderr.decode()[-2000:]}")
        last_seq = int(final.group(2))
        reader.drain()
        reader.close()
    finally:
        if runtime is not None and runtime.poll() is None:
            runtime.kill()
            runtime.wait()
        broker.stop()
    head = reader.seen[:last_seq + 1]
    lost = head.count(0)
    duplicated = sum(count - 1 for count in reader.seen if count > 1)
    beyond = sum(1 for count in reader.seen[last_seq + 1:] if count)
    rate = counted / args.duration
    per_million = 1e6 / counted if counted else 0.0
    return {
        "workload": (f"datagen -> {args.destinations} topic(s) x {args.partitions} "
                     f"partition(s), " + (
                         f"{args.batch_size} records/poll, transactions of up to "
                         f"{args.interval_ms} ms of polls, " if args.interval_ms else
                         f"{args.batch_size} records/transaction, ") +
                     f"~{args.record_bytes} B values, sync {args.sync}"),
        "destinations": args.destinations,
        "records_per_s": round(rate),
        "latency_ms": reader.latency.summary_ms(),
        "latency_measure": "record CreateTime (set when the driver queues it) to "
                           "read_committed consumer receipt",
        "value_bytes_mean": round(reader.value_bytes / counted, 1) if counted else None,
        "runtime_cpu_s_per_million": round((cpu_runtime[1] - cpu_runtime[0]) * per_million, 2),
        "broker_cpu_s_per_million": round((cpu_broker[1] - cpu_broker[0]) * per_million, 2),
        "reader_cpu_s_per_million": round((cpu_reader[1] - cpu_reader[0]) * per_million, 2),
        "records_committed": last_seq + 1,
        "lost": lost,
        "duplicated": duplicated,
        "unknown": beyond,
        "options": {key: value for key, value in vars(args).items() if key != "suite"},
        "machine": machine_description("/tmp"),
    }


def main(args: argparse.Namespace) -> int:
    if args.destinations < 1 or args.partitions < 1 or args.duration <= 0 or not (
            0 <= args.interval_ms <= 60_000):
        raise SystemExit("rivven bench connect: --destinations, --partitions >= 1, "
                         "--duration > 0, --interval-ms in 0..60000")
    result = run_connect_bench(args)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        latency = result["latency_ms"]
        print(result["workload"])
        print(f"{result['records_per_s']:>10,} rec/s  p50 {latency['p50']:.1f} p99 "
              f"{latency['p99']:.1f} max {latency['max']:.1f} ms (end to end)  "
              f"cpu runtime {result['runtime_cpu_s_per_million']} s/M broker "
              f"{result['broker_cpu_s_per_million']} s/M reader "
              f"{result['reader_cpu_s_per_million']} s/M  value {result['value_bytes_mean']} B  "
              f"lost {result['lost']} dup {result['duplicated']} unknown {result['unknown']}")
    return 1 if result["lost"] or result["duplicated"] or result["unknown"] else 0
