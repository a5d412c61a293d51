"""The real ``rivven-broker`` process: graceful SIGTERM, restart on the same data, kill -9.

Method: run the installed executable as a subprocess on free loopback ports with a data
directory in ``tmp_path`` (``broker_process`` fixture), drive it with a blocking raw-protocol
client, stop it with SIGTERM or SIGKILL, start it again on the same directory and read back.
The kill -9 test pipelines acks=all produces under ``--sync-policy always``, records every
acknowledged (partition, offset, payload), kills the process while requests are still in
flight, restarts, and checks that every acknowledged batch is there at its offset.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.messages import (
    CreateTopic,
    DescribeTopic,
    Fetch,
    FetchPartition,
    FetchTopic,
    Metadata,
    Produce,
    ProducePartition,
    ProduceTopic,
)
from rivven_broker.records import BatchBuilder, decode_records


def batch(*values: bytes) -> bytes:
    builder = BatchBuilder(batch_bytes_max=1 << 20)
    for value in values:
        builder.append(1_000, None, value)
    return builder.build()


def produce(topic: str, partition: int, records: bytes, acks: int = -1) -> Produce:
    return Produce(acks=acks, timeout_ms=30_000,
                   topics=(ProduceTopic(topic, (ProducePartition(partition, records),)),))


def read_all(client, topic: str, partition: int) -> list:
    records, offset = [], 0
    while True:
        request = Fetch(max_wait_ms=0, max_bytes=1 << 22,
                        topics=(FetchTopic(topic, (FetchPartition(partition, offset, 1 << 22),)),))
        answer = client.call(request).topics[0].partitions[0]
        assert answer.error_code == ErrorCode.NONE
        batch_records = [r for r in decode_records(answer.records) if r.offset >= offset]
        if not batch_records:
            return records
        records.extend(batch_records)
        offset = batch_records[-1].offset + 1


def test_sigterm_finishes_in_flight_requests_exits_zero_and_restart_finds_the_data(
    broker_process, connect_blocking
):
    first = broker_process()
    client = connect_blocking(first.port)
    assert client.call(CreateTopic("kept", 2)).error_code == ErrorCode.NONE
    for index in range(20):
        answer = client.call(produce("kept", index % 2, batch(b"r%d" % index), acks=1))
        assert answer.topics[0].partitions[0].error_code == ErrorCode.NONE
    # A long poll in flight when the signal arrives is still answered before the exit.
    waiting = connect_blocking(first.port)
    waiting.send(Fetch(max_wait_ms=1_000, min_bytes=1 << 30,
                       topics=(FetchTopic("kept", (FetchPartition(0, 0),)),)))
    with urllib.request.urlopen(f"http://127.0.0.1:{first.http_port}/health", timeout=10) as page:
        assert page.status == 200
    assert first.terminate() == 0
    answered = waiting.receive().response.topics[0].partitions[0]
    assert answered.error_code == ErrorCode.NONE and answered.high_watermark == 10

    second = broker_process(data_dir=first.data_dir)
    client = connect_blocking(second.port)
    assert client.call(DescribeTopic("kept")).partitions == 2
    for partition in (0, 1):
        values = [r.value for r in read_all(client, "kept", partition)]
        assert values == [b"r%d" % i for i in range(20) if i % 2 == partition]
    assert second.terminate() == 0


def test_a_second_broker_on_the_same_data_dir_is_refused(broker_process):
    first = broker_process()
    with pytest.raises(RuntimeError, match="exited early with code 1"):
        broker_process(data_dir=first.data_dir)
    assert first.terminate() == 0


@pytest.mark.slow
def test_kill_9_loses_no_acknowledged_batch(broker_process, connect_blocking):
    broker = broker_process("--sync-policy", "always")
    client = connect_blocking(broker.port)
    assert client.call(CreateTopic("durable", 2)).error_code == ErrorCode.NONE
    acknowledged: list[tuple[int, int, bytes]] = []  # (partition, offset, payload)
    in_flight: dict[int, tuple[int, bytes]] = {}
    kill_after, pipeline_depth, sent = 300, 16, 0
    killed = False
    while not killed:
        while len(in_flight) < pipeline_depth:
            partition = sent % 2
            payload = b"payload-%06d-" % sent + b"x" * (sent % 97)
            correlation_id = client.send(produce("durable", partition, batch(payload)))
            in_flight[correlation_id] = (partition, payload)
            sent += 1
        event = client.receive()
        partition, payload = in_flight.pop(event.correlation_id)
        answer = event.response.topics[0].partitions[0]
        assert answer.error_code == ErrorCode.NONE
        acknowledged.append((partition, answer.base_offset, payload))
        if len(acknowledged) == kill_after:
            assert in_flight  # mid-stream: requests still on their way
            broker.kill()
            killed = True
    # Answers that were already on the wire count as acknowledged too.
    try:
        while in_flight:
            event = client.receive()
            partition, payload = in_flight.pop(event.correlation_id)
            answer = event.response.topics[0].partitions[0]
            if answer.error_code == ErrorCode.NONE:
                acknowledged.append((partition, answer.base_offset, payload))
    except (EOFError, ConnectionError):
        pass

    restarted = broker_process(data_dir=broker.data_dir)
    reader = connect_blocking(restarted.port)
    stored = {
        partition: {r.offset: r.value for r in read_all(reader, "durable", partition)}
        for partition in (0, 1)
    }
    for partition, offset, payload in acknowledged:
        assert stored[partition].get(offset) == payload, (partition, offset)
    # Offsets are dense from 0 and nothing unacknowledged sits in the middle of the log.
    for partition in (0, 1):
        assert sorted(stored[partition]) == list(range(len(stored[partition])))
    assert restarted.terminate() == 0


def test_health_answers_on_the_real_process(broker_process):
    process = broker_process()
    with urllib.request.urlopen(f"http://127.0.0.1:{process.http_port}/health", timeout=10) as page:
        assert page.status == 200
        assert b'"serving"' in page.read()
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"http://127.0.0.1:{process.http_port}/missing", timeout=10)
    assert info.value.code == 404
    assert process.terminate() == 0


def test_environment_variables_configure_the_process_and_logs_can_be_json(
        broker_process, tmp_path):
    """Every setting from RIVVEN_ variables (a flag still wins), one JSON object per log
    line with --log-format json, /livez and /readyz on the real process, --version."""
    import subprocess

    from tests.integration.conftest import _broker_command

    process = broker_process(
        "--node-id", "5", defaults=False, stderr=subprocess.PIPE,
        env={"RIVVEN_DATA_DIR": str(tmp_path / "from-env"), "RIVVEN_LISTEN": "127.0.0.1:0",
             "RIVVEN_HTTP": "127.0.0.1:0", "RIVVEN_LOG_FORMAT": "json",
             "RIVVEN_LOG_LEVEL": "INFO", "RIVVEN_NODE_ID": "4"})
    assert (tmp_path / "from-env").is_dir()
    for path in ("/livez", "/readyz"):
        with urllib.request.urlopen(f"http://127.0.0.1:{process.http_port}{path}",
                                    timeout=10) as page:
            assert page.status == 200
            assert json.loads(page.read())["node_id"] == 5  # the flag won
    assert process.terminate() == 0
    lines = process.popen.stderr.read().decode().splitlines()
    documents = [json.loads(line) for line in lines if line.strip()]
    assert documents and {"time", "level", "logger", "message"} <= set(documents[0])
    assert any(d["level"] == "INFO" for d in documents)
    version = subprocess.run([*_broker_command(), "--version"], capture_output=True,
                             text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("rivven-broker ")


def test_peers_without_a_quorum_serve_but_are_not_ready(broker_process, connect_blocking, capfd):
    """--peers on loopback without a key file: the development key, loudly. The peers are not
    up, so there is no controller quorum: the broker serves, keeps trying, lists no registered
    broker and no controller in Metadata, and /health says
    it is not ready (503)."""
    process = broker_process("--peers", "2@127.0.0.1:19093,3@127.0.0.1:29093")
    client = connect_blocking(process.port)
    metadata = client.call(Metadata())
    assert metadata.brokers == () and metadata.controller_id == -1
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"http://127.0.0.1:{process.http_port}/health", timeout=10)
    assert info.value.code == 503 and json.loads(info.value.read())["ready"] is False
    assert process.terminate() == 0
    err = capfd.readouterr().err
    assert "NO CLUSTER KEY" in err


def test_metrics_of_a_real_broker_process_after_traffic(broker_process):
    """/metrics of a real `rivven-broker` after a produce, a fetch and a commit: the process
    and Python collectors, requests by api and error name, bytes and records by topic, the
    network totals and a group's lag per partition, in Prometheus' naming."""
    from rivven_broker.client import Consumer, Producer, TopicPartition

    process = broker_process()
    with Producer(process.address, linger_ms=5) as producer:
        for i in range(10):
            producer.send("metered", value=b"v%d" % i, partition=0)
        producer.flush()
    with Consumer(process.address, group_id="meter", enable_auto_commit=False,
                  auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("metered", 0)])
        got = []
        while len(got) < 10:
            got += consumer.poll(timeout_ms=1_000)
        consumer.commit({TopicPartition("metered", 0): 4})
    with urllib.request.urlopen(f"http://127.0.0.1:{process.http_port}/metrics",
                                timeout=10) as page:
        text = page.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)

    def value(name: str) -> float:
        assert name in samples, f"{name} not in /metrics"
        return samples[name]

    assert value("process_cpu_seconds_total") > 0 and value("process_open_fds") > 0
    assert value("process_resident_memory_bytes") > 0
    assert any(name.startswith("python_gc_collections_total") for name in samples)
    assert value('rivven_topic_produced_records_total{topic="metered"}') == 10
    assert value('rivven_topic_produced_bytes_total{topic="metered"}') > 0
    assert value('rivven_topic_fetched_bytes_total{topic="metered"}') > 0
    assert value('rivven_requests_total{api="Produce",error="NONE"}') >= 1
    assert value("rivven_network_received_bytes_total") > 0
    assert value("rivven_network_sent_bytes_total") > 0
    assert value('rivven_consumer_lag{group="meter",partition="0",topic="metered"}') == 6
