"""The runtime against a real broker with its HTTP API up: a datagen source routed by a field
to several topics under an allowlist and a ``max_destinations`` cap dead-letters what
admission refuses in the batch's own transaction; a destination the broker refuses
permanently opens its breaker while the others keep flowing; the endpoints report it all."""

from __future__ import annotations

import json
import re

import pytest
import trio

from rivven_broker.client.errors import UnknownTopicOrPartitionError
from rivven_broker.client.trio import open_admin
from rivven_connect.core.config import load_config
from rivven_connect.driver import run_connect
from rivven_connect.sources import build_source
from tests.integration.connect.helpers import read_committed, values


class _HeldOpen:
    """A source that, once its inner source is exhausted, waits for ``release`` before it
    says so: the runtime (and its HTTP server) stays up for the test to look at."""

    def __init__(self, inner, release: trio.Event) -> None:
        self.inner, self.release = inner, release

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def poll(self, max_records):
        records = await self.inner.poll(max_records)
        if records is None:
            await self.release.wait()
        return records


async def _get(port: int, path: str) -> tuple[int, bytes]:
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(
                f"GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode())
            answer = bytearray()
            while data := await stream.receive_some(65536):
                answer += data
    head, _, body = bytes(answer).partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def _get_json(port: int, path: str):
    status, body = await _get(port, path)
    assert status == 200, (path, status, body)
    return json.loads(body)


def _metrics(text: bytes) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.decode().splitlines() if line and not line.startswith("#")}


async def _run_held(nursery, config, address, results):
    release = trio.Event()
    sources = {name: _HeldOpen(build_source(source), release)
               for name, source in config.sources.items()}

    async def run(task_status=trio.TASK_STATUS_IGNORED):
        results.update(await run_connect(config, address, sources, trio.Event(), seed=1,
                                         http="127.0.0.1:0", task_status=task_status))

    port = await nursery.start(run)
    return port, release


async def _wait_for_position(port: int, name: str, position: int) -> dict:
    with trio.fail_after(60):
        while True:
            status = await _get_json(port, f"/connectors/{name}/status")
            assert status["state"] in ("running", "degraded"), status
            if status["position"] == position:
                return status
            await trio.sleep(0.05)


COUNT = 300
ROUTES = [("\\d*[0-2]", "http.a"), ("\\d*[3-5]", "http.b"), ("\\d*[6-7]", "http.c"),
          ("\\d*8", "other.x"), ("\\d*9", "http.d")]


def _admission_config():
    return load_config({
        "http": "off",
        "sources": {"gen": {
            "connector": "datagen", "topic": "http.a",
            "config": {"count": COUNT, "batch_size": 50, "seed": 3},
            "transforms": [{"type": "ContentRouter", "field": "seq", "patterns": [
                {"matches": pattern, "topic": topic} for pattern, topic in ROUTES]}],
            "routing": {
                "admission": {"mode": "allowlist", "topics": ["http.a", "http.*"],
                              "max_destinations": 3},
                "on_admission_failure": "dlq", "dlq_topic": "http.dlq",
                "topic_defaults": {"partitions": 2, "configs": {"retention.ms": 3600000}},
            },
        }},
    }, env={})


