"""kill -9 of ``rivven-connect`` at each crash point, and of the broker under a running
runtime: after a restart every record is read exactly once by ``read_committed`` readers
across the three routed topics, the offsets topic ends at the final position, and a side
effect cut off by the crash runs after the restart (real broker and runtime processes; the
crash points are ``rivven_connect.crash_points``)."""

from __future__ import annotations

import json
import math
import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest
import trio

from rivven_broker.client.trio import open_admin
from rivven_connect.core.config import OFFSETS_TOPIC
from rivven_connect.crash_points import CRASH_AT_ENV, POINTS
from tests.integration.connect.helpers import read_committed, values

ROOT = pathlib.Path(__file__).resolve().parents[3]
TOPICS = ("crash.a", "crash.b", "crash.c")
LINES, LINE_BATCH = 600, 64  # the file source: 10 batches
COUNT, GEN_BATCH = 3000, 100  # datagen: 30 batches
RUN_TIMEOUT_S = 90
#: ``transaction: {boundary: interval}``: polls gathered up to this many records (a long
#: interval, so the bound and the end of the data decide, as the crash counts need).
GATHERED_RECORDS = {"file": 200, "datagen": 300}


def _config(tmp_path: pathlib.Path, kind: str, rate: int | None = None,
            boundary: str = "poll") -> pathlib.Path:
    if kind == "file":
        path = tmp_path / "rows.jsonl"
        with open(path, "w") as handle:
            for n in range(LINES):
                handle.write(json.dumps({"n": n, "topic": TOPICS[n % 3]}) + "\n")
        source = (f"connector: file\n    config: {{ path: {path}, done_marker: true, "
                  f"batch_size: {LINE_BATCH} }}")
    else:
        source = (f"connector: datagen\n    config: {{ count: {COUNT}, batch_size: {GEN_BATCH},"
                  f" record_size_bytes: 32, rate: {rate or 'null'}, "
                  f"topics: [{', '.join(TOPICS)}] }}")
    transaction = "{ boundary: poll }" if boundary == "poll" else (
        f"{{ boundary: interval, interval_ms: 60000, records_max: {GATHERED_RECORDS[kind]} }}")
    config = tmp_path / "connect.yaml"
    config.write_text(f"""
version: "1.0"
http: off
sources:
  src:
    {source}
    topic: {TOPICS[0]}
    routing: {{ topic_column: topic, default_topic: {TOPICS[0]} }}
    transaction: {transaction}
""")
    return config


def _runtime(config: pathlib.Path, bootstrap: str, crash_at: str | None = None
             ) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(CRASH_AT_ENV, None)
    if crash_at is not None:
        env[CRASH_AT_ENV] = crash_at
    return subprocess.Popen([sys.executable, "-m", "rivven_connect", "--config", str(config),
                             "--bootstrap", bootstrap], env=env, stderr=subprocess.PIPE)


def _finish(run: subprocess.Popen[bytes]) -> tuple[int, str]:
    try:
        _, stderr = run.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    return run.returncode, stderr.decode()


async def _create_topics(bootstrap: str) -> None:
    async with open_admin(bootstrap) as admin:
        for topic in TOPICS:
            await admin.create_topic(topic, partitions=3)


async def _read_all(bootstrap: str, isolation_level: str = "read_committed"
                    ) -> dict[str, list]:
    return {topic: values(await read_committed(bootstrap, topic, isolation_level))
            for topic in TOPICS}


async def _offset_records(bootstrap: str) -> list[dict]:
    """The source's committed offset records: one per committed transaction."""
    records = await read_committed(bootstrap, OFFSETS_TOPIC)
    return [json.loads(record.value) for record in records if record.key == b"src"]


async def _last_offset_record(bootstrap: str) -> dict:
    return (await _offset_records(bootstrap))[-1]


