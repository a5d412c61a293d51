"""Consume-transform-produce over 50,000 records survives a crash of the processing client.

Goal: the committed output holds every input exactly once although the processor dies in
the middle of a transaction. Method: the real broker as a subprocess; 50,000 input records
written by an idempotent producer; the processor (``ctp_processor.py``, its own process) is
started, commits a few transactions (output records plus consumed offsets, atomically), opens
one more, writes its output and is killed with SIGKILL. A second processor instance with the
same transactional id fences the dead one (its open transaction is aborted), resumes from the
group's committed offsets and runs to the end. A read_committed consumer then finds exactly
one ``out-<v>`` for every input ``v``, each in its input's partition, in input order.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

import pytest

from rivven_broker.client import Admin, Consumer, Producer, TopicPartition

pytestmark = pytest.mark.slow

_PROCESSOR = pathlib.Path(__file__).with_name("ctp_processor.py")
_ROOT = pathlib.Path(__file__).resolve().parents[2]
_TOTAL = 50_000


def start_processor(bootstrap: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(_ROOT)}
    return subprocess.Popen([sys.executable, str(_PROCESSOR), bootstrap, *args],
                            stdout=subprocess.PIPE, env=env, cwd=str(_ROOT))


def wait_for_line(process: subprocess.Popen, wanted: bytes, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            raise AssertionError(f"processor exited with {process.wait()} before {wanted!r}")
        if line.strip() == wanted:
            return
    raise AssertionError(f"no {wanted!r} within {timeout_s} s")


def read_committed(bootstrap: str, topic: str, partitions: int) -> dict[int, list]:
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    out: dict[int, list] = {p: [] for p in range(partitions)}
    with Consumer(bootstrap, auto_offset_reset="earliest",
                  isolation_level="read_committed") as consumer:
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + 60
        for tp in tps:
            while consumer.position(tp) < ends[tp]:
                assert time.monotonic() < deadline
                for record in consumer.poll(timeout_ms=200, max_records=20_000):
                    out[record.partition].append(record)
    return out


def test_consume_transform_produce_is_exactly_once_across_a_processor_crash(broker_process):
    broker = broker_process()
    bootstrap = broker.address
    with Admin(bootstrap) as admin:
        admin.create_topic("in", partitions=2)
        admin.create_topic("out", partitions=2)
    with Producer(bootstrap, linger_ms=5) as producer:
        for i in range(_TOTAL):
            producer.send("in", key=b"k%d" % (i % 97), value=b"%d" % i)
        producer.flush()

    first = start_processor(bootstrap, "3")  # 3 transactions, then dies inside the 4th
    try:
        wait_for_line(first, b"MID")
    finally:
        first.kill()
        first.wait()
    before_crash = read_committed(bootstrap, "out", 2)
    assert 0 < sum(map(len, before_crash.values())) < _TOTAL  # the first 3 transactions

    second = start_processor(bootstrap)
    try:
        wait_for_line(second, b"DONE", timeout_s=300)
        assert second.wait(60) == 0
    finally:
        if second.poll() is None:
            second.kill()

    inputs = read_committed(bootstrap, "in", 2)
    outputs = read_committed(bootstrap, "out", 2)
    for partition in (0, 1):
        expected = [b"out-" + r.value for r in inputs[partition]]
        assert [r.value for r in outputs[partition]] == expected  # once each, in order
    assert sum(map(len, outputs.values())) == _TOTAL
    with Consumer(bootstrap, group_id="ctp", enable_auto_commit=False) as consumer:
        committed = consumer.committed([TopicPartition("in", p) for p in (0, 1)])
    assert sum(committed.values()) == _TOTAL