async def test_admission_rejections_are_dead_lettered_in_the_transaction_and_reported(
        broker, nursery):
    results: dict = {}
    port, release = await _run_held(nursery, _admission_config(), broker.address, results)
    status = await _wait_for_position(port, "gen", COUNT - 1)

    def seqs(last_digits):
        return [n for n in range(COUNT) if n % 10 in last_digits]

    assert status["state"] == "running" and status["records"] == 240
    assert status["batches"] == COUNT // 50 and status["dead_lettered"] == 60
    assert await _get_json(port, "/connectors") == {
        "connectors": [{"name": "gen", "connector": "datagen", "kind": "source"}]}
    health = await _get_json(port, "/health")
    assert health == {"status": "ok", "connectors": {"gen": "running"}}
    destinations = await _get_json(port, "/connectors/gen/destinations")
    assert destinations["max_destinations"] == 3
    assert [(d["topic"], d["routed"], d["breaker"], d["partitions"])
            for d in destinations["destinations"]] == [
        ("http.a", 90, "closed", 2), ("http.b", 90, "closed", 2), ("http.c", 60, "closed", 2)]
    status_code, body = await _get(port, "/metrics")
    metrics = _metrics(body)
    assert status_code == 200 and b"topic=" not in body
    assert metrics['rivven_connect_records_total{connector="gen"}'] == 240
    assert metrics['rivven_connect_routed_records_total{connector="gen"}'] == 240
    assert metrics['rivven_connect_destinations_active{connector="gen"}'] == 3
    assert metrics['rivven_connect_dead_lettered_records_total{connector="gen"}'] == 60
    assert metrics['rivven_connect_rejected_records_total{connector="gen",'
                   'reason="not_allowed"}'] == 30
    assert metrics['rivven_connect_rejected_records_total{connector="gen",'
                   'reason="max_destinations"}'] == 30
    assert metrics['rivven_connect_circuits_open{connector="gen"}'] == 0
    assert metrics['rivven_connect_connector_state{connector="gen",state="running"}'] == 1
    assert (await _get(port, "/connectors/nope/status"))[0] == 404

    release.set()
    with trio.fail_after(30):
        while "gen" not in results:
            await trio.sleep(0.02)
    assert results["gen"].state == "stopped" and results["gen"].records == 240

    for topic, digits in (("http.a", (0, 1, 2)), ("http.b", (3, 4, 5)), ("http.c", (6, 7))):
        assert sorted(row["seq"] for row in values(
            await read_committed(broker.address, topic))) == seqs(digits), topic
    dead = await read_committed(broker.address, "http.dlq")  # read_committed sees them
    assert sorted(row["seq"] for row in values(dead)) == seqs((8, 9))
    for record in dead:
        headers = {name: value.decode() for name, value in record.headers}
        seq = json.loads(record.value)["seq"]
        reason, original = ("not_allowed", "other.x") if seq % 10 == 8 else (
            "max_destinations", "http.d")
        assert headers["rivven.dlq.reason"] == reason
        assert headers["rivven.dlq.original_topic"] == original
        assert headers["rivven.dlq.connector"] == "gen"
        assert headers["rivven.dlq.stage"] == "admission"
        assert headers["rivven.dlq.source_position"] == str(seq)
    async with open_admin(broker.address) as admin:
        assert (await admin.describe_topic("http.b")).partitions == 2  # topic_defaults
        for never_admitted in ("http.d", "other.x"):
            with pytest.raises(UnknownTopicOrPartitionError):
                await admin.describe_topic(never_admitted)


BREAKER_COUNT = 100