def _check_exactly_once(bootstrap: str, kind: str) -> None:
    """Every record once, in its routed topic; the offsets topic at the final position."""
    field, total = ("n", LINES) if kind == "file" else ("seq", COUNT)
    seen = trio.run(_read_all, bootstrap)
    for topic, rows in seen.items():
        assert all(row["topic"] == topic for row in rows), topic
    ids = sorted(row[field] for rows in seen.values() for row in rows)
    assert ids == list(range(total)), (len(ids), len(set(ids)))  # none lost, none twice
    final = trio.run(_last_offset_record, bootstrap)["position"]
    assert final == (LINE_BYTES if kind == "file" else COUNT - 1), final


LINE_BYTES = sum(len(json.dumps({"n": n, "topic": TOPICS[n % 3]})) + 1 for n in range(LINES))


def _crash_at(point: str, kind: str, boundary: str) -> str:
    """Mid-run, except between commit and side effect of the file source: its last batch,
    so only the restart can write the final ``.done`` marker."""
    if point == "after_commit_before_side_effect" and kind == "file":
        per_transaction = LINE_BATCH if boundary == "poll" else (
            LINE_BATCH * math.ceil(GATHERED_RECORDS[kind] / LINE_BATCH))
        return f"{point}:{math.ceil(LINES / per_transaction)}"
    return f"{point}:3"


@pytest.mark.parametrize("kind,boundary", [("file", "poll"), ("datagen", "poll"),
                                           ("file", "interval"), ("datagen", "interval")])
@pytest.mark.parametrize("point", POINTS)
def test_kill_9_at_a_crash_point_then_a_restart_delivers_exactly_once(
        broker_process, tmp_path, point, kind, boundary):
    """Also with several polls per transaction (``boundary: interval``)."""
    broker = broker_process()
    trio.run(_create_topics, broker.address)
    config = _config(tmp_path, kind, boundary=boundary)
    crash_at = _crash_at(point, kind, boundary)

    code, stderr = _finish(_runtime(config, broker.address, crash_at))
    assert code == -9 and f"crash point {crash_at} reached" in stderr, (code, stderr)
    done = tmp_path / "rows.jsonl.done"
    if kind == "file" and point == "after_commit_before_side_effect":
        # committed through the end, but the marker is one batch behind
        assert int(done.read_text()) < LINE_BYTES
        assert trio.run(_last_offset_record, broker.address)["position"] == LINE_BYTES

    code, stderr = _finish(_runtime(config, broker.address))
    assert code == 0, stderr
    _check_exactly_once(broker.address, kind)
    if kind == "file":
        assert done.read_text() == f"{LINE_BYTES}\n"  # the side effect at the final position
    if boundary == "interval":  # a transaction took several polls (+1: the crashed run's)
        batch = LINE_BATCH if kind == "file" else GEN_BATCH
        total = LINES if kind == "file" else COUNT
        per_transaction = batch * math.ceil(GATHERED_RECORDS[kind] / batch)
        committed = len(trio.run(_offset_records, broker.address))
        assert committed <= math.ceil(total / per_transaction) + 1, committed
    if point == "before_commit":  # the killed batch was in the log, aborted by the restart
        raw = trio.run(_read_all, broker.address, "read_uncommitted")
        assert sum(map(len, raw.values())) > (LINES if kind == "file" else COUNT)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_kill_9_of_the_broker_under_a_running_runtime_still_delivers_exactly_once(
        broker_process, tmp_path):
    listen = ("--listen", f"127.0.0.1:{_free_port()}")
    broker = broker_process(*listen)
    trio.run(_create_topics, broker.address)
    config = _config(tmp_path, "datagen", rate=600)  # about 5 s of records
    run = _runtime(config, broker.address)
    try:
        deadline = time.monotonic() + 30
        while not (before := sum(map(len, trio.run(_read_all, broker.address).values()))):
            assert run.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        assert broker.kill() != 0
        assert before < COUNT // 2, before  # killed early in the run
        time.sleep(1.0)  # the runtime's transactions fail meanwhile: it backs off
        assert run.poll() is None, "the runtime gave up while the broker was down"
        broker = broker_process(*listen, data_dir=broker.data_dir)
        code, stderr = _finish(run)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert code == 0, stderr
    assert "source src: stopped" in stderr, stderr
    _check_exactly_once(broker.address, "datagen")
