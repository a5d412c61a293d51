"""The HTTP side of the broker: /livez, /readyz, /health, /metrics, the dashboard, codes.

Method: an in-process broker on loopback; requests made with the standard library's HTTP
client (``urllib``) on a worker thread, so the broker's h11 server meets a real, independent
client. /health is checked while serving (200), while stopping with a request still in flight
(503) and while starting (503: an ``Env`` whose ``run_sync`` holds log recovery back until the
test has looked), when /livez already answers 200.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any

import trio

from rivven_broker.protocol.messages import (
    CreateTopic,
    Fetch,
    FetchPartition,
    FetchTopic,
    Produce,
    ProducePartition,
    ProduceTopic,
)
from rivven_broker.records import BatchBuilder
from rivven_broker.server.broker import Broker
from rivven_broker.server.config import BrokerConfig, HostPort
from rivven_broker.server.env import RealEnv


async def get(port: int, path: str, method: str = "GET") -> tuple[int, Any, bytes]:
    def fetch() -> tuple[int, Any, bytes]:
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
        try:
            with urllib.request.urlopen(request, timeout=10) as page:
                return page.status, page.headers, page.read()
        except urllib.error.HTTPError as error:
            return error.code, error.headers, error.read()

    return await trio.to_thread.run_sync(fetch)


def one_batch() -> bytes:
    builder = BatchBuilder(batch_bytes_max=1 << 20)
    builder.append(1_000, b"k", b"value")
    return builder.build()


async def test_health_metrics_and_dashboard(broker, connect):
    client = await connect(broker.port)
    await client.call(CreateTopic("shown", 2))
    await client.call(Produce(acks=-1, topics=(ProduceTopic("shown", (ProducePartition(1, one_batch()),)),)))

    status, headers, body = await get(broker.http_port, "/health")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body) == {"status": "serving", "ready": True, "node_id": 1}

    status, headers, body = await get(broker.http_port, "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    text = body.decode()
    assert 'rivven_requests_total{api="Produce",error="NONE"} 1.0' in text
    assert 'rivven_requests_total{api="CreateTopic",error="NONE"} 1.0' in text
    assert 'rivven_log_end_offset{partition="1",topic="shown"} 1.0' in text
    assert 'rivven_log_end_offset{partition="0",topic="shown"} 0.0' in text
    assert 'rivven_high_watermark{partition="1",topic="shown"} 1.0' in text
    groups = [line for line in text.splitlines() if line.startswith("rivven_sync_groups_total ")]
    assert groups and float(groups[0].split()[1]) >= 1  # the acks=-1 produce waited for one
    assert "rivven_produce_latency_seconds_bucket" in text
    assert "rivven_fetch_latency_seconds_count" in text
    assert "rivven_connections 1.0" in text
    assert "rivven_network_received_bytes_total" in text and "rivven_network_sent_bytes_total" in text

    status, headers, body = await get(broker.http_port, "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert b"shown" in body and b"Rivven broker 1" in body

    assert (await get(broker.http_port, "/nowhere"))[0] == 404
    assert (await get(broker.http_port, "/health", method="POST"))[0] == 405
    status, _, body = await get(broker.http_port, "/health", method="HEAD")
    assert status == 200 and body == b""


async def test_malformed_http_gets_400(broker):
    stream = await trio.open_tcp_stream("127.0.0.1", broker.http_port)
    await stream.send_all(b"NOT HTTP AT ALL\r\n\r\n")
    reply = b""
    with trio.fail_after(10):
        while chunk := await stream.receive_some(4096):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 400")
    await stream.aclose()


class _HeldEnv(RealEnv):
    """RealEnv whose ``run_sync`` (log recovery) and ``run_fsync`` (the group commit) wait
    while ``hold`` is set."""

    def __init__(self, data_dir: str) -> None:
        super().__init__(data_dir)
        self.hold: trio.Event | None = None

    async def run_sync(self, fn, *args):
        if self.hold is not None:
            await self.hold.wait()
        return await super().run_sync(fn, *args)

    async def run_fsync(self, fn, *args):
        if self.hold is not None:
            await self.hold.wait()
        return await super().run_fsync(fn, *args)


async def start_held(nursery, tmp_path, *, hold_recovery: bool):
    http_port = _free_port()
    config = BrokerConfig(data_dir=str(tmp_path), listen=HostPort("127.0.0.1", 0),
                          http=HostPort("127.0.0.1", http_port))
    env = _HeldEnv(config.data_dir)
    if hold_recovery:
        env.hold = trio.Event()
    broker = Broker(env, config)
    nursery.start_soon(broker.serve)
    return env, broker, http_port


async def wait_for_health(http_port: int, wanted: int) -> bytes:
    with trio.fail_after(10):
        while True:  # until the HTTP server is bound and says what we wait for
            try:
                status, _, body = await get(http_port, "/health")
            except urllib.error.URLError:
                status, body = 0, b""
            if status == wanted:
                return body
            await trio.lowlevel.checkpoint()


async def test_health_is_503_while_starting(nursery, tmp_path):
    """A broker recovering its logs is live (a liveness probe must not kill it) and not
    ready (no traffic yet): /livez 200, /readyz and /health 503, then all 200."""
    env, broker, http_port = await start_held(nursery, tmp_path, hold_recovery=True)
    body = await wait_for_health(http_port, 503)  # recovery is held: still starting
    assert json.loads(body)["status"] == "starting"
    status, _, body = await get(http_port, "/livez")
    assert status == 200 and json.loads(body) == {"status": "starting", "live": True,
                                                  "node_id": 1}
    assert (await get(http_port, "/readyz"))[0] == 503
    env.hold.set()
    await wait_for_health(http_port, 200)
    assert (await get(http_port, "/readyz"))[0] == 200
    assert (await get(http_port, "/livez"))[0] == 200
    broker.request_shutdown()
    await broker.wait_stopped()


async def test_health_is_503_while_stopping_and_in_flight_requests_finish(nursery, tmp_path, connect):
    env, broker, http_port = await start_held(nursery, tmp_path, hold_recovery=False)
    await wait_for_health(http_port, 200)
    client = await connect(broker.addresses.listen.port)
    await client.call(CreateTopic("t", 1))
    env.hold = trio.Event()  # fsyncs wait: an acks=all produce stays in flight
    await client.send(Produce(acks=-1, topics=(ProduceTopic("t", (ProducePartition(0, one_batch()),)),)))
    broker.request_shutdown()
    body = await wait_for_health(http_port, 503)
    assert json.loads(body)["status"] == "stopping"
    env.hold.set()
    answer = await client.receive()  # the in-flight request is still answered
    assert answer.response.topics[0].partitions[0].error_code == 0
    await broker.wait_stopped()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
