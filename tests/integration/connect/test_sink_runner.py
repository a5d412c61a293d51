"""Sinks in-process under trio against a real broker: a datagen source feeds a topic, a file
sink in a consumer group writes every record once and commits the group's offsets; a second
run of the sink writes nothing again; a webhook that answers 400 stops its sink in ``error``
without committing."""

from __future__ import annotations

import functools
import json

import trio

from rivven_broker.client.trio import open_admin, open_consumer
from rivven_broker.client.types import TopicPartition
from rivven_connect.core.config import load_config
from rivven_connect.driver import run_connect
from rivven_connect.sinks import build_sink
from rivven_connect.sources import build_source

COUNT = 700


def _config(out_dir, sinks: dict, count: int = COUNT):
    return load_config({
        "broker": {"bootstrap": "127.0.0.1:1"}, "http": "off",
        "sources": {"gen": {"connector": "datagen", "topic": "sink.in",
                            "config": {"count": count, "seed": 3, "batch_size": 100}}},
        "sinks": sinks,
    }, env={})


def _rows(out_dir) -> list[dict]:
    rows = []
    for path in sorted(out_dir.glob("records-*.jsonl")):
        rows.extend(json.loads(line) for line in path.read_bytes().splitlines(keepends=True)
                    if line.endswith(b"\n"))  # a line the sink's thread is writing now
    return rows


async def _run_until(config, address, done, *, timeout_s: float = 60) -> dict:
    """Run the runtime until ``done()`` holds, then stop it as SIGTERM would."""
    stop = trio.Event()
    sources = {name: build_source(source) for name, source in config.sources.items()}
    sinks = {name: build_sink(sink) for name, sink in config.sinks.items()}
    results: dict = {}

    async def runtime() -> None:
        results.update(await run_connect(config, address, sources, stop, seed=5, sinks=sinks))

    with trio.fail_after(timeout_s):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runtime)
            while not done(results):
                await trio.sleep(0.05)
            stop.set()
    return results


async def _committed(address: str, group: str, partitions: int) -> dict:
    async with open_consumer(address, group_id=group, enable_auto_commit=False) as consumer:
        tps = [TopicPartition("sink.in", p) for p in range(partitions)]
        return {tp.partition: offset for tp, offset in (await consumer.committed(tps)).items()}


async def test_datagen_to_file_sink_every_record_once_and_offsets_committed(broker, tmp_path):
    async with open_admin(broker.address) as admin:
        await admin.create_topic("sink.in", partitions=3)
    out = tmp_path / "archive"
    sink = {"archive": {"connector": "file", "topics": ["sink.in"], "consumer_group": "arch",
                        "config": {"path": str(out), "max_bytes": 16384, "max_files": 1000}}}
    config = _config(out, sink)
    results = await _run_until(config, broker.address,
                               lambda _: out.exists() and len(_rows(out)) >= COUNT)
    assert results["gen"].state == "stopped" and results["gen"].records == COUNT
    archive = results["sinks.archive"]
    assert archive.state == "stopped" and archive.error is None, archive
    rows = _rows(out)
    seqs = sorted(row["value"]["seq"] for row in rows)
    assert seqs == list(range(COUNT))  # every record, once
    assert len(list(out.glob("records-*.jsonl"))) > 1  # it rotated
    for partition in range(3):  # per partition in offset order (transaction markers
        offsets = [row["offset"] for row in rows if row["partition"] == partition]  # take
        assert offsets == sorted(set(offsets))  # offsets too: there are gaps)
    committed = await _committed(broker.address, "arch", 3)
    assert committed == {p: 1 + max(row["offset"] for row in rows if row["partition"] == p)
                         for p in range(3)}
    assert archive.records == COUNT
    assert archive.position == {f"sink.in/{p}": committed[p] for p in range(3) if committed[p]}

    # A second run of the group starts at its commit: only the 10 new records are written.
    again = _config(out, sink, count=COUNT + 10)
    await _run_until(again, broker.address, lambda _: len(_rows(out)) >= COUNT + 10)
    assert sorted(row["value"]["seq"] for row in _rows(out)) == list(range(COUNT + 10))


async def test_a_webhook_answering_400_stops_its_sink_in_error_and_commits_nothing(
        broker, tmp_path):
    import h11

    async def handler(stream) -> None:
        connection = h11.Connection(h11.SERVER)
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                connection.receive_data(await stream.receive_some(65536))
            elif isinstance(event, h11.EndOfMessage):
                break
        await stream.send_all(connection.send(h11.Response(
            status_code=400, headers=[("Content-Length", "0")])) +
            connection.send(h11.EndOfMessage()))
        await stream.aclose()

    async with open_admin(broker.address) as admin:
        await admin.create_topic("sink.in", partitions=1)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, handler, 0)
        port = listeners[0].socket.getsockname()[1]
        sink = {"hook": {"connector": "http-webhook", "topics": ["sink.in"],
                         "config": {"url": f"http://127.0.0.1:{port}/in"}}}
        config = _config(tmp_path, sink)
        results = await _run_until(config, broker.address, lambda r: "sinks.hook" in r)
        nursery.cancel_scope.cancel()
    hook = results["sinks.hook"]
    assert hook.state == "error" and "HTTP 400" in hook.error and hook.records == 0, hook
    assert await _committed(broker.address, "connect-hook", 1) == {0: None}


async def test_a_sink_is_served_by_the_http_api_with_its_committed_offsets(broker, tmp_path):
    from tests.integration.connect.test_driver_http import _get_json

    async with open_admin(broker.address) as admin:
        await admin.create_topic("sink.in", partitions=1)
    out = tmp_path / "archive"
    sink = {"archive": {"connector": "file", "topics": ["sink.in"], "consumer_group": "web",
                        "config": {"path": str(out)}}}
    config = _config(out, sink)
    stop = trio.Event()
    sources = {name: build_source(source) for name, source in config.sources.items()}
    sinks = {name: build_sink(s) for name, s in config.sinks.items()}
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(functools.partial(
                run_connect, config, broker.address, sources, stop, seed=5, sinks=sinks,
                http="127.0.0.1:0"))
            listed = await _get_json(port, "/connectors")
            assert {"name": "archive", "connector": "file", "kind": "sink"} in \
                listed["connectors"], listed
            while True:
                status = await _get_json(port, "/connectors/archive/status")
                if status["records"] >= COUNT:
                    break
                await trio.sleep(0.05)
            assert status["state"] == "running" and status["position"] == {
                "sink.in/0": status["position"]["sink.in/0"]}
            assert status["position"]["sink.in/0"] > COUNT  # the offsets, markers included
            stop.set()
