"""``rivven-connect`` with a file sink as a real process against a real broker process:
datagen → topic → file sink. A clean run (SIGTERM once everything is written) leaves every
record in the files exactly once; a run killed with SIGKILL mid-way and restarted leaves every
record at least once, and each partition's records in offset order (a restart rewinds to the
group's last commit, so a partition may repeat a tail, never reorder)."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import trio

from rivven_broker.client.trio import open_admin

ROOT = pathlib.Path(__file__).resolve().parents[3]
COUNT = 2000
TOPIC = "sinkproc.in"


def _write_config(path: pathlib.Path, out: pathlib.Path, rate: int) -> None:
    path.write_text(f"""
version: "1.0"
http: off
sources:
  gen:
    connector: datagen
    topic: {TOPIC}
    config: {{ count: {COUNT}, rate: {rate}, record_size_bytes: 32, seed: 11, batch_size: 50 }}
sinks:
  archive:
    connector: file
    topics: [{TOPIC}]
    consumer_group: archive
    config: {{ path: "{out}", max_bytes: 65536, max_files: 1000 }}
""")


def _start(config: pathlib.Path, address: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rivven_connect", "--config", str(config), "--bootstrap", address],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE)


def _rows(out: pathlib.Path) -> list[dict]:
    rows = []
    for path in sorted(out.glob("records-*.jsonl")):
        for line in path.read_bytes().splitlines(keepends=True):
            if line.endswith(b"\n"):  # a line being written now is not whole yet
                rows.append(json.loads(line))
    return rows


def _wait_for(run: subprocess.Popen, condition, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert run.poll() is None, run.stderr.read().decode()
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _stop(run: subprocess.Popen) -> bytes:
    try:
        run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, stderr.decode()
    return stderr


async def _create(address: str) -> None:
    async with open_admin(address) as admin:
        await admin.create_topic(TOPIC, partitions=2)


def _seqs(rows: list[dict]) -> list[int]:
    return [row["value"]["seq"] for row in rows]


def test_a_clean_run_writes_every_record_exactly_once(broker_process, tmp_path):
    broker = broker_process()
    trio.run(_create, broker.address)
    out = tmp_path / "out"
    config = tmp_path / "connect.yaml"
    _write_config(config, out, rate=5000)
    run = _start(config, broker.address)
    _wait_for(run, lambda: len(_rows(out)) >= COUNT)
    stderr = _stop(run)
    assert b"sink archive: stopped" in stderr and b"source gen: stopped" in stderr, stderr
    rows = _rows(out)
    assert sorted(_seqs(rows)) == list(range(COUNT))  # every record, once
    assert all(row["value_format"] == "json" for row in rows)


def test_sigkill_mid_run_then_restart_writes_every_record_at_least_once_in_order(
        broker_process, tmp_path):
    broker = broker_process()
    trio.run(_create, broker.address)
    out = tmp_path / "out"
    config = tmp_path / "connect.yaml"
    _write_config(config, out, rate=400)  # 5 s of data: the kill lands while it flows
    run = _start(config, broker.address)
    try:
        _wait_for(run, lambda: len(_rows(out)) >= COUNT // 10)
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()
    before = _rows(out)
    assert 0 < len(set(_seqs(before))) < COUNT, len(before)  # really killed mid-run

    again = _start(config, broker.address)
    _wait_for(again, lambda: set(_seqs(_rows(out))) >= set(range(COUNT)), timeout_s=120)
    _stop(again)
    rows = _rows(out)
    assert set(_seqs(rows)) == set(range(COUNT))  # every record at least once, nothing else
    assert rows[:len(before)] == before  # what the killed run wrote whole is still there
    for partition in (0, 1):
        offsets = [row["offset"] for row in rows if row["partition"] == partition]
        firsts = list(dict.fromkeys(offsets))
        assert firsts == sorted(firsts), partition  # first deliveries in offset order
        # a repeat only ever rewinds to an earlier commit and replays forward from there;
        # the commit may be the very record last written (kill after the write, before the
        # commit that covers it): then it comes again at once
        for earlier, later in zip(offsets, offsets[1:]):
            if later <= earlier:
                assert later in offsets[:offsets.index(earlier) + 1], (partition, earlier, later)
    # seq -> (partition, offset) never changes: the repeats are the same records
    placed = {}
    for row in rows:
        assert placed.setdefault(row["value"]["seq"], (row["partition"], row["offset"])) == (
            row["partition"], row["offset"])