async def test_a_destination_the_broker_refuses_opens_its_breaker_and_the_others_flow(
        broker, nursery):
    async with open_admin(broker.address) as admin:
        await admin.create_topic("brk.big", partitions=1, config={"max.message.bytes": "256"})
    config = load_config({
        "http": "off",
        "sources": {"gen": {
            "connector": "datagen", "topic": "brk.ok",
            "config": {"count": BREAKER_COUNT, "batch_size": 20, "record_size_bytes": 400},
            "transforms": [{"type": "ContentRouter", "field": "seq", "patterns": [
                {"matches": "\\d*[02468]", "topic": "brk.ok"},
                {"matches": "\\d*[13579]", "topic": "brk.big"}]}],
            "routing": {"on_admission_failure": "dlq", "dlq_topic": "brk.dlq"},
        }},
    }, env={})
    results: dict = {}
    port, release = await _run_held(nursery, config, broker.address, results)
    status = await _wait_for_position(port, "gen", BREAKER_COUNT - 1)
    assert status["records"] == BREAKER_COUNT // 2
    assert status["dead_lettered"] == BREAKER_COUNT // 2
    destinations = {d["topic"]: d for d in
                    (await _get_json(port, "/connectors/gen/destinations"))["destinations"]}
    big, ok = destinations["brk.big"], destinations["brk.ok"]
    assert big["breaker"] == "open" and big["failures"] == 5 and big["routed"] == 0
    assert "MESSAGE_TOO_LARGE" in big["last_error"]
    assert ok["breaker"] == "closed" and ok["routed"] == BREAKER_COUNT // 2
    assert ok["failures"] == 0  # a batch failing for another topic is no verdict for it
    metrics = _metrics((await _get(port, "/metrics"))[1])
    assert metrics['rivven_connect_circuits_open{connector="gen"}'] == 1
    assert metrics['rivven_connect_rejected_records_total{connector="gen",'
                   'reason="circuit_open"}'] == BREAKER_COUNT // 2
    release.set()
    with trio.fail_after(30):
        while "gen" not in results:
            await trio.sleep(0.02)
    assert results["gen"].state == "stopped"
    ok_rows = values(await read_committed(broker.address, "brk.ok"))
    assert sorted(row["seq"] for row in ok_rows) == list(range(0, BREAKER_COUNT, 2))
    assert await read_committed(broker.address, "brk.big") == []
    dead = await read_committed(broker.address, "brk.dlq")
    assert sorted(json.loads(r.value)["seq"] for r in dead) == list(range(1, BREAKER_COUNT, 2))
    assert {dict(r.headers)["rivven.dlq.reason"] for r in dead} == {b"circuit_open"}
    assert re.fullmatch(r"\d+", dict(dead[0].headers)["rivven.dlq.source_position"].decode())


async def _post(port: int, path: str) -> tuple[int, dict]:
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n"
                                  f"connection: close\r\n\r\n".encode())
            answer = bytearray()
            while data := await stream.receive_some(65536):
                answer += data
    head, _, body = bytes(answer).partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


async def test_abandon_batch_skips_the_batch_a_degraded_source_cannot_commit(
        broker, nursery, monkeypatch):
    from rivven_connect.core import batch_cycle

    monkeypatch.setattr(batch_cycle, "commit_failure_threshold", 3)  # degraded sooner
    monkeypatch.setattr(batch_cycle, "backoff_max_ms", 200)
    async with open_admin(broker.address) as admin:
        await admin.create_topic("ab.big", partitions=1, config={"max.message.bytes": "256"})
    config = load_config({
        "http": "off",
        "sources": {"gen": {
            "connector": "datagen", "topic": "ab.ok",
            "config": {"count": 20, "batch_size": 10, "record_size_bytes": 400},
            "transforms": [{"type": "ContentRouter", "field": "seq", "patterns": [
                {"matches": "5", "topic": "ab.big"}, {"matches": "\\d+", "topic": "ab.ok"}]}],
        }},
    }, env={})
    results: dict = {}
    port, release = await _run_held(nursery, config, broker.address, results)
    status, answer = await _post(port, "/connectors/gen/abandon-batch")
    assert status == 409, answer  # not degraded (yet): refused, nothing skipped
    with trio.fail_after(60):
        while (await _get_json(port, "/connectors/gen/status"))["state"] != "degraded":
            await trio.sleep(0.02)
        while (answer := await _post(port, "/connectors/gen/abandon-batch"))[0] != 202:
            await trio.sleep(0.01)  # refused while retrying (not backing off): try again
    status = await _wait_for_position(port, "gen", 19)
    assert status["state"] == "running" and status["abandoned_batches"] == 1
    assert status["abandoned_records"] == 10 and status["last_abandon_at_ms"] is not None
    assert status["records"] == 10
    metrics = _metrics((await _get(port, "/metrics"))[1])
    assert metrics['rivven_connect_abandoned_records_total{connector="gen"}'] == 10
    release.set()
    with trio.fail_after(30):
        while "gen" not in results:
            await trio.sleep(0.02)
    rows = values(await read_committed(broker.address, "ab.ok"))
    assert sorted(row["seq"] for row in rows) == list(range(10, 20))
    assert await read_committed(broker.address, "ab.big") == []
